"""How a number is written for a person: days, money, step times, shares, memory, rates. One home, so that the
Markdown tables, results/report.md, the CLI and the plots round alike ("3.2 d" or "17 h", "$83,500", "51 ms").

Two significant digits below 10 and whole numbers (with thousands separators) above: enough to compare settings,
no false precision from a median of a few timed steps. Unknown values are a dash. Imports no torch."""

from __future__ import annotations

import math
from typing import Any

DASH = "-"
# a duration's unit by its size: (seconds per unit, symbol, long name), largest first
DURATIONS = ((86400.0, "d", "days"), (3600.0, "h", "hours"), (60.0, "min", "minutes"), (1.0, "s", "seconds"))


def known(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


def number(x: float | None, small: int = 2) -> str:
    """`small` significant digits (3.2, 0.047; with 3: 51.2), whole numbers from 10 ** (small - 1) on (17, 1,234)."""
    if not known(x):
        return DASH
    if x == 0:
        return "0"
    digits = max(0, small - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{digits}f}"
    if digits and float(text.replace(",", "")) >= 10 ** (small - 1):  # 9.96 -> "10", not "10.0"
        text = f"{x:,.{digits - 1}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 1.50 -> 1.5, 1.00 -> 1


def duration_s(seconds: float | None) -> str:
    """A duration in its largest whole unit: 3.2 d, 17 h, 12 min, 48 s, 380 ms."""
    if not known(seconds):
        return DASH
    for size, symbol, _ in DURATIONS:
        if abs(seconds) >= size:
            return f"{number(seconds / size)} {symbol}"
    return f"{number(seconds * 1000)} ms" if seconds else "0 s"


def days(d: float | None) -> str:
    """Days to train: 3.2 d, 17 d, 173 d; under a day in hours, minutes, seconds (17 h, 12 min, 48 s, 3.8 ms)."""
    return duration_s(d * 86400) if known(d) else DASH


def step(seconds: float | None) -> str:
    """A step time: 1.2 s, 51 ms, 0.8 ms (three digits: steps are compared closely)."""
    if not known(seconds):
        return DASH
    if abs(seconds) >= 1 or seconds == 0:
        return f"{number(seconds, 3)} s"
    return f"{number(seconds * 1000, 3)} ms"


def usd(x: float | None) -> str:
    """$83,500 / $804 / $12.34 / <$0.01; '-' when unknown."""
    if not known(x):
        return DASH
    if 0 < abs(x) < 0.005:
        return "<$0.01"
    return f"${x:,.2f}" if abs(x) < 100 else f"${x:,.0f}"


def percent(share: float | None) -> str:
    """A share as a percentage: 41%, 3.1%, 0.047%."""
    return f"{number(share * 100)}%" if known(share) else DASH


def gib(x: float | None) -> str:
    """Memory: 1.2 GiB, 35 GiB."""
    return f"{number(x)} GiB" if known(x) else DASH


def rate(x: float | None) -> str:
    """A throughput: 12,345 (per second), 47, 3.2."""
    return number(x)


def times(x: float | None) -> str:
    """A ratio: 1.3x, 12x."""
    return f"{number(x)}x" if known(x) else DASH


def sci(x: float | None) -> str:
    """A count too large for digits (FLOPs): 1.23e+12."""
    return f"{x:.3g}" if known(x) else DASH


def layout(nodes: Any, gpus_per_node: Any) -> str:
    """A GPU layout: nodes x GPUs per node, `1x8`."""
    return f"{nodes}x{gpus_per_node}"


def duration_unit(days_values: list[float | None]) -> tuple[float, str]:
    """(days per unit, long name) of the unit a plot's duration axis reads best in: that of the median value, so
    that tiny models' seconds are not drawn as 1e-7 days."""
    vals = sorted(v for v in days_values if known(v) and v > 0)
    if not vals:
        return 1.0, "days"
    median_s = vals[len(vals) // 2] * 86400
    for size, _, name in DURATIONS:
        if median_s >= size or size == 1.0:
            return size / 86400, name
    raise AssertionError("unreachable")

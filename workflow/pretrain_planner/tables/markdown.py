"""Markdown tables from plain rows, without polars: the one formatting rule of every table the project writes
(aggregate.to_markdown for data frames, the GPU benchmark's reports on a machine without polars)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def cell(v: Any) -> str:
    """A value as a table cell: 4 significant digits, thousands separators, blanks for nulls, yes/no, no `|`."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], max_rows: int | None = None, total: int | None = None
) -> str:
    """A GitHub-flavoured Markdown table of `rows` (each a sequence of values in `columns` order): the first
    `max_rows` of them, and a note when there are more (`total`: how many there are, if `rows` is already cut)."""
    shown = list(rows)[:max_rows] if max_rows is not None else list(rows)
    n = len(shown) if total is None else total
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in shown]
    if n > len(shown):
        lines.append(f"\n({len(shown)} of {n} rows shown; all of them in the CSV beside this file)")
    return "\n".join(lines) + "\n"

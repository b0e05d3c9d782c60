"""Markdown tables a person reads in a 120-column terminal and on GitHub: the one formatting rule of every table the
project writes (`to_markdown` for polars data frames; `table` for plain rows, without polars, for the GPU benchmark's
reports on a machine that has none).

Every value is written by its column's unit (tables/units.py: days as "3.2 d" / "17 h", money as "$83,500", MFU as
"3.1%", step times as "51.2 ms"), columns are padded so the raw text lines up, a long text (a reason, a note) moves
under the table as a numbered note with a `[n]` in its cell, a column blank in every row is named under the table
instead of shown, and a table still wider than the terminal is cut into blocks of columns, each repeating the key
columns. The CSV beside each .md keeps every column and every digit (`csv_text` for plain rows: the csv module's
quoting, so a value holding a comma or a quote reads back whole). Imports no torch and no polars.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pretrain_planner.tables import units

if TYPE_CHECKING:
    import polars as pl

WIDTH = 120  # characters of a line: a terminal's width
NOTE_AT = 36  # a text cell longer than this becomes a numbered note under the table
MAX_KEYS = 3  # leading text columns repeated in every block of a cut table, at most


def unit_of(column: str) -> Callable[[Any], str] | None:
    """The writer of a numeric column by its name (the tables' naming: *_days, *_usd, *_gib, mfu, step_time_s, ...);
    None: a plain number."""
    c = column.lower()
    if "flops" in c and "tflops" not in c:
        return units.sci
    if c.endswith("per_s") or c.endswith("_per_sample") or c.endswith("_per_step"):
        return units.rate
    if "days" in c and "gpu_days" not in c:
        return units.days
    if c.endswith("usd") or c.endswith("_usd_optimistic") or c.endswith("_usd_pessimistic"):
        return units.usd
    if "mfu" in c or c.endswith("_share") or c == "share_of_run":
        return units.percent
    if c.startswith("step_time") or c.endswith("step_time_s") or c.endswith("_step_s"):
        return units.step
    if c.endswith("_s"):
        return units.duration_s
    if c.endswith("_gib"):
        return units.gib
    if c.startswith("speedup") or c.endswith("_over_analytic") or c.endswith("_over_original"):
        return units.times
    if c == "gain" or c.endswith("_gain"):
        return units.percent
    return None


def cell(v: Any, column: str = "") -> str:
    """One value as the table shows it: by its column's unit, else 3 significant digits (whole numbers with thousands
    separators from 100 on); yes/no; blank for nulls; no `|` or line break."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        writer = unit_of(column)
        return writer(v) if writer else units.number(v, 3)
    if isinstance(v, int):
        writer = unit_of(column)
        return writer(float(v)) if writer and writer is not units.rate else (f"{v:,}" if abs(v) >= 10_000 else str(v))
    return str(v).replace("|", "\\|").replace("\n", " ")


def _notes(rows: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """Long texts replaced by `[n]` (the same text, the same n), with the notes' lines."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        new = []
        for text in row:
            if len(text) > NOTE_AT:
                n = seen.setdefault(text, len(seen) + 1)
                text = f"[{n}]"
            new.append(text)
        out.append(new)
    lines = [textwrap.fill(text, WIDTH - 2, initial_indent=f"- [{n}] ", subsequent_indent="  ")
             for text, n in seen.items()]  # fmt: skip
    return out, lines


def _lines(columns: Sequence[str], rows: list[list[str]], right: Collection[str] = ()) -> list[str]:
    widths = [max([len(c), 3, *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    rule = ["-" * (w + 1) + ":" if c in right else "-" * (w + 2) for c, w in zip(columns, widths, strict=True)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |",
             "|" + "|".join(rule) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(t.ljust(w) for t, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return lines


def _blocks(columns: list[str], rows: list[list[str]], keys: int, width: int) -> list[list[int]]:
    """Column indices of each block: the first `keys` columns in every block, the others filled in while the
    block's lines fit in `width`."""
    widths = [max([len(c), 3, *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns)]
    key_w = 1 + sum(widths[:keys])
    blocks, current, used = [], [], key_w
    for i in range(keys, len(columns)):
        if current and used + widths[i] > width:
            blocks.append(current)
            current, used = [], key_w
        current.append(i)
        used += widths[i]
    if current or not blocks:
        blocks.append(current)
    return [[*range(keys), *b] for b in blocks]


def _leading_text(columns: Sequence[str], rows: list[Sequence[Any]]) -> int:
    """How many leading columns hold only text (or nothing): the keys a cut table repeats, at most MAX_KEYS."""
    for i in range(len(columns)):
        column = [r[i] for r in rows]
        if any(v is not None and not isinstance(v, str) for v in column) or all(v is None for v in column):
            return min(i, MAX_KEYS)
    return min(len(columns), MAX_KEYS)


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    max_rows: int | None = None,
    total: int | None = None,
    keys: int | None = None,
    width: int = WIDTH,
) -> str:
    """A GitHub-flavoured Markdown table of `rows` (each a sequence of values in `columns` order): the first
    `max_rows` of them, and a note when there are more (`total`: how many there are, if `rows` is already cut).
    Units by column name, padded, long texts as notes below, a column blank in every row named below instead of
    shown, and cut into blocks of columns (each repeating the first `keys` columns: default, the text columns that
    lead) where a line would pass `width` characters."""
    values = list(rows)
    shown = values[:max_rows] if max_rows is not None else values
    n = len(values) if total is None else total
    columns = list(columns)
    if keys is None:
        keys = _leading_text(columns, shown)
    texts = [[cell(v, c) for c, v in zip(columns, row, strict=True)] for row in shown]
    blank = [i for i in range(keys, len(columns)) if texts and not any(r[i] for r in texts)]
    kept = [c for i, c in enumerate(columns) if i not in blank]
    texts = [[t for i, t in enumerate(r) if i not in blank] for r in texts]
    texts, notes = _notes(texts)
    lines: list[str] = []
    for k, block in enumerate(_blocks(kept, texts, keys, width)):
        if k:
            lines.append("")
        lines += _lines([kept[i] for i in block], [[r[i] for i in block] for r in texts])
    if notes:
        lines += ["", *notes]
    if blank:  # a column with nothing in it says nothing
        lines += ["", textwrap.fill(f"(No value in any row, so not shown: {', '.join(columns[i] for i in blank)}.)",
                                    width)]  # fmt: skip
    if n > len(shown):
        lines.append(f"\n({len(shown)} of {n} rows shown; all of them in the CSV beside this file)")
    return "\n".join(lines) + "\n"


def plain(columns: Sequence[str], rows: Iterable[Sequence[Any]], right: Collection[str] = ()) -> list[str]:
    """The lines of a Markdown table of values already written as text (a benchmark's report: its own digits and
    units, every row, no notes): `table`'s layout (padded, `|` and line breaks escaped), the `right` columns
    right-aligned."""
    texts = [[str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in rows]
    if any(len(r) != len(columns) for r in texts):
        raise ValueError(f"a row has not {len(columns)} values (columns {list(columns)})")
    return _lines(list(columns), texts, right)


def to_markdown(df: pl.DataFrame, max_rows: int | None = None, keys: int | None = None, width: int = WIDTH) -> str:
    """`table` of a polars data frame (its columns, its rows)."""
    shown = df if max_rows is None else df.head(max_rows)
    return table(df.columns, shown.iter_rows(), max_rows, df.height, keys, width)


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The CSV beside a `table` of the same rows: every column, every digit (`str` of each value, None as an empty
    field), quoted by the csv module where a value holds a comma, a quote or a line break; Unix line ends."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue()

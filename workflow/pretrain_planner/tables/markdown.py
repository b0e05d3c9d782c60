"""Markdown tables a person reads in a 120-column terminal and on GitHub.

Every value is written by its column's unit (tables/units.py: days as "3.2 d" / "17 h", money as "$83,500", MFU as
"3.1%", step times as "51.2 ms"), columns are padded so the raw text lines up, a long text (a reason, a note) moves
under the table as a numbered note with a `[n]` in its cell, and a table still wider than the terminal is cut into
blocks of columns, each repeating the key columns. The CSV beside each .md keeps every column and every digit.
Imports no torch."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

from pretrain_planner.tables import units

WIDTH = 120  # characters of a line: a terminal's width
NOTE_AT = 36  # a text cell longer than this becomes a numbered note under the table


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


def cell_text(column: str, v: Any) -> str:
    """One value as the table shows it."""
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


def _notes(columns: list[str], rows: list[list[str]]) -> tuple[list[list[str]], list[str]]:
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


def _lines(columns: Sequence[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(c), 3, *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]  # fmt: skip
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


def to_markdown(df: pl.DataFrame, max_rows: int | None = None, keys: int | None = None, width: int = WIDTH) -> str:
    """A GitHub-flavoured Markdown table of `df`: units by column name, padded, long texts as notes below, and
    cut into blocks of columns (each repeating the first `keys` columns: default, the text columns that lead)
    where a line would pass `width` characters; a column blank in every row is named below instead of shown."""
    shown = df if max_rows is None else df.head(max_rows)
    columns = list(df.columns)
    rows = [[cell_text(c, v) for c, v in zip(columns, row, strict=True)] for row in shown.iter_rows()]
    if keys is None:
        keys = next((i for i, c in enumerate(columns) if df.schema[c] != pl.String), len(columns))
        keys = min(keys, 3)
    blank = [i for i in range(keys, len(columns)) if rows and not any(r[i] for r in rows)]
    if blank:  # a column with nothing in it says nothing: named under the table instead
        columns = [c for i, c in enumerate(columns) if i not in blank]
        rows = [[t for i, t in enumerate(r) if i not in blank] for r in rows]
    rows, notes = _notes(columns, rows)
    lines: list[str] = []
    for k, block in enumerate(_blocks(columns, rows, keys, width)):
        if k:
            lines.append("")
        lines += _lines([columns[i] for i in block], [[r[i] for i in block] for r in rows])
    if notes:
        lines += ["", *notes]
    if blank:
        left_out = ", ".join(df.columns[i] for i in blank)
        lines += ["", textwrap.fill(f"(No value in any row, so not shown: {left_out}.)", width)]
    if max_rows is not None and df.height > max_rows:
        lines.append(f"\n({max_rows} of {df.height} rows shown; all of them in the CSV beside this file)")
    return "\n".join(lines) + "\n"

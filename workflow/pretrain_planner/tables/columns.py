"""Every table column's type, stated once, and the CSV readers that apply it. Imports no torch.

A CSV read back by inference would type an all-empty column as text and a column of whole numbers as integers, so
each reader gives polars the declared types. A column that is a result's field has that field's type
(results.RESULT_FIELDS, the cells' schema); the tables' own columns are declared here, once: those of the main
tables (aggregate.py: cells, time_to_train, feasibility, costs, pareto, problems, benchmark_cost, loss_check), those
of the study and what-if tables (study.py, whatif.py, which keep the study's own names), and the few both have. An
undeclared column is a number (Float64)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from pretrain_planner.results import RESULT_FIELDS

DTYPES: dict[str, type[pl.DataType]] = {
    "str": pl.String, "int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "json": pl.String,
}  # fmt: skip
RESULT_SCHEMA = {name: DTYPES[kind] for name, kind in RESULT_FIELDS.items()}


def _kinds(**names: str) -> dict[str, str]:
    """{column: kind} from kind="col col ..." (one line per kind reads better than 80 dict entries)."""
    return {col: kind for kind, cols in names.items() for col in cols.split()}


_BOTH = _kinds(str="best_method note peak_kind")
# the main tables' own columns (in feasibility, `naive` and `fl` are whether each fits: text)
TABLE_COLUMNS: dict[str, str] = {
    **RESULT_FIELDS,
    **_BOTH,
    **_kinds(
        str="path problem cost_note cost_kind verdict naive fl fitting_methods partition folder files state detail "
        "strategy need_method need_source cheapest_fix other_fixes loss passed_over role against quantity test_fault "
        "curves tie",
        int="methods_ok methods_oom methods_unsupported methods_suspect methods_noisy methods_valid "
        "methods_not_measured time_limit_min methods_run methods_pruned left_at band_runs steps",
        bool="valid fits_naive fits_fl fits_any pareto",
    ),
}
# the study's and the what-if's own columns (in the study's speed-ups, `naive` is a number of days)
STUDY_COLUMNS: dict[str, str] = {
    **RESULT_FIELDS,
    **_BOTH,
    **_kinds(
        str="sharding ours_setting ours_method original_source free_lunch_method memory_saving_method optimal_method "
        "family study_counter_note source why basis evidence rests_on sources transfer model_error",
        int="original_gpus memory_saving_methods",
        bool="free_lunch checkpointing offload in_sweep in_mean in_count_mean stand_in",
    ),
}


def dtype(name: str, columns: Mapping[str, str] = TABLE_COLUMNS) -> type[pl.DataType]:
    """The polars type of column `name` in a main table (or, with STUDY_COLUMNS, a study or what-if table)."""
    return DTYPES[columns.get(name, "float")]


def schema(names: Iterable[str], columns: Mapping[str, str] = TABLE_COLUMNS) -> dict[str, type[pl.DataType]]:
    return {name: dtype(name, columns) for name in names}


def read_csv(path: str | Path, columns: Mapping[str, str] = TABLE_COLUMNS) -> pl.DataFrame:
    """A table's CSV with its columns' declared types (the header read by the csv module, quoting and all)."""
    with open(path, newline="") as fh:
        header = next(csv.reader(fh), [])
    return pl.read_csv(path, schema_overrides=schema([c for c in header if c], columns))

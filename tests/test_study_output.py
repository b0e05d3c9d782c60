"""The study's views as a reader gets them (issue 36): the Markdown written as the main tables are (the reader's
headers, one GPUs column, units, the mean row labelled `mean` and what it averages said under the table, 120
columns), the CSVs with every column the plots read; the study's optimal (the fastest fl-based method) labelled so
and, on the `cpu` stand-in where free-lunch has little to win, a line saying its speed-ups are no finding about
GPUs; and captions that describe no sweep, report.md saying what this one holds. No training: cells are written as
a cell writes them (tests/demo_results.py for the default sweep)."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from pretrain_planner.report import study_plots
from pretrain_planner.tables import aggregate, study

from .conftest import CATALOG, COSTS, REPO, cell_result, write_set
from .demo_results import build_demo_results

WIDTH = 120
# The CSV columns the plots and downstream code read (as before issue 36): kept, in this order, first
CSV_COLUMNS = {
    "speedups": ["model", "gpu", "nodes", "gpus_per_node", "world_size", "days_naive", "analytic_days",
                 "days_optimal", "speedup_analytic", "speedup_naive", "speedup_optimal", "in_mean"],
    "memory_saving": ["model", "gpu", "nodes", "gpus_per_node", "world_size", "free_lunch_method", "days_free_lunch",
                      "memory_saving_method", "days_memory_saving", "gain", "in_mean", "in_count_mean"],
    "step_time_stats": ["model", "gpu", "nodes", "gpus_per_node", "world_size", "memory_saving_methods", "worst_s",
                        "median_s", "optimal_s", "optimal_method", "free_lunch_s", "speedup_median",
                        "speedup_optimal", "speedup_free_lunch", "in_mean"],
    "optimal_settings": ["model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "free_lunch",
                         "checkpointing", "sharding", "offload", "micro_batch", "grad_accum_steps",
                         "training_days"],
    "gpu_days": ["model", "original_gpus", "original_days", "original_gpu_days", "ours_setting", "ours_method",
                 "ours_days", "ours_gpu_days", "ours_over_original", "original_source"],
}  # fmt: skip
# The study views' captions (workflow/report/): read for every sweep, so they describe none
CAPTIONS = ["study_views", "study_days", "study_claims", "study_reading", "step_time_stats", "speedups",
            "speedups_plot", "memory_saving", "memory_saving_gain", "days_naive", "days_optimal", "optimal_settings",
            "gpu_days", "gpu_days_plot", "model_flops"]  # fmt: skip


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("demo") / "results"
    tables, _, _ = build_demo_results(root)
    return root, tables


def _tables(text: str) -> list[list[str]]:
    out, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_study_tables_read_as_the_main_tables(demo):
    """Human headers (no snake_case), one GPUs column (`1x2`) instead of nodes / GPUs per node / world size, one
    block within 120 columns, the mean row's model `mean` (not a `[1]` note), what it averages under the table."""
    root, _ = demo
    for name in study.STUDY_TABLES:
        text = (root / f"tables/study/{name}.md").read_text()
        found = _tables(text)
        assert len(found) == 1, f"{name}: cut into {len(found)} blocks of columns"
        table = found[0]
        header = _cells(table[0])
        assert not [h for h in header if "_" in h], (name, header)
        assert not {"nodes", "gpus_per_node", "world_size"} & set(header), (name, header)
        assert all(len(line) <= WIDTH for line in table), (name, max(table, key=len))
        rows = [_cells(line) for line in table[2:]]
        assert not [r for r in rows if re.fullmatch(r"\[\d+\]", r[0])], f"{name}: a note in the model column"
        if "GPUs" in header:
            gpus = {r[header.index("GPUs")] for r in rows} - {""}
            assert gpus and all(re.fullmatch(r"\d+x\d+", g) for g in gpus), (name, gpus)
    for name in ("speedups", "memory_saving", "step_time_stats"):
        text = (root / f"tables/study/{name}.md").read_text()
        (table,) = _tables(text)
        last = _cells(table[-1])
        assert last[0] == "mean" and last[1:3] == ["", ""], (name, last)
        under = " ".join(text.split(table[-1], 1)[1].split())
        assert re.search(r"mean \(last row\): over the \d+ rows? marked `in mean`, gptneox models", under), under


def test_study_tables_write_units_and_keep_the_csv_columns(demo):
    root, tables = demo
    md = (root / "tables/study/speedups.md").read_text()
    (table,) = _tables(md)
    header = _cells(table[0])
    assert header[:4] == ["model", "GPU", "GPUs", "naive"] and "optimal vs naive" in header
    row = dict(zip(header, _cells(table[2]), strict=True))
    assert re.fullmatch(r"[\d.,]+ (d|h|min|s|ms)", row["naive"]), row
    assert re.fullmatch(r"[\d.,]+ (d|h|min|s|ms) \(fl[\w+-]*\)", row["optimal (fl-based)"]), row
    assert re.fullmatch(r"[\d.]+x", row["optimal vs naive"]), row
    settings = (root / "tables/study/optimal_settings.md").read_text()
    assert "%*" in settings and "MEASURED on the host" in settings  # MFU against the host's peak, marked and said
    for name, columns in CSV_COLUMNS.items():
        got = study.read_study_table(tables[f"{name}_csv"]).columns
        assert got[: len(columns)] == columns, (name, got)


# (model, gpu, gpus, method, days): free-lunch slower than naive on the cpu stand-in and on one A100 setting
SLOWER = [
    ("tiny-gptneox", "cpu", 1, "naive", 0.010), ("tiny-gptneox", "cpu", 1, "fl", 0.020),
    ("tiny-gptneox", "cpu", 2, "naive", 0.006), ("tiny-gptneox", "cpu", 2, "fl", 0.012),
    ("pythia-160m", "a100", 1, "naive", 10.0), ("pythia-160m", "a100", 1, "fl", 12.0),
    ("pythia-160m", "a100", 2, "naive", 6.0), ("pythia-160m", "a100", 2, "fl", 4.0),
]  # fmt: skip


def _built(tmp_path: Path, rows: list[tuple]) -> dict[str, str]:
    plan, paths = write_set(tmp_path, [cell_result(m, g, 1, k, meth, "ok", d) for m, g, k, meth, d in rows])
    out = aggregate.table_files(str(tmp_path / "tables"))
    aggregate.build_tables(plan, paths, out, str(tmp_path / "aggregate.log"), CATALOG, COSTS)
    files = study.table_files(str(tmp_path / "tables/study"))
    study.build_study_tables(out["cells_parquet"], files, str(tmp_path / "study.log"), CATALOG, 0.85)
    return files


def test_an_optimal_slower_than_naive_is_said_why(tmp_path):
    """The stand-in's optimal (fl 0.5x) is labelled the fastest fl-based method, and the speed-ups table and the
    days_optimal view say that on the stand-in free-lunch has little to win: not a finding about GPUs; a GPU
    setting where naive is faster says the optimal takes fl-based methods only."""
    files = _built(tmp_path, SLOWER)
    for name in ("speedups", "days_optimal"):
        text = " ".join(Path(files[f"{name}_md"]).read_text().split())
        assert "On the `cpu` stand-in" in text and "slower than naive in 2 of its 2 settings here" in text, name
        assert "not a finding about GPUs" in text and "TF32 does not exist on a CPU" in text, name
        assert "On GPU types the optimal is slower than naive in 1 of 2 settings" in text, name
    md = Path(files["speedups_md"]).read_text()
    assert "optimal (fl-based)" in md and "fastest fl-based method" in md
    spd = study.read_study_table(files["speedups_csv"])  # the plot reads the stand-in from the CSV
    assert spd.filter(pl.col("gpu") == "cpu")["stand_in"].all()
    assert not spd.filter(pl.col("gpu") == "a100")["stand_in"].any()


def test_a_gpu_sweep_gets_no_stand_in_line(tmp_path):
    files = _built(tmp_path, [r for r in SLOWER if r[1] == "a100"])
    for name in ("speedups", "days_optimal"):
        assert "stand-in" not in Path(files[f"{name}_md"]).read_text(), name


def test_the_stand_in_is_recognised_as_the_code_does():
    """The GPU type `cpu` (the trainer's rule), a peak measured on the host (only a CPU rank measures one), or a
    CPU device: each a stand-in cell; a datasheet peak on a GPU is not."""
    df = pl.DataFrame({"gpu": ["cpu", "my-laptop", "a100", "a100"],
                       "peak_kind": [None, "measured", "datasheet", "datasheet"],
                       "device_name": [None, None, "NVIDIA A100-SXM4-80GB", "CPU (AMD EPYC)"]})  # fmt: skip
    assert df.select(study.on_stand_in(df))["gpu"].to_list() == [True, True, False, True]


def test_the_speedups_plot_labels_the_optimal_and_says_why_on_the_stand_in(tmp_path):
    files = _built(tmp_path, SLOWER)
    spd = study.read_study_table(files["speedups_csv"]).with_columns(pl.lit(True).alias("in_mean"))
    stats = study.read_study_table(files["step_time_stats_csv"])
    fig = study_plots.figure_speedups(spd.filter(pl.col("gpu") == "cpu"), stats)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[-1] == "optimal\n(fastest fl-based)", labels
    said = " ".join(" ".join(t.get_text() for t in fig.texts).split())
    assert "cpu stand-in" in said and "the optimal under 1x is the stand-in's result, not a finding about GPUs" in said
    fig = study_plots.figure_speedups(spd.filter(pl.col("gpu") == "a100"), stats)
    assert not [t for t in fig.texts if "stand-in" in t.get_text()]


def test_captions_describe_no_sweep_and_report_md_says_this_ones(demo):
    """A caption is read for every sweep: it says nothing about what the demo holds (it said the demo's views had no
    memory-saving rows and no MFU long after both changed); report.md's sentence about this sweep is generated."""
    for stem in CAPTIONS:
        text = (REPO / "workflow/report" / f"{stem}.rst").read_text()
        assert "demo" not in text.lower(), (stem, text)
        assert not re.search(r"\bcarry no MFU\b|\bEmpty when the sweep has no memory-saving", text), stem
    root, tables = demo
    report = " ".join((root / "report.md").read_text().split())
    cells = pl.read_parquet(tables["cells_parquet"])
    saving = sorted(set(cells.filter(pl.col("method").str.contains(r"\+"))["method"]))
    settings = cells.select("model", "gpu", "nodes", "gpus_per_node").unique().height
    said = ", ".join(f"`{m}`" for m in saving)
    assert f"This sweep: {settings} settings, {settings} of them on the `cpu` stand-in;" in report
    assert f"memory-saving: {said}." in report

"""The study's views by the study's own definitions (apoorvkh/academic-pretraining scripts/plotting/), on a hand-made
set of results written as cells write them (no training):

- optimal = the fastest free-lunch method, with or without memory saving (training_time_tables.py reads the
  all_optimized sweep, free_lunch: true only): never naive, never a naive base with a memory-saving part;
- GPU-days = 8 x the days of the optimal 8 x A100 setting (gpu_days.py), the setting a config key;
- the means over the Pythia models only, the memory-saving ones over more than one GPU (training_time_avg.py,
  optimal_memory_saving_speedups.py, mem_saving_methods.py), with a column naming the rows each mean takes;
- models and GPU types in the study's order (Pythia by size, then RoBERTa; RTX 3090, A6000, A100, H100)."""

from __future__ import annotations

import polars as pl
import pytest
from pretrain_planner.planning.configtypes import StudySection
from pretrain_planner.report import study_plots
from pretrain_planner.schema import ConfigError
from pretrain_planner.tables import aggregate, study

from .conftest import CATALOG, cell_result, write_set

# (model, gpu, gpus, method, days to train): one node each
SET = [
    # pythia-160m on 8 x A100: naive+ac is the fastest of all, fl+zero1 the fastest free-lunch method
    ("pythia-160m", "a100", 8, "naive", 10.0),
    ("pythia-160m", "a100", 8, "naive+ac", 3.0),
    ("pythia-160m", "a100", 8, "fl", 6.0),
    ("pythia-160m", "a100", 8, "fl+ac", 7.0),
    ("pythia-160m", "a100", 8, "fl+zero1", 5.0),
    # ... and on 1 A100: fewer GPU-days (30) than on 8 (8 x 5 = 40); memory saving costs time (fl+ac)
    ("pythia-160m", "a100", 1, "naive", 50.0),
    ("pythia-160m", "a100", 1, "fl", 30.0),
    ("pythia-160m", "a100", 1, "fl+ac", 40.0),
    ("pythia-160m", "rtx3090", 2, "fl", 90.0),
    ("pythia-410m", "a100", 8, "naive", 12.0),
    ("pythia-410m", "a100", 8, "fl", 8.0),
    ("pythia-410m", "a100", 8, "fl+ac", 9.0),
    # pythia-1b: on 1 H100 naive is faster than free-lunch, so the study's optimal is the slower fl
    ("pythia-1b", "h100", 1, "naive", 10.0),
    ("pythia-1b", "h100", 1, "fl", 12.0),
    ("pythia-1b", "a100", 2, "naive", 30.0),
    ("pythia-1b", "a100", 2, "fl", 20.0),
    ("pythia-1b", "a100", 2, "fl+zero2", 16.0),
    ("pythia-1b", "a100", 2, "fl+zero3", 24.0),
    # RoBERTa: not a Pythia model, so in no mean
    ("roberta-large", "a100", 8, "naive", 10.0),
    ("roberta-large", "a100", 8, "fl", 5.0),
    ("roberta-large", "a100", 8, "fl+ac", 2.5),
]


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> pl.DataFrame:
    root = tmp_path_factory.mktemp("study") / "results"
    plan, paths = write_set(root, [cell_result(m, g, 1, k, meth, "ok", d) for m, g, k, meth, d in SET])
    return aggregate.cells_table(plan, paths, CATALOG)[0]


def tables(cells: pl.DataFrame, given: dict | None = None) -> dict:
    """The study's tables, `given` the config's study keys over the schema's (typed, as the facade types them)."""
    return study.build_all(cells, CATALOG, 0.85, StudySection.given(given))


def csv_of(value):
    return value[0] if isinstance(value, tuple) else value


def md_of(value):
    return value[1] if isinstance(value, tuple) else value


def row(df: pl.DataFrame, model: str, gpu: str, gpn: int) -> dict:
    (r,) = df.filter((pl.col("model") == model) & (pl.col("gpu") == gpu) & (pl.col("gpus_per_node") == gpn)).rows(
        named=True
    )
    return r


def test_optimal_is_the_fastest_free_lunch_method(cells):
    t = tables(cells)
    days = csv_of(t["days_optimal"]).filter(pl.col("model") == "pythia-160m").row(0, named=True)
    assert days["a100 1x8"] == pytest.approx(5.0)  # fl+zero1, not naive+ac (3 days)
    assert csv_of(t["days_optimal"]).filter(pl.col("model") == "pythia-1b")["h100 1x1"][0] == pytest.approx(12.0)
    settings = csv_of(t["optimal_settings"])
    assert row(settings, "pythia-160m", "a100", 8)["best_method"] == "fl+zero1"
    assert row(settings, "pythia-1b", "h100", 1)["best_method"] == "fl"
    assert settings["free_lunch"].all()
    # time_to_train keeps the fastest of every method
    ttt = aggregate.time_to_train(cells)
    assert row(ttt, "pythia-160m", "a100", 8)["best_method"] == "naive+ac"
    assert row(ttt, "pythia-1b", "h100", 1)["best_method"] == "naive"


def test_gpu_days_are_gpus_times_the_optimal_days_on_8_a100(cells):
    gd = csv_of(tables(cells)["gpu_days"])
    p160 = gd.filter(pl.col("model") == "pythia-160m").row(0, named=True)
    assert p160["ours_setting"] == "a100 1x8" and p160["ours_method"] == "fl+zero1"
    assert p160["ours_gpu_days"] == pytest.approx(40.0)  # not the 1-GPU setting's 30 GPU-days
    assert p160["original_gpu_days"] == 32 and p160["ours_over_original"] == pytest.approx(40 / 32)
    assert gd.filter(pl.col("model") == "pythia-1b")["ours_gpu_days"][0] is None  # not measured on 8 x A100
    # the setting is the config's: 2 x A100 gives pythia-1b 2 x 16 days (fl+zero2)
    two = csv_of(tables(cells, {"gpu_days_gpus_per_node": 2})["gpu_days"])
    assert two.filter(pl.col("model") == "pythia-1b")["ours_gpu_days"][0] == pytest.approx(32.0)


def test_speedups_mean_over_pythia_models_only(cells):
    t = tables(cells)
    want = sum(n / o for n, o in ((10, 5), (50, 30), (12, 8), (10, 12), (30, 16))) / 5
    mean = md_of(t["speedups"]).row(-1, named=True)
    assert mean["speedup_optimal"] == pytest.approx(want)
    assert mean["model"] == "mean"  # labelled plainly; what it averages is the note under the table
    assert "over the 5 rows marked `in mean`, gptneox models" in " ".join(t["speedups"].notes)
    spd = csv_of(t["speedups"])
    assert not row(spd, "roberta-large", "a100", 8)["in_mean"]
    assert row(spd, "pythia-160m", "a100", 8)["speedup_optimal"] == pytest.approx(10 / 5)
    used = spd.filter(pl.col("in_mean"))
    assert set(used["model"]) == {"pythia-160m", "pythia-410m", "pythia-1b"} and used.height == 5


def test_memory_saving_means_over_pythia_on_more_than_one_gpu(cells):
    t = tables(cells)
    gains = [(6 - 5) / 6, (8 - 9) / 8, (20 - 16) / 20]  # pythia-160m / 410m on 8, pythia-1b on 2 A100s
    assert md_of(t["memory_saving"]).row(-1, named=True)["gain"] == pytest.approx(sum(gains) / 3)
    want = sum([7 / 5, 9 / 9, 24 / 16]) / 3
    assert md_of(t["step_time_stats"]).row(-1, named=True)["speedup_optimal"] == pytest.approx(want)
    ms = csv_of(t["memory_saving"])
    assert row(ms, "pythia-160m", "a100", 1)["gain"] == pytest.approx((30 - 40) / 30)
    assert not row(ms, "pythia-160m", "a100", 1)["in_mean"] and row(ms, "pythia-160m", "a100", 1)["in_count_mean"]
    assert not row(ms, "roberta-large", "a100", 8)["in_mean"]
    stats = csv_of(t["step_time_stats"])
    assert set(stats.filter(pl.col("in_mean"))["model"]) == {"pythia-160m", "pythia-410m", "pythia-1b"}
    assert stats.filter(pl.col("in_mean")).height == 3
    p1b = row(stats, "pythia-1b", "a100", 2)
    assert p1b["speedup_optimal"] == pytest.approx(24 / 16) and p1b["speedup_free_lunch"] == pytest.approx(24 / 20)
    # the memory-saving methods are free-lunch ones: naive+ac is not one of pythia-160m's on 8 A100s
    assert row(stats, "pythia-160m", "a100", 8)["memory_saving_methods"] == 2


def test_the_plots_draw_the_study_means(cells):
    t = tables(cells)
    fig = study_plots.figure_speedups(csv_of(t["speedups"]), csv_of(t["step_time_stats"]))
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights[2] == pytest.approx(md_of(t["speedups"]).row(-1, named=True)["speedup_optimal"])
    fig = study_plots.figure_memory_saving(csv_of(t["memory_saving"]))
    by_count, by_model = fig.axes
    assert [x.get_text() for x in by_model.get_xticklabels()] == ["pythia-160m", "pythia-410m", "pythia-1b"]
    assert "roberta-large" not in {x.get_text() for ax in fig.axes for x in ax.get_xticklabels()}
    assert [x.get_text() for x in by_count.get_xticklabels()] == ["1x1", "1x2", "1x8"]


def test_models_and_gpu_types_in_the_study_order(cells):
    t = tables(cells)
    days = csv_of(t["days_optimal"])
    assert days["model"].to_list() == ["pythia-160m", "pythia-410m", "pythia-1b", "roberta-large"]
    assert days.columns[1:] == ["rtx3090 1x2", "a100 1x1", "a100 1x2", "a100 1x8", "h100 1x1"]
    assert md_of(t["days_naive"])["model"].to_list() == days["model"].to_list()
    settings = csv_of(t["optimal_settings"])
    assert settings.select("model", "gpu").unique(maintain_order=True).rows()[:3] == [
        ("pythia-160m", "rtx3090"), ("pythia-160m", "a100"), ("pythia-410m", "a100")]  # fmt: skip
    flops = csv_of(t["model_flops"])["model"].to_list()
    assert (
        flops.index("pythia-410m") < flops.index("pythia-1b") < flops.index("pythia-12b") < flops.index("roberta-large")
    )


def test_the_study_section_is_checked():
    assert StudySection.given() == StudySection("a100", 1, 8, ("gptneox",)) == study.typed(None, "here")
    with pytest.raises(ConfigError, match="study.average_families.*pythia.*known families: gptneox"):
        StudySection.given({"average_families": ["pythia"]})
    with pytest.raises(ConfigError, match="study.gpu_days_gpu: .a1000. is not a GPU type of .*config/gpus.yaml"):
        StudySection.given({"gpu_days_gpu": "a1000"}).in_catalog(CATALOG)

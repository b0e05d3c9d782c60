"""The loss check's plot (report/loss_plot.py) and its section of report.md, from hand-made curves files as the check
job writes them (trainer/losscheck.py): one panel per checked setting, each line a method's loss minus its
reference's inside the reference's band, the verdicts in the legend, no two texts on top of each other. No
training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
from pretrain_planner.planning import losscheck
from pretrain_planner.report import document, loss_plot
from pretrain_planner.tables import aggregate

STEPS = 12
NAIVE = [6.0 - 0.05 * s for s in range(STEPS)]


def _run(name: str, role: str, shift: float = 0.0, **extra) -> dict:
    loss = [x + shift * (s + 1) / STEPS for s, x in enumerate(NAIVE)]
    return {"name": name, "method": name.split("~")[0], "role": role, "loss": loss, "grad_norm": [None] * STEPS,
            **extra}  # fmt: skip


def _variants(of: str, spread: float = 1e-3) -> list[dict]:
    return [_run(f"{of}~mb2", "variant", spread, of=of), _run(f"{of}~dropout1", "variant", -spread, of=of)]


def write_curves(root: Path, model: str, nodes: int, gpn: int, runs: list[dict], gpu: str = "cpu") -> str:
    path = root / "results/loss_check" / model / gpu / f"{nodes}x{gpn}" / "curves.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    check = {"steps": STEPS, "global_batch": 16, "seed": 0, "init": "init.pt", "gpu_hours_estimate": 0.001}
    setting = {"model": model, "gpu": gpu, "nodes": nodes, "gpus_per_node": gpn, "method": "naive"}
    path.write_text(json.dumps({"setting": setting, "check": check, "runs": runs}))
    return str(path)


def three_settings(root: Path) -> list[str]:
    """tiny-a 1x1: fl the same, `bad` 5% higher, a TF32 line and a method against it; tiny-a 1x2: fl, naive's band
    widened by 1x1's naive; tiny-b 1x1: fl the same, fl+ac failed (`not checked`)."""
    a1 = [_run("naive", "reference"), *_variants("naive"), _run("fl", "method", 2e-4, against="naive"),
          _run("bad", "method", 0.6, against="naive"), _run("naive~tf32", "precision", 5e-4),
          _run("naive~tf32~mb2", "variant", 7e-4, of="naive~tf32"),
          _run("tf32m", "method", 6e-4, against="naive~tf32")]  # fmt: skip
    a2 = [_run("naive", "reference", 3e-4), _run("fl", "method", 4e-4, against="naive")]
    b1 = [_run("naive", "reference"), *_variants("naive"), _run("fl", "method", -1e-4, against="naive"),
          {"name": "fl+ac", "method": "fl+ac", "role": "method", "against": "naive", "loss": [], "grad_norm": [],
           "error": "RuntimeError: the compiled graph broke"}]  # fmt: skip
    return [write_curves(root, "tiny-a", 1, 1, a1), write_curves(root, "tiny-a", 1, 2, a2),
            write_curves(root, "tiny-b", 1, 1, b1)]  # fmt: skip


def texts_overlap(fig) -> list[str]:
    """Every pair of drawn texts (titles, axis labels, drawn tick labels, texts, legends) whose boxes overlap, and
    every one that leaves the canvas (tests/test_plots_layout.py's check, in short)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [(f"figure text {t.get_text()!r}", t.get_window_extent(r)) for t in fig.texts if t.get_text().strip()]
    for i, ax in enumerate(fig.axes):
        boxes += [(f"axes {i} title", ax.title.get_window_extent(r))] if ax.title.get_text() else []
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if axis.label.get_text():
                boxes.append((f"axes {i} {name} label", axis.label.get_window_extent(r)))
            boxes += [(f"axes {i} {name} tick {t.label1.get_text()!r}", t.label1.get_window_extent(r))
                      for t in axis._update_ticks() if t.label1.get_visible() and t.label1.get_text()]  # fmt: skip
        boxes += [(f"axes {i} text", t.get_window_extent(r)) for t in ax.texts if t.get_text().strip()]
        if ax.get_legend() is not None:
            boxes.append((f"axes {i} legend", ax.get_legend().get_window_extent(r)))
    ext = np.array([[b.x0, b.y0, b.x1, b.y1] for _, b in boxes])
    w = np.minimum(ext[:, None, 2], ext[None, :, 2]) - np.maximum(ext[:, None, 0], ext[None, :, 0])
    h = np.minimum(ext[:, None, 3], ext[None, :, 3]) - np.maximum(ext[:, None, 1], ext[None, :, 1])
    hit = np.triu((w > 1) & (h > 1), k=1)
    found = [f"{boxes[i][0]} overlaps {boxes[j][0]}" for i, j in zip(*np.nonzero(hit), strict=True)]
    c = fig.bbox
    return found + [f"{what} leaves the canvas" for what, b in boxes
                    if b.x0 < c.x0 - 1 or b.y0 < c.y0 - 1 or b.x1 > c.x1 + 1 or b.y1 > c.y1 + 1]  # fmt: skip


def _labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_one_panel_per_setting_with_each_line_inside_its_band(tmp_path):
    table, _ = aggregate.loss_check_table(three_settings(tmp_path), None)
    fig = loss_plot.figure_loss_check(table)
    assert [ax.get_title() for ax in fig.axes] == ["tiny-a cpu 1x1", "tiny-a cpu 1x2", "tiny-b cpu 1x1"]
    first = fig.axes[0]
    verdicts = {
        r["method"]: r["loss"]
        for r in table.filter(
            pl.col("model") == "tiny-a", pl.col("nodes") == 1, pl.col("gpus_per_node") == 1
        ).iter_rows(named=True)
    }
    assert verdicts["fl"] == "same" and verdicts["bad"].startswith("differs +")
    labels = _labels(first)
    for method, verdict in verdicts.items():
        assert f"{method}: {verdict}" in labels, labels
    assert "naive's band (3 runs)" in labels and "naive~tf32's band (1 run)" in labels
    lines = {line.get_label(): line for line in first.get_lines() if not line.get_label().startswith("_")}
    bad = lines[f"bad: {verdicts['bad']}"].get_ydata()
    assert np.allclose(bad, [0.6 * (s + 1) / STEPS for s in range(STEPS)])  # the method minus naive, per step
    assert lines[f"naive~tf32: {verdicts['naive~tf32']}"].get_linestyle() == "--"  # a precision line, dashed
    tf32m = lines[f"tf32m: {verdicts['tf32m']}"].get_ydata()  # against naive at TF32, not naive
    assert np.allclose(tf32m, [1e-4 * (s + 1) / STEPS for s in range(STEPS)])
    # the shaded band is the one losscheck.judge_records judged with: naive's variants and its 1x2 twin
    band = losscheck.band(NAIVE, [v["loss"] for v in [*_variants("naive"), _run("naive", "reference", 3e-4)]])
    (shade, *_) = first.collections
    top = shade.get_paths()[0].vertices[:, 1].max()
    assert np.isclose(top, max(band))
    # 1x2 has no variant of its own: 1x1's naive (the same model, batches and steps) is its band
    assert "naive's band (1 run)" in _labels(fig.axes[1])
    assert table.filter(pl.col("gpus_per_node") == 2)["band_runs"].to_list() == [1]
    assert any(x.startswith("fl+ac: not checked (RuntimeError") for x in _labels(fig.axes[2]))
    assert not texts_overlap(fig), texts_overlap(fig)


def test_make_plot_writes_png_svg_and_a_log(tmp_path):
    table, _ = aggregate.loss_check_table(three_settings(tmp_path), None)
    csv = tmp_path / "loss_check.csv"
    table.write_csv(csv)
    out = loss_plot.plot_files(str(tmp_path / "plots"))
    assert set(out) == {"loss_check_png", "loss_check_svg"}
    loss_plot.make_plot(str(csv), out, str(tmp_path / "loss_plot.log"))
    assert Path(out["loss_check_png"]).read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in Path(out["loss_check_svg"]).read_bytes()[:2000]
    assert (tmp_path / "loss_plot.log").read_text() == "loss plot: 3 panels of 3 checked settings (3 with a curve)\n"
    assert document.caption_of("loss_check_png").endswith("loss_check_plot.rst")


def test_no_check_is_the_empty_figure(tmp_path):
    table, _ = aggregate.loss_check_table([], None)
    assert table.is_empty()
    fig = loss_plot.figure_loss_check(table)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.texts] == [loss_plot.NO_CHECK]
    assert not texts_overlap(fig)
    csv = tmp_path / "loss_check.csv"
    table.write_csv(csv)  # the aggregate rule's empty table: a header only
    out = loss_plot.plot_files(str(tmp_path / "plots"))
    loss_plot.make_plot(str(csv), out, str(tmp_path / "loss_plot.log"))
    assert Path(out["loss_check_png"]).stat().st_size > 0


def test_a_setting_without_a_curve_has_no_panel(tmp_path):
    failed = [_run("naive", "reference"), {"name": "fl", "method": "fl", "role": "method", "against": "naive",
                                           "loss": [], "skipped": "fl did not build"}]  # fmt: skip
    paths = [*three_settings(tmp_path)[:1], write_curves(tmp_path, "tiny-c", 1, 1, failed)]
    table, _ = aggregate.loss_check_table(paths, None)
    fig = loss_plot.figure_loss_check(table)
    assert len(fig.axes) == 1
    assert "1 setting without a curve to draw" in fig.texts[0].get_text()
    only, _ = aggregate.loss_check_table(paths[1:], None)
    (ax,) = loss_plot.figure_loss_check(only).axes
    assert [t.get_text() for t in ax.texts] == [loss_plot.NO_CURVE]


def test_more_settings_than_panels_say_so(tmp_path):
    runs = [_run("naive", "reference"), *_variants("naive"), _run("fl", "method", 1e-4, against="naive")]
    paths = [write_curves(tmp_path, f"tiny-{i:02d}", 1, 1, runs) for i in range(loss_plot.MAX_PANELS + 1)]
    table, _ = aggregate.loss_check_table(paths, None)
    fig = loss_plot.figure_loss_check(table)
    assert len(fig.axes) == loss_plot.MAX_PANELS
    assert f"the first {loss_plot.MAX_PANELS} of {loss_plot.MAX_PANELS + 1} settings" in fig.texts[0].get_text()
    assert not texts_overlap(fig), texts_overlap(fig)


def test_report_section(tmp_path):
    """report.md's "Does each method train the same model?": the counts, the table, the plot and its caption;
    no section where the sweep has no loss_check table."""
    table, _ = aggregate.loss_check_table(three_settings(tmp_path), None)
    tables = {"loss_check_csv": str(tmp_path / "loss_check.csv"), "loss_check_md": str(tmp_path / "loss_check.md")}
    table.write_csv(tables["loss_check_csv"])
    plots = loss_plot.plot_files(str(tmp_path / "plots"))
    md = "\n".join(document._loss_check(document.Links(tables, plots, tmp_path)))
    assert md.startswith("## Does each method train the same model?")
    assert "6 method lines at 3 settings: 4 `same` as naive, 1 `differs`, 1 `not checked`." in md
    assert "](plots/loss_check_plot.png)" in md and document.paragraphs("loss_check_plot")[0] in md
    assert document.paragraphs("loss_check")[0] in md and "| differs +" in md
    assert document._loss_check(document.Links({}, plots, tmp_path)) == []

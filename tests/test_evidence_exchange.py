"""Issue 40 (1): a measured cell is an evidence row. One site's sweep exports its ok cells (`pretrain-planner evidence
export`), another imports them (`evidence import`) into its evidence folder, and its `predict` for a GPU type only
those cells measured then rests on them, naming them; an import is validated as a whole and refused as a whole."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from pretrain_planner import cli
from pretrain_planner.planning import evidence_exchange as ex

from .conftest import CATALOG, cell_result, write_set

MODEL, GPU = "pythia-1b", "l40s"  # l40s: a catalog GPU type no shipped row measured


def _cell(gpu: str, gpn: int, method: str, mfu: float, **extra) -> dict:
    """A cell of pythia-1b at `mfu` of the GPU's dense peak (cell_result's step time set from it)."""
    spec = CATALOG.models[MODEL]
    probe = cell_result(MODEL, gpu, 1, gpn, method, "ok", 1.0)
    step = probe["flops_per_step"] / (mfu * gpn * probe["peak_tflops"] * 1e12)
    r = cell_result(MODEL, gpu, 1, gpn, method, "ok", step * spec.recipe.steps / 86400, **extra)
    r.update(device_name=f"NVIDIA {gpu.upper()}", versions={"torch": "2.13.0", "transformers": "5.25.0"})
    return r


@pytest.fixture(scope="module")
def site_a(tmp_path_factory) -> Path:
    """Site A's results: pythia-1b fl on 1 x 4 l40s and a100 (a pair: l40s's own offset), on 1 x 2 l40s (fl, naive),
    at MFUs well below what the public evidence predicts for l40s (~37%); one suspect cell, an oom one, a cpu one."""
    root = tmp_path_factory.mktemp("site-a") / "results"
    cells = [_cell(GPU, 4, "fl", 0.22), _cell("a100", 4, "fl", 0.30), _cell(GPU, 2, "fl", 0.24),
             _cell(GPU, 2, "naive", 0.18),
             _cell("a100", 2, "fl", 0.9, suspect=True, suspect_reason="above 85% of the dense peak"),
             cell_result(MODEL, GPU, 1, 1, "naive", "oom"),
             cell_result("tiny-gptneox", "cpu", 1, 1, "naive", "ok", 0.01)]  # fmt: skip
    write_set(root, cells)
    return root


def _predict(capsys, results: Path) -> dict:
    assert cli.main(["predict", "--results", str(results), "--model", MODEL, "--gpu", GPU, "--count", "4",
                     "--json"]) == 0, capsys.readouterr().err  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_exported_cells_imported_elsewhere_are_what_the_prediction_rests_on(site_a, tmp_path, capsys):
    out = tmp_path / "site-a.csv"
    assert cli.main(["evidence", "export", "--results", str(site_a), "--site", "lab-a", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["gpu_type"], r["gpu_count"], r["method"]) for r in rows) == [
        ("a100", "4", "fl"), (GPU, "2", "fl"), (GPU, "2", "naive"), (GPU, "4", "fl")]  # fmt: skip
    assert "suspect" in err and "a100/1x2/fl" in err and "cpu" in err, err  # left out, each named with why
    for r in rows:  # the shipped schema's columns, with the provenance
        assert list(r) == list(ex.COLUMNS)
        assert (
            r["site"] == "lab-a"
            and r["source_id"] == "site:lab-a"
            and r["gpu_name"] == f"NVIDIA {r['gpu_type'].upper()}"
        )
        assert json.loads(r["versions"]) == {"torch": "2.13.0", "transformers": "5.25.0"}
        assert r["planner_commit"] and r["date"] and r["gpus_per_node"] == r["gpu_count"]
        assert float(r["per_gpu_rate"]) * int(r["gpu_count"]) == pytest.approx(float(r["value"]))

    fresh = tmp_path / "site-b" / "results"  # another site, nothing measured: public evidence only
    fresh.mkdir(parents=True)
    before = _predict(capsys, fresh)
    assert "lab-a" not in before["rests_on"] and "l40s" not in before["rests_on"], before["rests_on"]
    assert "shipped" in before["model_error"] and "imported" not in before["model_error"], before["model_error"]

    assert cli.main(["evidence", "import", "--results", str(fresh), str(out)]) == 0
    said = capsys.readouterr().out
    assert "imported 4 row(s)" in said and "+ 4 imported rows" in said, said
    assert (fresh / "evidence" / ex.IMPORTED_CSV).is_file()
    after = _predict(capsys, fresh)
    target = next(r for r in rows if (r["gpu_type"], r["gpu_count"]) == (GPU, "4"))
    assert target["row_id"] in after["rests_on"], after["rests_on"]  # the 1 x 4 l40s cell itself, by its row id
    assert "site:lab-a" in after["sources"], after
    assert "4 imported" in after["model_error"], after["model_error"]  # the errors say what they were measured on
    assert "unmeasured" in before["transfer"] and "unmeasured" not in after["transfer"], (before, after)
    # the site measured the target at 22% MFU where the public evidence predicts ~37%: the prediction follows it
    spec = CATALOG.models[MODEL]
    tokens = spec.recipe.global_batch * spec.recipe.sequence_length * spec.recipe.steps
    measured_days = tokens / (4 * float(target["per_gpu_rate"])) / 86400
    assert after["days_central"] == pytest.approx(measured_days, rel=0.15), (after["days_central"], measured_days)
    assert abs(before["days_central"] / measured_days - 1) > 0.3, (before["days_central"], measured_days)

    # importing the same file again adds nothing: the same provenance and workload is kept once
    assert cli.main(["evidence", "import", "--results", str(fresh), str(out)]) == 0
    assert "imported 0 row(s)" in (said := capsys.readouterr().out) and "4 already there (kept once)" in said, said
    assert len(list(csv.DictReader((fresh / "evidence" / ex.IMPORTED_CSV).open()))) == 4


def _rows(tmp_path: Path, site_a: Path) -> list[dict]:
    rows, _left = ex.export_rows(_cells_table(site_a), CATALOG, "lab-a", commit="abc", today="2026-12-04")
    return rows


def _cells_table(results: Path):
    from pretrain_planner.tables import aggregate

    paths = [str(p) for p in results.glob("cells/**/result.json")]
    cells, _ = aggregate.cells_table(aggregate.read_plan(results / "plan.csv"), paths, CATALOG)
    return cells


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text(ex.csv_text(rows))
    return path


@pytest.mark.parametrize(
    "change, why",
    [
        ({"per_gpu_rate": "1e9"}, "faster than the GPU allows"),
        ({"model": "gpt-5"}, "model 'gpt-5' is not in"),
        ({"gpu_type": "tpu-v5"}, "GPU type 'tpu-v5' is not in"),
        ({"gpu_type": "cpu"}, "CPU ranks are no GPU type's evidence"),
        ({"per_gpu_rate_unit": "tokens/day"}, "per_gpu_rate_unit 'tokens/day': allowed"),
        ({"per_gpu_rate": "-5"}, "must be > 0"),
        ({"nodes": "3"}, "nodes dividing it"),
        ({"precision": "int4"}, "precision 'int4'"),
        ({"method": "fl+warp9"}, "method 'fl+warp9'"),
        ({"site": ""}, "empty `site`"),
        ({"source_id": "lambda-dlbench"}, "source_id 'lambda-dlbench': an exported row's is site:<its site>"),
    ],
)
def test_an_import_with_one_bad_row_imports_nothing_and_names_it(site_a, tmp_path, change, why):
    rows = _rows(tmp_path, site_a)
    bad = {**rows[1], **change}
    path = _write(tmp_path / "mixed.csv", [rows[0], bad, rows[2]])
    folder = tmp_path / "evidence"
    with pytest.raises(ex.EvidenceError) as got:
        ex.import_files([path], CATALOG, folder)
    text = str(got.value)
    assert "nothing imported: 1 row(s) refused" in text and f"{path}:3" in text and why in text, text
    assert not (folder / ex.IMPORTED_CSV).exists()  # all or nothing


def test_a_file_that_is_not_evidence_is_refused_naming_the_column(tmp_path, capsys):
    path = tmp_path / "other.csv"
    path.write_text("model,gpu,step_time_s\npythia-1b,a100,0.5\n")
    assert cli.main(["evidence", "import", "--results", str(tmp_path / "results"), str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: not an evidence file: no column row_id" in err and "per_gpu_rate" in err, err
    assert cli.main(["evidence", "import", "--results", str(tmp_path / "results"), str(tmp_path / "none.csv")]) == 1
    assert "none.csv: no such file" in capsys.readouterr().err


def test_an_imported_row_counts_as_evidence_only_through_its_checks(site_a, tmp_path):
    """Loaded evidence = the shipped rows + the imported ones, each with its origin; a row that passed the import
    but sits above the `suspect` share of the peak is loaded as skipped, with the reason (as a shipped one is)."""
    rows = _rows(tmp_path, site_a)
    l40s_4 = next(r for r in rows if (r["gpu_type"], int(r["gpu_count"])) == (GPU, 4))  # measured at 22% MFU
    near_peak = {**l40s_4, "per_gpu_rate": str(float(l40s_4["per_gpu_rate"]) * 0.9 / 0.22), "row_id": "hot#1",
                 "micro_batch": "8"}  # fmt: skip
    ex.import_files([_write(tmp_path / "a.csv", [*rows, near_peak])], CATALOG, tmp_path / "ev")
    loaded = ex.loaded_evidence(CATALOG, 0.85, tmp_path / "ev")
    origins = loaded.origins()
    assert origins["imported"] == 4 and origins["shipped"] > 200, origins
    assert ("hot#1", next(w for r, w in loaded.skipped if r == "hot#1")) in loaded.skipped
    assert "above the `suspect` limit" in dict(loaded.skipped)["hot#1"]
    imported = [r for r in loaded.runs if r.origin == "imported"]
    assert {r.software for r in imported} == {"pretrain-planner"}  # the planner's trainer: same software as here
    assert {r.tf32 for r in imported if r.method == "naive"} == {False}  # naive computes fp32 as fp32, eager


def test_your_own_cells_give_your_gpu_type_its_offset(site_a):
    """Issue 40 (4): the sweep's own cells join the cross-GPU fit. Site A's pythia-1b fl on 4 x l40s and 4 x a100 is a
    pair: l40s gets its own offset, so a model site A never measured (pythia-410m) is predicted on l40s as a measured
    GPU type, with the narrower band of that kind, and moved from what the public evidence alone predicts (by the
    offset the pair shows); the fit's errors count the own cells."""
    from pretrain_planner.tables.whatif import Predictor

    cells = _cells_table(site_a)
    mine = Predictor(cells, CATALOG).predict("pythia-410m", GPU, 1, 4)
    public_only = Predictor(cells.clear(), CATALOG).predict("pythia-410m", GPU, 1, 4)
    assert "unmeasured" in public_only.transfer and "unmeasured" not in mine.transfer, (public_only, mine)
    assert "own" in mine.model_error and "own" not in public_only.model_error, mine.model_error
    assert abs(mine.days_central / public_only.days_central - 1) > 0.05, (mine.days_central, public_only.days_central)
    width = (mine.days_pessimistic / mine.days_optimistic, public_only.days_pessimistic / public_only.days_optimistic)
    assert width[0] < width[1], width


def test_a_sites_finished_cells_shrink_the_error_on_its_held_back_ones():
    """Issue 40 (4), replayed on the public evidence (benchmarks/evidence_replay.py): a site owning H100s, nothing
    else having measured them; as 16 of its sweep's cells finish, the error of predicting each held-back one (from
    its workload's runs on other GPU types) and the band both shrink."""
    import sys

    from .conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import evidence_replay
    from pretrain_planner.planning.evidence import public_evidence

    got = evidence_replay.figures(evidence_replay.replay(public_evidence(CATALOG).runs, CATALOG.gpus, ks=(0, 16),
                                                         only=["h100"]))  # fmt: skip
    none, some = got["0"], got["16"]
    assert none["cells"] == some["cells"] >= 30, got
    assert some["mean_abs"] < 0.7 * none["mean_abs"], got
    assert some["half_width"] < none["half_width"], got

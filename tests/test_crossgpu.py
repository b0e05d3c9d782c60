"""The cross-GPU model (planning/crossgpu.py), its evidence (planning/evidence.py, data/evidence/) and the GPU facts it
reads (config/gpus.yaml): the shipped rows are sourced and none is from the held-out acceptance set; on runs made from
a known machine the fit finds the machine's memory-bound weight and a GPU type left out lies inside its band; the
transfer between GPU types moves by the measured matmul rate and the bandwidth, not by the datasheet peak."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
import sys

import pytest
from pretrain_planner.planning import crossgpu, evidence, stepmodel
from pretrain_planner.planning.evidence import Run

from .conftest import CATALOG, REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import crossgpu_loo  # noqa: E402  (the leave-one-out harness: benchmarks/crossgpu_loo.py)

DATA = evidence.DATA


def test_every_shipped_row_is_sourced_and_none_is_held_out():
    """A source per row, listed in sources.md with an exact location; nothing from mosaicml/llm-foundry."""
    sources = (DATA / "sources.md").read_text()
    with open(evidence.PUBLIC_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 100
    for r in rows:
        assert r["source_id"] and f"## {r['source_id']}" in sources, r["row_id"]
        assert r["location"].strip(), r["row_id"]
        assert "llm-foundry" not in r["location"].lower() and "mosaicml" not in r["location"].lower(), r["row_id"]


def test_public_evidence_is_runs_or_reasons():
    ev = evidence.public_evidence(CATALOG)
    with open(evidence.PUBLIC_CSV, newline="") as f:
        ids = [r["row_id"] for r in csv.DictReader(f)]
    assert sorted([r.id for r in ev.runs] + [i for i, _why in ev.skipped]) == sorted(ids)
    assert all(why for _i, why in ev.skipped)
    kinds = {r.kind for r in ev.runs}
    assert {"causal_lm", "masked_lm", "image_classification"} <= kinds
    assert len({r.gpu for r in ev.runs}) >= 10
    # the study's own days imply more than the `suspect` share of the peak (its unsynchronised timer): not evidence
    assert not any(r.source == "khandelwal2024" for r in ev.runs)
    for r in ev.runs:
        assert r.seconds > 0 and r.flops > 0 and r.memory_bytes > 0, r.id
        peak = CATALOG.gpus[r.gpu].peak_for(r.precision)
        assert r.flops / r.seconds <= 0.85 * peak * 1e12, r.id  # never above the `suspect` limit


def test_every_rated_gpu_type_has_its_facts():
    """A GPU type with a peak has a memory bandwidth; measured matmul rates lie below their datasheet peaks (a few
    percent above for GeForce cards, whose clocks boost past the datasheet's)."""
    for name, g in CATALOG.gpus.items():
        if not g.peak_tflops:
            continue
        assert g.memory_gb_s, name
        for key, rate in g.matmul_tflops.items():
            assert 0.5 * g.peak_tflops[key] < rate < 1.1 * g.peak_tflops[key], (name, key)
    share = stepmodel.matmul_share(CATALOG.gpus.values())
    assert 0.6 < share < 0.95
    a40 = stepmodel.rates(CATALOG.gpus["a40"], "bf16", share)  # no measured rate: the catalog's median share
    assert a40 and not a40.matmul_measured and a40.matmul_tflops == pytest.approx(149.7 * share)
    assert stepmodel.rates(CATALOG.gpus["cpu"], "bf16", share) is None


MACHINE_KAPPA = 2.0  # the synthetic machine: memory-bound bytes at half the datasheet bandwidth


def _runs(gpus, kappa=MACHINE_KAPPA, noise=None) -> list[Run]:
    """Runs of three workloads (memory-bound shares 5%..60%) made from the step model on a machine with `kappa`, each
    at an efficiency of its own that is the same on every GPU type (what the model assumes transfers)."""
    model = crossgpu.CrossGpu(CATALOG.gpus, crossgpu.Params(kappa, math.inf))
    out = []
    for k, (flops, mem, eff) in enumerate([(6e9, 2e6, 0.7), (1e9, 4e6, 0.5), (2e9, 1.5e7, 0.6)]):
        for i, g in enumerate(gpus):
            t = model.ideal(flops, mem, g, "bf16") / eff * (noise[i] if noise else 1.0)
            out.append(Run(f"w{k}-{g}", "synthetic", "-", f"w{k}", "causal_lm", 1e9, g, 8, f"w{k}", "ddp", "bf16",
                           t, flops, mem))  # fmt: skip
    return out


def test_fit_finds_the_machine_and_predicts_a_gpu_type_left_out():
    runs = _runs(["a100", "h100", "a6000", "rtx3090", "l40s", "a100-40gb"])
    fitted = crossgpu.fit(runs, CATALOG.gpus)
    assert fitted.params.kappa_mem == MACHINE_KAPPA
    assert fitted.calibration.mean_abs < 1e-6  # the model's own world: no error out of sample
    for h in crossgpu_loo.leave_one_gpu_out(runs, CATALOG.gpus):
        assert h.error == pytest.approx(0.0, abs=1e-6) and h.inside, h.run.id


# offsets of twelve GPU types the step model cannot explain (the same on every workload of a type), spread as the
# public evidence's are (its fitted effects span -25% .. +30%)
OFFSETS = {"a100": 1.0, "h100": 1.15, "a6000": 0.9, "rtx3090": 0.85, "l40s": 1.05, "h200": 1.1, "a100-40gb": 0.97,
           "a100-pcie": 1.02, "h100-pcie": 1.08, "rtx4090": 0.88, "a40": 0.93, "a100-40gb-pcie": 1.0}  # fmt: skip


def test_band_is_calibrated_on_errors_out_of_sample():
    """Offsets the model cannot explain widen the band; every GPU type left out in turn lies inside it about as often
    as promised (the errors of one type share its offset, so the band counts types, not runs, and is widened for
    how few it was drawn from)."""
    gpus = list(OFFSETS)
    holdouts = crossgpu_loo.leave_one_gpu_out(_runs(gpus, noise=list(OFFSETS.values())), CATALOG.gpus)
    assert sum(h.inside for h in holdouts) / len(holdouts) >= 0.8
    width = lambda hs: statistics.median(h.estimate.high / h.estimate.low for h in hs)  # noqa: E731
    assert width(holdouts) > 1.08 and width(crossgpu_loo.leave_one_gpu_out(_runs(gpus), CATALOG.gpus)) < 1.001
    assert crossgpu._small_sample(5) > crossgpu._small_sample(13) > crossgpu._small_sample(100) > 1.0


def _software_runs(offsets: dict[str, float], skip: tuple[str, str] | None = None) -> list[Run]:
    """Three workloads of software s1 on every GPU type and one of software s2, each GPU type `offsets` slower
    than the step model says on all of them (`skip`: a (workload, GPU type) not measured)."""
    model = crossgpu.CrossGpu(CATALOG.gpus, crossgpu.Params(1.0, math.inf))
    out = []
    for k, (flops, mem, eff, sw) in enumerate([(6e9, 2e6, 0.7, "s1"), (1e9, 4e6, 0.5, "s1"), (2e9, 1.5e7, 0.6, "s1"),
                                               (3e9, 5e6, 0.55, "s2")]):  # fmt: skip
        for g, off in offsets.items():
            if (f"w{k}", g) == skip:
                continue
            t = model.ideal(flops, mem, g, "bf16") / eff * off
            out.append(Run(f"w{k}-{g}", sw, "-", f"w{k}", "causal_lm", 1e9 * (k + 1), g, 8, f"w{k}", "ddp", "bf16",
                           t, flops, mem, software=sw))  # fmt: skip
    return out


def test_a_gpu_types_offset_measured_by_other_software_carries_to_a_new_workload():
    """The H100 runs 25% slower than its rates say on every workload of software s1 (the public H100s do, relative to
    an A100); a workload of software s2 measured everywhere but on the H100 is predicted there with that offset
    (the per-GPU effect), and the prediction says it is that kind of transfer. Without effects it was 20% fast."""
    offsets = {g: 1.0 for g in ("a100", "a6000", "rtx3090", "l40s", "h200", "a100-40gb")} | {"h100": 1.25}
    runs = _software_runs(offsets, skip=("w3", "h100"))
    model = crossgpu.fit(runs, CATALOG.gpus)
    truth = next(r for r in _software_runs(offsets) if r.id == "w3-h100")
    est = model.estimate([r for r in runs if r.model == "w3"], crossgpu_loo.work_of_run(truth), "h100")
    assert est.central / truth.seconds - 1 == pytest.approx(0.0, abs=0.03)
    assert est.kind == crossgpu.Kind("same", True) and "measured in the evidence" in est.band_note
    assert model.effects["h100"] - model.effects["a100"] == pytest.approx(math.log(1.25), abs=0.05)
    # a GPU type the evidence never measured has no effect of its own: its neighbours' offsets are not guessed
    lone = crossgpu.fit([r for r in runs if r.gpu != "h100"], CATALOG.gpus)
    assert "h100" not in lone.effects and lone.correction("a100", "h100") == 0.0
    assert lone.estimate([r for r in runs if r.model == "w3" and r.gpu != "h100"], crossgpu_loo.work_of_run(truth),
                         "h100").kind == crossgpu.Kind("same", False)  # fmt: skip


def test_a_gpu_type_measured_only_alone_has_no_effect():
    """Runs of a GPU type in groups no other type measured (the calibration points, e.g. this project's H200 rows)
    say nothing of its offset: it stays out of the effects, and a transfer to it is of the unseen kind."""
    offsets = {g: 1.0 for g in ("a100", "a6000", "rtx3090", "l40s")} | {"h100": 1.2}
    runs = [r for r in _software_runs(offsets) if r.gpu != "h100"]
    alone = _software_runs({"h100": 1.2})[0]
    alone = Run("alone", "s3", "-", "solo", "causal_lm", 1e9, "h100", 1, "solo-h100", "ddp", "bf16", alone.seconds,
                alone.flops, alone.memory_bytes, software="s3")  # fmt: skip
    model = crossgpu.fit([*runs, alone], CATALOG.gpus)
    assert "h100" not in model.effects and set(model.effects) == set(offsets) - {"h100"}


def test_each_kind_of_transfer_has_its_own_measured_error():
    """On the shipped evidence the kinds' out-of-sample errors differ (a GPU type absent from the evidence errs more
    than one measured by other software): each gets its own band and the prediction quotes its own kind's
    figures."""
    ev = evidence.public_evidence(CATALOG)
    model = crossgpu.fit(ev.runs, CATALOG.gpus)
    seen, unseen = model.calibration.of(crossgpu.Kind("same", True)), model.calibration.of(crossgpu.Kind("same", False))
    assert seen.n >= 100 and unseen.n >= 100
    assert seen.mean_abs < unseen.mean_abs
    width = lambda e: e.band(False)[1] - e.band(False)[0]  # noqa: E731
    assert width(seen) < width(unseen)
    other = model.calibration.of(crossgpu.Kind("stand-in, other software", True))
    assert other.n and other.band(False) != unseen.band(False)  # its own errors widen the pooled band
    # a stand-in: pythia-2.8b from this project's pythia-1b runs on an H200, predicted for an H100
    spec = CATALOG.model("pythia-2.8b")
    work = evidence.catalog_work(spec)
    basis = [r for r in ev.runs if r.model == "pythia-1b"]
    est = model.estimate(basis, work, "h100")
    assert est.kind == crossgpu.Kind("stand-in", True) and est.band_note.startswith("a stand-in workload")
    assert model.estimate(basis, evidence.catalog_work(CATALOG.model("pythia-1b")), "h100").kind.workload == "same"


def test_rows_their_sources_flag_are_not_evidence():
    """Lambda's multi-GPU rows whose per-GPU rate is above 1.1x or below 0.5x the suite's one-GPU rate are flagged
    SUSPECT in sources.md's terms (e.g. 8 x RTX 3090 BERT-large at 0.18x): skipped, with the flag as the reason."""
    ev = evidence.public_evidence(CATALOG)
    skipped = dict(ev.skipped)
    for rid in ("r0082", "r0088", "r0189", "r0318"):
        assert rid in skipped and skipped[rid].startswith("flagged by its source notes: SUSPECT"), rid
    assert not any("SUSPECT" in r.note for r in ev.runs)
    assert {r.software for r in ev.runs} >= {"lambda-dlbench v0", "lambda-dlbench v1", "pretrain-planner"}


def test_transfer_moves_by_matmul_rate_and_bandwidth_not_by_the_peak():
    """A100 -> H100: the datasheet peak grows 3.17x, the measured matmul rate ~3.0x, the bandwidth 1.64x; a step
    speeds up between the last two, by more the less memory-bound it is (the MFU transfer said 3.17x always)."""
    model = crossgpu.CrossGpu(CATALOG.gpus, crossgpu.Params(1.0, math.inf))
    speedups = []
    for mem in (1e5, 2e6, 2e7):
        run = Run("x", "s", "-", "m", "causal_lm", 1e9, "a100", 8, "g", "ddp", "bf16", 1e-4, 6e9, mem)
        t = model.transfer(run, evidence.Work("m", "causal_lm", 1e9, 6e9, mem, "bf16"), "h100")
        speedups.append(run.seconds / t)
    bw = CATALOG.gpus["h100"].memory_gb_s / CATALOG.gpus["a100"].memory_gb_s
    mm = CATALOG.gpus["h100"].matmul_tflops["bf16"] / CATALOG.gpus["a100"].matmul_tflops["bf16"]
    assert mm > speedups[0] > speedups[1] > speedups[2] > bw
    assert max(speedups) < CATALOG.gpus["h100"].peak_tflops["bf16"] / CATALOG.gpus["a100"].peak_tflops["bf16"]


def test_near_gpu_types_weigh_more():
    model = crossgpu.CrossGpu(CATALOG.gpus, crossgpu.Params(1.0, 0.3))
    assert model.distance("a100", "a100-pcie") < model.distance("a100", "h100") < model.distance("a100", "rtx3090")
    assert model.weight("a100-pcie", "a100") > model.weight("h100", "a100") > model.weight("rtx3090", "a100")


def test_memory_bound_bytes_follow_the_shape():
    """Eager attention adds the scores; a longer vocabulary adds the loss; fp32 doubles the bytes."""
    spec = CATALOG.model("pythia-1b").to_dict()
    fused, eager = stepmodel.memory_bytes_per_sample(spec), stepmodel.memory_bytes_per_sample(spec, True)
    a = spec["arch"]
    tokens = spec["recipe"]["sequence_length"]
    assert eager - fused == pytest.approx(stepmodel.EAGER_SCORE_B * a["num_attention_heads"] * tokens * tokens
                                          * a["num_hidden_layers"])  # fmt: skip
    expect = tokens * (a["num_hidden_layers"] * stepmodel.LAYER_B_PER_HIDDEN * a["hidden_size"]
                       + stepmodel.LOGIT_B * a["vocab_size"])  # fmt: skip
    assert fused == pytest.approx(expect)
    fp32 = {**spec, "recipe": {**spec["recipe"], "precision": "fp32"}}
    assert stepmodel.memory_bytes_per_sample(fp32) == pytest.approx(2 * fused)


# A100, H100 and V100 runs of five sources: kappa_mem and tau move with what is left out, and with the A100 or the
# H100 left out nothing is left to choose them on
FIVE_SOURCES = ("nvidia-nemo-mm", "fms-fsdp", "megatron-lm-ci", "nvidia-jax-toolbox", "nvidia-dle-bert")


def test_the_error_a_prediction_quotes_is_the_one_measured_held_out():
    """The seen kind's error a prediction quotes (and its band) is that of leave_one_cell_out, which refits kappa_mem
    and tau without the cell left out: before, the calibration kept the ones fitted with the cell in and quoted 6.8%
    where the benchmark measured 7.8% (the band too narrow: 87% inside for a promised 90%); on these runs 5.4% against
    9.4%."""
    ev = evidence.public_evidence(CATALOG)
    runs = [r for r in ev.runs if r.source in FIVE_SOURCES]
    quoted = crossgpu.fit(runs, CATALOG.gpus).calibration.of(crossgpu.Kind("same", True))
    held = [h for h in crossgpu_loo.leave_one_cell_out(runs, CATALOG.gpus) if h.estimate.kind.seen]
    errors = [abs(h.error) for h in held]
    assert quoted.n == len(held) >= 20
    assert quoted.mean_abs == pytest.approx(statistics.mean(errors), rel=1e-9)
    assert quoted.max_abs == pytest.approx(max(errors), rel=1e-9)


@pytest.mark.parametrize("unseen", [False, True], ids=["type measured", "type left out"])
def test_a_stand_ins_quoted_error_is_the_one_measured_held_out(unseen):
    """Each stand-in kind's quoted error is that of leave_one_model_out, which fits again on what is left (kappa_mem,
    tau, lambda; fit's defaults and no effects where nothing is left to choose them on). Before, the calibration kept
    the parameters fitted on every run: on the full evidence it quoted 9.9% (max 45%) where the benchmark measured 8.5%
    for a stand-in of the same software, 15.2% (max 84%) against 15.4% (max 70%) with its GPU type left out; on these
    runs 8.0% against 7.9% with the type measured, 32.9% against 28.8% with it left out."""
    ev = evidence.public_evidence(CATALOG)
    runs = [r for r in ev.runs if r.source in FIVE_SOURCES]
    calibration = crossgpu.fit(runs, CATALOG.gpus).calibration
    by_kind: dict[crossgpu.Kind, list[float]] = {}
    for h in crossgpu_loo.leave_one_model_out(runs, CATALOG.gpus, unseen=unseen):
        by_kind.setdefault(h.estimate.kind, []).append(abs(h.error))
    assert {k.workload for k in by_kind} == {"stand-in", "stand-in, other software"}
    assert {k.seen for k in by_kind} == {not unseen}
    for kind, errors in by_kind.items():
        quoted = calibration.of(kind)
        assert quoted.n == len(errors), kind
        assert quoted.mean_abs == pytest.approx(statistics.mean(errors), rel=1e-9), kind
        assert quoted.max_abs == pytest.approx(max(errors), rel=1e-9), kind


def test_a_replicated_rank_at_a_small_micro_batch_pays_its_model_state_traffic():
    """A rank's gradient is written and accumulated once per micro-batch, its optimizer step reads and writes the
    model states once per step: per sample these shrink with the micro-batch and the samples per step (the V100
    16 GB at a quarter of its 32 GB twin's batch). Priced where the method replicates the states; a row whose method
    shards them (FSDP, ZeRO, tensor / pipeline parallel) leaves the term out, as a cell of a sharded method does."""
    from pretrain_planner.tables.predictor import _work

    assert stepmodel.state_bytes_per_sample(1e9, 4, 64) == pytest.approx(
        stepmodel.GRAD_ACCUM_B * 1e9 / 4 + stepmodel.OPTIMIZER_B * 1e9 / 64
    )
    assert stepmodel.state_bytes_per_sample(1e9, None, None) == 0.0
    entry = evidence._models_yaml()["BERT-large (SQuAD v1.1 fine-tuning step)"]
    row = {"row_id": "x1", "group_id": "g", "source_id": "s", "model": "BERT-large (SQuAD v1.1 fine-tuning step)",
           "n_layers": "24", "hidden": "1024", "heads": "16", "seq_len": "384", "vocab": "30522", "gpu_type": "v100",
           "gpu_count": "1", "precision": "fp16 (AMP)", "method": "Horovod, Adam", "per_gpu_rate": "50000",
           "per_gpu_rate_unit": "tokens/s/GPU", "location": "-", "notes": ""}  # fmt: skip
    small = evidence.run_of_row({**row, "micro_batch": "4", "global_batch": "4"}, entry, CATALOG)
    large = evidence.run_of_row({**row, "micro_batch": "24", "global_batch": "24"}, entry, CATALOG)
    assert small.memory_bytes > 1.5 * large.memory_bytes and small.flops == large.flops
    sharded = {**row, "method": "FSDP, selective AC"}
    assert evidence.run_of_row({**sharded, "micro_batch": "4", "global_batch": "4"}, entry, CATALOG).memory_bytes == (
        evidence.run_of_row({**sharded, "micro_batch": "24", "global_batch": "24"}, entry, CATALOG).memory_bytes
    )
    spec = CATALOG.model("pythia-1b")
    assert _work(spec, "fl", 2, 8).memory_bytes > _work(spec, "fl", 16, 8).memory_bytes
    assert _work(spec, "fl+zero2", 2, 8).memory_bytes == _work(spec, "fl+zero2", 16, 8).memory_bytes


def test_a_fit_is_made_once_per_process_for_the_same_runs_and_gpu_types():
    """Every Predictor, the what-if rule and the CLI fit the same evidence: the second ask is the first fit (its bands
    took seconds of out-of-sample refits), another set of runs or another catalog's rates a fit of its own."""
    from pretrain_planner.planning.catalog import load_catalog

    runs = evidence.public_evidence(CATALOG).runs
    first = crossgpu.fit(runs, CATALOG.gpus)
    again = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    assert crossgpu.fit(list(runs), again.gpus) is first
    assert crossgpu.fit(runs[:-1], CATALOG.gpus) is not first
    faster = {**CATALOG.gpus, "h100": dataclasses.replace(CATALOG.gpus["h100"], memory_gb_s=9999)}
    assert crossgpu.fit(runs, faster) is not first


def test_a_calibration_kept_on_disk_is_the_one_computed_and_its_evidence_keys_it(tmp_path, monkeypatch):
    """A CLI answer is a new process: the calibration (seconds of out-of-sample refits) is computed once per evidence
    and code and read back after (planning/diskcache.py), equal to the one computed in every field; other evidence is
    an entry of its own. On the code before the cache, nothing was stored."""
    monkeypatch.setenv("PP_CACHE_DIR", str(tmp_path))
    gpus = ["a100", "h100", "a6000", "rtx3090", "l40s", "a100-40gb"]
    runs = _runs(gpus, noise=[OFFSETS[g] for g in gpus])
    monkeypatch.setattr(crossgpu, "_FITS", {})
    first = crossgpu.fit(runs, CATALOG.gpus)
    assert first.calibration.kinds and first.calibration.origins
    assert len(list(tmp_path.rglob("*.json"))) == 1
    calibrated = []
    monkeypatch.setattr(crossgpu, "_FITS", {})  # a new process's memo
    monkeypatch.setattr(crossgpu, "_calibrate", lambda t: calibrated.append(t) or pytest.fail("calibrated again"))
    again = crossgpu.fit(runs, CATALOG.gpus)
    assert not calibrated
    assert again.calibration == first.calibration
    assert (again.params, again.effects) == (first.params, first.effects)
    monkeypatch.undo()
    monkeypatch.setenv("PP_CACHE_DIR", str(tmp_path))
    crossgpu.fit(runs[:-1], CATALOG.gpus)
    assert len(list(tmp_path.rglob("*.json"))) == 2

"""Out-of-sample check of the cross-GPU model (planning/crossgpu.py) on the public evidence it ships with.

    .venv/bin/python benchmarks/predict_crossgpu.py [--out benchmarks/results/predict_crossgpu.md]

Every figure is made on data left out of the whole procedure (kappa_mem, tau, lambda, the per-GPU effects and the
bands, themselves calibrated out of sample within what is left), once per kind of transfer a prediction can be:
- the headline, a GPU type nobody in the evidence measured: every GPU type of
  workflow/pretrain_planner/data/evidence/public_throughput.csv left out in turn, its runs predicted from the runs of
  their groups (the same workload and setting) on the other types; no information about the held-out type's
  throughput is used (no effect of its own: crossgpu_loo.leave_one_gpu_out);
- a GPU type the evidence measured with other workloads by other software (the what-if's case for the catalog's GPU
  types): every workload x GPU type x software left out, with the workload's other runs on that type and that
  software's other runs on it, the type's effect coming from other software's runs (crossgpu_loo.leave_one_cell_out);
- a stand-in workload (a model with no evidence of its own, predicted from the nearest-sized one of its kind, the
  same software first): every workload left out, and with its GPU type left out too (crossgpu_loo.leave_one_model_out).
The error of a prediction is central / published - 1 of the seconds per token (the days to train a fixed number of
tokens move with it); "inside" means the published figure lies inside the predicted band. Targets (issue 40): to a GPU
type other software measured, mean |error| <= 6%, inside >= 90%, median band no wider than +-15%; to a GPU type absent
from the evidence, mean <= 10%, inside >= 90%; the stand-ins keep issue 23's (8%, 90%, +-20%). The figures are also
given on the runs of the rows shipped before issue 40 (r0001-r0444), so that a source added since is judged by what
it does to the old runs' predictions as well as by its own. No training, no torch; about five
minutes on two cores. mosaicml/llm-foundry's benchmark tables are not in the evidence (the held-out acceptance set).

Beside the Markdown, `predict_crossgpu.json` holds its figures by name: the README and the docs quote them, and
tests/test_quoted_figures.py checks every quote against that file.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

import crossgpu_loo  # noqa: E402
from pretrain_planner.planning import crossgpu, evidence, evidence_exchange  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402

TARGET_MEAN, TARGET_INSIDE, TARGET_HALF_WIDTH = 0.08, 0.90, 0.20  # issue 23's, the stand-ins' still
SEEN_TARGETS = (0.06, 0.90, 0.15)  # issue 40: the same workload to a GPU type other software measured
UNSEEN_TARGETS = (0.10, 0.90, 0.20)  # issue 40: to a GPU type absent from the evidence (no band target: issue 23's)
EARLIER_LAST_ROW = "r0444"  # the last row shipped before issue 40's sources


def _mfu_transfer(runs, catalog) -> list[float]:
    """The errors of the what-if before issue 23 on the headline protocol: the compute MFU against the datasheet peak
    transferred as it is (seconds x peak ratio), the mean over the group's other GPU types."""
    by_group = defaultdict(list)
    for r in runs:
        by_group[r.group].append(r)
    out = []
    for r in runs:
        peak = catalog.gpus[r.gpu].peak_for(r.precision)
        preds = [b.seconds * catalog.gpus[b.gpu].peak_for(b.precision) / peak for b in by_group[r.group]
                 if b.gpu != r.gpu]  # fmt: skip
        if preds:
            out.append(statistics.geometric_mean(preds) / r.seconds - 1)
    return out


def _half_width(e: crossgpu.Estimate) -> float:
    return max(e.high / e.central - 1, 1 - e.low / e.central)


def _items(holdouts) -> list[tuple[float, bool, float]]:
    return [(h.error, h.inside, _half_width(h.estimate)) for h in holdouts]


def _row(label: str, items: list[tuple[float, bool, float]]) -> list[str]:
    """A row of a `_per` table; items: (error, inside, half-width)."""
    errs = [abs(e) for e, _i, _w in items]
    return [label, str(len(items)), f"{statistics.mean(errs):.1%}", f"{max(errs):.1%}",
            f"{statistics.mean(e for e, _i, _w in items):+.1%}", f"{sum(i for _e, i, _w in items) / len(items):.0%}",
            f"{statistics.median(w for _e, _i, w in items):.0%}"]  # fmt: skip


COLUMNS = ["runs", "mean abs error", "max abs error", "mean error (bias)", "truth inside the band",
           "median band half-width"]  # fmt: skip
TARGET_COLUMNS = ["runs predicted", "mean abs error (target)", "max abs error", "truth inside the band",
                  "median band half-width (target)"]  # fmt: skip


def _per(first: str, rows: list[list[str]]) -> list[str]:
    """A table of `_row`s, its first column named `first` (what each row is: a GPU type, a pair, a source)."""
    return markdown.plain([first, *COLUMNS], rows)


def _targets_row(label: str, holdouts, targets: tuple[float, float, float] | None = None) -> list[str]:
    """A row of the targets table: the kind's figures, each against its target (issue 23's without `targets`)."""
    target_mean, target_inside, target_width = targets or (TARGET_MEAN, TARGET_INSIDE, TARGET_HALF_WIDTH)
    items = _items(holdouts)
    mean_abs = statistics.mean(abs(e) for e, _i, _w in items)
    inside = sum(i for _e, i, _w in items) / len(items)
    width = statistics.median(w for _e, _i, w in items)
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    return [label, str(len(items)), f"{mean_abs:.1%} (<= {target_mean:.0%}) {met(mean_abs <= target_mean)}",
            f"{max(abs(e) for e, _i, _w in items):.0%}", f"{inside:.1%} {met(inside >= target_inside)}",
            f"+-{width:.0%} (<= +-{target_width:.0%}) {met(width <= target_width)}"]  # fmt: skip


def _floor(runs, model: crossgpu.CrossGpu) -> tuple[list[str], float, float, int]:
    """The scatter of one GPU pair's ratio across the workloads and GPU counts one software measured on both: what no
    transfer by GPU-level quantities can remove. Per pair: the log ratio's spread raw, and after the fitted model's
    own ratio (its workload composition and effects); the floor is the mean |error| left after the best constant per
    pair, i.e. with the pair's average offset known exactly."""
    by = defaultdict(dict)
    for r in runs:
        by[(r.software, r.group)][r.gpu] = r
    pairs = defaultdict(list)  # (software, a, b) -> [(log observed ratio, log model ratio)]
    for (sw, _g), rs in by.items():
        for a in rs:
            for b in rs:
                if a < b:
                    ra, rb = rs[a], rs[b]
                    moved = model.transfer(rb, crossgpu_loo.work_of_run(ra), a)
                    if moved:
                        pairs[(sw, a, b)].append((math.log(ra.seconds / rb.seconds), math.log(ra.seconds / moved)))
    rows: list[list[str]] = []
    raw_floor, model_floor, n_all = [], [], 0
    for (sw, a, b), v in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
        if len(v) < 3:
            continue
        obs, res = np.array([x for x, _y in v]), np.array([y for _x, y in v])
        f_raw = np.abs(np.exp(obs - obs.mean()) - 1)
        f_mod = np.abs(np.exp(res - res.mean()) - 1)
        raw_floor += list(f_raw)
        model_floor += list(f_mod)
        n_all += len(v)
        if len(rows) < 30:  # the 30 largest
            rows.append([sw, f"{a} / {b}", str(len(v)), f"{math.exp(obs.min()):.2f} .. {math.exp(obs.max()):.2f}",
                         f"{obs.std():.3f}", f"{res.std():.3f}", f"{f_mod.mean():.1%}"])  # fmt: skip
    columns = ["software", "GPU pair", "groups", "observed ratio a/b (min .. max)", "spread of log ratio",
               "spread left by the model", "floor: mean abs error after the best constant per pair"]  # fmt: skip
    n_pairs = sum(len(v) >= 3 for v in pairs.values())
    return markdown.plain(columns, rows), float(np.mean(raw_floor)), float(np.mean(model_floor)), n_pairs


def _oracle(runs, model: crossgpu.CrossGpu) -> float:
    """In-sample two-way fit with a free effect per GPU type and a free level per group (no shrinkage, every run
    seen): the mean |error| no model with one number per GPU type can beat on this evidence."""
    t = crossgpu._Table(model, runs)
    li = t.li(model.params.kappa_mem)
    mask = np.ones(len(t.y), bool)
    b = t.effects(li, mask, 1e-9)
    ok = np.isfinite(b[t.pg])
    b = np.where(np.isfinite(b), b, 0.0)
    ng = len(t.groups)
    level = np.bincount(t.gg, t.y - li - b[t.pg], ng) / np.maximum(np.bincount(t.gg, minlength=ng), 1)
    res = (t.y - li - level[t.gg] - b[t.pg])[ok]
    return float(np.mean(np.abs(np.exp(res) - 1)))


def _batch_effect(holdouts, mb: dict[str, float]) -> tuple[float, int]:
    """Slope of each single-basis prediction's log error against log2 of the micro-batch ratio (target / basis),
    over the held-out predictions whose rows state micro-batches: what a batch term would have to model."""
    xs, ys = [], []
    for h in holdouts:
        for est in h.by_gpu.values():
            for run, _t, _w in est.basis:
                if h.run.id in mb and run.id in mb and mb[h.run.id] != mb[run.id]:
                    xs.append(math.log2(mb[h.run.id] / mb[run.id]))
                    ys.append(math.log(est.central / h.run.seconds))
    if len(xs) < 10:
        return 0.0, len(xs)
    slope = float(np.polyfit(xs, ys, 1)[0])
    return math.exp(slope) - 1, len(xs)


def _figures(holdouts) -> dict[str, float]:
    """A kind's figures as the targets table rounds them (shares, not percents)."""
    items = _items(holdouts)
    errs = [abs(e) for e, _i, _w in items]
    return {"runs": len(items), "mean_abs": statistics.mean(errs), "max_abs": max(errs),
            "inside": sum(i for _e, i, _w in items) / len(items),
            "half_width": statistics.median(w for _e, _i, w in items)}  # fmt: skip


def _key(kind: crossgpu.Kind) -> str:
    """'same, seen', 'stand-in, unseen', 'stand-in, other software, seen' ..."""
    return f"{kind.workload}, {'seen' if kind.seen else 'unseen'}"


def report(folder: Path | None = None) -> tuple[str, dict]:
    """The benchmark's markdown, and its figures by name (predict_crossgpu.json): on the shipped evidence and the
    rows imported into `folder` (`pretrain-planner evidence import`), each origin counted."""
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    ev = evidence_exchange.loaded_evidence(catalog, folder=folder)
    full = crossgpu.fit(ev.runs, catalog.gpus)
    rated = [r for r in ev.runs if full.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32)]
    rows = {}
    for path in (evidence.PUBLIC_CSV, *([folder / evidence_exchange.IMPORTED_CSV] if folder else [])):
        if path.is_file():
            with open(path, newline="") as f:
                rows.update({r["row_id"]: r for r in csv.DictReader(f)})
    mb = {i: float(r["micro_batch"]) for i, r in rows.items() if r["micro_batch"].strip()}
    print("leave one GPU type out ...", file=sys.stderr, flush=True)
    logo = crossgpu_loo.leave_one_gpu_out(ev.runs, catalog.gpus)
    print("leave one workload x GPU type x software out ...", file=sys.stderr, flush=True)
    cells = crossgpu_loo.leave_one_cell_out(ev.runs, catalog.gpus)
    print("leave one workload out (stand-ins) ...", file=sys.stderr, flush=True)
    standin = crossgpu_loo.leave_one_model_out(ev.runs, catalog.gpus)
    standin_unseen = crossgpu_loo.leave_one_model_out(ev.runs, catalog.gpus, unseen=True)
    by_kind = defaultdict(list)
    for h in [*logo, *cells, *standin, *standin_unseen]:
        by_kind[h.estimate.kind].append(h)
    old = _mfu_transfer(rated, catalog)
    floor_lines, raw_floor, model_floor, n_pairs = _floor(rated, full)
    slope, n_slope = _batch_effect(cells, mb)
    effect_sd = float(np.std(list(full.effects.values())))
    figures: dict = {
        "evidence": {"runs": len(ev.runs), "sources": len({r.source for r in ev.runs}),
                     "gpu_types": len({r.gpu for r in ev.runs}), "origins": ev.origins()},
        "kinds": {"same, unseen": _figures(logo), "same, seen": _figures(cells),
                  **{_key(k): _figures(by_kind[k]) for k in crossgpu.KINDS
                     if k.workload != "same" and by_kind.get(k)}},
        "old_mfu_transfer": {"mean_abs": statistics.mean(abs(e) for e in old), "max_abs": max(abs(e) for e in old)},
        "floor": {"raw": raw_floor, "model": model_floor, "oracle": _oracle(rated, full)},
        "effects": {g: math.exp(b) - 1 for g, b in full.effects.items()},
    }  # fmt: skip
    lines = [
        "# Cross-GPU model: out-of-sample checks on the public evidence", "", __doc__.split("\n\n")[2], "",
        f"Evidence: {len(ev.runs)} usable runs ({evidence.origins_text(ev.origins())}) of "
        f"{len({r.source for r in ev.runs})} sources on {len({r.gpu for r in ev.runs})} GPU types ({len(ev.skipped)} "
        "rows not usable, reasons below).", "",
        "## Against the targets", "",
    ]  # fmt: skip
    targets = [
        _targets_row("**headline**: the same workload to a GPU type absent from the evidence (each GPU type left "
                     "out)", logo, UNSEEN_TARGETS),
        _targets_row("the same workload to a GPU type measured by other software (each workload x GPU type x "
                     "software left out)", cells, SEEN_TARGETS),
        *[_targets_row(f"{kind.label} ({kind.protocol})", by_kind[kind]) for kind in crossgpu.KINDS
          if kind.workload != "same" and by_kind.get(kind)],
    ]  # fmt: skip
    lines += markdown.plain(["kind of transfer (how it is left out)", "runs predicted", "mean abs error (target)",
                             "max abs error", "truth inside the band (target >= 90%)",
                             "median band half-width (target)"], targets)  # fmt: skip
    earlier = {"unseen": [h for h in logo if h.run.id <= EARLIER_LAST_ROW],
               "seen": [h for h in cells if h.run.id <= EARLIER_LAST_ROW]}  # fmt: skip
    figures["earlier"] = {k: _figures(v) for k, v in earlier.items() if v}
    if all(earlier.values()):
        lines += [
            "", f"On the runs of the rows shipped before issue 40 (r0001-{EARLIER_LAST_ROW}), predicted from all the "
            "evidence:", "",
            *markdown.plain(["kind of transfer", *TARGET_COLUMNS], [
                _targets_row("headline: a GPU type absent from the evidence", earlier["unseen"], UNSEEN_TARGETS),
                _targets_row("a GPU type measured by other software", earlier["seen"], SEEN_TARGETS)]),
        ]  # fmt: skip
    lines += [
        "",
        f"For comparison on the headline protocol: the transfer before issue 23 (compute MFU against the datasheet "
        f"peak) erred by {statistics.mean(abs(e) for e in old):.1%} on average (max {max(abs(e) for e in old):.0%}, "
        f"{len(old)} runs); the first cross-GPU model (the two rates, no per-GPU effects, the SUSPECT rows in; this "
        "file at commit d995e06) by 13.2% (max 82%), the truth inside its band in 89% of 248 runs at a median "
        "half-width of +-37%.",
        "",
        "## What limits it: the scatter of one GPU pair's ratio across workloads, and each type's offset", "",
        "Between two GPU types one software measured on several workloads and GPU counts, the ratio of their seconds "
        "per token is not one number. A transfer by GPU-level quantities (rates, effects, a constant per pair) "
        "predicts one ratio per pair up to the workload's composition; what scatters beyond that is a floor for a "
        f"transfer from one other type. Over {n_pairs} pairs x software with three groups or more (the 30 largest "
        f"shown): with the pair's mean offset known exactly, the mean |error| left is **{raw_floor:.1%}** with no "
        f"model at all and **{model_floor:.1%}** after the model's own ratio (its memory-bound share per workload and "
        "the per-GPU effects); weighting the nearest types does better than this average pair because near pairs "
        "scatter less (the table: the A100 variants among themselves against the A100 and the H100). An in-sample "
        "fit with a free effect per GPU type and a free level per group, every run seen (no model with one number "
        "per GPU type does better on this "
        f"evidence), leaves **{_oracle(rated, full):.1%}**. The headline protocol cannot know the held-out type's "
        f"offset: the fitted effects spread by {effect_sd:.2f} in log (sd over the {len(full.effects)} types), which "
        f"alone makes a prediction blind to it err by about {0.8 * effect_sd:.0%} on average where no near type "
        "shares it; that, not the rates, is why the headline errs most.", "",
        *floor_lines, "",
        f"The micro-batch, which the public sources pick per GPU type (larger on GPUs with more memory): per doubling "
        f"of the target's micro-batch over its basis', the prediction errs by {slope:+.1%} ({n_slope} single-basis "
        "predictions with both micro-batches stated, of the protocol where the target type's effect is known; on "
        "the headline protocol the micro-batch stands in for the unknown effect, larger batches running on the "
        "bigger types). What the step model prices of it: a rank's model-state traffic per sample (a micro-batch's "
        "gradient written and accumulated, an optimizer step's parameter and moments: planning/stepmodel."
        "state_bytes_per_sample), where a row's method replicates the model states.", "",
        "## Fitted on all the evidence (what `pretrain-planner predict` and the what-if use)", "",
        f"{full.params.describe()}. Per-GPU effects (log seconds beyond what the matmul rate and bandwidth say, "
        "relative to the average GPU type; positive: slower): "
        + ", ".join(f"{g} {math.exp(b) - 1:+.0%}" for g, b in sorted(full.effects.items(), key=lambda kv: kv[1]))
        + ". Measured error by kind (out of sample within the evidence, which sets the bands):", "",
        *[f"- {line}" for line in full.calibration.lines()], "",
        "## Headline protocol per held-out GPU type", "",
    ]  # fmt: skip
    by_target: dict[str, list] = defaultdict(list)
    by_pair: dict[tuple[str, str], list] = defaultdict(list)
    by_source: dict[str, list] = defaultdict(list)
    params: dict[str, crossgpu.Params] = {}
    for h in logo:
        item = (h.error, h.inside, _half_width(h.estimate))
        by_target[h.run.gpu].append(item)
        by_source[h.run.source].append(item)
        params[h.run.gpu] = h.params
        for g, e in h.by_gpu.items():
            by_pair[(g, h.run.gpu)].append((e.central / h.run.seconds - 1, e.low <= h.run.seconds <= e.high,
                                            _half_width(e)))  # fmt: skip
    lines += _per("held out", [_row(f"{g} ({params[g].describe()})", v) for g, v in sorted(by_target.items())])
    cell_target: dict[str, list] = defaultdict(list)
    cell_source: dict[str, list] = defaultdict(list)
    for h in cells:
        cell_target[h.run.gpu].append((h.error, h.inside, _half_width(h.estimate)))
        cell_source[h.run.source].append((h.error, h.inside, _half_width(h.estimate)))
    lines += ["", "## A GPU type measured by other software, per GPU type (each workload x GPU type x software left "
              "out)", ""]  # fmt: skip
    lines += _per("predicted", [_row(g, v) for g, v in sorted(cell_target.items())])
    lines += ["", "## A GPU type measured by other software, per source", ""]
    lines += _per("source", [_row(s, v) for s, v in sorted(cell_source.items())])
    figures["seen_by_gpu"] = {g: {"runs": len(v), "mean_abs": statistics.mean(abs(e) for e, _i, _w in v),
                                  "max_abs": max(abs(e) for e, _i, _w in v),
                                  "inside": sum(i for _e, i, _w in v) / len(v),
                                  "half_width": statistics.median(w for _e, _i, w in v)}
                              for g, v in sorted(cell_target.items())}  # fmt: skip
    lines += ["", "## Headline protocol per pair of GPU types (the held-out type predicted from one other type's "
              "runs)", ""]  # fmt: skip
    lines += _per("from -> to", [_row(f"{a} -> {b}", v) for (a, b), v in sorted(by_pair.items())])
    figures["pairs"] = {f"{a} -> {b}": {"runs": len(v), "mean_abs": statistics.mean(abs(e) for e, _i, _w in v),
                                        "max_abs": max(abs(e) for e, _i, _w in v)}
                        for (a, b), v in sorted(by_pair.items())}  # fmt: skip
    lines += ["", "## Headline protocol per source", ""]
    lines += _per("source", [_row(s, v) for s, v in sorted(by_source.items())])
    sub = defaultdict(list)
    for h in [*standin, *standin_unseen]:
        sub[(h.run.model, sorted({r.model for r, _t, _w in h.estimate.basis})[0])].append(
            (h.error, h.inside, _half_width(h.estimate)))  # fmt: skip
    lines += ["", "## Stand-ins (each workload left out, predicted from its stand-in; both GPU cases)", ""]
    lines += _per("workload <- stand-in", [_row(f"{a} <- {b}", v) for (a, b), v in sorted(sub.items())])
    worst = sorted(logo, key=lambda h: -abs(h.error))[:15]
    lines += ["", "## The largest errors of the headline protocol", ""]
    lines += markdown.plain(["run", "held out", "from", "error", "band"], [
        [h.run.label, h.run.gpu, ", ".join(sorted(h.by_gpu)), f"{h.error:+.0%}",
         f"{h.estimate.low / h.run.seconds - 1:+.0%} .. {h.estimate.high / h.run.seconds - 1:+.0%}"]
        for h in worst])  # fmt: skip
    reasons = Counter(why.split(":")[0] if "GPU type" not in why else why.split(" is not")[0] for _r, why in ev.skipped)
    lines += ["", "## Rows not used", ""]
    lines += markdown.plain(["why", "rows"], [[why, str(n)] for why, n in reasons.most_common()])
    flagged = [i for i, why in ev.skipped if why.startswith("flagged by its source")]
    lines += [
        "",
        f"The {len(flagged)} rows flagged SUSPECT by their sources ({', '.join(flagged)}: multi-GPU rates per GPU "
        "above 1.1x or below 0.5x the same suite's one-GPU rate, e.g. 8 x RTX 3090 BERT-large at 0.18x) are not "
        "evidence; the first model's largest errors (-82%, -65%) were two of them.",
        "",
        "Reading: a transfer between GPU types of one class (A100 SXM / PCIe / 40 GB) errs by a few percent; the "
        "errors grow with the distance between the two types' matmul rates and bandwidths and are shared by all "
        "workloads of a type (the H100 runs slower than its rates say relative to an A100, the GDDR cards faster). "
        "Where the evidence has measured the target type with other workloads by other software, that offset is "
        "known (the per-GPU effect) and the error halves; where it has not, nothing in the two rates tells it. "
        "These figures, per kind, are what `pretrain-planner predict` and the what-if table quote as the error of "
        "each prediction.",
        "",
    ]
    return "\n".join(lines), figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/predict_crossgpu.md"))
    ap.add_argument("--evidence", type=Path, help="an evidence folder whose imported rows join the shipped ones "
                    "(`pretrain-planner evidence import`; default: the shipped rows alone)")  # fmt: skip
    args = ap.parse_args()
    write(Path(args.out), *report(args.evidence))
    return 0


def write(out: Path, text: str, figures: dict) -> None:
    """The benchmark's Markdown at `out`, its figures by name beside it (.json), the Markdown printed."""
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())

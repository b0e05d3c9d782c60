"""Leave-one-GPU-type-out check of the cross-GPU model (planning/crossgpu.py) on the public evidence it ships with.

    .venv/bin/python benchmarks/predict_crossgpu.py [--out benchmarks/results/predict_crossgpu.md]

For every GPU type of workflow/pretrain_planner/data/evidence/public_throughput.csv: the model is fitted on the runs of
the OTHER GPU types (kappa, tau and the band, itself from errors made out of sample within them), then each run of the
held-out type is predicted from the runs of its group (the same workload and setting) on the other types. The error of
a prediction is central / published - 1 of the seconds per token (the days to train a fixed number of tokens move
with it); "inside" means the published figure lies inside the predicted band. Per pair of GPU types the held-out
run is predicted from the basis type's runs alone (the same fitted model). Targets (issue 23): mean |error| <= 8%,
inside >= 90%, band no wider than +-20% of the central value. No training, no torch; a few seconds.
mosaicml/llm-foundry's benchmark tables are not in the evidence (they are the held-out acceptance set).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.planning import crossgpu, evidence  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402

TARGET_MEAN, TARGET_INSIDE, TARGET_HALF_WIDTH = 0.08, 0.90, 0.20


def _mfu_transfer(runs, catalog) -> list[float]:
    """The errors of the what-if before issue 23 on the same protocol: the compute MFU against the datasheet peak
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


def _row(label: str, items: list[tuple[float, bool, float]]) -> str:
    """items: (error, inside, half-width)."""
    errs = [abs(e) for e, _i, _w in items]
    return (f"| {label} | {len(items)} | {statistics.mean(errs):.1%} | {max(errs):.1%} | "
            f"{statistics.mean(e for e, _i, _w in items):+.1%} | {sum(i for _e, i, _w in items) / len(items):.0%} | "
            f"{statistics.median(w for _e, _i, w in items):.0%} |")  # fmt: skip


HEAD = ("| {} | runs | mean abs error | max abs error | mean error (bias) | truth inside the band | median band "
        "half-width |\n|---|---|---|---|---|---|---|")  # fmt: skip


def report() -> str:
    """The benchmark's markdown."""
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    ev = evidence.public_evidence(catalog)
    holdouts = crossgpu.leave_one_gpu_out(ev.runs, catalog.gpus)
    full = crossgpu.fit(ev.runs, catalog.gpus)
    overall = [(h.error, h.inside, _half_width(h.estimate)) for h in holdouts]
    mean_abs = statistics.mean(abs(e) for e, _i, _w in overall)
    inside = sum(i for _e, i, _w in overall) / len(overall)
    width = statistics.median(w for _e, _i, w in overall)
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    old = _mfu_transfer(ev.runs, catalog)
    lines = [
        "# Cross-GPU model: leave-one-GPU-type-out on the public evidence", "", __doc__.split("\n\n")[2], "",
        f"Evidence: {len(ev.runs)} usable runs of {len({r.source for r in ev.runs})} sources on "
        f"{len({r.gpu for r in ev.runs})} GPU types ({len(ev.skipped)} rows not usable, reasons below); "
        f"{len(holdouts)} runs predicted.", "",
        "## Against the targets", "",
        "| figure | measured | target | |", "|---|---|---|---|",
        f"| mean abs error of the central value | {mean_abs:.1%} | <= {TARGET_MEAN:.0%} | "
        f"{met(mean_abs <= TARGET_MEAN)} |",
        f"| max abs error | {max(abs(e) for e, _i, _w in overall):.1%} | - | |",
        f"| truth inside the band | {inside:.0%} | >= {TARGET_INSIDE:.0%} | {met(inside >= TARGET_INSIDE)} |",
        f"| median band half-width | {width:.0%} | <= {TARGET_HALF_WIDTH:.0%} | {met(width <= TARGET_HALF_WIDTH)} |",
        f"| the transfer before issue 23 (compute MFU against the datasheet peak): mean abs error | "
        f"{statistics.mean(abs(e) for e in old):.1%} (max {max(abs(e) for e in old):.0%}, {len(old)} runs) | | |",
        "",
        f"Fitted on all the evidence (what `pretrain-planner predict` uses): {full.params.describe()}; "
        f"{full.calibration.describe()}.", "",
        "## Per held-out GPU type (predicted from every other type)", "", HEAD.format("held out"),
    ]  # fmt: skip
    by_target: dict[str, list] = defaultdict(list)
    by_pair: dict[tuple[str, str], list] = defaultdict(list)
    by_source: dict[str, list] = defaultdict(list)
    params: dict[str, crossgpu.Params] = {}
    for h in holdouts:
        item = (h.error, h.inside, _half_width(h.estimate))
        by_target[h.run.gpu].append(item)
        by_source[h.run.source].append(item)
        params[h.run.gpu] = h.params
        for g, e in h.by_gpu.items():
            by_pair[(g, h.run.gpu)].append((e.central / h.run.seconds - 1, e.low <= h.run.seconds <= e.high,
                                            _half_width(e)))  # fmt: skip
    lines += [_row(f"{g} ({params[g].describe()})", v) for g, v in sorted(by_target.items())]
    lines += ["", "## Per pair of GPU types (the held-out type predicted from one other type's runs)", "",
              HEAD.format("from -> to")]  # fmt: skip
    lines += [_row(f"{a} -> {b}", v) for (a, b), v in sorted(by_pair.items())]
    lines += ["", "## Per source", "", HEAD.format("source")]
    lines += [_row(s, v) for s, v in sorted(by_source.items())]
    worst = sorted(holdouts, key=lambda h: -abs(h.error))[:15]
    lines += ["", "## The largest errors", "", "| run | held out | from | error | band |", "|---|---|---|---|---|"]
    lines += [f"| {h.run.label} | {h.run.gpu} | {', '.join(sorted(h.by_gpu))} | {h.error:+.0%} | "
              f"{h.estimate.low / h.run.seconds - 1:+.0%} .. {h.estimate.high / h.run.seconds - 1:+.0%} |"
              for h in worst]  # fmt: skip
    reasons = Counter(why.split(":")[0] if "GPU type" not in why else why.split(" is not")[0] for _r, why in ev.skipped)
    lines += ["", "## Rows not used", "", "| why | rows |", "|---|---|"]
    lines += [f"| {why} | {n} |" for why, n in reasons.most_common()]
    lines += [
        "",
        "Reading: transfers between GPU types of one generation and class (A100 SXM / PCIe / 40 GB) err by a few "
        "percent; the errors grow with the distance between the two GPU types' matmul rates and bandwidths. The "
        "rows of one group do not always share their software (sources.md: Lambda's v1 suite ran two container "
        "builds on different GPU types) nor their micro-batch (larger on GPUs with more memory), which the model "
        "does not see. A100 -> H100 is still optimistic on average (the H100 is predicted faster than published). "
        "The targets are not met on this evidence; these figures are what `pretrain-planner predict` and the "
        "what-if table quote as the model's error.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/predict_crossgpu.md"))
    out = Path(ap.parse_args().out)
    out.write_text(text := report())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Evidence that grows with use (issue 40, 4): a site's own cells tighten the predictions for its GPU type.

    .venv/bin/python benchmarks/evidence_replay.py [--out benchmarks/results/evidence_replay.md] [--gpus a100,h100]

Replayed on the shipped public evidence (workflow/pretrain_planner/data/evidence/public_throughput.csv), as the
what-if sees a sweep in progress: for every GPU type G in turn, a site owns G and nothing in the evidence measured G
but the site's sweep; that sweep is G's runs, finished one by one in a shuffled order (seeded). For each of its cells
x, held back, the cross-GPU model (planning/crossgpu.py) is fitted on the other GPU types' runs plus the first k
finished cells (never one of x's own workload x software on G) and predicts x from x's group on the other types,
for k = 0 (the headline case: G unmeasured, its offset unknown), 1, 2, 4, 8, 16. A finished cell whose group spans
another GPU type is a pair: it gives G its own offset (the per-GPU effect), which x's prediction then uses. The error
is central / published - 1 of x's seconds per token, on the same cells at every k (those with at least 16 finished
cells besides their own workload), over five orders; "inside": the published figure lies inside the band (the full
fit's bands, which a refit keeps: its out-of-sample checks are most of a fit's time). No training, no torch; a few
minutes on two cores. mosaicml/llm-foundry's tables are not in the evidence (the held-out acceptance set).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

import crossgpu_loo  # noqa: E402
import predict_crossgpu  # noqa: E402
from pretrain_planner.planning import crossgpu, evidence  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.planning.evidence import Run  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402

KS = (0, 1, 2, 4, 8, 16)


def replay(runs: Sequence[Run], gpus: Mapping[str, Any], ks: Sequence[int] = KS, seeds: Iterable[int] = (0,),
           only: Iterable[str] | None = None) -> dict[int, list[tuple[str, float, bool, float]]]:  # fmt: skip
    """k -> [(the held-back run's id, its error, inside the band, the band's half-width)] over the same held-back
    cells at every k, once per seed (the order the site's cells finish in)."""
    full = crossgpu.fit(runs, gpus)
    rated = [r for r in runs if full.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32)]
    out: dict[int, list[tuple[str, float, bool, float]]] = defaultdict(list)
    for held, seed in ((g, s) for g in sorted(set(only) if only else {r.gpu for r in rated}) for s in seeds):
        site = [r for r in rated if r.gpu == held]
        others = [r for r in rated if r.gpu != held]
        order = sorted(site, key=lambda r: r.id)
        random.Random(f"{seed}:{held}").shuffle(order)
        for x in site:
            finished = [r for r in order if (r.model, r.software) != (x.model, x.software)]
            if len(finished) < max(ks):
                continue
            got = []
            for k in ks:
                train = [*others, *finished[:k]]
                model = crossgpu.fit(train, gpus, calibration=full.calibration)
                basis = [b for b in train if b.group == x.group and b.gpu != held]
                est = model.estimate(basis, crossgpu_loo.work_of_run(x), held)
                if est is None:
                    break
                h = crossgpu_loo.Holdout(x, est, {}, model.params)
                got.append((k, (x.id, h.error, h.inside, (est.high / est.low) ** 0.5 - 1)))
            if len(got) == len(ks):
                for k, row in got:
                    out[k].append(row)
    return dict(out)


def figures(result: Mapping[int, list[tuple[str, float, bool, float]]]) -> dict[str, dict[str, float]]:
    return {str(k): {"cells": len(rows), "mean_abs": statistics.mean(abs(e) for _i, e, _in, _w in rows),
                     "inside": sum(i for _i, _e, i, _w in rows) / len(rows),
                     "half_width": statistics.median(w for _i, _e, _in, w in rows)}
            for k, rows in sorted(result.items()) if rows}  # fmt: skip


def report(only: Iterable[str] | None = None, seeds: int = 5) -> tuple[str, dict]:
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    ev = evidence.public_evidence(catalog)
    fig = figures(replay(ev.runs, catalog.gpus, seeds=range(seeds), only=only))
    lines = ["# A site's own cells tighten its GPU type's predictions (replay on the public evidence)", "",
             __doc__.split("\n\n")[2].replace("\n", " "), "",
             *markdown.plain(
                 ["cells finished on the site's GPU type (k)", "held-back cells predicted", "mean abs error",
                  "truth inside the band", "median band half-width"],
                 [[k, f["cells"], f"{f['mean_abs']:.1%}", f"{f['inside']:.0%}", f"+-{f['half_width']:.0%}"]
                  for k, f in fig.items()])]  # fmt: skip
    first, last = fig[str(KS[0])], fig[str(KS[-1])]
    lines += ["", f"From no cell of its own to {KS[-1]}, the mean error on the site's held-back cells goes from "
              f"{first['mean_abs']:.1%} to {last['mean_abs']:.1%} ({len(ev.runs)} public runs; "
              f"{first['cells']} predictions: {seeds} orders of the held-back cells on "
              f"{len(only) if only else 'every'} GPU type(s) with enough runs)."]  # fmt: skip
    return "\n".join(lines) + "\n", {"by_k": fig, "runs": len(ev.runs), "seeds": seeds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/evidence_replay.md"))
    ap.add_argument("--gpus", help="only these GPU types as the site's (comma-separated; default: every one)")
    ap.add_argument("--seeds", type=int, default=5, help="orders the site's cells finish in (default 5)")
    args = ap.parse_args()
    predict_crossgpu.write(Path(args.out), *report(args.gpus.split(",") if args.gpus else None, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

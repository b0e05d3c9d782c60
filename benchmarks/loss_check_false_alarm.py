"""How often the loss check calls a correct method `differs` (false alarms), and how often it catches a broken one.

For each of N seeds (the initial weights and the batches both change with it), on one CPU rank, in this process:
naive (the reference), naive's variants (half its micro-batch; another dropout seed where the model has dropout),
the correct methods (free-lunch, activation checkpointing with and without it, the fused linear + cross-entropy
head) and two broken ones (trainer/losscheck.py's test faults: the loss not divided under accumulation, the learning
rate doubled), judged with benchmark.loss_check's defaults (planning/losscheck.py). Writes
benchmarks/results/loss_check_false_alarm.{md,json}.

    .venv/bin/python benchmarks/loss_check_false_alarm.py [--seeds 20] [--steps 20] [--models tiny-gptneox tiny-bert]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.planning import losscheck as lc  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.schema import section  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402
from pretrain_planner.trainer import losscheck  # noqa: E402

CORRECT = ["fl", "fl+ac", "naive+ac", "fl+flce"]
BROKEN = {"naive!unscaled_accum": ("naive", "unscaled_accum"), "naive!lr_x2": ("naive", "lr_x2")}


def runs(mb: int) -> list[dict]:
    out = [{"name": "naive", "method": "naive", "micro_batch": mb, "role": "reference"},
           {"name": "naive~mb2", "method": "naive", "micro_batch": mb // 2, "role": "variant", "of": "naive"},
           {"name": "naive~dropout1", "method": "naive", "micro_batch": mb, "dropout_seed": 1, "role": "variant",
            "of": "naive", "only_if_dropout": True}]  # fmt: skip
    out += [{"name": m, "method": m, "micro_batch": mb, "role": "method", "against": "naive"} for m in CORRECT]
    out += [{"name": n, "method": m, "micro_batch": mb, "role": "method", "against": "naive"}
            for n, (m, _) in BROKEN.items()]  # fmt: skip
    return out


def one(model: dict, gpu: dict, seed: int, steps: int, work: Path, eager: bool = False) -> list[dict]:
    spec = {"cell": {"model": model["name"], "gpu": "cpu", "nodes": 1, "gpus_per_node": 1, "method": "naive"},
            "init_method": "naive", "model": model, "gpu": gpu, "benchmark": section("config", "benchmark", {}),
            "threads_per_rank": os.cpu_count() or 1,
            "check": {"steps": steps, "global_batch": model["recipe"]["global_batch"], "seed": seed,
                      "init": str(work / f"init-{model['name']}-{seed}.pt")},
            "runs": runs(4), "outputs": {"curves": str(work / f"curves-{model['name']}-{seed}.json")}}  # fmt: skip
    if eager:
        spec["compile_model"] = False  # the models stay eager (a CPU compile per run dominates the time)
    rec = losscheck.run_rank(spec)["record"]
    conf = lc.settings()
    return lc.judge_records([rec], conf.k, conf.tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=lc.settings().steps)
    ap.add_argument("--models", nargs="+", default=["tiny-gptneox", "tiny-bert"])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/loss_check_false_alarm"))
    ap.add_argument("--eager", action="store_true", help="no model compiled (fl's compile left out)")
    args = ap.parse_args()
    os.environ[lc.FAULT_ENV] = ";".join(f"{n}={f}" for n, (_, f) in BROKEN.items())
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    gpu = catalog.gpu("cpu").to_dict()
    t0, rows, lines = time.time(), [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for seed in range(args.seeds):
                for r in one(catalog.model(name).to_dict(), gpu, seed, args.steps, Path(tmp), args.eager):
                    rows.append({"model": name, "seed": seed, "method": r["method"], "loss": r["loss"],
                                 "worst_ratio": r.get("worst_ratio"), "left_at": r.get("left_at")})  # fmt: skip
                print(f"{name} seed {seed}: " + ", ".join(f"{r['method']} {r['loss']}" for r in rows[-6:]),
                      flush=True)  # fmt: skip
                lines = write(args, rows, t0)  # after every seed: a run stopped early keeps what it measured
    print("\n".join(lines))


def write(args: argparse.Namespace, rows: list[dict], t0: float) -> list[str]:
    """The table and the JSON of the seeds run so far."""
    seeds = {name: len({r["seed"] for r in rows if r["model"] == name}) for name in args.models}
    lines = [
        "# Loss check: false alarms and catches",
        "",
        f"`.venv/bin/python benchmarks/loss_check_false_alarm.py --seeds {args.seeds} --steps {args.steps}"
        f"{' --eager' if args.eager else ''}` "
        f"({time.strftime('%Y-%m-%d')}, one CPU rank, {time.time() - t0:.0f} s so far; seeds run: "
        + ", ".join(f"{n} {k}" for n, k in seeds.items())
        + f"; k = {lc.settings().k}, tail = {lc.settings().tail}"
        + ("; models eager, no compile" if args.eager else "")
        + "). Each seed changes the initial weights and the batches. A correct method called "
        "`differs` is a false alarm; a broken one called `same` is a miss.",
        "",
    ]
    table = []
    summary = []
    for name in args.models:
        for method in [*CORRECT, *BROKEN]:
            mine = [r for r in rows if r["model"] == name and r["method"] == method]
            if not mine:
                continue
            differs = sum(r["loss"].startswith(lc.DIFFERS) for r in mine)
            same = sum(r["loss"] == lc.SAME for r in mine)
            kind = "broken" if method in BROKEN else "correct"
            rate = f"{differs}/{len(mine)} false alarms" if kind == "correct" else f"{differs}/{len(mine)} caught"
            worst = max((r["worst_ratio"] for r in mine if r["worst_ratio"] is not None), default=None)
            table.append([name, method, kind, same, differs, rate, "" if worst is None else f"{worst:.3g}"])
            summary.append({"model": name, "method": method, "kind": kind, "same": same, "differs": differs,
                            "runs": len(mine), "worst_ratio": worst})  # fmt: skip
    worst_col = "worst distance / band (max over seeds)"
    columns = ["model", "method", "kind", "same", "differs", "rate", worst_col]
    lines += markdown.plain(columns, table, right={"same", "differs", worst_col})
    correct = [s for s in summary if s["kind"] == "correct"]
    alarms, total = sum(s["differs"] for s in correct), sum(s["runs"] for s in correct)
    lines += ["", f"False-alarm rate over every correct method and seed: {alarms}/{total}."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return lines


if __name__ == "__main__":
    main()

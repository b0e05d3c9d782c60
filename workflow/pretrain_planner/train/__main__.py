"""`torchrun --nproc-per-node=N -m pretrain_planner.train PLAN_DIR/plan.json [--steps N | --time-budget-h H]
[--out DIR] [--data PATH] [--tokenizer PATH]`: run an exported plan on every rank (torchrun's RANK / WORLD_SIZE /
LOCAL_RANK), or as a single process without torchrun. See train/run.py.

A run refused before it trains (a checkpoint of another run in the output folder: trainer/runidentity.py) is one
line on stderr (rank 0's) and exit status 2; under launch.sh (PP_REFUSAL_FILE set) every rank exits 0 after rank 0
wrote the line there too, so that torchrun adds no traceback of its own, and launch.sh exits 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pretrain_planner.planning.configtypes import TrainSection
from pretrain_planner.planning.corpus import TOKEN_DTYPES

REFUSAL_ENV = "PP_REFUSAL_FILE"  # launch.sh's file for a rank's one-line refusal (tables/export.py)
REFUSED_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    d = TrainSection.defaults()  # the schema's train section: a run without a config starts from it
    p = argparse.ArgumentParser(prog="python -m pretrain_planner.train", description=__doc__)
    p.add_argument("plan", help="plan.json of results/optimal/{model}/{gpu}/{N}x{G}/ (or its folder)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's, else its time budget)")
    budget.add_argument("--time-budget-h", type=float, help="hours of training time instead of steps")
    p.add_argument("--out", help="output folder (default: results/train/{model}/{gpu}/{N}x{G}/ in the working dir)")
    p.add_argument(
        "--data",
        help="token ids (.npy, .bin), text (.txt, .jsonl, .parquet, a datasets folder; a file, "
        "folder or glob) or an image folder (default: generated); docs/train.md",
    )
    p.add_argument("--data-dtype", choices=TOKEN_DTYPES, help="a raw .bin's token dtype")
    p.add_argument("--data-field", help="the text field of jsonl / parquet / datasets (default: text)")
    p.add_argument(
        "--tokenizer",
        help="a tokenizer.json or a local Hugging Face tokenizer folder; 'train': a BPE "
        "trained on the corpus (text needs one; the generated corpus trains one)",
    )
    p.add_argument("--device", choices=["auto", "cpu"], default=d.device, help="cpu: a GPU plan on CPU processes")
    p.add_argument("--threads", type=int, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps after each start left out of the throughput")
    p.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    p.add_argument(
        "--eval-every", type=int, default=d.eval_every, help="steps between validation losses (0: at the end only)"
    )
    p.add_argument(
        "--eval-batches", type=int, default=d.eval_batches, help="held-out micro-batches per validation (0: none)"
    )
    p.add_argument(
        "--checkpoint-every-min", type=float, default=d.checkpoint_every_min, help="minutes of training time"
    )
    p.add_argument("--checkpoint-every-steps", type=int)
    p.add_argument("--fake-step-s", type=float, help=argparse.SUPPRESS)  # testing: a deterministic clock
    p.add_argument("--kill-at-step", type=int, help=argparse.SUPPRESS)  # testing: SIGKILL rank 0 after that step
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pretrain_planner.tables import units
    from pretrain_planner.train.jobs import canonical
    from pretrain_planner.train.run import train_plan

    kwargs = {k: v for k, v in vars(args).items() if k != "plan"}
    kwargs["out"] = canonical(args.out)  # relative to this working directory, whatever a rank's is
    res = train_plan(canonical(args.plan), **kwargs)
    if res.get("status") == "refused":
        refusal = os.environ.get(REFUSAL_ENV)
        if res.get("rank", 0) == 0:
            print(f"pretrain_planner.train: {res['reason']}", file=sys.stderr, flush=True)
            if refusal:
                Path(refusal).write_text(res["reason"] + "\n")
        return 0 if refusal else REFUSED_EXIT
    if res.get("status") == "ok":
        t = res["throughput"]
        ratio = (t.get("ratio") or {}).get("step_time_s")
        val = f", validation loss {units.number(res['val_loss'], 3)}" if res.get("val_loss") is not None else ""
        print(f"trained {res['steps']} steps ({res['stop_reason']}), sustained step {units.step(t.get('step_time_s'))}"
              f", train / prediction {units.times(ratio)}{val}; {res['run_dir']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`torchrun --nproc-per-node=N -m pretrain_planner.train PLAN_DIR/plan.json [--steps N | --time-budget-h H]
[--out DIR] [--data PATH] [--tokenizer PATH]`: run an exported plan on every rank (torchrun's RANK / WORLD_SIZE /
LOCAL_RANK), or as a single process without torchrun. See train/run.py."""

from __future__ import annotations

import argparse
import sys

from pretrain_planner.planning.corpus import TOKEN_DTYPES


def build_parser() -> argparse.ArgumentParser:
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
    p.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: a GPU plan on CPU processes")
    p.add_argument("--threads", type=int, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps after each start left out of the throughput")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every-min", type=float, default=30.0, help="minutes of training time")
    p.add_argument("--checkpoint-every-steps", type=int)
    p.add_argument("--fake-step-s", type=float, help=argparse.SUPPRESS)  # testing: a deterministic clock
    p.add_argument("--kill-at-step", type=int, help=argparse.SUPPRESS)  # testing: SIGKILL rank 0 after that step
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pretrain_planner.train.run import train_plan

    kwargs = {k: v for k, v in vars(args).items() if k != "plan"}
    res = train_plan(args.plan, **kwargs)
    if res.get("status") == "ok":
        t = res["throughput"]
        print(f"trained {res['steps']} steps ({res['stop_reason']}), sustained step {t.get('step_time_s')} s, "
              f"ratio to the prediction {t.get('ratio')}; {res['run_dir']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What one resumable checkpoint of the 24-hour BERT costs: the write the budget stage's loop makes.

    .venv/bin/python benchmarks/checkpoint_cost.py [--dir DIR] [--repeats 3] [--model bert-24h]

Builds the catalog's model (config/models.yaml, from config values: nothing downloaded) in fp32 on the CPU with
the recipe's AdamW state (exp_avg, exp_avg_sq: what a checkpoint after the first step holds), then times
`torch.save({"model": ..., "optimizer": ...})` + `os.replace` into DIR as trainer/loop.py `Loop.checkpoint` does
(no fsync: the page cache may absorb part of the write), and the same followed by an fsync (the write on disk).
Prints the size, the seconds and what checkpointing every `--every` seconds would cost over the 24-hour budget
(every rank waits while rank 0 writes), and appends them to benchmarks/results/checkpoint_cost.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "workflow"))

from pretrain_planner.planning.catalog import load_catalog  # noqa: E402


def state(model_name: str):
    import torch
    from pretrain_planner.trainer.models import build_model

    spec = load_catalog(HERE / "config/models.yaml", HERE / "config/gpus.yaml").model(model_name).to_dict()
    torch.manual_seed(0)
    net, _ = build_model(spec, "sdpa")
    opt_cfg = spec["recipe"]["optimizer"]
    opt = torch.optim.AdamW(net.parameters(), lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]), eps=opt_cfg["eps"],
                            weight_decay=opt_cfg["weight_decay"])  # fmt: skip
    for p in net.parameters():  # the state one optimizer step creates, without a backward pass
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    params = sum(p.numel() for p in net.parameters())
    return {"model": net.state_dict(), "optimizer": opt.state_dict()}, params


def write(ck, folder: Path, fsync: bool) -> float:
    import torch

    t0 = time.perf_counter()
    tmp, final = folder / ".checkpoint.pt.tmp", folder / "checkpoint.pt"
    torch.save(ck, tmp)
    if fsync:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, final)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder in results/)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="bert-24h")
    ap.add_argument("--every", type=float, default=1800.0, help="the cadence to price (s; the old default)")
    ap.add_argument("--budget-hours", type=float, default=24.0)
    args = ap.parse_args()
    ck, params = state(args.model)
    base = args.dir or HERE / "results"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix=".checkpoint-cost-") as tmp:
        folder = Path(tmp)
        plain = [write(ck, folder, fsync=False) for _ in range(args.repeats)]
        synced = [write(ck, folder, fsync=True) for _ in range(args.repeats)]
        size = (folder / "checkpoint.pt").stat().st_size
    budget_s = args.budget_hours * 3600
    n = int(budget_s // args.every)
    lines = [
        f"## {dt.datetime.now().isoformat(timespec='seconds')} - {platform.node()}, {args.model}",
        "",
        f"- checkpoint: {params / 1e6:.1f}M parameters, fp32 weights + AdamW state, {size / 1e9:.2f} GB "
        f"(written to {base})",
        f"- write as Loop.checkpoint (torch.save + os.replace, no fsync): median {statistics.median(plain):.2f} s "
        f"(runs: {', '.join(f'{t:.2f}' for t in plain)}), {size / 1e9 / statistics.median(plain):.2f} GB/s",
        f"- the same with fsync: median {statistics.median(synced):.2f} s (runs: "
        f"{', '.join(f'{t:.2f}' for t in synced)}), {size / 1e9 / statistics.median(synced):.2f} GB/s",
        f"- every {args.every:g} s over {args.budget_hours:g} h: {n} checkpoints, {n * statistics.median(plain):.0f} s "
        f"without fsync ({100 * n * statistics.median(plain) / budget_s:.2f}% of the budget), "
        f"{n * statistics.median(synced):.0f} s with ({100 * n * statistics.median(synced) / budget_s:.2f}%), on "
        "every rank (they wait at the barrier while rank 0 writes)",
        "- the default (null, the reference run's): 1 checkpoint at the end, "
        f"{statistics.median(plain):.2f} - {statistics.median(synced):.2f} s",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = HERE / "benchmarks/results/checkpoint_cost.md"
    if not out.exists():
        out.write_text("# What a resumable checkpoint of the 24-hour BERT costs (benchmarks/checkpoint_cost.py)\n\n")
    with out.open("a") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Our trainer vs `transformers.Trainer`, same model, same settings, one process: prints the ratio.

Both train the same config-built model on the same synthetic token batches with the same micro-batch,
accumulation, precision (bf16 autocast on GPU), TF32, SDPA attention, fused AdamW and gradient clipping.
HF's step time is taken by a callback that synchronises the device at every optimizer-step boundary;
ours is the pipeline's own measurement (`trainer.run.run_rank`, whole synchronised steps). Our row
"fl (compiled)" adds torch.compile, the free-lunch setting the benchmark would actually pick.

    GPU:  python benchmarks/trainer_vs_hf.py --model pythia-410m --micro-batch 16 --accum 4
    CPU:  .venv/bin/python benchmarks/trainer_vs_hf.py --smoke      (tiny model; checks the script only)

Writes a Markdown table to --out (default benchmarks/results/trainer_vs_hf.md).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
if str(REPO / "workflow") not in sys.path:
    sys.path.insert(0, str(REPO / "workflow"))

import torch  # noqa: E402
import transformers  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection  # noqa: E402
from pretrain_planner.planning.grid import Cell  # noqa: E402
from pretrain_planner.planning.spec import cell_spec  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402
from pretrain_planner.trainer.models import build_model  # noqa: E402
from pretrain_planner.trainer.run import run_rank  # noqa: E402
from pretrain_planner.trainer.tasks import synthetic_batch  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(transformers.TrainerCallback):
    """Wall time of each optimizer step, bounded by device synchronisation."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        _sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        self.times.append(time.perf_counter() - self._t0)


def run_hf(model: dict, mb: int, accum: int, steps: int, warmup: int, gpu: bool) -> dict:
    torch.manual_seed(0)
    net, _ = build_model(model, "sdpa")
    gen = torch.Generator().manual_seed(0)
    n = mb * accum * 2  # a small pool, cycled (no data work worth timing)
    pool = synthetic_batch(model, n, gen)
    rows = [{k: v[i] for k, v in pool.items()} for i in range(n)]

    total = mb * accum * (warmup + steps)  # exactly the samples max_steps consumes (a sampler over
    # a huge length would allocate a permutation of it)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return total

        def __getitem__(self, i):
            return rows[i % n]

    opt = model["recipe"]["optimizer"]
    out = tempfile.mkdtemp(prefix="hf_trainer_")
    args = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=accum,
        max_steps=warmup + steps,
        learning_rate=opt["lr"],
        adam_beta1=opt["betas"][0],
        adam_beta2=opt["betas"][1],
        adam_epsilon=opt["eps"],
        weight_decay=opt["weight_decay"],
        max_grad_norm=model["recipe"]["grad_clip"] or 0.0,
        lr_scheduler_type="constant",
        bf16=gpu,
        tf32=gpu,
        optim="adamw_torch_fused" if gpu else "adamw_torch",
        use_cpu=not gpu,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    timer = StepTimer()
    trainer = transformers.Trainer(model=net, args=args, train_dataset=Data(), callbacks=[timer])
    trainer.train()
    times = timer.times[warmup:]
    return {"step_time_s": statistics.median(times), "timed_steps": len(times)}


def run_ours(catalog, model_name: str, gpu_type: str, mb: int, accum: int, steps: int, warmup: int,
             compile_: bool, precision: str | None) -> dict:  # fmt: skip
    cell = Cell(model_name, gpu_type, 1, 1, "fl")
    folder = Path(tempfile.mkdtemp(prefix="ours_"))
    benchmark = BenchmarkSection.given({"warmup_steps": warmup, "timed_steps": steps, "max_micro_batch": mb,
                                        "seed": 0, "suspect_mfu": 0.85, "device": "auto",
                                        "max_spread": 1e9})  # its own spread is reported  # fmt: skip
    launcher = LauncherSection.given({"kind": "debug", "timeout_min": 60})
    spec = cell_spec(cell, catalog, benchmark, launcher, str(folder / "result.json"), str(folder / "steps.jsonl"))
    spec = copy.deepcopy(spec)
    spec["model"]["recipe"]["global_batch"] = mb * accum
    spec["model"]["supports_compile"] = compile_
    if precision:
        spec["model"]["recipe"]["precision"] = precision
    spec["threads_per_rank"] = max(1, os.cpu_count() or 1)
    return run_rank(spec)["result"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="pythia-410m")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny-gptneox: checks the script, not speed")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/trainer_vs_hf.md"))
    a = p.parse_args()
    gpu = torch.cuda.is_available() and not a.smoke
    if a.smoke:
        a.model, a.micro_batch, a.accum, a.steps, a.warmup = "tiny-gptneox", 4, 2, 3, 1
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    model = copy.deepcopy(catalog.model(a.model).to_dict())
    precision = "bf16" if gpu else "fp32"
    model["recipe"]["precision"] = precision
    seq = model["recipe"]["sequence_length"]
    tokens = a.micro_batch * a.accum * seq
    gpu_type = "h200" if gpu else "cpu"
    rows = []
    hf = run_hf(model, a.micro_batch, a.accum, a.steps, a.warmup, gpu)
    hf_label = "sdpa, bf16, tf32, fused AdamW" if gpu else "sdpa, fp32, CPU"
    rows.append((f"transformers.Trainer ({hf_label})", hf["step_time_s"]))
    for label, comp in (("ours, fl without compile (same settings)", False), ("ours, fl (compiled)", True)):
        r = run_ours(catalog, a.model, gpu_type, a.micro_batch, a.accum, a.steps, a.warmup, comp, precision)
        rows.append((label, r["step_time_s"]))
    device = torch.cuda.get_device_name() if gpu else "CPU"
    lines = [
        f"# Our trainer vs transformers.Trainer ({'smoke, CPU' if a.smoke else device})",
        "",
        f"date {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}; torch {torch.__version__}; "
        f"transformers {transformers.__version__}; model {a.model}; micro-batch {a.micro_batch} x accumulation "
        f"{a.accum} x sequence {seq}; precision {precision}; {a.warmup} warm-up + {a.steps} timed steps",
        f"command: `{' '.join(sys.argv)}`",
        "",
        *markdown.plain(
            ["trainer", "step s (median)", "tokens/s", "ratio vs Trainer"],
            [[label, f"{t:.4f}", f"{tokens / t:,.0f}", f"{hf['step_time_s'] / t:.3f}"] for label, t in rows],
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    Path(a.out).with_suffix(".json").write_text(json.dumps({"rows": rows, "args": vars(a)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

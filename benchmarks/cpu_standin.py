"""Does the `cpu` stand-in measure the model, or an emulation? The demo cell (tiny-gptneox/cpu/1x1/naive) through
the whole pipeline against a plain torch loop of the same step (the same model from config values, eager attention,
the recipe's AdamW, clipping, micro-batch 4 x 4 accumulation, one pinned thread), on this CPU as it is and with
oneDNN capped at AVX2 (as on a CPU without bf16 instructions, e.g. an AMD EPYC 7003).

    .venv/bin/python benchmarks/cpu_standin.py                 # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/cpu_standin.py --steps 40 --no-emulated

Rows: `pipeline` is the cell's median step (result.json step_time_s, snakemake --profile cluster/local on a
one-cell sweep); `plain` the median of the same number of steps of the plain loop. The target: the demo cell within
1.5x of the plain loop on both kinds of CPU. The bf16 rows show why the stand-ins are fp32: the same cell with a
bf16 recipe (forced to run with PRETRAIN_PLANNER_CPU_BF16=native) against the plain fp32 loop. Figures go to stdout
and are appended to benchmarks/results/cpu_standin.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
from pretrain_planner.tables import markdown  # noqa: E402

# oneDNN and ATen without AVX-512; inductor's cache apart: its keys do not include ATen's capability, and a kernel
# compiled under one and loaded under the other corrupts memory (seen here: malloc's "unaligned tcache chunk")
EMULATED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / "torchinductor-avx2")}  # fmt: skip
MODEL = "tiny-gptneox"

PLAIN = r"""
import contextlib, json, os, statistics, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
torch.set_num_threads(1)
arch, recipe, steps, precision = json.loads(sys.argv[1])
cfg = GPTNeoXConfig(**arch)
cfg._attn_implementation = "eager"  # naive
torch.manual_seed(0)
model = GPTNeoXForCausalLM(cfg)
opt = recipe["optimizer"]
optimizer = torch.optim.AdamW(model.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                              weight_decay=opt["weight_decay"])
micro, seq = 4, recipe["sequence_length"]
accum = recipe["global_batch"] // micro
batches = [torch.randint(0, arch["vocab_size"], (micro, seq)) for _ in range(accum)]
def step():
    for x in batches:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with ctx:
            loss = model(input_ids=x, labels=x).loss
        (loss / accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for _ in range(2):
    step()
times = []
for _ in range(steps):
    t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
print(json.dumps({"median_s": statistics.median(times)}))
"""


def plain_loop(model: dict, steps: int, precision: str, env: dict[str, str]) -> float:
    arg = json.dumps([model["arch"], {**model["recipe"], "precision": precision}, steps, precision])
    out = subprocess.run([sys.executable, "-c", PLAIN, arg], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=1800, check=True)  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_s"])


def pipeline_cell(model: dict, steps: int, precision: str, env: dict[str, str]) -> dict:
    """The demo cell through Snakemake (local launcher: the host pool, one pinned rank), as the demo runs it."""
    with tempfile.TemporaryDirectory(prefix="cpu-standin-") as tmp:
        work = Path(tmp)
        name = MODEL if precision == "fp32" else f"{MODEL}-{precision}"
        entry = {**model, "recipe": {**model["recipe"], "precision": precision}}
        (work / "models.yaml").write_text(yaml.safe_dump({"models": {name: entry}}))
        cfg = {
            "catalog": {"models": str(work / "models.yaml"), "gpus": str(REPO / "config/gpus.yaml")},
            "sweep": {"models": [name], "gpus": ["cpu"], "nodes": [1], "gpus_per_node": [1], "methods": ["naive"]},
            "launcher": {"kind": "local", "timeout_min": 30},
            "benchmark": {"warmup_steps": 2, "timed_steps": steps, "max_micro_batch": 4, "max_spread": 50},
        }
        (work / "c.yaml").write_text(yaml.safe_dump(cfg))
        snakemake = str(Path(sys.executable).parent / "snakemake")
        cmd = [snakemake, "-s", str(REPO / "Snakefile"), "-d", str(work), "--profile", str(REPO / "cluster/local"),
               "--cores", "2", "--configfile", str(work / "c.yaml")]  # fmt: skip
        run_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PRETRAIN_PLANNER_CPU_BF16": "native", **env}
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=run_env, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"the pipeline cell failed:\n{proc.stderr[-3000:]}")
        return json.loads((work / f"results/cells/{name}/cpu/1x1/naive/result.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each (default 20)")
    ap.add_argument("--no-emulated", action="store_true", help="skip the rows with oneDNN capped at AVX2")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 rows")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/cpu_standin.md")
    args = ap.parse_args(argv)
    from pretrain_planner.planning import hostcpu

    model = yaml.safe_load((REPO / "config/models.yaml").read_text())["models"][MODEL]
    hosts = [("this CPU", {})] + ([] if args.no_emulated else [("oneDNN capped at AVX2 (no bf16)", EMULATED)])
    rows = []
    for label, env in hosts:
        support = hostcpu.detect(env={k: v for k, v in {**os.environ, **env}.items() if k != hostcpu.OVERRIDE_ENV})
        plain = plain_loop(model, args.steps, "fp32", env)
        for precision in ["fp32"] + ([] if args.no_bf16 else ["bf16"]):
            result = pipeline_cell(model, args.steps, precision, env)
            ratio = result["step_time_s"] / plain
            rows.append((label, "native" if support.native else "emulated", precision, result["step_time_s"], plain,
                         ratio))  # fmt: skip
            print(f"{label:34s} bf16 {rows[-1][1]:8s} pipeline {precision}: {result['step_time_s'] * 1e3:7.1f} ms "
                  f"| plain fp32 loop: {plain * 1e3:6.1f} ms | ratio {ratio:.2f}", flush=True)  # fmt: skip
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())  # fmt: skip
    text = [
        f"\n## {dt.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores, {args.steps} timed steps each\n",
        f"The demo cell `{MODEL}/cpu/1x1/naive` through the pipeline against a plain torch loop of the same step",
        "(fp32, one pinned thread); target: within 1.5x on both kinds of CPU. bf16 rows: the same cell with a bf16",
        "recipe, forced to run (the grid marks it invalid where bf16 is emulated).\n",
        *markdown.plain(
            ["host", "bf16", "pipeline precision", "pipeline step (ms)", "plain fp32 loop (ms)", "ratio"],
            [[h, b, p, f"{s * 1e3:.1f}", f"{pl * 1e3:.1f}", f"{r:.2f}"] for h, b, p, s, pl, r in rows],
        ),
    ]
    fp32 = [r for *_, p, _, _, r in rows if p == "fp32"]
    text.append(f"\nfp32 (the demo): worst ratio {max(fp32):.2f} ({'within' if max(fp32) <= 1.5 else 'ABOVE'} 1.5x)")
    if not args.out.exists():
        args.out.write_text("# The CPU stand-in against a plain loop (benchmarks/cpu_standin.py)\n")
    with args.out.open("a") as fh:
        fh.write("\n".join(text) + "\n")
    print(f"median step ratio pipeline/plain, fp32: {statistics.median(fp32):.2f}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

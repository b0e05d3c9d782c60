#!/usr/bin/env python
"""The one GPU run (issue 28): the figures that matter, most valuable first, in one command of at most ~540 s.

    bash benchmarks/gpu_all.sh            (on the GPU machine; it runs this with the carried packages)
    SMOKE=1 bash benchmarks/gpu_all.sh    (the same parts on a CPU with tiny models: checks the script)

Parts, in the order of their value (each in its own processes, with its own time budget):

  env        the machine: date, GPU, driver, CUDA, library versions, which optional back-ends import (item 5)
  p2_1b      P2: the levers combined on Pythia-1B (fl+liger+flce+cstep, compiled, micro-batch cap 32)
  p2_410m    P2: the same on Pythia-410M
  p1_1b      P1: 100 sustained steps of p2_1b's setting on a fresh instance against its predicted step
  p5_train   P5: the train stage from a plan exported from p2_410m's cell (no Snakemake, no polars)
  p4_status  every method on Pythia-160M, cheapest first, three processes at once (statuses, not timings)
  p4_probes  the OOM probe and the timing-honesty check
  p6_loss    P6: the lever cells' loss against naive's on Pythia-160M (issue 39), only if time is left
  p2_cg      P2 with CUDA graphs instead of the compiled step, only if time is left

A part may use the time earlier parts left unused (each must end by the time its budget plus theirs allows) and
never more than TOTAL_S; its cells run in worker processes (gpucheck/runner.py) with a cap each, the risky paths
(Liger, cstep, cg) alone in theirs. Rows are written the moment a cell ends, and after every part everything is
packed into $OUT as four files: summary.md, summary.json, reports.tgz (every part's report and the cells' files)
and gpu_all.log, so a run cut short still brings back what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for p in (REPO / "benchmarks", REPO / "workflow"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from gpucheck.envinfo import gpu_count, gpu_type  # noqa: E402
from gpucheck.parts import (  # noqa: E402
    SMOKE_BLOCKED,
    SMOKE_SCALE,
    Part,
    build_parts,
    known_before,
    predicted_s,
    train_overhead_s,
    train_steps,
)

TOTAL_S = 540  # the device tool allows 600 s a command: this leaves time for the packing and the transfer
PACK_RESERVE_S = 8  # kept free at the end for the last packing
MAX_PACKED_FILE = 4 * 2**20  # bigger files stay out of reports.tgz (listed in the summary)
OUT_FILES = ("summary.md", "summary.json", "reports.tgz", "gpu_all.log")  # what comes back: at most 8 files
NOT_PACKED = ("data",)  # the train stage's generated corpus and tokens: megabytes, and made again from the seed


class Log:
    def __init__(self, path: Path) -> None:
        self.path, self.t0 = path, time.time()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, msg: str) -> None:
        line = f"[gpu_all {time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        with self.path.open("a") as fh:
            fh.write(line + "\n")


# ------------------------------------------------------------------------------------------------ running


class Run:
    """One run of the parts: the work folder, the log, the records, the packing."""

    def __init__(self, args: argparse.Namespace) -> None:
        from gpucheck.cells import Settings
        from pretrain_planner.planning.catalog import load_catalog

        self.args, self.t0 = args, time.time()
        self.out, self.work = Path(args.out), Path(args.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = Log(self.work / "gpu_all.log")
        self.catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
        # smoke: one torch thread a process (two on a busy 2-core machine are several times slower)
        cores = 1 if args.smoke else len(os.sched_getaffinity(0))
        self.settings = Settings(
            smoke=args.smoke,
            gpu="cpu" if args.smoke else args.gpu_type or gpu_type(self.catalog),
            warmup_steps=1,
            timed_steps=3,
            accum_factor=2,
            threads=cores,
            cells_dir=str(self.work / "cells"),
            visible_gpus=gpu_count(),
        )
        # the machine's facts always (seconds), then the parts asked for
        self.parts = [p for p in build_parts(args.smoke) if not args.parts or p.name in args.parts or p.kind == "env"]
        self.state: dict[str, dict[str, Any]] = {}
        self.env: dict[str, Any] = {}
        self.command = os.environ.get("GPU_ALL_COMMAND") or shlex.join([sys.executable, *sys.argv])

    # -- the plan ------------------------------------------------------------------------------------------
    def plan(self) -> None:
        from gpucheck import timeplan

        end = 0.0
        total = self.args.total_s
        # the least time each later part that fits in TOTAL_S by its budget needs (those past it get none reserved)
        ends, cum = [], 0.0
        for q in self.parts:
            cum += 0 if q.optional else q.budget_s
            ends.append(cum)
        fits = [not q.optional and e <= total for q, e in zip(self.parts, ends, strict=True)]
        later_min = [
            sum(q.min_s for q, f in zip(self.parts[i + 1 :], fits[i + 1 :], strict=True) if f)
            for i in range(len(self.parts))
        ]
        self.log(
            f"{'smoke (CPU, tiny models)' if self.args.smoke else 'GPU'} run; TOTAL_S {total:.0f} s; work "
            f"{self.work}; reports -> {self.out} ({', '.join(OUT_FILES)})"
        )
        for note in known_before(self.settings, self.args.block):
            self.log(f"known before running: {note}")
        self.log("time plan (budget: the part's share of TOTAL_S; predicted: benchmarks/gpucheck/timeplan.py):")
        self.log(f"  {'part':<10} {'value':<5} {'budget s':>8} {'predicted s':>11} {'ends by s':>9}  what")
        for i, part in enumerate(self.parts):
            pred = predicted_s(part, self.catalog, self.settings)
            if not part.optional:
                end += part.budget_s
            # by its budget plus what earlier parts leave, keeping the later parts' minimum
            end_by = total if part.optional else min(end, total - later_min[i])
            self.state[part.name] = {
                "value": part.value,
                "title": part.title,
                "budget_s": part.budget_s,
                "predicted_s": round(pred, 1),
                "ends_by_s": round(end_by, 1),
                "status": "pending",
                "cells": [p.label for g in part.groups for p in g],
                "records": [],
            }
            self.log(
                f"  {part.name:<10} {part.value:<5} {part.budget_s:>8.0f} {pred:>11.0f} {end_by:>9.0f}  "
                f"{part.title}{' (only on time left over)' if part.optional else ''}"
            )
            for g in part.groups if part.kind == "cells" else []:
                for plan in g:
                    self.log(
                        f"      {plan.label}: predicted {timeplan.cell_s(plan, self.catalog, self.settings):.0f}"
                        f" s, cap {timeplan.cap_s(plan, self.catalog, self.settings):.0f} s"
                        + (" (own process)" if plan.risky else "")
                    )
        over = [q.name for q, e in zip(self.parts, ends, strict=True) if not q.optional and e > total]
        if over:
            self.log(
                f"  past TOTAL_S by their budgets, so run only on time earlier parts leave: {', '.join(over)} "
                "(a second, shorter command: --parts " + ",".join(over) + ")"
            )
        self.pack()

    # -- the parts ---------------------------------------------------------------------------------------------
    def run(self) -> int:
        """The parts in order; a SIGTERM (the hard stop of gpu_all.sh) stops the workers and packs what there is."""

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, stop)
        self.plan()
        try:
            self._parts()
        except KeyboardInterrupt as exc:  # the workers are stopped by the runner on the way out
            running = [n for n, st in self.state.items() if st["status"] == "running"]
            for name in running:
                self.state[name].update(status="stopped", reason=f"the command was stopped ({exc})")
            self.log(f"stopped ({exc}) during {running}; packing what there is")
            self.pack()
            return 124
        bad = [n for n, s in self.state.items() if s["status"] in ("problems", "error")]
        self.log(
            f"done in {time.time() - self.t0:.0f} s; "
            + (f"problems in {bad}" if bad else "no problems")
            + f"; {self.out}: {', '.join(OUT_FILES)}"
        )
        self.pack(final=True)
        return 1 if bad else 0

    def _parts(self) -> None:
        for part in self.parts:
            st = self.state[part.name]
            now = time.time() - self.t0
            deadline = st["ends_by_s"] if not part.optional else self.args.total_s
            deadline = min(deadline, self.args.total_s) - (PACK_RESERVE_S if deadline >= self.args.total_s else 0)
            left = deadline - now
            if left < part.min_s:
                st.update(status="skipped", reason=f"{max(left, 0):.0f} s left of its time (needs {part.min_s:.0f})")
                self.log(f"=== {part.name} SKIPPED: {st['reason']}")
                self.pack()
                continue
            self.log(f"=== {part.name} ({part.value}): {part.title}; {left:.0f} s (predicted {st['predicted_s']:.0f})")
            st["status"], t = "running", time.time()
            try:
                getattr(self, f"_{part.kind}")(part, self.t0 + deadline)
                st["status"] = "problems" if any(_bad(r) for r in st["records"]) else "done"
            except Exception as exc:  # noqa: BLE001 - a part's failure must not stop the others
                import traceback

                st.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
                self.log(f"  {part.name} failed: {st['error']}")
            st["actual_s"] = round(time.time() - t, 1)
            self.log(f"=== {part.name} {st['status']} in {st['actual_s']:.0f} s (predicted {st['predicted_s']:.0f})")
            self.pack()

    def _env(self, part: Part, deadline: float) -> None:
        folder = self.work / part.name
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "environment.json"
        path = os.pathsep.join(p for p in (str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "GPU_ALL_COMMAND": self.command, "PYTHONPATH": path}
        with (folder / "envinfo.log").open("w") as fh:
            subprocess.run(
                [sys.executable, "-m", "gpucheck.envinfo", str(out)],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=max(1.0, deadline - time.time()),
            )
        self.env = json.loads(out.read_text())
        self.env["command"] = self.command
        self._write_report(part)
        v = self.env["versions"]
        self.log(
            f"  {self.env.get('gpu_name') or 'CPU'}, driver {self.env.get('driver')}, python {self.env['python']}, "
            f"torch {v.get('torch')}, CUDA {self.env.get('cuda_runtime')}, imports {self.env['imports']}"
        )

    def _cells(self, part: Part, deadline: float) -> None:
        from gpucheck import timeplan
        from gpucheck.runner import Runner

        folder = self.work / part.name
        folder.mkdir(parents=True, exist_ok=True)
        st = self.state[part.name]
        settings = self.settings
        if part.lanes > 1:
            from dataclasses import replace

            settings = replace(settings, threads=max(1, settings.threads // part.lanes))
        plans = [p for g in part.groups for p in g]
        caps = {p.label: timeplan.cap_s(p, self.catalog, settings) for p in plans}
        pred = {p.label: timeplan.cell_s(p, self.catalog, settings) for p in plans}

        def on_record(rec: dict[str, Any]) -> None:
            from gpucheck import checks

            st["records"].append(rec)
            checks.cross_checks(st["records"])
            with (folder / "rows.jsonl").open("a") as fh:
                fh.write(json.dumps(rec, default=str) + "\n")
            self.log(f"  {rec['label']}: {_line(rec)}")
            self._write_report(part)

        runner = Runner(
            folder,
            settings,
            sys.executable,
            str(REPO / "config/models.yaml"),
            str(REPO / "config/gpus.yaml"),
            self.log,
            on_record,
            caps,
            pred,
        )
        runner.run(part.groups, deadline, part.lanes, min_start_s=5 if self.args.smoke else 15)

    def _train(self, part: Part, deadline: float) -> None:
        from gpucheck.cells import read_record
        from gpucheck.trainrun import run_train

        st = self.state[part.name]
        records = [read_record(self.settings, p.label) for p in part.groups[0]]
        source = next((r for r in records if r and r.get("status") == "ok"), None)
        if source is None:
            seen = "; ".join(f"{r['label']}: {r.get('status')}" for r in records if r) or "not run"
            st["records"].append(
                {
                    "label": "train stage",
                    "plan": {"kind": "train"},
                    "status": "skipped",
                    "reason": f"no measured cell to export a plan from ({seen})",
                }
            )
            self.log(f"  skipped: {st['records'][-1]['reason']}")
            return
        step = source["result"]["step_time_s"]
        fixed = train_overhead_s(self.catalog.model(source["result"]["model"]).to_dict(), self.settings)
        steps = train_steps(self.settings, step, deadline - time.time() - fixed)
        self.log(
            f"  exporting {source['label']}'s plan; the train stage for {steps} steps (measured step {step:.3g} s)"
        )
        folder = self.work / part.name
        rec = run_train(source, self.catalog, folder, steps, self.settings.threads, deadline, sys.executable)
        st["records"].append(rec)
        self.log(f"  {rec['label']}: {_line(rec)}")
        self._write_report(part)

    def _loss(self, part: Part, deadline: float) -> None:
        from gpucheck.losscheck import run_loss_check

        st = self.state[part.name]
        (plan,) = part.groups[0]
        self.log(f"  {plan.label}: {', '.join(plan.methods)} against naive, {plan.steps} steps")
        for rec in run_loss_check(plan, self.catalog, self.settings.gpu, self.settings.threads,
                                  self.work / part.name, deadline):  # fmt: skip
            st["records"].append(rec)
            self.log(f"  {rec['label']}: {rec.get('loss') or ''} {_line(rec)}")
        self._write_report(part)

    # -- reports and packing ---------------------------------------------------------------------------------
    def _write_report(self, part: Part) -> None:
        from gpucheck.report import render_part

        st = self.state[part.name]
        folder = self.work / part.name
        header = [
            ("part", f"{part.name} ({part.value}): {part.title}"),
            ("command", f"`{self.command}`"),
            ("machine", _machine(self.env)),
            ("budget / predicted s", f"{part.budget_s:.0f} / {st['predicted_s']:.0f}"),
        ]
        records = [r for r in st["records"] if (r.get("plan") or {}).get("kind") != "train"]
        (folder / "report.json").write_text(json.dumps({"part": st, "environment": self.env}, indent=1, default=str))
        try:
            text = render_part(f"GPU run, {part.name}", header, records)
        except Exception as exc:  # noqa: BLE001 - a report that cannot be drawn must not stop the run: the JSON holds it
            why = f"{type(exc).__name__}: {exc}"
            text = f"# GPU run, {part.name}\n\nthe report could not be rendered ({why}); see report.json\n"
            self.log(f"  {part.name}: report not rendered: {why}")
        (folder / "report.md").write_text(text)

    def pack(self, final: bool = False) -> None:
        """summary.md / summary.json / reports.tgz / gpu_all.log into $OUT, each replaced whole (a cut leaves the
        previous one)."""
        from gpucheck.summary import render_summary

        left_out: list[str] = []
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                if not path.is_file() or path.suffix == ".tmp":
                    continue
                rel = path.relative_to(self.work)
                if any(part in NOT_PACKED for part in rel.parts):
                    continue
                if path.stat().st_size > MAX_PACKED_FILE:
                    left_out.append(f"{rel} ({path.stat().st_size / 2**20:.0f} MiB)")
                    continue
                tar.add(path, arcname=f"gpu_all/{rel}")
        meta = {
            "command": self.command,
            "smoke": self.args.smoke,
            "total_s": self.args.total_s,
            "started_utc": dt.datetime.fromtimestamp(self.t0, dt.timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": round(time.time() - self.t0, 1),
            "finished": final,
            "left_out_of_reports": left_out,
            "known_before": known_before(self.settings, self.args.block),
            "work": str(self.work),
        }
        summary = {"meta": meta, "environment": self.env, "parts": self.state}
        try:
            md = render_summary(summary)
        except Exception as exc:  # noqa: BLE001 - never lose the run to its summary: summary.json holds it all
            md = f"# GPU run\n\nsummary.md could not be rendered ({type(exc).__name__}: {exc}); see summary.json\n"
        for name, data in (
            ("summary.json", json.dumps(summary, indent=1, default=str).encode()),
            ("summary.md", md.encode()),
            ("reports.tgz", buf.getvalue()),
            ("gpu_all.log", self.log.path.read_bytes()),
        ):
            tmp = self.out / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(self.out / name)


def _bad(rec: dict[str, Any]) -> bool:
    from gpucheck.report import failed

    return failed(rec) or rec.get("status") in ("no plan",)


def _line(rec: dict[str, Any]) -> str:
    r = rec.get("result") or {}
    text = rec.get("status") or "?"
    if rec.get("status") not in ("ok", "not needed"):
        text += f" ({str(rec.get('reason') or r.get('reason') or rec.get('error') or '')[:300]})"
    if r.get("status") == "ok":
        mfu = "–" if r.get("mfu") is None else f"{r['mfu']:.1%}"
        text += (
            f": mb {r.get('micro_batch')} x {r.get('grad_accum_steps')}, step {r.get('step_time_s'):.4g} s, "
            f"{(r.get('tokens_per_s') or 0):,.0f} tok/s, MFU {mfu}, peak {(r.get('peak_mem_gib') or 0):.1f} GiB"
        )
    if rec.get("prediction_error") is not None:
        text += f": predicted / sustained - 1 = {rec['prediction_error']:+.2%}"
    if rec.get("ratio") is not None:
        text += f": train / prediction = {rec['ratio']:.3f} over {rec.get('trained_steps')} steps"
    bad = [c for c, ok in rec.get("checks") or [] if not ok]
    return text + (f"; FAILED CHECKS {bad}" if bad else "") + f" [{rec.get('cell_wall_s', rec.get('wall_s'))} s]"


def _machine(env: dict[str, Any]) -> str:
    if not env:
        return "–"
    v = env.get("versions") or {}
    return (
        f"{env.get('gpu_name') or 'CPU'}; driver {env.get('driver')}; torch {v.get('torch')}, CUDA "
        f"{env.get('cuda_runtime')}, transformers {v.get('transformers')}; {env.get('date_utc')}"
    )


def child_path(blocked: tuple[str, ...], folder: Path) -> None:
    """PYTHONPATH for every process this run starts: benchmarks/ and workflow/ first (nothing of this repository
    is installed on the GPU machine), then a package for each of `blocked` that raises ImportError (here and in
    every subprocess, as on the GPU machine, where they are not installed). `pretrain_planner` among them makes
    an installed copy unusable: a process that loses workflow/ from its path fails as it would there."""
    for name in blocked:
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed on the GPU machine (gpu_all_blocked)')\n"
        )
    if blocked:
        sys.path.insert(0, str(folder))
        for repo_path in (REPO / "workflow", REPO / "benchmarks"):
            sys.path.insert(0, str(repo_path))
    first = [str(REPO / "benchmarks"), str(REPO / "workflow"), *([str(folder)] if blocked else [])]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*first, os.environ.get("PYTHONPATH", "")) if p)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models: checks the script, not the GPU")
    p.add_argument(
        "--out",
        default=os.environ.get("OUT") or str(REPO / "benchmarks/results/gpu_all"),
        help=f"where {', '.join(OUT_FILES)} go (default $OUT)",
    )
    p.add_argument("--work", default=None, help="the run's files (default: $TMPDIR/gpu_all-<date>)")
    p.add_argument("--total-s", type=float, default=None, help=f"the whole command's time (default {TOTAL_S})")
    p.add_argument("--parts", default=None, help="comma-separated part names (default: all, in order)")
    p.add_argument("--gpu-type", default=None, help="GPU type of config/gpus.yaml (default: GPU 0's, else h200)")
    p.add_argument("--plan-only", action="store_true", help="print the time plan and stop (no GPU needed)")
    p.add_argument("--block", default=None, help=f"imports made to fail (smoke default: {','.join(SMOKE_BLOCKED)})")
    args = p.parse_args(argv)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    args.work = args.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpu_all-{stamp}")
    args.total_s = args.total_s or float(os.environ.get("TOTAL_S") or TOTAL_S * (SMOKE_SCALE if args.smoke else 1))
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()] if args.parts else None
    args.block = tuple(
        b
        for b in (args.block if args.block is not None else (",".join(SMOKE_BLOCKED) if args.smoke else "")).split(",")
        if b
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", f"{args.work}-inductor")  # shared by the parts, not packed
    child_path(args.block, Path(f"{args.work}-blocked") / "gpu_all_blocked")
    if args.plan_only:
        Run(args).plan()
        return 0
    if not args.smoke and not gpu_count():
        print(
            "gpu_all: no CUDA device visible (nvidia-smi); SMOKE=1 / --smoke checks the script on a CPU",
            file=sys.stderr,
        )
        return 2
    return Run(args).run()


if __name__ == "__main__":
    sys.exit(main())

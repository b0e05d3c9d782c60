"""`pretrain-planner train`: run an exported plan for real through the config's launcher (or --launcher):
train/jobs.py; the config's `train:` section gives the defaults of the flags left out. While the job runs, its
progress lines (train.log's `train: ` lines: step, loss, tokens/s, ETA) are shown; a run refused before it trains
(a checkpoint of another run) is one line and exit status 1."""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.cli.config import REPO, CliError, load_config, results_dir
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection, TrainSection
from pretrain_planner.tables import units


@dataclass
class Trained:
    result: dict[str, Any]  # train/jobs.run_plan's record: the run, its steps, its throughput against the prediction
    out: Path


def query(args: argparse.Namespace) -> Trained:
    """Runs the plan (the one command that acts; its answer is the run's record)."""
    from pretrain_planner.train import jobs
    from pretrain_planner.trainer.runidentity import RunRefused

    config = load_config(args)
    rec = jobs.read_plan(args.plan)
    launcher = LauncherSection.of(config["launcher"])  # the config's launcher, typed here; a flag replaces a field
    flags = {"kind": args.launcher, "site": args.site, "timeout_min": args.timeout_min}
    launcher = replace(launcher, **{k: v for k, v in flags.items() if v})
    launch = jobs.launch_settings(launcher, rec, REPO)
    out = Path(args.out) if args.out else layout.train_dir_of_plan(rec, results_dir(config))
    out = out.resolve()  # the run's folder, whatever the job's working directory
    log_path = args.log or str(out / "launch.log")
    t = TrainSection.of(config["train"])  # the config's train section, typed as the train rule has it; a flag wins
    if args.steps or args.time_budget_h:
        t = replace(t, steps=args.steps, time_budget_hours=args.time_budget_h)
    device = args.device or t.run_device(BenchmarkSection.of(config["benchmark"]).device)
    t = replace(t, data=jobs.canonical(args.data or t.data),
                tokenizer=jobs.canonical_tokenizer(args.tokenizer or t.tokenizer),
                data_dtype=args.data_dtype or t.data_dtype, data_field=args.data_field or t.data_field,
                eval_every=t.eval_every if args.eval_every is None else args.eval_every,
                eval_batches=t.eval_batches if args.eval_batches is None else args.eval_batches)  # fmt: skip
    try:
        jobs.check_data(rec, t)
    except jobs.DataError as exc:  # before any job or host lock: one line
        raise CliError(str(exc)) from None
    follow = contextlib.nullcontext() if launch.kind == "debug" else _following(out / layout.TRAIN_LOG)
    try:
        with follow:  # (the debug launcher's rank prints its lines itself)
            res = jobs.run_plan(
                jobs.plan_file(args.plan).resolve(), launch, out, log_path, t, threads=args.threads, device=device
            )
    except RunRefused as exc:
        raise CliError(str(exc)) from None
    return Trained(res, out)


@contextlib.contextmanager
def _following(log: Path, every_s: float = 0.5) -> Iterator[None]:
    """While the block runs, print the run's console lines (train.log's `train: ` lines) written from now on."""
    from pretrain_planner.train.jobs import CONSOLE_MARK

    start = log.stat().st_size if log.exists() else 0
    done = threading.Event()

    def show(pos: int) -> int:
        if not log.exists() or log.stat().st_size <= pos:
            return pos
        with log.open("rb") as fh:
            fh.seek(pos)
            chunk = fh.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        for line in complete.decode(errors="replace").splitlines():
            if CONSOLE_MARK in line:
                print(line[line.index(CONSOLE_MARK) :], flush=True)
        return pos + len(complete)

    def loop() -> None:
        pos = start
        while not done.wait(every_s):
            pos = show(pos)
        show(pos)

    thread = threading.Thread(target=loop, name="follow-train-log", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def render_json(a: Trained) -> str:
    return json.dumps(a.result, indent=1, default=str)


def render_text(a: Trained) -> str:
    """One line, its figures rounded as the tables round them (tables/units.py)."""
    res, out = a.result, a.out
    t, ratio = res["throughput"], (res["throughput"].get("ratio") or {})
    val = f", validation loss {units.number(res['val_loss'], 3)}" if res.get("val_loss") is not None else ""
    return (f"{res['model']} on {res['nodes']}x{res['gpus_per_node']} {res['gpu']} ({res['method']}): {res['steps']} "
            f"steps ({res['stop_reason']}), sustained step {units.step(t.get('step_time_s'))}, train / prediction "
            f"{units.times(ratio.get('step_time_s'))}{val}; {out / layout.RESULT}, "
            f"{out / layout.THROUGHPUT_MD}")  # fmt: skip

"""The train stage through the pipeline's one stage launcher (launch/stage.py), like the benchmark cells and the
budget stage. Imports no torch.

`local` (submitit LocalExecutor: one process per rank on this host), `slurm` (one job on the partition the site
file maps the plan's GPU type to, one task per GPU; re-attached after a driver restart through its record; a
pre-empted or timed-out run checkpoints, is requeued and resumes) and `debug` (in the caller's process, one rank).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch import stage
from pretrain_planner.launch.rankjob import EntryJob
from pretrain_planner.launch.request import Outcome, RuleLog
from pretrain_planner.planning.configtypes import Launch, LauncherSection, TrainSection, require
from pretrain_planner.planning.corpus import TRAIN_TOKENIZER, CorpusInfo, check_train_data
from pretrain_planner.results import atomic_write_text
from pretrain_planner.train.record import write_tables
from pretrain_planner.trainer.runidentity import RunRefused

CONSOLE_MARK = "train: "  # the run's lines of train.log that the console shows (progress, resume, metrics)


def plan_file(plan: str | Path, setting: str | None = None) -> Path:
    """plan.json: the file itself, the folder holding it, or (the optimal/ folder of the export) its setting's."""
    p = Path(plan)
    if p.is_dir() and setting is not None and not (p / layout.PLAN_FILE).is_file():
        p = p / setting
    return p / layout.PLAN_FILE if p.is_dir() else p


def read_plan(plan: str | Path) -> dict[str, Any]:
    p = plan_file(plan)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no plan (the export_plan rule writes results/optimal/{{model}}/{{gpu}}/"
                                "{N}x{G}/plan.json)")  # fmt: skip
    return json.loads(p.read_text())


def launch_settings(launcher: LauncherSection, plan: dict[str, Any], basedir: str | Path = ".") -> Launch:
    """How the run is launched (launch/stage.py): the config's launcher, and on SLURM the site's settings for the
    plan's GPU type."""
    require(launcher, LauncherSection, "train.jobs.launch_settings")
    gpu, nodes, world = plan["gpu"]["name"], int(plan["nodes"]), int(plan["nodes"]) * int(plan["gpus_per_node"])
    return stage.launch_settings(launcher, gpu, nodes, world, basedir, layout.PLAN_FILE, "nodes x gpus_per_node",
                                 "gpu")  # fmt: skip


def check_data(plan: dict[str, Any], train: TrainSection) -> CorpusInfo | None:
    """The run's data (`train`'s) checked against the plan's model before any job or host lock (planning/corpus.py:
    headers only); a problem is one line (DataError)."""
    require(train, TrainSection, "train.jobs.check_data")
    try:
        return check_train_data(plan["model"], train.data, train.data_dtype, train.data_field, train.tokenizer)
    except ValueError as exc:
        raise DataError(str(exc)) from None


class DataError(ValueError):
    """The train stage's data cannot be read as planned (one line: the file, the key, what is accepted)."""


def run_plan(
    plan: str | Path,
    launch: Launch,
    out_dir: str | Path,
    log_path: str | Path,
    train: TrainSection,
    *,
    threads: int = 1,
    device: str = "auto",
) -> dict[str, Any]:
    """Run plan.json through the launcher into `out_dir` (result.json, throughput.{md,csv}, run/ to resume from),
    with `train`'s budget, data, checkpoints and validation (its paths canonical already: `canonical`); `device`:
    the job's (TrainSection.run_device, or a flag). The job gets them as JSON (`TrainSection.job_options`)."""
    require(train, TrainSection, "train.jobs.run_plan")
    require(launch, Launch, "train.jobs.run_plan")
    p = plan_file(plan).resolve()
    rec = read_plan(p)
    corpus = check_data(rec, train)
    options = train.job_options()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpu, nodes, gpn = rec["gpu"]["name"], int(rec["nodes"]), int(rec["gpus_per_node"])
    world = nodes * gpn
    on_gpus, per_rank = stage.placement(launch, gpu, device, world, threads)
    kwargs = {"out": str(out), "device": device, "threads": per_rank,
              **{k: v for k, v in options.items() if v is not None}}  # fmt: skip
    log = RuleLog(log_path)
    log(f"train: plan {p} ({rec['model']['name']}, {nodes}x{gpn} {gpu}, method {rec['method']}), launcher "
        f"{launch.kind}, {per_rank} thread(s) per rank, options {json.dumps(options, default=str)}")  # fmt: skip
    if corpus is not None:
        log(f"train: data {corpus.path}: {corpus.format}, {len(corpus.files)} file(s), "
            f"{corpus.tokens if corpus.tokens is not None else 'unknown (text)'} tokens")  # fmt: skip
    req = stage.request(
        EntryJob("pretrain_planner.train.run:train_plan", {"plan": str(p), **kwargs}, restartable=False),
        f"pp-train-{rec['model']['name']}-{gpu}-{nodes}x{gpn}", launch, out, {"plan": str(p), **kwargs},
        nodes=nodes, gpus_per_node=gpn, on_gpus=on_gpus, threads=per_rank, hours=train.time_budget_hours or 0,
    )  # fmt: skip
    result = out / layout.RESULT

    def collect(outcome: Outcome) -> None:
        """It finished while the driver was away and Snakemake removed its outputs as incomplete: rank 0's returned
        result is the run's (a new job would only resume at the last step and train nothing)."""
        refused(outcome.first)
        if isinstance(outcome.first, dict) and "throughput" in outcome.first:
            atomic_write_text(result, json.dumps(outcome.first, indent=1, default=str))
            write_tables(out, outcome.first)
            log(f"job {outcome.job_id}: result.json and the throughput tables written from its returned result")

    outcome = stage.run(req, log, "train", log_path, [result], collect)
    refused(outcome.first)  # result.json may be an earlier run's: the job's own answer says
    return outcome.first if req.kind == "debug" else json.loads(result.read_text())


def refused(first: Any) -> None:
    """Raise RunRefused when the job's rank 0 refused to start (a checkpoint of another run: its one line)."""
    if isinstance(first, dict) and first.get("status") == "refused":
        raise RunRefused(first["reason"])


def train_rule(
    plan_input: str,
    wildcards: Any,
    train: TrainSection,
    launcher: LauncherSection,
    device: str,
    result: str,
    log_path: str,
    threads: int,
    basedir: str | Path,
) -> dict[str, Any]:
    """The train rule: the setting's plan.json (given, or inside the export's optimal/ folder) through the
    config's launcher (typed by the facade: Pipeline.launcher), with the config's `train` section (typed by the
    facade: Pipeline.train) on `device` (Pipeline.train_device), into the folder of the rule's `result`
    (result.json)."""
    require(train, TrainSection, "train.jobs.train_rule")
    setting = layout.setting_folder(wildcards.model, wildcards.gpu, wildcards.nodes, wildcards.gpus_per_node)
    p = plan_file(plan_input, setting)
    rec = read_plan(p)
    launch = launch_settings(launcher, rec, basedir)
    run = replace(train, data=canonical(train.data), tokenizer=canonical_tokenizer(train.tokenizer))
    return run_plan(p, launch, os.path.dirname(result), log_path, run, threads=threads, device=device)


def canonical(path: str | None) -> str | None:
    """A path given relative to the working directory, absolute (symbolic links resolved): the same data whatever
    the working directory of the job's ranks, and recorded alike by every way of launching the run."""
    return str(Path(path).expanduser().resolve()) if path else None


def canonical_tokenizer(tokenizer: str | None) -> str | None:
    """The tokenizer option made canonical: a path absolute, the word `train` (a BPE trained on the corpus,
    planning/corpus.TRAIN_TOKENIZER) as it is."""
    return tokenizer if tokenizer == TRAIN_TOKENIZER else canonical(tokenizer)

"""Where everything lives under the results folder. Every path is composed here; the Snakemake rules, the
planner, the launcher, the search, the tables, the CLI, the trainer's loop and the stages ask this module
(results/README.md says what each file holds). Inside a prepared data folder the names are its format's
(trainer/data/). Imports no torch.

    results/
      plan.csv                                   every cell of the sweep, valid or not
      config.json                                the config the sweep ran with (sweeprecord.py: what the CLI reads)
      cells/{model}/{gpu}/{N}x{G}/{method}/      one cell: result.json, steps.jsonl, cell.log, state.json ...
      search/{model}/{gpu}/{N}x{G}/              the adaptive search's rounds: round{k}.json (round_file), search.json
      tables/ plots/ report.md                   the aggregation
      loss_check/{model}/{gpu}/{N}x{G}/          the loss-equivalence check of a setting: curves.json, check.log,
                                                 runs/ (each run's curve by its key: a later check reuses it)
      loss_check/{model}/init-seed{S}.pt         the one initial state every run of the check loads
      optimal/{model}/{gpu}/{N}x{G}/             the plan to run (plan.json, training_arguments.json, launch.sh)
      budget/                                    the time-budgeted BERT stage: data/, pretrain/, glue/, glue.{csv,md};
                                                 with budget.sweep recipes/{name}/ (the same), data-seq{N}/,
                                                 sweep.{csv,md}, sweep_loss.png
      train/{model}/{gpu}/{N}x{G}/               the train stage (a plan run for real): result.json,
                                                 throughput.{md,csv}, train.log, run/ (checkpoint, steps.jsonl)
      site/preflight.md, site/preflight/         the preflight of each GPU type's partition and environment (SLURM)
      logs/                                      the rules' logs
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PLAN = "plan.csv"
SWEEP_CONFIG = "config.json"  # sweeprecord.py: the config the folder was made from
CELLS = "cells"
SEARCH = "search"
TABLES = "tables"
PLOTS = "plots"
REPORT = "report.md"
STUDY = f"{TABLES}/study"  # the study's views (tables/study.py); tables/whatif.{csv,md} beside the tables
STUDY_PLOTS = f"{PLOTS}/study"  # their plots (report/study_plots.py)
OPTIMAL = "optimal"
LOSS_CHECK = "loss_check"
LOSS_CURVES = "curves.json"  # a setting's check runs: every step's loss and gradient norm
LOSS_CHECK_LOG = "check.log"
LOSS_CHECK_RUNS = "runs"  # a setting's check runs kept by key (not a rule's output: Snakemake leaves them)
BUDGET = "budget"
TRAIN = "train"
LOGS = "logs"
PREFLIGHT_DIR = "site/preflight"  # launch/preflight.py: {gpu}.json (passed), {gpu}.stopped.json, {gpu}/ (its job)
PREFLIGHT_STOPPED = ".stopped.json"
PREFLIGHT_MD = "site/preflight.md"  # every GPU type's last preflight

# a cell's folder and its files
RESULT = "result.json"
STEPS = "steps.jsonl"
CELL_LOG = "cell.log"
SETTING_PATTERN = "{model}/{gpu}/{nodes}x{gpus_per_node}"
CELL_PATTERN = f"{CELLS}/{SETTING_PATTERN}/{{method}}"
CELL_RE = re.compile(
    rf"{CELLS}/(?P<model>[^/]+)/(?P<gpu>[^/]+)/(?P<nodes>\d+)x(?P<gpus_per_node>\d+)/(?P<method>[^/]+)"
)
CELL_STATE = "state.json"  # launch/state.py
CELL_PROGRESS = "progress.jsonl"  # launch/progress.py
SLURM_RECORD = "slurm_job.json"  # launch/rankjob.py
LOCAL_RECORD = "local_job.json"
ROUND = "round"  # search/{setting}/round{k}.json and .log: the adaptive search's k-th round (round_file)
SEARCH_FILE = "search.json"
PLAN_FILE = "plan.json"
OPTIMAL_INDEX = "index.csv"  # optimal/index.csv: every setting's plan, or why there is none
SUBMITIT = "submitit"  # a job's folder of submitit's pickles and logs
# a training run's folder (the loop's: train/.../run, budget/.../pretrain/run): outlives a killed job
CHECKPOINT = "checkpoint.pt"
DEEPSPEED_CHECKPOINTS = "deepspeed"  # ZeRO's own sharded checkpoints, named by checkpoint.pt
VALIDATION_LOG = "validation.jsonl"
# a train run's folder (train/{model}/{gpu}/{N}x{G}/) and its files
THROUGHPUT_MD = "throughput.md"
THROUGHPUT_CSV = "throughput.csv"
TRAIN_LOG = "train.log"
TRAIN_RUN = "run"  # checkpoint.pt, steps.jsonl: outlives a killed job (not a Snakemake output)


# the budget stage's folder (budget/) and its files: {recipe} is "" for the budget file's own recipe and
# recipes/{name}/ for a swept one, {data} is "data" or data-seq{N} (budget/sweep.py), {task} a GLUE task
BUDGET_INDEX = "{data}/index.json"
BUDGET_PRETRAIN = "{recipe}pretrain"  # model/, result.json (+ summary.{csv,md}, loss.png), run/
BUDGET_GLUE_TASK = "{recipe}glue/{task}"  # metrics.json (+ model/ for MNLI)
BUDGET_GLUE_TABLE = "{recipe}glue.{ext}"  # csv, md
BUDGET_SWEEP_TABLE = "sweep.{ext}"  # csv, md
BUDGET_SWEEP_PLOT = "sweep_loss.png"
METRICS = "metrics.json"
MODEL_DIR = "model"
PRETRAIN_SUMMARY = "summary.{ext}"  # csv, md
LOSS_PLOT = "loss.png"


def budget_path(results: str | Path, pattern: str, **fields: str) -> str:
    """A path under budget/ from one of the BUDGET_* patterns; the fields not given stay Snakemake wildcards."""
    names = ("data", "recipe", "task", "ext")
    return f"{results}/{BUDGET}/" + pattern.format(**{k: fields.get(k, wildcard(k)) for k in names})


def setting_folder(model: str, gpu: str, nodes: int | str, gpus_per_node: int | str) -> str:
    """{model}/{gpu}/{N}x{G}: a setting's folder below cells/, search/ and optimal/."""
    return SETTING_PATTERN.format(model=model, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node)


def cell_path(model: str, gpu: str, nodes: int | str, gpus_per_node: int | str, method: str) -> str:
    """cells/{model}/{gpu}/{N}x{G}/{method}, relative to the results folder."""
    return CELL_PATTERN.format(model=model, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node, method=method)


def cell_file(results: str | Path, folder: str, method: str, name: str = RESULT) -> str:
    """A file of a cell, from its setting's folder ({model}/{gpu}/{N}x{G})."""
    return f"{results}/{CELLS}/{folder}/{method}/{name}"


def cell_coords(path: str | Path) -> dict[str, Any] | None:
    """The cell a path lies in (cells/{model}/{gpu}/{N}x{G}/{method}[/...]), or None."""
    m = CELL_RE.search(str(path).replace("\\", "/"))
    if not m:
        return None
    d = m.groupdict()
    return {**d, "nodes": int(d["nodes"]), "gpus_per_node": int(d["gpus_per_node"])}


def all_results(results: str | Path, model: str = "*") -> list[Path]:
    """Every cell's result.json under the results folder (of one `model`, if given)."""
    return sorted(Path(results).glob(f"{CELLS}/{model}/*/*/*/{RESULT}"))


def search_dir(results: str | Path, folder: str) -> str:
    return f"{results}/{SEARCH}/{folder}"


def round_file(folder: str | Path, k: int | str, ext: str = "json") -> str:
    """{folder}/round{k}.json (or .log): the rule's pattern (k a wildcard, "{k}"), a glob's ("*") and a reader's."""
    return f"{folder}/{ROUND}{k}.{ext}"


def round_number(path: str | Path) -> int | None:
    """k of a round{k}.json, None for a file of another name."""
    p = Path(path)
    k = p.stem.removeprefix(ROUND)
    return int(k) if p.stem.startswith(ROUND) and k.isdigit() and p.suffix == ".json" else None


def optimal_dir(results: str | Path, model: str, gpu: str, nodes: int | str, gpus_per_node: int | str) -> Path:
    return Path(results) / OPTIMAL / setting_folder(model, gpu, nodes, gpus_per_node)


def table(results: str | Path, name: str) -> Path:
    """tables/{name} (e.g. "time_to_train.csv")."""
    return Path(results) / TABLES / name


def log(results: str | Path, name: str) -> str:
    """logs/{name} (e.g. "aggregate.log", "budget/pretrain.log")."""
    return f"{results}/{LOGS}/{name}"


def wildcard(name: str) -> str:
    """A Snakemake wildcard in a pattern composed here (`{name}` written as `{{name}}` in an f-string)."""
    return "{" + name + "}"


def cell_dir_pattern(results: str) -> str:
    """The benchmark rule's cell folder, with Snakemake wildcards."""
    w = {k: wildcard(k) for k in ("model", "gpu", "nodes", "gpus_per_node", "method")}
    return f"{results}/{CELL_PATTERN.format(**w)}"


def search_dir_pattern(results: str) -> str:
    """The search rules' setting folder, with Snakemake wildcards."""
    w = {k: wildcard(k) for k in ("model", "gpu", "nodes", "gpus_per_node")}
    return f"{results}/{SEARCH}/{SETTING_PATTERN.format(**w)}"


def train_dir(results: str | Path, model: str, gpu: str, nodes: int | str, gpus_per_node: int | str) -> Path:
    """train/{model}/{gpu}/{N}x{G}: where the train stage runs a setting's plan."""
    return Path(results) / TRAIN / setting_folder(model, gpu, nodes, gpus_per_node)


def train_dir_of_plan(plan: dict[str, Any], results: str | Path = "results") -> Path:
    """The train folder of a plan.json record (its model, GPU type, nodes and GPUs per node)."""
    model = plan["model"]["name"] if isinstance(plan["model"], dict) else plan["model"]
    gpu = plan["gpu"]["name"] if isinstance(plan["gpu"], dict) else plan["gpu"]
    return train_dir(results, model, gpu, plan["nodes"], plan["gpus_per_node"])


def train_dir_pattern(results: str) -> str:
    """The train rule's folder, with Snakemake wildcards."""
    w = {k: wildcard(k) for k in ("model", "gpu", "nodes", "gpus_per_node")}
    return f"{results}/{TRAIN}/{SETTING_PATTERN.format(**w)}"


def optimal_plan_pattern(results: str) -> str:
    """optimal/{model}/{gpu}/{N}x{G}/plan.json, with Snakemake wildcards."""
    w = {k: wildcard(k) for k in ("model", "gpu", "nodes", "gpus_per_node")}
    return f"{results}/{OPTIMAL}/{SETTING_PATTERN.format(**w)}/{PLAN_FILE}"


def loss_check_dir(results: str | Path, folder: str) -> str:
    """A setting's loss-check folder (`folder`: {model}/{gpu}/{N}x{G})."""
    return f"{results}/{LOSS_CHECK}/{folder}"


def loss_check_dir_pattern(results: str) -> str:
    """The loss_check rule's setting folder, with Snakemake wildcards."""
    w = {k: wildcard(k) for k in ("model", "gpu", "nodes", "gpus_per_node")}
    return loss_check_dir(results, SETTING_PATTERN.format(**w))


def loss_check_run(curves: str | Path, key: str) -> Path:
    """Where the run of key `key` of the check whose curves file is `curves` is kept."""
    return Path(curves).parent / LOSS_CHECK_RUNS / f"{key}.json"


def loss_check_init(results: str | Path, model: str, seed: int) -> str:
    """The initial weights every run of a model's check loads (written once by the first check job)."""
    return f"{results}/{LOSS_CHECK}/{model}/init-seed{seed}.pt"


def preflight_file(results: str | Path, gpu: str) -> str:
    """A GPU type's passed preflight (launch/preflight.py), the input of each of its cells."""
    return f"{results}/{PREFLIGHT_DIR}/{gpu}.json"

"""Shared helpers of the tests (a test module imports them from here, never from another test module): the real
Snakemake CLI on temporary sweeps against this repository's Snakefile, the SLURM testbed, synthetic results, the
budget stage's configs, benchmark sweeps, the train stage's plans."""

from __future__ import annotations

import contextlib
import csv
import html
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import yaml
from pretrain_planner import layout
from pretrain_planner.budget import config as bconfig
from pretrain_planner.budget import jobs
from pretrain_planner.facade.pipeline import PLAN_COLUMNS, load
from pretrain_planner.launch.preflight import JOB_PREFIX
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.configtypes import BenchmarkSection, BudgetRecipe, CostsSection, Launch, LauncherSection
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.planning.settings import KEYS, differences, resolve
from pretrain_planner.results import write_result
from pretrain_planner.tables import export
from pretrain_planner.trainer.loop import PACE_ENV
from snakemake.utils import update_config

# The smallest GPT-NeoX the catalog accepts: shared by the catalog and grid unit tests.
TINY_GPTNEOX_ARCH = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 64,
    "intermediate_size": 64,
}
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# A sweep's wall time includes waiting for the host: a local CPU job holds the whole host (launch/hostpool.py), so
# the end-to-end sweeps of the three xdist workers run their cells one at a time between them. On a 2-core host
# without native bf16, test_search_e2e's adaptive sweep held the host ~6 of its 20 min (it waited the rest behind
# the other workers' cells) and hit the old 1,200 s limit with its own work half done (CI rehearsal, 2026-12-02).
# The limit guards against a hang only; CI's own limit (90 min) bounds the whole suite.
SWEEP_TIMEOUT_S = 2700


def snakemake(
    workdir: Path,
    *args: str,
    env: dict | None = None,
    timeout: int = SWEEP_TIMEOUT_S,
    snakefile: Path = REPO / "Snakefile",
    python: Path | None = None,
) -> subprocess.CompletedProcess:
    """`snakemake -s <repo>/Snakefile -d <workdir> ...` (or another `snakefile`), output captured; `python`: run by
    that interpreter (`python -m snakemake`: another environment's, e.g. `login_env`'s)."""
    exe = [str(python), "-m", "snakemake"] if python else [str(BIN / "snakemake")]
    cmd = [*exe, "-s", str(snakefile), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=full_env, timeout=timeout)


def budget_workflow(work: Path, budget: dict, launcher: str, steps: int, **train) -> Path:
    """The `budget` target of a Snakefile of our own that includes common.smk and pretrain.smk (not the benchmark
    rules), with `budget` as work/config/budget.yaml and the main config's launcher kind `launcher`; `steps` steps
    on the fake clock (1 s each, training time: exact, where a wall clock would count start-up too), validation
    half-way and at the end, `train` keys over the file's. Returns the results folder."""
    budget["train"].update(budget_hours=steps / 3600, fake_step_s=1.0, clock="train", **train)
    budget["train"]["validation"].update(every=0.5, dense_first=0.0, dense_last=0.0)
    (work / "Snakefile").write_text(
        f'configfile: "main.yaml"\n\n\ninclude: "{REPO}/workflow/rules/common.smk"\n'
        f'include: "{REPO}/workflow/rules/pretrain.smk"\n'
    )
    main = {"catalog": {"models": str(REPO / "config/models.yaml"), "gpus": str(REPO / "config/gpus.yaml")},
            "sweep": {"models": ["tiny-bert"], "gpus": ["cpu"]}, "launcher": {"kind": launcher}}  # fmt: skip
    (work / "main.yaml").write_text(yaml.safe_dump(main))
    (work / "config").mkdir(exist_ok=True)
    (work / "config/budget.yaml").write_text(yaml.safe_dump(budget))
    proc = snakemake(work, "--cores", "2", "--force-use-threads", "budget", timeout=900, snakefile=work / "Snakefile")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work / "results"


def sections(config: dict) -> tuple[BenchmarkSection, LauncherSection]:
    """A test's partial `benchmark` and `launcher` sections typed as the facade types them (the schema's defaults
    under what the test gives): what planning/spec.cell_spec takes."""
    return BenchmarkSection.given(config.get("benchmark")), LauncherSection.given(config.get("launcher"))


def write_config(path: Path, **sections) -> Path:
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


# How the suite runs on pytest-xdist workers (pyproject's addopts, `-n 4`): most of a SLURM drill's time is waiting for
# the scheduler, and most of an end-to-end sweep's is one rank computing, so four workers (two of them the SLURM
# units) share two cores well.
# A module's tests stay on one worker (its module fixtures, Snakemake sweeps of minutes, run once, not once per
# worker). The SLURM modules run on two independent testbed clusters (cluster/testbed/instance.sh: `testbed` at
# /etc/slurm, `testbed1` at /etc/slurm-1), each cluster's modules on one worker, one after the other: the drills take
# nodes down, restart the daemons and count every job in sacct, so no other test may use their cluster meanwhile,
# but the two clusters share nothing but munged and the cores, so their units run side by side (one unit of ~38 min
# was the suite's critical path). The longest units start first (their order below; the rest follows in collection
# order), so no worker is left with a long one at the end. Two modules that read one sweep (a session fixture: made
# once per worker process) are one unit too, so the sweep is made once (SWEEP_UNITS); test_slurm and
# test_calendar_slurm share partitions_sweep, so they share a cluster.
SLURM_UNITS = {  # the unit: (its cluster's instance, its modules)
    "the SLURM testbed": (0, ("test_slurm", "test_calendar_slurm", "test_preflight_slurm")),
    "the second SLURM testbed": (1, ("test_chaos_soak", "test_slurm_faults", "test_budget_slurm")),
}
SLURM_INSTANCE = {module: instance for instance, modules in SLURM_UNITS.values() for module in modules}
SLURM_MODULES = tuple(SLURM_INSTANCE)
FIRST_MODULES = ("test_pipeline_e2e", "test_search_e2e", "test_benchmarks_smoke", "test_deepspeed", "test_sharding",
                 "test_budget_glue", "test_oom", "test_memory", "test_local_runs", "test_bad_env")  # fmt: skip
SWEEP_UNITS = {  # the module: (its unit, the shared sweep's fixtures it reads)
    "test_search_e2e": ("the default sweep", ("adaptive_sweep", "default_sweep")),
    "test_pipeline_e2e": ("the default sweep", ("adaptive_sweep", "default_sweep")),
    "test_sharding": ("tiny-bert's methods sweep", ("methods_sweep",)),
    "test_deepspeed": ("tiny-bert's methods sweep", ("methods_sweep",)),
}


def slurm_unit(stem: str) -> str | None:
    """The SLURM unit a test module belongs to, or None."""
    return next((unit for unit, (_, modules) in SLURM_UNITS.items() if stem in modules), None)


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: each SLURM testbed cluster's modules together, two modules that share a
    sweep together, else the test's module file."""
    path = nodeid.split("::", 1)[0]
    stem = Path(path).stem
    return slurm_unit(stem) or (SWEEP_UNITS[stem][0] if stem in SWEEP_UNITS else path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler by units of `unit_of`, the longest first (xdist's own `--dist loadgroup` reads
    groups from the test ids, which pytest 9.2's structured ids no longer let it change)."""
    from xdist.scheduler import LoadScopeScheduling

    order = list(dict.fromkeys([*SLURM_UNITS, *(unit_of(f"tests/{m}.py") for m in FIRST_MODULES)]))

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            first = min(self.workqueue, key=lambda unit: order.index(unit) if unit in order else len(order))
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """Every test on a SLURM testbed cluster must sit in one of SLURM_UNITS' modules, or a worker would run it beside
    a drill (partitions_sweep's in the first cluster's, where it runs); every test of a shared sweep in one of its
    SWEEP_UNITS modules, or another worker would make the sweep again."""
    stray = sorted(item.nodeid for item in items if ("slurm_cluster" in item.fixturenames
                   and slurm_unit(Path(item.path).stem) is None) or ("partitions_sweep" in item.fixturenames
                   and SLURM_INSTANCE.get(Path(item.path).stem) != 0))  # fmt: skip
    if stray:
        raise pytest.UsageError(f"tests on a SLURM testbed cluster outside tests/conftest.py SLURM_UNITS: {stray}")
    shared = {f: unit for unit, fixtures in SWEEP_UNITS.values() for f in fixtures}
    stray = sorted(item.nodeid for item in items for f in item.fixturenames if f in shared
                   and unit_of(item.nodeid) != shared[f])  # fmt: skip
    if stray:
        raise pytest.UsageError(f"tests of a shared sweep outside tests/conftest.py SWEEP_UNITS: {stray}")


# Every test phase's start, end and xdist worker, for benchmarks/suite_time.py (each module's time, each worker's
# timeline, the critical path): one JSON line per phase in .pytest_cache/suite_times/<subset>.jsonl, written by the
# controller as the reports come in (on xdist the workers' reports reach it with their worker), after a first line
# with the session's start; a run of the same subset replaces the file.
_TIMES: dict = {}


def pytest_sessionstart(session):
    if os.environ.get("PYTEST_XDIST_WORKER") or session.config.option.collectonly:
        return
    expr = session.config.option.markexpr or "all"
    subset = re.sub(r"[^a-z0-9]+", "-", expr.lower()).strip("-") or "all"
    folder = Path(session.config.rootpath) / ".pytest_cache/suite_times"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        _TIMES["file"] = open(folder / f"{subset}.jsonl", "w")  # noqa: SIM115 - open for the whole session
        workers = getattr(session.config.option, "numprocesses", None)
        head = {"session": {"start": time.time(), "markexpr": expr, "workers": workers}}
        _TIMES["file"].write(json.dumps(head) + "\n")


def pytest_runtest_logreport(report):
    fh = _TIMES.get("file")
    if fh is None:
        return
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    fh.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "worker": worker,
                         "start": report.start, "stop": report.stop, "duration": report.duration}) + "\n")  # fmt: skip
    fh.flush()


def pytest_sessionfinish(session):
    fh = _TIMES.pop("file", None)
    if fh is not None:
        fh.write(json.dumps({"session": {"stop": time.time()}}) + "\n")
        fh.close()


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """Each test leaves os.environ as it found it: on an xdist worker the next test is any module's, and a variable
    one left set (an in-process one-rank cell sets RANK, LOCAL_RANK, WORLD_SIZE for DeepSpeed) made a later one fail
    (accelerate waited for a torchrun rendezvous). Only what changed is put back, key by key."""
    before = dict(os.environ)
    yield
    for key in [k for k in os.environ if k not in before]:
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture
def repo() -> Path:
    return REPO


def _slurm_healthy(env: dict[str, str]) -> bool:
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in out.stdout


SLURM_ENV_KEYS = ("SLURM_TESTBED_INSTANCE", "SLURM_CONF")  # what slurm_env may set: the rest of a SLURM module's env


def slurm_env(instance: int) -> dict[str, str]:
    """The environment that points SLURM's commands (and cluster/testbed's scripts) at a testbed cluster: instance 0
    is SLURM's default place, /etc/slurm; instance 1's config is /etc/slurm-1 (cluster/testbed/instance.sh). sbatch
    carries SLURM_CONF into the jobs, and slurmd sets it in them too."""
    if instance == 0:
        return {}
    return {"SLURM_TESTBED_INSTANCE": str(instance), "SLURM_CONF": f"/etc/slurm-{instance}/slurm.conf"}


@pytest.fixture(scope="module", autouse=True)
def _slurm_instance(request):
    """A SLURM module's tests, fixtures and subprocesses talk to its own testbed cluster (SLURM_UNITS): the module's
    environment is set before its module fixtures (autouse comes first in its scope) and put back after it."""
    instance = SLURM_INSTANCE.get(Path(request.path).stem)
    if instance is None:
        yield
        return
    before = {k: os.environ.pop(k, None) for k in SLURM_ENV_KEYS}
    os.environ.update(slurm_env(instance))
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def testbed_up(instance: int) -> None:
    """The live single-host SLURM cluster `instance` of cluster/testbed: started if it is not running (needs root)."""
    import shutil

    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        pytest.skip("SLURM is not installed: run `bash envs/setup.sh test` (installs cluster/testbed packages)")
    env = {k: v for k, v in os.environ.items() if k not in SLURM_ENV_KEYS}
    env.update(slurm_env(instance))
    if not _slurm_healthy(env) and os.geteuid() != 0:
        pytest.skip(f"the SLURM testbed's cluster {instance} is down and starting it needs root: "
                    f"SLURM_TESTBED_INSTANCE={instance} bash cluster/testbed/slurm-up.sh")  # fmt: skip
    # idempotent: a no-op (~0.2 s) on a healthy cluster, a fresh cluster otherwise
    proc = subprocess.run(["bash", str(REPO / "cluster/testbed/slurm-up.sh")], capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def slurm_cluster(request):
    """The module's testbed cluster (SLURM_UNITS), running."""
    testbed_up(SLURM_INSTANCE.get(Path(request.path).stem, 0))
    return True


# A drill's job must run for a while (to be caught running, killed, requeued, to outlast a time limit): its steps are
# paced (trainer/loop.py PP_TEST_STEP_S: each step lasts PACE_S, the rest slept), so it lasts as long on a fast host as
# on a slow one and keeps no core busy meanwhile (unpaced, such drills burned a core each for their whole length: a
# tenth of the suite's CPU on a 2-core host). A drill asks steps_lasting(seconds) steps and passes PACED in the
# environment of the process that starts the job (the driver, `pretrain-planner train`): its ranks inherit it.
PACE_S = 0.5
PACED = {PACE_ENV: str(PACE_S)}


def steps_lasting(seconds: float) -> int:
    """Steps of a paced run (PACED) that lasts about `seconds` (a job's start-up comes on top)."""
    return max(10, math.ceil(seconds / PACE_S))


# ---------------------------------------- synthetic cell results and the catalog (tables, export, CLI, plots)
CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


COSTS = CostsSection.given({"amortisation_years": 5, "pareto_cost": "hardware"})  # typed, as the facade types it


def cell_result(model, gpu, nodes, gpn, method, status="ok", days=None, mb=4, suspect=False, **extra):
    """A plausible result.json for a cell; `days` sets the step time through the recipe's steps."""
    m = CATALOG.models[model]
    world = nodes * gpn
    r = {"status": status, "model": model, "gpu": gpu, "nodes": nodes, "gpus_per_node": gpn, "world_size": world,
         "method": method, "precision": m.recipe.precision, "global_batch": m.recipe.global_batch,
         "wall_time_s": 360.0, "versions": {"torch": "synthetic"}}  # fmt: skip
    if status == "ok":
        steps = m.recipe.steps
        step = days * 86400 / steps if days is not None else 0.5
        per_sample = train_flops_per_sample(m.to_dict())
        flops = per_sample * m.recipe.global_batch
        peak = CATALOG.gpus[gpu].peak_for(m.recipe.precision, tf32=method.startswith("fl"))
        r.update(
            micro_batch=mb, grad_accum_steps=m.recipe.global_batch // world // mb, step_time_s=step,
            step_time_p10_s=0.95 * step, step_time_p90_s=1.1 * step, timed_steps=5, warmup_steps=2,
            samples_per_s=m.recipe.global_batch / step, tokens_per_s=m.recipe.global_batch * 2048 / step,
            flops_per_step=flops, peak_tflops=peak, mfu=flops / (step * world * peak * 1e12) if peak else None,
            suspect=suspect, peak_mem_gib=40.0, recipe_steps=steps,
            training_days=steps * step / 86400 if steps else None,
            steps_in_budget=m.recipe.time_budget_hours * 3600 / step if m.recipe.time_budget_hours else None,
            method_settings={"base": method.split("+")[0]}, micro_batch_trials=[{"micro_batch": mb, "fits": True}],
        )  # fmt: skip
    else:
        r["reason"] = "micro-batch 1 does not fit on every rank" if status == "oom" else "not here"
    r.update(extra)
    return r


def write_set(root, results: list[dict], invalid: list[tuple] = ()) -> tuple[str, list[str]]:
    """plan.csv (the results' cells, valid, plus `invalid` (model, gpu, nodes, gpn, method, reason)) and the
    result files; returns (plan path, result paths)."""
    rows, paths = [], []
    for r in results:
        path = f"cells/{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        rows.append({"model": r["model"], "gpu": r["gpu"], "nodes": r["nodes"], "gpus_per_node": r["gpus_per_node"],
                     "world_size": r["nodes"] * r["gpus_per_node"], "method": r["method"], "valid": True, "reason": "",
                     "per_rank_batch": 1.0, "partition": "gpu", "time_limit_min": 60,
                     "gpu_hours_max": float(r["nodes"] * r["gpus_per_node"]), "path": path})  # fmt: skip
        write_result(root / path / "result.json", r)
        paths.append(str(root / path / "result.json"))
    for model, gpu, nodes, gpn, method, reason in invalid:
        rows.append({"model": model, "gpu": gpu, "nodes": nodes, "gpus_per_node": gpn, "world_size": nodes * gpn,
                     "method": method, "valid": False, "reason": reason, "per_rank_batch": 1.0, "partition": "gpu",
                     "time_limit_min": 60, "gpu_hours_max": 0.0,
                     "path": f"cells/{model}/{gpu}/{nodes}x{gpn}/{method}"})  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "plan.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=PLAN_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return str(root / "plan.csv"), paths


P = "pythia-1b"


# (gpu, nodes, gpn, method, status, days): the hand-made Pythia-1B sweep. Hardware prices per setting:
# a100 x1 $20,000, x2 $39,500, x4 $83,500; h100 x1 $31,000, x4 $127,500; rtx3090 x1 $2,300, x2 $4,100;
# a6000 x4 $26,700, x8 $48,900; 2 nodes x 4 a100 $167,000; h200 has no price.
GPU_SET = [
    ("a100", 1, 1, "naive", "oom", None),
    ("a100", 1, 1, "fl", "ok", 60.0),
    ("a100", 1, 2, "naive", "ok", 40.0),
    ("a100", 1, 2, "fl", "ok", 30.0),
    ("a100", 1, 4, "naive", "ok", 25.0),
    ("a100", 1, 4, "fl", "ok", 20.0),
    ("a100", 1, 4, "fl+zero1", "ok", 17.57),
    ("h100", 1, 4, "fl", "ok", 8.0),
    ("h100", 1, 1, "fl", "ok", 70.0),  # dominated by a100 x1 (60 d, $20,000)
    ("rtx3090", 1, 1, "naive", "oom", None),
    ("rtx3090", 1, 1, "fl", "oom", None),
    ("rtx3090", 1, 1, "fl+ac", "ok", 200.0),
    ("rtx3090", 1, 2, "fl", "ok", 108.0),
    ("rtx3090", 1, 4, "naive", "oom", None),
    ("rtx3090", 1, 4, "fl", "oom", None),
    ("a6000", 1, 4, "fl", "ok", 40.0),
    ("a6000", 1, 8, "fl", "ok", 35.0),  # dominated by a100 x2 (30 d, $39,500)
    ("a6000", 1, 8, "fl+fsdp-full", "ok", 36.0),
    ("h200", 1, 8, "fl", "ok", 5.0),  # no price: blank cost
    ("a100", 2, 4, "fl+fsdp-full", "ok", 9.0),  # dominated by h100 x4 (8 d, $127,500)
    ("h100", 1, 2, "fl+ac", "ok", 1.0),  # suspect: never the best
    ("h100", 1, 2, "fl", "ok", 25.0),
]


def gpu_set_results() -> list[dict]:
    out = [cell_result(P, g, n, k, m, s, d, suspect=(g, k, m) == ("h100", 2, "fl+ac")) for g, n, k, m, s, d in GPU_SET]
    out.append(cell_result("bert-24h", "a100", 1, 1, "fl", "ok", None))
    out.append(cell_result("tiny-gptneox", "cpu", 1, 1, "naive", "ok", 0.01))
    out.append(cell_result("tiny-gptneox", "cpu", 1, 1, "fl", "ok", 0.008))
    return out


INVALID = [(P, "v100", 1, 1, "naive", "bf16 (recipe precision of pythia-1b) is not supported by v100")]


# ---------------------------------------- the budget stage's configs
def budget_cfg(tmp_path, load=True, **over):
    """A tiny budget config (the shipped corpus), written to tmp_path and loaded like the pipeline does
    (`load=False`: only its path)."""
    import yaml

    raw = {
        "seed": 0,
        "corpus": {"files": [str(REPO / "tests/data/corpus/*.txt")], "validation_fraction": 0.1},
        "tokenizer": {"vocab_size": 300},
        "data": {"seq_len": 32, "duplication_factor": 2, "samples_per_shard": 150, "docs_per_batch": 40},
        "model": {"family": "roberta-prelayernorm", "arch": {"hidden_size": 32, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "intermediate_size": 64, "type_vocab_size": 1,
                  "sparse_prediction": True}},
        "train": {"budget_hours": 12 / 3600, "clock": "train", "global_batch": 8, "micro_batch": 4, "fake_step_s": 1.0,
                  "checkpoint_every_s": 4, "early_stop": [], "finetune_checkpoints": [0.5],
                  "validation": {"every": 0.25, "dense_every": 0.1, "dense_first": 0.0, "dense_last": 0.0,
                                 "max_samples": 16}},
        "glue": {"data_dir": str(REPO / "tests/data/glue"), "tasks": ["mnli", "rte", "stsb", "mrpc"], "lr": 1e-3,
                 "batch": 16, "epochs": 1, "max_len": 48, "warmup_steps": 1},
    }  # fmt: skip
    for section, values in over.items():
        raw[section] = {**raw[section], **values} if isinstance(values, dict) else values
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(raw))
    return bconfig.load(path) if load else path


# ---------------------------------------- the budget stage's pre-training through the local launcher
LOCAL_LAUNCH = Launch(LauncherSection.given({"kind": "local", "timeout_min": 10}), None, None)
DEBUG_LAUNCH = Launch(LauncherSection.given({"kind": "debug", "timeout_min": 1}), None, None)


def budget_steps(run_dir):
    return [json.loads(ln) for ln in (run_dir / "steps.jsonl").read_text().splitlines()]


def run_budget(cfg, tmp, name, **kw):
    d = tmp / name
    return jobs.pretrain(BudgetRecipe.of(cfg), LOCAL_LAUNCH, str(tmp / "data/index.json"), str(d / "model"),
                         str(d / "result.json"), str(d / "run"), str(d / "log"), threads=2, **kw)  # fmt: skip


def assert_kill_resume_matches(cfg, tmp, ref: str, name: str, ref_result, rel: float, abs_: float) -> None:
    """Rank 0 SIGKILLed after step 6 (last checkpoint at 4), then rerun: it resumes at step 4 and its 12 losses
    and validation loss match the uninterrupted run `ref` (the same cfg)."""
    with pytest.raises(RuntimeError, match="failed in job"):
        run_budget(cfg, tmp, name, kill_at_step=6)  # rank 0 dies; rank 1's next collective fails
    assert len(budget_steps(tmp / name / "run")) == 6 and not (tmp / name / "result.json").exists()
    resumed = run_budget(cfg, tmp, name)
    assert "resumed at step 4" in (tmp / name / "log").read_text()
    want, got = budget_steps(tmp / ref / "run"), budget_steps(tmp / name / "run")
    assert [s["step"] for s in got] == list(range(1, 13))
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], rel=rel, abs=abs_)
    assert resumed["val_loss"] == pytest.approx(ref_result["val_loss"], rel=rel)


# ---------------------------------------- the live SLURM testbed
SITE = str(REPO / "tests/data/site-testbed.yaml")


PROFILE = str(REPO / "cluster/slurm")


def bench(timed_steps: int) -> dict:
    """The testbed cells' benchmark section: CPU ranks, tiny steps; noise is not what these tests check."""
    return {"warmup_steps": 1, "timed_steps": timed_steps, "max_micro_batch": 4, "device": "cpu", "max_spread": 50}


def sacct(after: int, name: str | None = None, preflight: bool = False) -> list[dict[str, str]]:
    """Jobs (allocations, not steps) with an id above `after`; sacct can lag a moment behind. A sweep's preflight
    jobs (one per GPU type before its cells) are left out unless `preflight`: a test counts its cells' jobs."""
    fields = ["JobID", "JobName", "Partition", "AllocTRES", "State", "NodeList"]
    cmd = ["sacct", "-X", "-n", "-P", "-S", "2020-01-01", "-o", ",".join(f + "%200" for f in fields)]
    if name:
        cmd += ["--name", name]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [dict(zip(fields, ln.split("|"), strict=True)) for ln in out.splitlines() if ln.strip()]
    rows = [r for r in rows if preflight or not r["JobName"].startswith(JOB_PREFIX)]
    return [r for r in rows if int(r["JobID"].split("_")[0]) > after]


LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED", "RESIZING")


def ended(after: int, name: str, timeout: float = 90) -> list[dict[str, str]]:
    """The jobs named `name` once accounting shows each one ended: a driver moves on as soon as a job's results
    are on disk, while the job itself may still be exiting (RUNNING in sacct for a moment longer)."""
    done = lambda: (jobs := sacct(after, name)) and not any(j["State"].startswith(LIVE_STATES) for j in jobs) and jobs  # noqa: E731
    return wait_for(done, timeout, f"sacct to record the end of {name}")


def last_job_id() -> int:
    """The newest job id so far: a test counts only the jobs it submitted itself. The controller's too (`job_ids`):
    right after a bring-up a plain sacct can list nothing yet (cluster/testbed/README.md), and the bring-up's smoke
    jobs would count as the test's."""
    return max((int(j.split("_")[0]) for j in job_ids()), default=0)


def wait_for(predicate, timeout: float, what: str, every: float = 1.0):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def cell_results(work: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((work / "results/cells").glob("*/*/*/*/result.json"))]


def start_driver(work: Path, cfg: Path, *targets: str, env: dict | None = None) -> subprocess.Popen:
    """The SLURM profile's driver in the background (its output in work/driver.log), building `targets` (none:
    everything); `env` over this process's environment (PACED for a drill's paced steps)."""
    cmd = [str(BIN / "snakemake"), *targets, "-s", str(REPO / "Snakefile"), "-d", str(work), "--profile", PROFILE,
           "--configfile", str(cfg)]  # fmt: skip
    log = open(work / "driver.log", "a")  # noqa: SIM115 - the driver outlives this function
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
    return subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def dump_driver_threads(driver: subprocess.Popen) -> None:
    """A driver that did not stop when asked: SIGABRT, so its fault handler writes every thread's stack to
    driver.log (PYTHONFAULTHANDLER) before it dies, for the failure's report."""
    if driver.poll() is None:
        os.kill(driver.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            driver.wait(timeout=10)


# ---------------------------------------- benchmark sweeps through the local launcher
TIMED = 3


# wiring, not noise; no loss check (tests/test_loss_check.py checks it: these sweeps' tests read cells and plans)
BENCH = {"warmup_steps": 1, "timed_steps": TIMED, "max_micro_batch": 4, "max_spread": 50, "loss_check": {"mode": "off"}}


def snakemake_bounded(workdir: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """`snakemake ...` in its own session; past `timeout` the whole tree (driver and every rank) is killed
    and the test fails: a hang can neither block the suite nor leave processes behind."""
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"snakemake did not finish within {timeout} s (a hang?)\n{out[-3000:]}\n{err[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_sweep(
    work: Path,
    models: list[str],
    methods: list[str],
    env: dict | None = None,
    timeout: int = 600,
    targets: tuple[str, ...] = ("cells",),
):
    """A local sweep of `models` x `methods` on 2 CPU ranks (BENCH), building `targets` (the cells; their tables and
    reports only where a test reads them)."""
    cfg = write_config(
        work / "sweep.yaml",
        sweep={"models": models, "gpus": ["cpu"], "nodes": [1], "gpus_per_node": [2], "methods": methods},
        launcher={"kind": "local", "timeout_min": 5},
        benchmark=BENCH,
    )
    proc = snakemake_bounded(
        work, *targets, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg), env=env,
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work


def cell(work: Path, model: str, method: str, ranks: int = 2) -> tuple[dict, list[dict]]:
    d = work / "results/cells" / model / "cpu" / f"1x{ranks}" / method
    result = json.loads((d / "result.json").read_text())
    steps = [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]
    return result, steps


def losses(steps: list[dict]) -> list[float]:
    return [s["loss"] for s in steps]


def leftover_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (a test's work folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


# ---------------------------------------- DeepSpeed
HAVE_DS = importlib.util.find_spec("deepspeed") is not None


# ---------------------------------------- end-to-end sweeps two modules share (each pair one unit: SWEEP_UNITS)
# On the slowest 2-core host the suite took ~43 min, much of it the same cells measured twice with their cold
# compiles (each cell is a fresh process): tests/test_search_e2e.py's probes are the default sweep's naive and fl
# cells, which tests/test_pipeline_e2e.py measured again in a folder of its own, and tests/test_sharding.py and
# tests/test_deepspeed.py each ran a tiny-bert sweep with its own naive cell, tables, report and loss check.
DEMO = yaml.safe_load((REPO / "config/config.yaml").read_text())
DEMO_LAUNCHER = {"kind": "local", "timeout_min": 15}
# the default sweep's benchmark with fewer timed steps and a wide spread limit (the wiring is the subject, not the
# timings); the adaptive runs use it too, without the loss check, which is the default sweep's (a cell's spec, its
# Snakemake params, leaves the loss check out: the default sweep finds the adaptive runs' cells measured)
DEMO_BENCH = {"warmup_steps": 1, "timed_steps": TIMED, "max_micro_batch": 4, "max_spread": 50,
              "loss_check": DEMO["benchmark"]["loss_check"]}  # fmt: skip
ADAPTIVE_MODELS = ["tiny-gptneox", "tiny-bert"]
ADAPTIVE_RANKS = [1, 2]
ADAPTIVE_METHODS = ["naive", "fl", "fl+ac", "fl+fsdp-grad", "fl+ac+fsdp-grad", "fl+fsdp-grad+off"]


@pytest.fixture(scope="session")
def adaptive_sweep(tmp_path_factory):
    """tests/test_search_e2e.py's runs, the first in the default sweep's folder: a dry run and the adaptive sweep
    (tiny models x 1, 2 ranks x six methods; its probes are the default sweep's naive and fl cells, trained for real,
    the checkpoint prunes the rest), `status`, the adaptive sweep again (nothing to do), then the exhaustive naive +
    fl sweep over the same results (only its cells table rebuilt: what test_search_e2e replays). No loss check: the
    default sweep checks every setting once, with fl+ac. The folder as they leave it is copied to `work` for the
    search's tests; `default_sweep` goes on in the original (`shared`), measuring only what the probes did not."""
    import shutil

    import polars as pl

    shared = tmp_path_factory.mktemp("default-sweep")
    sweep = {"models": ADAPTIVE_MODELS, "gpus": ["cpu"], "nodes": [1], "gpus_per_node": ADAPTIVE_RANKS}
    common = {"launcher": DEMO_LAUNCHER, "benchmark": {**DEMO_BENCH, "loss_check": {"mode": "off"}}}
    adaptive = write_config(shared / "adaptive.yaml", sweep={**sweep, "methods": ADAPTIVE_METHODS},
                            search={"strategy": "adaptive"}, **common)  # fmt: skip
    exhaustive = write_config(shared / "exhaustive.yaml", sweep={**sweep, "methods": ["naive", "fl"]}, **common)
    profile = ["--profile", str(REPO / "cluster/local"), "--cores", "2"]
    dry = snakemake(shared, "-n", "--cores", "2", "--configfile", str(adaptive))
    assert dry.returncode == 0, dry.stderr[-3000:]
    first = snakemake(shared, *profile, "--configfile", str(adaptive))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    tables = {name: pl.read_csv(shared / f"results/tables/{name}.csv") for name in ("cells", "benchmark_cost")}
    tables["report"] = (shared / "results/report.md").read_text()
    cmd = [sys.executable, "-m", "pretrain_planner", "status", "--results", str(shared / "results")]
    status = subprocess.run(cmd, cwd=shared, capture_output=True, text=True, timeout=120)
    again = snakemake(shared, *profile, "--configfile", str(adaptive))
    second = snakemake(shared, "results/tables/cells.parquet", *profile, "--configfile", str(exhaustive))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    work = tmp_path_factory.mktemp("adaptive")
    shutil.copytree(shared / "results", work / "results", symlinks=True)
    return {"work": work, "shared": shared, "dry": dry, "first": first, "again": again, "second": second,
            "tables": tables, "status": status}  # fmt: skip


@pytest.fixture(scope="session")
def default_sweep(adaptive_sweep):
    """The default sweep (config/config.yaml's grid, its loss check and costs, the cpu stand-in's nominal price) with
    DEMO_BENCH, through the local profile, in the folder the adaptive runs left: their cells are this sweep's naive
    and fl cells, so it measures fl+ac and the loss checks. (folder, config, the run)."""
    work = adaptive_sweep["shared"]
    cfg = write_config(
        work / "sweep.yaml", sweep=DEMO["sweep"], launcher=DEMO_LAUNCHER, benchmark=DEMO_BENCH, costs=DEMO["costs"],
        train={"steps": 5},  # the README's train target on this sweep
    )  # fmt: skip
    probes = {p: p.stat().st_mtime_ns for p in (work / "results/cells").glob("*/*/*/*/result.json")}
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # the sharing holds: the probes were not measured again (a cell spec of another benchmark section would be)
    assert len(probes) == 8 and {p: p.stat().st_mtime_ns for p in probes} == probes
    return work, cfg, proc


SHARDING_METHODS = ["naive", "naive+ac", "naive+fsdp-grad", "naive+fsdp-full", "naive+fsdp-full+off", "fl+fsdp-full"]
ZERO_METHODS = ["naive+zero1", "naive+zero2", "naive+zero3", "naive+zero2+off", "naive+zero3+off"]


@pytest.fixture(scope="session")
def methods_sweep(tmp_path_factory):
    """One Snakemake run of tiny-bert (fp32: losses agree across methods to float rounding) on 2 gloo ranks:
    tests/test_sharding.py's DDP, activation checkpointing, FSDP2 in both modes, with CPU offload and compiled, and,
    where DeepSpeed is installed, tests/test_deepspeed.py's ZeRO-1/2/3 with and without offload; one naive cell,
    one set of tables for both. The folder."""
    methods = SHARDING_METHODS + (ZERO_METHODS if HAVE_DS else [])
    return run_sweep(
        tmp_path_factory.mktemp("methods"),
        ["tiny-bert"],
        methods,
        timeout=SWEEP_TIMEOUT_S,
        targets=("cells", "results/optimal"),
    )


# ---------------------------------------- recorded settings against the export's
def plan_row(method: str, nodes: int, gpn: int, mb: int, accum: int) -> dict:
    return {"best_method": method, "nodes": nodes, "gpus_per_node": gpn, "micro_batch": mb,
            "grad_accum_steps": accum, "step_time_s": 1.0, "training_days": 1.0}  # fmt: skip


def as_json(value):
    return json.loads(json.dumps(value))


def assert_recorded_is_exported(work: Path, model: str, method: str, ranks: int, gpu: str = "cpu") -> None:
    """The cell's result.json method_settings hold, for every key of planning.settings, the value the export
    writes into plan.json for that cell; and the exported arguments carry the same DeepSpeed dict / FSDP policy."""
    folder = layout.setting_folder(model, gpu, 1, ranks)
    result = json.loads(Path(layout.cell_file(work / "results", folder, method)).read_text())
    recorded = result["method_settings"]
    row = plan_row(method, 1, ranks, result["micro_batch"], result["grad_accum_steps"])
    spec_model, spec_gpu = CATALOG.model(model), CATALOG.gpus[gpu]
    planned = export.settings_for(spec_model, spec_gpu, row, recorded)
    assert set(KEYS) <= set(recorded), sorted(set(KEYS) - set(recorded))
    assert {k: as_json(recorded[k]) for k in KEYS} == as_json(planned), differences(planned, recorded)
    args, ds, _ = export.training_arguments(spec_model, spec_gpu, row, settings=planned)
    assert args.get("deepspeed") == recorded["deepspeed_config"] == ds
    assert (
        args["torch_compile"] is recorded["compile"]
        and args["gradient_checkpointing"] is recorded["activation_checkpointing"]
    )


# ---------------------------------------- config/paper.yaml as Snakemake builds it
@pytest.fixture(scope="module")
def paper():
    """The pipeline as Snakemake builds it: config/paper.yaml merged over config/config.yaml."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config/paper.yaml").read_text()))
    return load(config, REPO, "config/paper.yaml")


# ---------------------------------------- the shipped catalog files
MODELS_YAML = REPO / "config" / "models.yaml"


GPUS_YAML = REPO / "config" / "gpus.yaml"


# ---------------------------------------- the 24-hour preset
PRESET = REPO / "config/budget-24h.yaml"


CORPUS = [str(REPO / "tests/data/corpus/*.txt")]


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def preset_cfg(tmp_path, **over) -> dict:
    """The preset with `over` merged over it (a user's file that includes it), corpus pointed at the test corpus."""
    raw = merged(yaml.safe_load(PRESET.read_text()), {"corpus": {"files": CORPUS}, **over})
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(raw))
    return bconfig.load(path, REPO)


# ---------------------------------------- the train stage's plans
def write_plan(folder: Path, model: str, mb: int = 4, gpus_per_node: int = 1, method: str = "naive") -> Path:
    """A plan.json as the export writes it: the catalog's model and GPU, the method, a measurement."""
    spec, gpu = CATALOG.model(model), CATALOG.gpu("cpu")
    gb = spec.recipe.global_batch
    plan = {
        "model": spec.to_dict(), "gpu": gpu.to_dict(), "nodes": 1, "gpus_per_node": gpus_per_node, "method": method,
        "measured": {"micro_batch": mb, "grad_accum_steps": gb // (mb * gpus_per_node), "step_time_s": 0.5,
                     "samples_per_s": gb / 0.5, "tokens_per_s": gb * (spec.recipe.sequence_length or 0) / 0.5 or None},
    }  # fmt: skip
    # the method's concrete settings, as the export records them
    accum = gb // mb // gpus_per_node
    spec = RunSpec.of(plan["model"], plan["gpu"], method, gpus_per_node)
    plan["method_settings"] = resolve(spec, mb, accum).as_dict()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    return folder / "plan.json"


def steps_of(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "run/steps.jsonl").read_text().splitlines()]


def plain_text(text: str) -> str:
    """Text without markup (HTML tags, Markdown's and reStructuredText's), whitespace collapsed."""
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return " ".join(re.sub(r"[`*]", "", text).split())


def slurm_conf(*pairs: str) -> None:
    """slurm.conf settings of the running testbed changed (KEY, VALUE, KEY, VALUE ...), its daemons restarted once
    with their state kept (cluster/testbed/daemon.sh conf): a restrictive site's settings for a drill; the caller
    puts them back."""
    cmd = ["bash", str(REPO / "cluster/testbed/daemon.sh"), "conf", *pairs]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# The restrictive site (issue 53): a QOS capping a user's submitted jobs enforced, requeue only where a job asks it,
# a job over its partition's limits accepted (then pending for ever), tasks bound to their CPUs
# (cluster/testbed/daemon.sh profile restrictive); `permissive` puts the testbed's own values back (slurm-up.sh's).
# QOS `pp-cap` (MaxSubmitJobsPerUser=2) is slurm-up.sh's.
CAP_QOS, CAP = "pp-cap", 2


def slurm_profile(name: str) -> None:
    """The running testbed reconfigured as the `restrictive` site, or back to its `permissive` self (daemon.sh)."""
    proc = subprocess.run(["bash", str(REPO / "cluster/testbed/daemon.sh"), "profile", name], capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@contextlib.contextmanager
def restrictive_site():
    """The testbed's daemons reconfigured as a restrictive site for the block, the permissive testbed after."""
    slurm_profile("restrictive")
    try:
        yield
    finally:
        slurm_profile("permissive")


def rpc_counts() -> dict[str, int]:
    """slurmctld's remote procedure calls so far by message type (`sdiag`): what the controller has been asked."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    section = out.split("by message type", 1)[1].split("by user", 1)[0]
    return {name: int(n) for name, n in re.findall(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)}


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job` of one job as its key=value fields."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def job_ids() -> set[str]:
    """Every job id the controller (in any state) and accounting know: what a test that must submit nothing counts."""
    queued = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i"], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    return set(queued.split()) | {j["JobID"] for j in sacct(-1, preflight=True)}


# the packages a login node's environment lacks (torch, and what cannot be imported without it)
TORCH_ONLY = ("torch", "functorch", "deepspeed", "triton", "nvidia")


def login_env(folder: Path) -> Path:
    """A login node's environment: a virtual environment with every package of the project's environment but torch
    (and what needs it to import), linked, not installed (nothing downloaded); returns its python, which a driver
    runs with while the site's `python` points the jobs at the project's. `import torch` fails there."""
    venv = folder / "login"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = venv / ours.relative_to(sys.prefix)
    for entry in ours.iterdir():
        if not entry.name.lower().startswith(TORCH_ONLY):
            (theirs / entry.name).symlink_to(entry)
    python = venv / "bin/python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr, probe
    return python


CONTAINER_PYTHON = "/opt/pp-venv/bin/python"  # the project's environment as a container shows it (site_two_envs)


def site_two_envs(work: Path) -> Path:
    """The testbed's site file as a site with a login and a compute environment (issue 52): every job runs the
    project's interpreter (`python`), loads a module (`module` on PATH: a stand-in that logs each call to
    work/modules.log), exports `env` and runs a `setup` line (it logs the job's view of an exported value to
    work/setup.log); a100's jobs run inside a container (bubblewrap: the environment bound read-only at
    /opt/pp-venv, `container=bwrap` set), h100's outside; a100's ask an account, a QOS and memory."""
    (work / "bin").mkdir(exist_ok=True)
    module = work / "bin/module"
    module.write_text(f'#!/bin/sh\necho "module $* (job $SLURM_JOB_ID)" >> {work}/modules.log\n')
    module.chmod(0o755)
    site = yaml.safe_load(Path(SITE).read_text())
    site["defaults"].update(python=str(BIN / "python"), modules=["testbed-mpi/1.0"],
                            env={"GLOO_SOCKET_IFNAME": "lo", "PP_SITE_NOTE": "it's $HOME `id`"},
                            setup=[f'echo "job $SLURM_JOB_ID: $PP_SITE_NOTE" >> {work}/setup.log'])  # fmt: skip
    if shutil.which("bwrap"):
        inside = Path(CONTAINER_PYTHON).parents[1]
        prefix = f"bwrap --dev-bind / / --ro-bind {sys.prefix} {inside} --setenv container bwrap"
        site["gpus"]["a100"].update(python=CONTAINER_PYTHON, container=prefix)
    # what a site's jobs ask beyond partition and GPUs: an account, a QOS, memory (the testbed enforces no
    # associations: they are carried, and read back from `scontrol show job`)
    site["gpus"]["a100"].update(account="pp-lab", qos="normal", mem_per_gpu_gb=1)
    path = work / "site-two-envs.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def partitions_sweep(tmp_path_factory):
    """tiny-gptneox naive 1x1 and 1x2 on a100 and h100 through the slurm profile: one job per cell on each GPU type's
    partition, the tables, the exported plans and the calendar; (folder, config, (the last job id before it, the
    last after it), the process). The driver runs in a login environment without torch (`login_env`), the jobs in
    the site's (`site_two_envs`).
    Shared by the first cluster's SLURM modules (one xdist worker runs them): tests/test_slurm.py reads its jobs and
    calendar, tests/test_calendar_slurm.py trains its h100 1x1 plan in segments. Session-scoped, so it starts before
    any module's environment is set: it is the first cluster's (no SLURM_CONF), which pytest_collection_modifyitems
    checks."""
    testbed_up(0)
    work = tmp_path_factory.mktemp("partitions")
    since = last_job_id()
    sweep = {"models": ["tiny-gptneox"], "gpus": ["a100", "h100"], "methods": ["naive"], "gpus_per_node": [1, 2]}
    site = site_two_envs(work)
    cfg = write_config(work / "c.yaml", sweep=sweep, launcher={"kind": "slurm", "site": str(site)}, benchmark=bench(3))
    env = {"PATH": f"{work / 'bin'}:{os.environ['PATH']}"}
    proc = snakemake(work, "--profile", PROFILE, "--configfile", str(cfg), env=env, python=login_env(work))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return work, cfg, (since, last_job_id()), proc

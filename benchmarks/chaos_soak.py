"""Chaos soak on the SLURM testbed (cluster/testbed): a benchmark sweep, a budget pre-training and a train-stage run,
driven by `snakemake --profile cluster/slurm` while faults are injected at random times from a seeded schedule, then
checked against a fault-free run of the same workflow.

    flock /work/slurm.lock .venv/bin/python benchmarks/chaos_soak.py --short          # CI: a few faults, ~5 min
    flock /work/slurm.lock .venv/bin/python benchmarks/chaos_soak.py --minutes 30 --faults 40   # the long soak

Run it under the testbed's lock (it submits jobs, stops daemons and takes nodes down), as root (daemon.sh).

Faults (kinds): the driver SIGKILLed, then `--unlock` and the same command again (`driver_kill`); the driver
SIGTERMed (`driver_term`); a node taken down under a running job, then resumed (`node_down`); slurmctld and slurmdbd
stopped and started again (`ctld_restart`, `dbd_restart`); `scancel` (`scancel`) and `scontrol requeue`
(`requeue`) of a random job; SIGKILL of one rank other than 0 inside a multi-rank job (`rank_kill`); a finished
cell's result.json cut in half while the sweep runs (`truncate`). A fault waits for what it needs (a running job,
a multi-rank job, a finished cell); the budget and train jobs are picked first while they run, so both stages are
drilled in every round. The sweep also has 2-node cells (MULTI_GPU, l40s, on the testbed's partition `multi`: 2 x 1
and 2 x 2, each one job over both nodes; the other partitions' max_nodes is 1): every round kills the last rank (on
the second node) of one running 2-node cell and takes the second node of one down (issue 37). Runs are sized by what
they must show, not by steps that fit this CPU.

After each round (the workflow finished, then one more run of the same command, as a user would after a fault):
- `sacct`: exactly one COMPLETED job per cell, budget and train job name; every other job of the round is one a
  fault ended (scancel -> CANCELLED, rank_kill -> FAILED, node_down -> NODE_FAIL), each accounted for;
- every result.json parses and names the job that slurm_job.json records, which is the COMPLETED one;
- the cells table equals the fault-free run's in cell set and status, the settings of time_to_train too;
- the budget and train step logs are continuous (steps 1..N, none lost or repeated) and their losses equal an
  uninterrupted run's (the fault-free round's, or a local run of the same plan when the sweep chose another one);
- no process of the round is left: no SLURM job queued, no task of its jobs, no driver.

Figures (cells, faults by kind, jobs per cell, mismatches, wall time) are printed and written to `--out`
(default benchmarks/results/chaos_soak.md, appended). Exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import dataclasses
import datetime as dt
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.launch.preflight import JOB_PREFIX  # noqa: E402  (a GPU type's preflight job's name)
from pretrain_planner.results import parse_result  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402

SITE = REPO / "tests/data/site-testbed.yaml"
PROFILE = REPO / "cluster/slurm"
DAEMON = REPO / "cluster/testbed/daemon.sh"
NODES = ("node-a100", "node-h100", "node-mn0", "node-mn1")
MULTI_GPU = "l40s"  # the GPU type of the testbed's two-node partition `multi` (tests/data/site-testbed.yaml)
CAP_QOS = "pp-cap"  # cluster/testbed/slurm-up.sh: MaxSubmitJobsPerUser=2, enforced on the restrictive site
MULTI_FAULTS = ("rank_kill", "node_down")  # what every round does to a running 2-node cell (issue 37)
KINDS = ("driver_kill", "driver_term", "node_down", "ctld_restart", "dbd_restart", "scancel", "requeue", "rank_kill",
         "truncate")  # fmt: skip
# what a fault leaves in accounting for the job it hit, when it took effect
ENDS = {"scancel": "CANCELLED", "rank_kill": "FAILED", "node_down": "NODE_FAIL"}
# srun's error when SLURM's own task layout fails as a job starts on a node ("failed to distribute tasks ... this
# should never happen"): seen on the restrictive testbed (task/affinity on virtual nodes that claim 4 CPUs of a
# 2-core host) when a job a node_down requeued starts again on the node that came back. The job ends FAILED at launch,
# before any rank ran; the driver submits it anew.
LAYOUT_FAILED = "Unable to layout tasks on given cpus"
TRAIN_SETTING = ("tiny-gptneox", "cpu", 1, 2)  # a `cpu` setting: every method exports a plan there
BUDGET_JOB = "pp-budget-pretrain-tiny-bert-24h-a100-1x2"  # the budget stage's pre-training (budget.jobs names it)
TRAIN_JOB = "pp-train-{}-{}-{}x{}".format(*TRAIN_SETTING)  # the train stage's run (train.jobs)


@dataclass
class Preset:
    models: list[str]
    gpus: list[str]  # one-node cells; MULTI_GPU's cells are also 2-node (the sweep's nodes [1, 2])
    gpus_per_node: list[int]
    methods: list[str]
    budget_steps: int  # fake-clock steps of the budget pre-training (1 s each), checkpointed every 10 or 1/12 of them
    train_steps: int
    faults: int  # at least this many faults in all
    minutes: float  # and at least this long under faults
    gap_s: tuple[float, float]  # seconds between faults (uniform)
    max_rounds: int = 8
    restrictive: bool = False  # the restrictive site (--restrictive): daemons reconfigured, a100 jobs under QOS pp-cap


PRESETS = {
    "short": Preset(["tiny-gptneox"], ["a100", "cpu", MULTI_GPU], [1, 2], ["naive"], 120, 60, 9, 0, (4, 12), 1),
    "long": Preset(["tiny-gptneox", "tiny-bert", "tiny-vit", "tiny-mamba", "tiny-convnext"],
                   ["a100", "cpu", MULTI_GPU], [1, 2], ["naive", "fl"], 300, 150, 40, 30, (8, 30)),
}  # fmt: skip


DRILL_S = 30.0  # seconds a budget or train run stays drillable: twice the longest blocking fault (~15 s)
# the soak waits while a daemon is down: these are postponed while a stage's job runs undrilled
BLOCKING = ("ctld_restart", "dbd_restart")


def sized_stages(p: Preset, step_s: float) -> Preset:
    """The preset with budget and train runs long enough to be drilled on this machine: a stage can be hit from its
    15th step to 5 before its end (Round._stage_ready), and that window lasts about DRILL_S at the yardstick's step
    (multirank.tiny_step_s; a stage's step is of its size: 16 samples of a tiny model), or at the pace (--pace). A
    count of steps that fits one CPU is over in a blink on a faster one (a fast machine's train run ended during a
    controller restart, undrilled); a slow one keeps the preset's."""
    need = 20 + math.ceil(DRILL_S / step_s)
    return dataclasses.replace(p, budget_steps=max(p.budget_steps, need), train_steps=max(p.train_steps, need))


def log(msg: str) -> None:
    print(f"[soak {dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out: {exc}")
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return proc


# ---------------------------------------------------------------- the cluster, as the soak sees it


def scontrol_job(job_id: str) -> dict[str, str]:
    out = run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def hosts(nodelist: str) -> list[str]:
    """The nodes of a SLURM node list ("node-mn[0-1]" -> node-mn0, node-mn1), in order."""
    if not nodelist or nodelist in ("None", "(null)"):
        return []
    if "[" not in nodelist and "," not in nodelist:
        return [nodelist]
    out = run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
    return out or [nodelist]


def squeue(since: int) -> list[dict[str, str]]:
    """The round's jobs the controller knows (queued or running)."""
    out = run(["squeue", "-h", "-o", "%i|%j|%T|%N"]).stdout
    rows = [dict(zip(("id", "name", "state", "nodes"), ln.split("|"), strict=False)) for ln in out.splitlines() if ln]
    return [r for r in rows if r["id"].isdigit() and int(r["id"]) > since and r["name"].startswith("pp-")]


def sacct(since: int) -> list[dict[str, str]] | None:
    """Every job (allocation) with an id above `since`; None when accounting does not answer."""
    proc = run(["sacct", "-X", "-n", "-P", "-S", "2020-01-01", "-o", "JobID,JobName%200,State,NodeList"])
    if proc.returncode != 0:
        return None
    rows = []
    for ln in proc.stdout.splitlines():
        parts = ln.split("|")
        if len(parts) == 4 and parts[0].split("_")[0].isdigit() and int(parts[0].split("_")[0]) > since:
            rows.append({"id": parts[0], "name": parts[1], "state": parts[2].split()[0], "nodes": parts[3]})
    return rows


def last_job_id() -> int:
    rows = sacct(-1) or []
    return max((int(r["id"].split("_")[0]) for r in rows), default=0)


def daemon(action: str, name: str) -> None:
    proc = run(["bash", str(DAEMON), action, name], timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"daemon.sh {action} {name}: {proc.stdout[-500:]}{proc.stderr[-1500:]}")


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rank_pid(job_id: str, rank: int) -> int | None:
    """The process of task `rank` of a SLURM job (the submitit task: SLURM_PROCID set by srun)."""
    for pid in processes():
        env = environ(pid)
        mine = env.get("SLURM_JOB_ID") == str(job_id) and env.get("SLURM_PROCID") == str(rank)
        if mine and "python" in cmdline(pid) and "submitit" in cmdline(pid):
            return pid
    return None


# ---------------------------------------------------------------- one workflow run (a round)


@dataclass
class Fault:
    kind: str
    at_s: float
    target: str = ""  # job id, node, cell, daemon
    name: str = ""  # the job's name
    jobs: list[str] = field(default_factory=list)  # job ids a node_down hit
    note: str = ""


class Round:
    """One run of the workflow in its own folder: the driver (restarted after each driver fault or failure, as a
    user would), the faults injected into it, what the checks found."""

    def __init__(self, work: Path, preset: Preset, label: str, tokenizer: Path) -> None:
        self.work, self.preset, self.label, self.tokenizer = work, preset, label, tokenizer
        self.work.mkdir(parents=True, exist_ok=True)
        self.cfg = self._write_configs()
        self.driver: subprocess.Popen | None = None
        self.faults: list[Fault] = []
        self.skipped: collections.Counter = collections.Counter()
        self.drilled: dict[str, str] = {}  # budget / train job name -> the fault that hit its stage
        self.multi_drilled: dict[str, str] = {}  # MULTI_FAULTS kind -> the 2-node cell's job it hit ("name id")
        self.restarts = 0
        self.failed_runs = 0
        self.since = last_job_id()
        self.t0 = time.time()
        self.wall_s = 0.0
        self.mismatches: list[str] = []
        self.figures: dict[str, Any] = {}

    # -- set-up
    def _write_configs(self) -> Path:
        p = self.preset
        budget = yaml.safe_load((REPO / "config/budget.yaml").read_text())
        budget["corpus"]["files"] = [str(REPO / "tests/data/corpus/*.txt")]
        budget["glue"]["data_dir"] = str(REPO / "tests/data/glue")
        # one tokenizer file for every round: WordPiece training is not deterministic from one process to the next
        # (huggingface/tokenizers#1794), and the budget runs must see the same data to be compared
        budget["tokenizer"]["path"] = str(self.tokenizer)
        budget["train"].update(
            budget_hours=p.budget_steps / 3600, fake_step_s=1.0, clock="train", gpu="a100", gpus_per_node=2,
            micro_batch=8, device="cpu", checkpoint_every_s=max(10, p.budget_steps // 12), finetune_checkpoints=[],
            early_stop=[], setting="config",
        )  # fmt: skip
        budget["train"]["validation"].update(every=0.5, dense_first=0.0, dense_last=0.0)
        (self.work / "budget.yaml").write_text(yaml.safe_dump(budget))
        # the testbed's site, each one-node partition's limit said: only MULTI_GPU's cells span two nodes
        site = yaml.safe_load(SITE.read_text())
        for gpu, settings in site["gpus"].items():
            settings["max_nodes"] = 2 if gpu == MULTI_GPU else 1
        if p.restrictive:  # a100's cells, preflight and budget job under the QOS cap of 2 submitted jobs
            # (slurm-up.sh's pp-cap), the driver allowed more: sbatch refuses some, which must wait, faults or not
            site["gpus"]["a100"]["qos"] = CAP_QOS
            site["max_queued_jobs"] = 4
        (self.work / "site.yaml").write_text(yaml.safe_dump(site))
        cfg = {
            "sweep": {"models": p.models, "gpus": p.gpus, "nodes": self.nodes, "gpus_per_node": p.gpus_per_node,
                      "methods": p.methods},
            "launcher": {"kind": "slurm", "site": str(self.work / "site.yaml")},
            "benchmark": {"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "device": "cpu", "max_spread": 50},
            "budget": str(self.work / "budget.yaml"),
            "train": {"steps": p.train_steps, "checkpoint_every_min": 0.02, "device": "cpu"},
        }  # fmt: skip
        path = self.work / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    @property
    def nodes(self) -> list[int]:
        return [1, 2] if MULTI_GPU in self.preset.gpus else [1]

    @property
    def targets(self) -> list[str]:
        m, g, n, gpn = TRAIN_SETTING
        return ["all", "results/budget/pretrain/result.json", f"results/train/{m}/{g}/{n}x{gpn}/result.json"]

    def snakemake(self, *extra: str) -> list[str]:
        return [str(BIN / "snakemake"), *extra, "-s", str(REPO / "Snakefile"), "-d", str(self.work), "--profile",
                str(PROFILE), "--configfile", str(self.cfg)]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow")}

    def start_driver(self) -> None:
        """`snakemake --unlock` then the same command again (a user after a fault)."""
        unlock = subprocess.run(self.snakemake("--unlock"), cwd=self.work, capture_output=True, text=True,
                                env=self.env(), timeout=300)  # fmt: skip
        if unlock.returncode != 0:
            log(f"{self.label}: --unlock failed: {unlock.stderr[-1000:]}")
        with open(self.work / "driver.log", "a") as fh:
            fh.write(f"\n===== soak: driver start {dt.datetime.now().isoformat(timespec='seconds')}\n")
            fh.flush()
            self.driver = subprocess.Popen(self.snakemake(*self.targets), cwd=self.work, stdout=fh, env=self.env(),
                                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def driver_alive(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def cells(self) -> list[str]:
        p = self.preset
        return [
            f"{m}/{g}/{n}x{k}/{meth}" for m in p.models for g in p.gpus for n in self.nodes
            for k in p.gpus_per_node for meth in p.methods if n == 1 or g == MULTI_GPU
        ]  # fmt: skip

    def _check_preflight(self, name: str, jobs: list[dict[str, str]], fault_of: dict[str, list[Fault]]) -> None:
        """A GPU type's preflight (one short job before its cells, launch/preflight.py): of a GPU type of the
        sweep, delivered at least once, every other end explained by a fault (a driver fault may run it again, and
        the next run cancels one the stopped driver left queued)."""
        if name.removeprefix(JOB_PREFIX) not in self.preset.gpus:
            self.mismatches.append(f"sacct: a preflight of a GPU type the sweep does not have: {name}: {jobs}")
            return
        # each run of the driver asks its own preflight: a queued one of a stopped driver is cancelled by the next run
        # (launch/preflight.py: another identity), which its log says
        gpu = name.removeprefix(JOB_PREFIX)
        logs = (self.work / "results/logs").glob(f"*preflight-{gpu}.log*")
        said = " ".join(p.read_text(errors="replace") for p in logs)
        by_driver = set(re.findall(r"cancelled job (\d+) \(it ran another spec", said))
        driver_faults = any(f.kind in ("driver_kill", "driver_term") for f in self.faults)
        for j in jobs:
            if j["state"] == "CANCELLED" and j["id"] in by_driver and driver_faults:
                continue
            if j["state"] != "COMPLETED" and not any(ENDS.get(f.kind) == j["state"] for f in fault_of.get(j["id"], [])):
                self.mismatches.append(f"sacct: job {j['id']} ({name}) ended {j['state']} and no fault explains it")
        if not any(j["state"] == "COMPLETED" for j in jobs):
            self.mismatches.append(f"sacct: {name} never completed: {jobs}")

    def job_names(self) -> set[str]:
        names = {"pp-" + c.replace("/", "-") for c in self.cells()}
        return names | {BUDGET_JOB, TRAIN_JOB}

    # -- faults
    def _running(self, multi: bool = False, nodes: int = 1) -> list[dict[str, str]]:
        """Running jobs of the round (`multi`: of 2 ranks or more; `nodes`: on at least that many nodes)."""
        out = []
        for j in squeue(self.since):
            if j["state"] != "RUNNING":
                continue
            if multi and int(scontrol_job(j["id"]).get("NumTasks", "1")) < 2:
                continue
            if len(hosts(j["nodes"])) < nodes:
                continue
            out.append(j)
        return out

    def multi_due(self) -> str | None:
        """The MULTI_FAULTS kind a running 2-node cell should get now: each once a round, the first while such a cell
        runs that no fault hit yet."""
        due = [k for k in MULTI_FAULTS if k not in self.multi_drilled]
        if not due or not self.nodes[1:]:
            return None
        return due[0] if self._unhit_multi() else None

    def _unhit_multi(self) -> dict[str, str] | None:
        """A running 2-node job no fault has hit."""
        hit = {f.target for f in self.faults} | {j for f in self.faults for j in f.jobs}
        return next((j for j in self._running(nodes=2) if j["id"] not in hit), None)

    STAGES = ("pp-budget", "pp-train")

    def _stage_ready(self, name: str) -> bool:
        """A budget or train job worth hitting: it has checkpointed and not yet finished its steps."""
        m, g, n, gpn = TRAIN_SETTING
        stage = "budget" if name.startswith("pp-budget") else "train"
        total = self.preset.budget_steps if stage == "budget" else self.preset.train_steps
        try:
            done = len(self.steps(stage))
        except (OSError, ValueError):
            return False
        return 15 <= done < total - 5

    def unhit_stage(self) -> dict[str, str] | None:
        """A running budget or train job that no fault has hit yet in this round, once it can be drilled."""
        hit = {f.name for f in self.faults} | set(self.drilled)
        for j in self._running():
            if j["name"].startswith(self.STAGES) and j["name"] not in hit and self._stage_ready(j["name"]):
                return j
        return None

    def _stage_undrilled(self) -> bool:
        """A budget or train job runs that no fault has hit yet in this round."""
        hit = {f.name for f in self.faults} | set(self.drilled)
        return any(j["name"].startswith(self.STAGES) and j["name"] not in hit for j in self._running())

    def _stage_first(self, jobs: list[dict[str, str]], rng: random.Random) -> dict[str, str] | None:
        """A budget or train job not hit yet (once it can be drilled), else a random job."""
        if not jobs:
            return None
        hit = {f.name for f in self.faults} | set(self.drilled)
        stage = [j for j in jobs if j["name"].startswith(self.STAGES) and j["name"] not in hit
                 and self._stage_ready(j["name"])]  # fmt: skip
        return stage[0] if stage else rng.choice(jobs)

    def _wait_for(self, what, timeout: float = 90.0):
        end = time.time() + timeout
        while time.time() < end:
            got = what()
            if got:
                return got
            if not self.driver_alive():
                return None
            time.sleep(0.5)
        return None

    def inject(self, kind: str, rng: random.Random, multi: bool = False) -> Fault | None:
        """Inject one fault of `kind` (`multi`: rank_kill / node_down into a running 2-node cell)."""
        at = time.time() - self.t0
        if kind in ("driver_kill", "driver_term"):
            if not self.driver_alive():
                return None
            sig = signal.SIGKILL if kind == "driver_kill" else signal.SIGTERM
            os.kill(self.driver.pid, sig)  # the driver only, as `kill <pid>` does: its SLURM jobs run on
            t = time.time()
            try:
                self.driver.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.driver.pid, signal.SIGKILL)
                self.driver.wait()
                self.mismatches.append(f"{kind}: the driver did not stop within 120 s")
            note = f"stopped in {time.time() - t:.1f} s"
            self.restarts += 1
            self.start_driver()
            return Fault(kind, at, target=str(self.driver.pid), note=note)
        if kind in ("ctld_restart", "dbd_restart"):
            name = "slurmctld" if kind == "ctld_restart" else "slurmdbd"
            daemon("stop", name)
            down = rng.uniform(3, 15)
            time.sleep(down)
            daemon("start", name)
            return Fault(kind, at, target=name, note=f"down {down:.0f} s")
        if kind == "truncate":
            done = [c for c in self.cells() if self._cell_done(c)]
            if not done:
                return None
            cell = rng.choice(done)
            path = self.work / "results/cells" / cell / "result.json"
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
            return Fault(kind, at, target=cell, note=f"{len(data)} -> {len(data) // 2} bytes")
        if kind == "node_down":
            if multi:  # a 2-node cell: its second node
                job = self._wait_for(self._unhit_multi)
            else:
                job = self._wait_for(lambda: self._stage_first(self._running(), rng))
            if job is None:
                return None
            on = hosts(job["nodes"])
            node = on[-1] if on and on[-1] in NODES else rng.choice(NODES)
            hit = [j["id"] for j in self._running() if node in hosts(j["nodes"])]
            run(["scontrol", "update", f"nodename={node}", "state=down", "reason=chaos-soak"], check=True)
            end = time.time() + 40
            while time.time() < end and any(int(scontrol_job(i).get("Restarts", "0")) < 1 for i in hit):
                time.sleep(1)
            time.sleep(rng.uniform(1, 5))
            run(["scontrol", "update", f"nodename={node}", "state=resume"])
            return Fault(kind, at, target=node, name=job["name"], jobs=hit,
                         note=f"under job {job['id']} on {job['nodes']}")  # fmt: skip
        if kind in ("scancel", "requeue"):
            job = self._wait_for(lambda: self._stage_first(self._running(), rng))
            if job is None:
                return None
            cmd = ["scancel", job["id"]] if kind == "scancel" else ["scontrol", "requeue", job["id"]]
            proc = run(cmd)
            return Fault(kind, at, target=job["id"], name=job["name"], note=proc.stderr.strip()[:200])
        if kind == "rank_kill":

            def victim():
                jobs = [j for j in [self._unhit_multi()] if j] if multi else self._running(multi=True)
                jobs.sort(key=lambda j: not (j["name"].startswith(self.STAGES) and self._stage_ready(j["name"])))
                for j in jobs:
                    last = int(scontrol_job(j["id"]).get("NumTasks", "2")) - 1  # on the last node of a 2-node job
                    pid = rank_pid(j["id"], last)
                    if pid:
                        return j, last, pid
                return None

            got = self._wait_for(victim)
            if got is None:
                return None
            (job, rank, pid) = got
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return None
            where = environ(pid).get("SLURMD_NODENAME") or "?"
            return Fault(kind, at, target=job["id"], name=job["name"], note=f"rank {rank} pid {pid} on {where}")
        raise ValueError(kind)

    def _cell_done(self, cell: str) -> bool:
        try:
            state = json.loads((self.work / "results/cells" / cell / "state.json").read_text())
        except (OSError, ValueError):
            return False
        return state.get("state") == "done" and (self.work / "results/cells" / cell / "result.json").is_file()

    def drive(self, rng: random.Random | None, until_faults: int, until_s: float) -> None:
        """Run the workflow to its end; with `rng`, inject faults meanwhile (until both `until_faults` were injected
        and `until_s` passed, or the workflow is done)."""
        self.start_driver()
        kinds = list(KINDS)
        next_at = time.time() + (rng.uniform(*self.preset.gap_s) if rng else 0)
        order: list[str] = []
        while True:
            if not self.driver_alive():
                rc = self.driver.wait()
                if rc == 0:
                    break
                self.failed_runs += 1
                tail = (self.work / "driver.log").read_text(errors="replace")[-3000:]
                log(f"{self.label}: the driver exited {rc} (run {self.failed_runs} failed); running it again\n{tail}")
                if self.failed_runs > 6:
                    self.mismatches.append(f"the workflow did not finish after {self.failed_runs} failed runs")
                    return
                self.start_driver()
                continue
            # every kind at least once a round (a drill's kind counts), beside the counts asked for
            missing = set(kinds) - {f.kind for f in self.faults}
            more = rng is not None and (len(self.faults) < until_faults or time.time() - self.t0 < until_s
                                        or bool(missing))  # fmt: skip
            # the budget and train stages are drilled in every round: a job fault for each, once it checkpointed
            drill = rng is not None and self.unhit_stage() is not None
            multi = None if rng is None or drill else self.multi_due()
            if (more and time.time() >= next_at) or drill or multi:
                if multi:
                    kind = multi
                elif drill:
                    kind = rng.choice(["rank_kill", "requeue", "scancel", "node_down", "driver_kill"])
                    if kind == "driver_kill":  # the stage's job runs on while its driver is away and is re-attached
                        self.drilled[self.unhit_stage()["name"]] = "driver_kill"
                else:
                    if not order:  # every kind once per pass, in a seeded order: the mix covers every kind
                        order = rng.sample(kinds, len(kinds))
                    if order[-1] in BLOCKING and self._stage_undrilled():
                        time.sleep(0.5)  # a daemon down now could outlast the stage's drillable window: later
                        continue
                    kind = order.pop()
                try:
                    fault = self.inject(kind, rng, multi=bool(multi))
                except Exception as exc:  # noqa: BLE001 - a fault the soak could not inject is a finding
                    self.mismatches.append(f"{kind}: could not inject: {type(exc).__name__}: {exc}")
                    fault = None
                if fault is None:
                    self.skipped[kind] += 1
                else:
                    self.faults.append(fault)
                    if fault.name.startswith(self.STAGES):
                        self.drilled.setdefault(fault.name, fault.kind)
                    if multi:
                        self.multi_drilled[kind] = f"{fault.name} ({fault.note})"
                    log(f"{self.label}: fault {len(self.faults)}: {fault.kind} {fault.target} {fault.name} "
                        f"{fault.note}".rstrip())  # fmt: skip
                next_at = time.time() + rng.uniform(*self.preset.gap_s)
            time.sleep(0.5)
        # a user's last run of the same command: a result damaged after the last driver start is repaired here
        self.start_driver()
        rc = self.driver.wait()
        if rc != 0:
            self.mismatches.append(f"the final run of the same command exited {rc}")
        self.wall_s = time.time() - self.t0

    # -- checks
    def recorded_jobs(self) -> set[str]:
        """Every job id a slurm_job.json of the round names, and every job a fault hit."""
        ids = {f.target for f in self.faults if f.kind in ("scancel", "requeue", "rank_kill")}
        ids |= {j for f in self.faults for j in f.jobs}
        for rec in self.work.glob("results/**/slurm_job.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                ids.add(str(json.loads(rec.read_text())["job_id"]))
        return ids

    def settle_accounting(self, leftover: set[str]) -> list[dict[str, str]]:
        """sacct's view once every job of the round has its final state there (records kept while slurmdbd was
        down arrive late); jobs still queued after the last run (`leftover`) are reported, not waited for."""
        end, rows, want = time.time() + 180, [], self.recorded_jobs()
        while time.time() < end:
            rows = sacct(self.since) or []
            live = [r for r in rows if r["id"] not in leftover and r["state"] in
                    ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "RESIZING", "SUSPENDED")]  # fmt: skip
            if not live and want <= {r["id"] for r in rows}:
                return rows
            time.sleep(3)
        self.mismatches.append(
            f"accounting did not settle within 180 s (missing {sorted(want - {r['id'] for r in rows})})"
        )
        return rows

    def folder_of(self, name: str) -> Path:
        """The submitit folder of a job name of the round."""
        m, g, n, gpn = TRAIN_SETTING
        if name == BUDGET_JOB:
            return self.work / "results/budget/pretrain/submitit"
        if name == TRAIN_JOB:
            return self.work / f"results/train/{m}/{g}/{n}x{gpn}/submitit"
        cells = {"pp-" + c.replace("/", "-"): c for c in self.cells()}
        return self.work / "results/cells" / cells[name] / "submitit"

    def delivered(self, name: str, job_id: str) -> bool:
        """Whether every task of the job returned (its submitit result pickle says success): a job a fault ended
        after that (scancel: submitit lets its tasks finish while SLURM waits KillWait seconds) still delivered."""
        from submitit.core.utils import pickle_load

        folder = self.folder_of(name)
        tasks = list(folder.glob(f"{job_id}_*_log.out"))
        pickles = list(folder.glob(f"{job_id}_*_result.pkl"))
        if not pickles or len(pickles) < len(tasks):
            return False
        try:
            return all(pickle_load(p)[0] == "success" for p in pickles)
        except Exception:  # noqa: BLE001 - a damaged pickle did not deliver
            return False

    def relaunch_failed(self, name: str, job_id: str, faults: list[Fault]) -> bool:
        """Whether a node_down hit the job and its requeued run then failed at launch in SLURM's task layout (its
        task logs hold srun's LAYOUT_FAILED): the node fault's doing, not the driver's."""
        if not any(f.kind == "node_down" for f in faults):
            return False
        logs = self.folder_of(name).glob(f"{job_id}_*_log.err")
        return any(LAYOUT_FAILED in p.read_text(errors="replace") for p in logs)

    def reruns_after_driver_faults(self, name: str) -> int:
        """Budget / train jobs run again because their job had finished while the driver was away and Snakemake had
        removed the outputs as incomplete (their log says so); each needs a driver fault before it."""
        m, g, n, gpn = TRAIN_SETTING
        logs = {BUDGET_JOB: "results/logs/budget/pretrain.log", TRAIN_JOB: f"results/logs/train/{m}/{g}/{n}x{gpn}.log"}
        if name not in logs or not any(f.kind in ("driver_kill", "driver_term") for f in self.faults):
            return 0
        try:
            text = (self.work / logs[name]).read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for ln in text.splitlines() if "finished without " in ln and "running again" in ln)

    def check(self, reference: Round | None) -> None:
        if reference is None and self.failed_runs:
            self.mismatches.append(f"the fault-free run failed {self.failed_runs} time(s); see {self.work}/driver.log")
        end = time.time() + 60  # tasks that returned take a moment to exit
        while squeue(self.since) and time.time() < end:
            time.sleep(2)
        leftover = {j["id"] for j in squeue(self.since)}
        self._check_nothing_left(leftover)
        rows = self.settle_accounting(leftover)
        by_name: dict[str, list[dict[str, str]]] = collections.defaultdict(list)
        for r in rows:
            by_name[r["name"]].append(r)
        expected = self.job_names()
        fault_of: dict[str, list[Fault]] = collections.defaultdict(list)
        for f in self.faults:
            for jid in [f.target, *f.jobs]:
                fault_of[jid].append(f)
        accounted: collections.Counter = collections.Counter()
        delivering: dict[str, list[str]] = {}
        for name, jobs in sorted(by_name.items()):
            if name.startswith(JOB_PREFIX):
                self._check_preflight(name, jobs, fault_of)
                continue
            if name not in expected:
                self.mismatches.append(f"sacct: unexpected job name {name}: {jobs}")
                continue
            good = []
            for j in jobs:
                hit = [f for f in fault_of.get(j["id"], []) if ENDS.get(f.kind) == j["state"]]
                if j["state"] == "COMPLETED":
                    good.append(j["id"])
                elif hit and self.delivered(name, j["id"]):
                    good.append(j["id"])  # its tasks returned before the fault could end them: it delivered
                    accounted[f"{hit[0].kind}, but the job delivered"] += 1
                elif hit:
                    accounted[hit[0].kind] += 1
                elif j["state"] == "FAILED" and self.relaunch_failed(name, j["id"], fault_of.get(j["id"], [])):
                    accounted["node_down, then its requeued run failed at launch (SLURM's task layout)"] += 1
                else:
                    self.mismatches.append(f"sacct: job {j['id']} ({name}) ended {j['state']} and no fault explains it")
            reruns = self.reruns_after_driver_faults(name)
            if len(good) != 1 + reruns:
                self.mismatches.append(f"sacct: {name} has {len(good)} jobs that delivered (expected {1 + reruns}): "
                                       f"{jobs}")  # fmt: skip
            accounted["stage job run again after a driver fault"] += reruns
            delivering[name] = good[-1:] if good else []
        accounted = collections.Counter({k: v for k, v in accounted.items() if v})
        for name in sorted(expected - set(by_name)):
            self.mismatches.append(f"sacct: no job for {name}")
        completed = delivering
        self._check_results(completed)
        self._check_tables(reference)
        self._check_runs(reference)
        if reference is not None:
            for stage in (BUDGET_JOB, TRAIN_JOB):
                if stage not in self.drilled:
                    self.mismatches.append(f"{stage} was not hit by any fault: its stage was not drilled")
            for kind in MULTI_FAULTS if self.nodes[1:] else ():
                if kind not in self.multi_drilled:
                    self.mismatches.append(f"no {kind} hit a running 2-node cell: the multi-node path was not drilled")
        capped = self._most_capped_at_once() if self.preset.restrictive else None
        if capped is not None and capped > 2:
            self.mismatches.append(f"sacct: {capped} jobs of QOS {CAP_QOS} were queued at once (its cap: 2)")
        per_name = collections.Counter(len(v) for k, v in by_name.items() if k in expected)
        self.figures = {
            "cells": len(self.cells()),
            "jobs": len(rows),
            "jobs_per_name": dict(sorted(per_name.items())),
            "failed_attempts_accounted": dict(accounted),
            "faults": dict(collections.Counter(f.kind for f in self.faults)),
            "skipped": dict(self.skipped),
            "stage_drills": dict(self.drilled),
            "multi_drills": dict(self.multi_drilled),
            "driver_restarts": self.restarts,
            "failed_driver_runs": self.failed_runs,
            "mismatches": len(self.mismatches),
            "wall_s": round(self.wall_s),
            "most_capped_at_once": capped,
        }

    def _most_capped_at_once(self) -> int:
        """The most of the round's jobs under the QOS cap (the restrictive site's a100 jobs) that were submitted and
        not ended at one time, from accounting: the driver's back-pressure must keep them within the cap."""
        proc = run(["sacct", "-X", "-n", "-P", "-S", "2020-01-01", "-o", "JobID,QOS,Submit,End"])
        spans = []
        for ln in proc.stdout.splitlines():
            jid, qos, submit, end = (ln.split("|") + ["", "", "", ""])[:4]
            if jid.isdigit() and int(jid) > self.since and qos == CAP_QOS:
                spans.append((submit, end if end not in ("", "Unknown") else "9999"))
        return max((sum(1 for a, b in spans if a <= t < b) for t, _ in spans), default=0)

    def _check_results(self, completed: dict[str, list[str]]) -> None:
        for cell in self.cells():
            folder = self.work / "results/cells" / cell
            row, why = parse_result(folder / "result.json")
            if row is None:
                self.mismatches.append(f"{cell}: result.json does not parse: {why}")
                continue
            model, gpu, setting, method = cell.split("/")
            self._names_its_job(
                cell, folder, row.get("slurm_job_id"), completed.get(f"pp-{model}-{gpu}-{setting}-{method}")
            )
        m, g, n, gpn = TRAIN_SETTING
        for label, folder, name in (
            ("budget", self.work / "results/budget/pretrain", BUDGET_JOB),
            ("train", self.work / f"results/train/{m}/{g}/{n}x{gpn}", TRAIN_JOB),
        ):
            try:
                res = json.loads((folder / "result.json").read_text())
            except (OSError, ValueError) as exc:
                self.mismatches.append(f"{label}: result.json unreadable: {exc}")
                continue
            self._names_its_job(label, folder, res.get("slurm_job_id"), completed.get(name))

    def _names_its_job(self, what: str, folder: Path, job_id: Any, completed: list[str] | None) -> None:
        try:
            record = json.loads((folder / "slurm_job.json").read_text())
        except (OSError, ValueError) as exc:
            self.mismatches.append(f"{what}: slurm_job.json unreadable: {exc}")
            return
        if not (str(job_id) == str(record.get("job_id")) and completed == [str(job_id)]):
            self.mismatches.append(f"{what}: result names job {job_id}, slurm_job.json {record.get('job_id')}, "
                                   f"sacct's COMPLETED {completed}")  # fmt: skip

    def table(self, name: str, columns: list[str]) -> set[tuple]:
        path = self.work / "results/tables" / f"{name}.csv"
        with open(path, newline="") as fh:
            return {tuple(row[c] for c in columns) for row in csv.DictReader(fh)}

    def _check_tables(self, reference: Round | None) -> None:
        if reference is None:
            return
        for name, cols in (("cells", ["model", "gpu", "nodes", "gpus_per_node", "method", "status"]),
                           ("time_to_train", ["model", "gpu", "nodes", "gpus_per_node"])):  # fmt: skip
            try:
                mine, ref = self.table(name, cols), reference.table(name, cols)
            except (OSError, KeyError) as exc:
                self.mismatches.append(f"tables/{name}.csv: unreadable: {exc}")
                continue
            if mine != ref:
                self.mismatches.append(f"tables/{name}.csv differs from the fault-free run's: only here "
                                       f"{sorted(mine - ref)[:5]}, only there {sorted(ref - mine)[:5]}")  # fmt: skip

    def steps(self, stage: str) -> list[dict[str, Any]]:
        m, g, n, gpn = TRAIN_SETTING
        folder = {"budget": "results/budget/pretrain", "train": f"results/train/{m}/{g}/{n}x{gpn}"}[stage]
        path = self.work / folder / "run/steps.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]

    def train_plan(self) -> Path:
        m, g, n, gpn = TRAIN_SETTING
        return self.work / f"results/optimal/{m}/{g}/{n}x{gpn}/plan.json"

    def _check_runs(self, reference: Round | None) -> None:
        want_steps = {"budget": self.preset.budget_steps, "train": self.preset.train_steps}
        for stage in ("budget", "train"):
            try:
                got = self.steps(stage)
            except (OSError, ValueError) as exc:
                self.mismatches.append(f"{stage}: steps.jsonl unreadable: {exc}")
                continue
            numbers = [s["step"] for s in got]
            if numbers != list(range(1, want_steps[stage] + 1)):
                self.mismatches.append(f"{stage}: steps are not 1..{want_steps[stage]} once each: {numbers[:8]}... "
                                       f"({len(numbers)} lines)")  # fmt: skip
                continue
            if reference is None:
                continue
            ref = reference.steps(stage) if stage == "budget" else uninterrupted_train(self, reference)
            bad = [(a["step"], a["loss"], b["loss"]) for a, b in zip(got, ref, strict=False)
                   if abs(a["loss"] - b["loss"]) > 1e-6 + 1e-5 * abs(b["loss"])]  # fmt: skip
            if len(ref) != len(got) or bad:
                self.mismatches.append(f"{stage}: losses differ from the uninterrupted run's at steps {bad[:5]} "
                                       f"({len(got)} vs {len(ref)} steps)")  # fmt: skip

    def _check_nothing_left(self, leftover: set[str]) -> None:
        """After the last run: no job of the round queued, no task of its jobs and no process of its folder."""
        if leftover:
            self.mismatches.append(f"jobs left queued after the last run: {sorted(leftover)}")
        ids = {str(i) for i in range(self.since + 1, last_job_id() + 1)} | leftover
        me = os.getpid()
        for pid in processes():
            if pid == me:
                continue
            env = environ(pid)
            if env.get("SLURM_JOB_ID") in ids and "slurmstepd" not in cmdline(pid):
                self.mismatches.append(f"process {pid} of job {env['SLURM_JOB_ID']} left running: {cmdline(pid)[:200]}")
            elif str(self.work) in cmdline(pid):
                self.mismatches.append(f"process {pid} of the round left running: {cmdline(pid)[:200]}")

    def cleanup(self) -> None:
        """Leave the testbed as it was: no driver, no job of the round, daemons up, nodes resumed."""
        if self.driver_alive():
            os.killpg(self.driver.pid, signal.SIGKILL)
            self.driver.wait()
        ids = [j["id"] for j in squeue(self.since)]
        if ids:
            run(["scancel", *ids])
        for name in ("slurmctld", "slurmdbd"):
            daemon("start", name)
        for node in NODES:
            run(["scontrol", "update", f"nodename={node}", "state=resume"])


_UNINTERRUPTED: dict[str, list[dict[str, Any]]] = {}


def _trains_as(plan: dict[str, Any]) -> dict[str, Any]:
    """What of a plan the train stage's run depends on (train/run.py): the model and its recipe, the method and its
    settings, the setting's size and the measured micro-batch; not the step times measured with it, which differ
    from round to round (comparing them made every round train its plan a second time, uninterrupted)."""
    fields = {k: plan.get(k) for k in ("model", "method", "method_settings", "nodes", "gpus_per_node")}
    return {**fields, "micro_batch": (plan.get("measured") or {}).get("micro_batch")}


def uninterrupted_train(chaos: Round, reference: Round) -> list[dict[str, Any]]:
    """The steps of an uninterrupted run of the plan the chaos round trained: the fault-free round's when it chose
    the same plan, else a local run of it now (2 gloo ranks on this host, the same steps and threads)."""
    plan, ref_plan = (_trains_as(json.loads(r.train_plan().read_text())) for r in (chaos, reference))
    key = json.dumps(plan, sort_keys=True, default=str)
    if plan == ref_plan:
        return reference.steps("train")
    if key not in _UNINTERRUPTED:
        out = chaos.work.parent / f"train-uninterrupted-{len(_UNINTERRUPTED)}"
        log(f"{chaos.label}: the sweep chose another train plan than the fault-free run; running it uninterrupted")
        proc = subprocess.run(
            [str(BIN / "pretrain-planner"), "train", "--plan", str(chaos.train_plan()), "--launcher", "local",
             "--device", "cpu", "--steps", str(chaos.preset.train_steps), "--threads", "2", "--out", str(out),
             "--config", str(chaos.cfg)],
            capture_output=True, text=True, env=chaos.env(), timeout=1800, cwd=chaos.work.parent,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"the uninterrupted train run failed: {proc.stderr[-2000:]}")
        _UNINTERRUPTED[key] = [json.loads(ln) for ln in (out / "run/steps.jsonl").read_text().splitlines() if ln]
    return _UNINTERRUPTED[key]


# ---------------------------------------------------------------- figures


def report(args: argparse.Namespace, reference: Round, rounds: list[Round], total_s: float) -> str:
    rev = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).stdout.strip()
    faults = collections.Counter()
    for r in rounds:
        faults.update(r.figures["faults"])
    mism = sum(r.figures["mismatches"] for r in rounds) + reference.figures["mismatches"]
    chaos_s = sum(r.wall_s for r in rounds)
    p = reference.preset
    two_node = (f", and {MULTI_GPU} x 2x{p.gpus_per_node} (each one job over the two nodes of partition multi)"
                if MULTI_GPU in p.gpus else "")  # fmt: skip
    site = "the permissive testbed"
    if args.restrictive:
        most = ", ".join(str(r.figures.get("most_capped_at_once")) for r in [reference, *rounds])
        site = (f"restrictive (daemon.sh profile restrictive; a100's jobs under QOS pp-cap, cap 2, the driver allowed "
                f"4): most a100 jobs queued at once per round {most}")  # fmt: skip
    columns = ["round", "wall (min)", "faults by kind", "skipped (no target)", "jobs per name (jobs: names)",
               "failed attempts, each from a fault", "budget / train drilled by", "2-node cells drilled by",
               "driver restarts", "failed driver runs", "mismatches"]  # fmt: skip
    table = [[r.label, f"{r.wall_s / 60:.1f}", _kv(r.figures["faults"]), _kv(r.figures["skipped"]),
              _kv(r.figures["jobs_per_name"]), _kv(r.figures["failed_attempts_accounted"]),
              _kv(r.figures["stage_drills"]), _kv(r.figures["multi_drills"]), r.figures["driver_restarts"],
              r.figures["failed_driver_runs"], r.figures["mismatches"]] for r in [reference, *rounds]]  # fmt: skip
    lines = [
        f"\n## {args.preset} soak, {dt.datetime.now():%Y-%m-%d %H:%M}, commit {rev}, seed {args.seed}\n",
        f"`{' '.join(sys.argv)}` on the cluster/testbed SLURM ({os.cpu_count()} cores, shared).\n",
        f"- cells: {rounds[0].figures['cells']} per round ({', '.join(p.models)} x {', '.join(p.gpus)} x "
        f"1x{p.gpus_per_node}{two_node} x {', '.join(p.methods)}), plus a budget pre-training ({p.budget_steps} "
        f"steps, 2 ranks) and a train-stage run ({p.train_steps} steps, 2 ranks)",
        f"- rounds under faults: {len(rounds)}; wall time under faults {chaos_s / 60:.1f} min; fault-free run "
        f"{reference.wall_s / 60:.1f} min; whole soak {total_s / 60:.1f} min",
        f"- faults injected: {sum(faults.values())} ({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))})",
        f"- result mismatches: {mism}",
        f"- site: {site}",
        "",
        *markdown.plain(columns, table),
    ]
    for r in [reference, *rounds]:
        for m in r.mismatches:
            lines.append(f"- mismatch ({r.label}): {m}")
    return "\n".join(lines) + "\n"


def _kv(d: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items(), key=lambda kv: str(kv[0]))) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_const", dest="preset", const="short", default="long",
                    help="the CI version: 6 cells, one round with each kind of fault once (~5-10 min)")  # fmt: skip
    ap.add_argument("--minutes", type=float, help="at least this long under faults (long: 30)")
    ap.add_argument("--faults", type=int, help="at least this many faults (long: 40)")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one, removed if all passed)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/chaos_soak.md")
    pace = (
        "every training step lasts at least this many seconds, the rest slept (the loop's test hook "
        "PP_TEST_STEP_S): the stages stay drillable as long without keeping the cores busy"
    )
    ap.add_argument("--pace", type=float, default=None, help=pace)
    restrictive = (
        "on the restrictive site (cluster/testbed/daemon.sh profile restrictive: QOS limits enforced, JobRequeue=0, "
        "EnforcePartLimits=NO, task/affinity; a100's jobs under QOS pp-cap, 2 submitted at most, the driver allowed "
        "4), the testbed's own settings put back after"
    )
    ap.add_argument("--restrictive", action="store_true", help=restrictive)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("chaos_soak.py stops SLURM daemons (cluster/testbed/daemon.sh): run it as root")
    if shutil.which("sbatch") is None or "UP" not in run(["scontrol", "ping"]).stdout:
        raise SystemExit("the SLURM testbed is not up: bash cluster/testbed/slurm-up.sh")
    preset = PRESETS[args.preset]
    preset.faults = args.faults if args.faults is not None else preset.faults
    preset.minutes = args.minutes if args.minutes is not None else preset.minutes
    work = args.work or Path(tempfile.mkdtemp(prefix="pp-chaos-"))
    t0 = time.time()
    rng = random.Random(args.seed)
    tokenizer = work / "tokenizer.json"
    if not tokenizer.is_file():
        from pretrain_planner.trainer.data.mlm import train_tokenizer

        vocab = yaml.safe_load((REPO / "config/budget.yaml").read_text())["tokenizer"]["vocab_size"]
        train_tokenizer(sorted(str(p) for p in (REPO / "tests/data/corpus").glob("*.txt")), vocab, True, tokenizer)
    if args.pace:
        from pretrain_planner.trainer.loop import PACE_ENV

        os.environ[PACE_ENV] = str(args.pace)  # every driver's environment (Round.env), so every job's
        step_s = args.pace
    else:
        from multirank import tiny_step_s

        step_s = tiny_step_s()
    preset = dataclasses.replace(sized_stages(preset, step_s), restrictive=args.restrictive)
    log(f"stages sized to this machine: budget {preset.budget_steps} steps, train {preset.train_steps} steps")
    reference = Round(work / "fault-free", preset, "fault-free", tokenizer)
    rounds: list[Round] = []
    if args.restrictive:
        run(["bash", str(DAEMON), "profile", "restrictive"], timeout=180, check=True)
    try:
        log(f"fault-free run of {len(reference.cells())} cells + budget + train in {reference.work}")
        try:
            reference.drive(None, 0, 0)
            reference.check(None)
        finally:
            reference.cleanup()
        log(f"fault-free run: {reference.wall_s:.0f} s, {reference.figures['mismatches']} mismatches")
        while not rounds or (sum(len(r.faults) for r in rounds) < preset.faults
                             or sum(r.wall_s for r in rounds) < preset.minutes * 60):  # fmt: skip
            r = Round(work / f"round{len(rounds) + 1}", preset, f"round {len(rounds) + 1}", tokenizer)
            rounds.append(r)
            left_faults = max(1, preset.faults - sum(len(x.faults) for x in rounds[:-1]))
            left_s = max(0.0, preset.minutes * 60 - sum(x.wall_s for x in rounds[:-1]))
            log(f"{r.label}: {len(r.cells())} cells + budget + train under faults in {r.work}")
            try:
                r.drive(rng, left_faults, left_s)
                r.check(reference)
            finally:
                r.cleanup()
            log(f"{r.label}: {r.wall_s:.0f} s, {len(r.faults)} faults, {r.figures['mismatches']} mismatches")
            # the figures so far, in case a later round is cut short
            args.out.with_suffix(".partial.md").write_text(report(args, reference, rounds, time.time() - t0))
            if len(rounds) >= preset.max_rounds:
                break
    except BaseException:
        for r in [reference, *rounds]:
            r.cleanup()
        raise
    finally:
        if args.restrictive:
            run(["bash", str(DAEMON), "profile", "permissive"], timeout=180, check=True)
    text = report(args, reference, rounds, time.time() - t0)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(text)
    args.out.with_suffix(".partial.md").unlink(missing_ok=True)  # the figures so far: the report has them all now
    failed = any(r.mismatches for r in [reference, *rounds])
    if not failed and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    elif failed:
        log(f"runs kept in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

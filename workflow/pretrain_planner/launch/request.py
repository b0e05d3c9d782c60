"""What a job is for the launcher (`JobRequest`), what it gave back (`Outcome`, `JobFailed`), and the rule log
that keeps every attempt. Imports no torch."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretrain_planner.launch.hostpool import HostPool
from pretrain_planner.planning.configtypes import LauncherSection
from pretrain_planner.planning.runspec import OnNodes
from pretrain_planner.results import before_write, disk_full

HISTORY_MAX = 400_000  # characters of earlier attempts kept at the top of a rule's log


class RuleLog:
    """Timestamped lines in a rule's log file. Snakemake deletes the file before each attempt; the lines of
    earlier attempts are kept beside it (`.<name>.attempts`) and copied back at the top, so a retry never
    loses why the attempt before it failed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.history = self.path.with_name(f".{self.path.name}.attempts")
        earlier = self.history.read_text(errors="replace")[-HISTORY_MAX:] if self.history.is_file() else ""
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        head = f"===== attempt started {stamp}" + (" (earlier attempts above)" if earlier else "") + "\n"
        self._write(earlier + head, "w")

    def _write(self, text: str, mode: str) -> None:
        """Into the log and its history; the driver's write checks first, a full disk named (DiskFull)."""
        before_write(self.path)
        for p in (self.path, self.history):
            try:
                with p.open(mode) as fh:
                    fh.write(text)
            except OSError as exc:
                raise disk_full(p, exc) from exc

    def _append(self, text: str) -> None:
        self._write(text, "a")

    def __call__(self, msg: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        self._append(f"[{stamp}] {msg}\n")

    def append_file(self, title: str, path: Path) -> None:
        if path.is_file():
            self._append(f"----- {title}: {path}\n{path.read_text(errors='replace')[-20000:]}\n")


def threads_per_rank(
    kind: str,
    slurm: dict[str, Any] | None,
    threads: int,
    world: int,
    on_gpus: bool = False,
    local_gpus: int | None = None,
) -> int:
    """CPU threads for each rank: the site's CPUs per GPU under SLURM; locally a GPU's share of the host's
    cores for a rank on a GPU, else the rule's threads shared out (the `cpu` type: one core per rank)."""
    if kind == "slurm" and slurm:
        return int(slurm["cpus_per_gpu"])
    if kind == "local" and on_gpus:
        return HostPool.from_config(local_gpus).cores_per_gpu
    return max(1, threads // max(1, world))


def driver_cores(kind: str, ranks: int, threads: int | None = None, available: int | None = None) -> int:
    """Cores a job holds on the driver's host (a rule's `threads:`): one when its ranks run elsewhere (SLURM),
    else as many as its ranks (at least `threads`), within the cores Snakemake has (`available`)."""
    if kind == "slurm":
        return 1
    want = max(threads or 1, ranks)
    return min(want, available) if available else want


def holds_gpus(gpu: str, device: str | None, local_gpus: int | None) -> bool:
    """Whether a local job takes GPUs from the host's pool: when it runs on them, and also when a pool is
    configured (`launcher.local_gpus`) for a GPU type forced onto the CPU (the pool's tests without a GPU)."""
    return gpu != "cpu" and (device != "cpu" or bool(local_gpus))


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class JobRequest(OnNodes):
    """One job for the launcher: a picklable callable run once per rank (`nodes` x `gpus_per_node`).

    Cells and the budget stage's pre-training and fine-tuning all go through `run_job`, so each gets the
    same executors, GPU requests, requeue contract and re-attachment."""

    fn: Any  # a job.RankJob: picklable, requeued on preemption / time-out
    name: str  # SLURM job name
    kind: str  # local | slurm (debug runs the callable in the caller)
    folder: Path  # submitit's logs and pickles
    nodes: int = 1
    gpus_per_node: int = 1
    timeout_min: int = 60  # local executor's limit (SLURM: the site's time_limit_min)
    use_gpus: bool = False  # local executor: the job takes GPUs from the host's pool
    slurm: dict[str, Any] | None = None  # the site's settings for the job's GPU type (planning/site.gpu_settings)
    record: Path | None = None  # slurm_job.json: lets a restarted driver re-attach
    identity: dict[str, Any] | None = None  # what the job computes: a recorded job of another identity is not reused
    max_num_timeout: int = 3  # requeues after a time-out that submitit allows (a long budget run needs more)
    extra_record: dict[str, Any] = field(default_factory=dict)
    launcher: LauncherSection = field(default_factory=LauncherSection.given)  # the config's (waits, local GPUs)
    cpu_threads: int = 1  # threads of each rank of a CPU job (a GPU rank gets its GPU's share of the cores)

    @property
    def workdir(self) -> Path:
        """The job's own folder (a cell's folder): its records and lock live here."""
        return (self.record or self.folder).parent

    def context(self, **more: Any) -> dict[str, Any]:
        slurm = dict(self.slurm or {})
        slurm["identity"] = spec_hash(self.identity or {})
        return {"kind": self.kind, "workdir": str(self.workdir), "what": self.name, "slurm": slurm, **more}


class JobFailed(RuntimeError):
    """A job ended without every rank's result: which job, SLURM's final state, and whether rank 0 left no
    result at all (killed, e.g. by the kernel's out-of-memory killer)."""

    def __init__(self, msg: str, job_id: str, state: Any = None, rank0_died: bool = False) -> None:
        super().__init__(msg)
        self.job_id, self.state, self.rank0_died = job_id, state, rank0_died


@dataclass
class Outcome:
    job_id: str
    values: list[Any]  # every rank's returned value, rank 0 first

    @property
    def first(self) -> Any:
        return self.values[0] if self.values else None

"""The devices of this host that a local job holds alone: a measurement never shares its CPU cores or GPUs.

A job on GPUs takes its GPUs from a pool (`launcher.local_gpus`, default: the GPUs this process can see) and,
with each GPU, an equal share of the host's cores; two jobs on disjoint GPUs run at once. A job on the CPU
(the `cpu` GPU type, or `benchmark.device: cpu` without a GPU pool) holds the whole host: CPU timings are
disturbed by any other work, so CPU jobs run one at a time. Each rank is pinned to its own cores.

Holding is done with `flock` on files in one folder per host and user (PP_HOST_LOCKS overrides it), so it
also holds between separate drivers and between the threads of one driver, and is released by the kernel
when a driver dies. The folder must be this user's own (own_lock_dir). Imports no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def lock_dir() -> Path:
    return Path(os.environ.get("PP_HOST_LOCKS") or Path(tempfile.gettempdir()) / f"pretrain-planner-{os.getuid()}")


def own_lock_dir(folder: Path) -> None:
    """Make the host-lock folder (only this user may write it: 0700) or check the one there is this user's own and
    a real folder: under a shared /tmp another user can create `pretrain-planner-<uid>` first, or a link of that
    name, and hold (or read) every lock of ours."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder" if not stat.S_ISDIR(st.st_mode) else None
        owner = what or f"owned by uid {st.st_uid}, not this user ({os.getuid()})"
        raise RuntimeError(
            f"host-lock folder {folder} is {owner}: refusing to use it (another user's locks would hold this "
            "host's devices, or read ours); remove it, or set PP_HOST_LOCKS to a folder of your own"
        )


def host_cores() -> list[int]:
    """The CPU cores this process may run on (a container's or cgroup's share, not the whole machine)."""
    return sorted(os.sched_getaffinity(0))


def visible_gpus() -> list[int]:
    """GPU indices this process can use: CUDA_VISIBLE_DEVICES when it lists indices, else nvidia-smi's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        items = [x.strip() for x in env.split(",") if x.strip()]
        if all(x.isdigit() for x in items):
            return [int(x) for x in items]
        return list(range(len(items)))  # UUIDs: the job sees them as 0..n-1
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(range(sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")))) if out.returncode == 0 else []


@dataclass
class Placement:
    """What a job holds: its GPUs (indices for CUDA_VISIBLE_DEVICES), each rank's cores, and whether it
    holds the whole host (a CPU job)."""

    gpus: list[int]
    cpus_by_rank: list[list[int]]
    threads_per_rank: int
    whole_host: bool
    held_since: float = 0.0
    waited_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_cores(cores: list[int], world: int, per_rank: int) -> list[list[int]]:
    """Rank r's cores: `per_rank` consecutive ones, wrapping around when there are fewer cores than asked."""
    n = len(cores)
    return [[cores[(r * per_rank + j) % n] for j in range(per_rank)] for r in range(world)]


@dataclass
class HostPool:
    """This host's GPUs and cores, held through lock files (see the module's docstring)."""

    gpus: list[int]
    cores: list[int] = field(default_factory=host_cores)
    folder: Path = field(default_factory=lock_dir)

    @classmethod
    def from_config(cls, local_gpus: int | None) -> HostPool:
        """`launcher.local_gpus`: how many GPUs this host lends to jobs (null: every visible one)."""
        found = visible_gpus()
        if local_gpus is None:
            return cls(found)
        if found and local_gpus > len(found):
            raise ValueError(f"launcher.local_gpus is {local_gpus} but this host shows {len(found)} GPU(s)")
        return cls(found[:local_gpus] if found else list(range(local_gpus)))

    @property
    def cores_per_gpu(self) -> int:
        return max(1, len(self.cores) // max(1, len(self.gpus)))

    def threads_per_rank(self, on_gpus: bool, cpu_threads: int = 1) -> int:
        """A GPU rank gets its GPU's share of the cores; a CPU rank `cpu_threads` (the `cpu` GPU type: one
        core per rank, its stand-in for a GPU)."""
        return self.cores_per_gpu if on_gpus else max(1, cpu_threads)

    def _slot_cores(self, slot: int) -> list[int]:
        k = self.cores_per_gpu
        return [self.cores[(slot * k + j) % len(self.cores)] for j in range(k)]

    @contextlib.contextmanager
    def hold(
        self,
        world: int,
        on_gpus: bool,
        cpu_threads: int = 1,
        log: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
        poll_s: float = 0.5,
    ) -> Iterator[Placement]:
        """Wait until the job's devices are free, hold them for the `with` block; yields where each rank runs."""
        if on_gpus and world > len(self.gpus):
            raise RuntimeError(
                f"the job needs {world} GPU(s) but this host lends {len(self.gpus)} to local jobs "
                f"(launcher.local_gpus; visible: {visible_gpus() or 'none'})"
            )
        own_lock_dir(self.folder)
        t0, said = time.time(), False
        while True:
            got = self._try(world, on_gpus)
            if got is not None:
                break
            if stop is not None and stop.is_set():
                raise RuntimeError("the driver is stopping: the job was not started")
            if log and not said:
                log(f"waiting for {'GPUs ' if on_gpus else 'the host (a CPU job holds it alone)'}: "
                    "another local job holds them")  # fmt: skip
                said = True
            time.sleep(poll_s)
        files, slots = got
        try:
            if on_gpus:
                gpus = [self.gpus[s] for s in slots]
                cpus = [self._slot_cores(s) for s in slots]
                per = self.cores_per_gpu
            else:
                gpus, per = [], max(1, cpu_threads)
                cpus = split_cores(self.cores, world, per)
            place = Placement(gpus, cpus, per, not on_gpus, time.time(), round(time.time() - t0, 3))
            if log:
                log(f"holding {'GPU(s) ' + ','.join(map(str, gpus)) + ' and ' if gpus else 'the whole host; '}"
                    f"cores {' | '.join(','.join(map(str, c)) for c in cpus)} (one group per rank)")  # fmt: skip
            yield place
        finally:
            for fh in files:
                fh.close()  # releases its flock

    def _try(self, world: int, on_gpus: bool) -> tuple[list[Any], list[int]] | None:
        """Take every lock the job needs, or none (a short mutex makes the multi-lock step atomic)."""
        with open(self.folder / "pool.mutex", "a") as mutex:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            held: list[Any] = []

            def take(name: str, mode: int) -> bool:
                fh = open(self.folder / name, "a")  # noqa: SIM115 - kept open while held
                try:
                    fcntl.flock(fh, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    fh.close()
                    return False
                held.append(fh)
                return True

            def give_up() -> None:
                for fh in held:
                    fh.close()

            if not take("host.lock", fcntl.LOCK_SH if on_gpus else fcntl.LOCK_EX):
                give_up()
                return None
            if not on_gpus:
                return held, []
            slots = []
            for slot in range(len(self.gpus)):
                if len(slots) == world:
                    break
                if take(f"gpu{self.gpus[slot]}.lock", fcntl.LOCK_EX):
                    slots.append(slot)
            if len(slots) < world:
                give_up()
                return None
            return held, slots


def cgroup_oom_kills() -> int | None:
    """The kernel's out-of-memory kills counted for this process's cgroup (v2 memory.events, hierarchical; v1
    memory.oom_control); None where there is no such file. Local ranks share the driver's cgroup; under SLURM's
    task cgroups (`.../step_N/task_K`) the step's cgroup is read, which counts every task of the step."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = Path(path.lstrip("/"))
        if rel.name.startswith("task_"):
            rel = rel.parent
        if controllers == "":  # cgroup v2
            f = Path("/sys/fs/cgroup") / rel / "memory.events"
        elif "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control"
        else:
            continue
        with contextlib.suppress(OSError, ValueError):
            for row in f.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


# ---------------------------------------------------------------- processes of a local job


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, it names one process: pids are
    reused), or None if there is no such live process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":  # a zombie has finished
        return None
    return int(fields[19])


def _boot_epoch(now: float) -> float | None:
    """The wall-clock time the host booted: now - /proc/uptime (10 ms), else /proc/stat's btime (1 s)."""
    try:
        with open("/proc/uptime") as fh:
            return now - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/stat") as fh:
            return next(float(ln.split()[1]) for ln in fh if ln.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def start_epoch(pid: int) -> float | None:
    """The wall-clock time a live process started (Linux: /proc/<pid>/stat's starttime, field 22, placed on the
    wall clock by the boot time); None where /proc cannot tell."""
    ticks, hz = start_time(pid), os.sysconf("SC_CLK_TCK")
    boot = _boot_epoch(time.time())
    return None if ticks is None or boot is None or hz <= 0 else boot + ticks / hz


def alive(pid: int, started: int | None) -> bool:
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def end_processes(procs: list[tuple[int, int | None]], grace_s: float = 3.0) -> list[int]:
    """SIGTERM the live ones among (pid, start time), SIGKILL what is left after `grace_s` (submitit's ranks
    ignore SIGTERM); the pids ended."""
    import signal

    live = [(p, s) for p, s in procs if alive(p, s)]
    for pid, _ in live:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    end = time.time() + grace_s
    while time.time() < end and any(alive(p, s) for p, s in live):
        time.sleep(0.1)
    for pid, s in live:
        if alive(pid, s):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    end = time.time() + 5
    while time.time() < end and any(alive(p, s) for p, s in live):
        time.sleep(0.1)
    return [p for p, _ in live]

"""Queue waits asked of the scheduler without submitting (issue 38): `sbatch --test-only` with exactly the request
a training job of a setting would make (its partition, nodes, tasks, GPUs, CPUs, memory, time limit: the site's
settings through site.sbatch_parameters, the one place a job's request is made), and the scheduler's expected
start read back as a calendar.Wait. Nothing is submitted; an answer without a start, a refusal or a scheduler
that cannot be reached is an unknown wait, never zero. Imports no torch."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pretrain_planner.planning.calendar import Wait, expected_start
from pretrain_planner.planning.site import sbatch_parameters

# (returncode, stdout + stderr) of a command: sbatch writes its --test-only answer to stderr
Asker = Callable[[list[str]], tuple[int, str]]


def run_sbatch(cmd: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    return p.returncode, p.stdout + p.stderr


def _flag(name: str, value: Any) -> str | None:
    if value is True:
        return f"--{name}"
    if value is False or value is None:
        return None
    return f"--{name}={value}"


def asking_command(settings: dict[str, Any], nodes: int, gpus_per_node: int, job_name: str) -> list[str]:
    """The `sbatch --test-only` line of a training job of `nodes` x `gpus_per_node` on the site's `settings` (a GPU
    type's, site.gpu_settings): the same options submitit's SlurmExecutor writes into the job's header."""
    p = sbatch_parameters(settings, nodes, gpus_per_node, job_name)
    flags = [
        _flag("job-name", p["job_name"]),
        _flag("nodes", p["nodes"]),
        _flag("ntasks-per-node", p["ntasks_per_node"]),
        _flag("cpus-per-task", p["cpus_per_task"]),
        _flag("time", p["time"]),
        *(
            _flag(k.replace("_", "-"), p.get(k))
            for k in ("partition", "constraint", "account", "qos", "gres", "gpus_per_node", "mem")
        ),  # fmt: skip
        *(_flag(k, v) for k, v in (p.get("additional_parameters") or {}).items()),
    ]
    return ["sbatch", "--test-only", *[f for f in flags if f], "--wrap", "true"]


def ask_start(
    settings: dict[str, Any],
    nodes: int,
    gpus_per_node: int,
    job_name: str,
    ask: Asker = run_sbatch,
    now: datetime | None = None,
) -> tuple[Wait, list[str]]:
    """(the wait the scheduler expects for this request, the command asked). `now`: the scheduler's clock (its
    answer is local time; on a login node the host's clock is the controller's within seconds)."""
    cmd = asking_command(settings, nodes, gpus_per_node, job_name)
    asked_at = now or datetime.now()
    rc, out = ask(cmd)
    part = settings.get("partition") or "the default partition"
    how = f"sbatch --test-only on {part}"
    if rc != 0:
        line = next((ln.strip() for ln in out.splitlines() if ln.strip()), f"exit status {rc}")
        return Wait(None, f"{how}: refused or not reachable ({line[:200]})"), cmd
    return expected_start(out, asked_at, how), cmd


def cred_expire(ask: Asker = run_sbatch) -> tuple[float | None, str]:
    """(seconds, how) of the controller's credential lifetime (`scontrol show config`, AuthInfo cred_expire=N): how
    long a requeued job is held. None where it says none (SLURM's default then) or cannot be asked."""
    rc, out = ask(["scontrol", "show", "config"])
    if rc != 0:
        return None, "scontrol show config not answered"
    m = re.search(r"cred_expire=(\d+)", out)
    return (float(m.group(1)), f"scontrol show config: cred_expire={m.group(1)}") if m else (
        None, "scontrol show config: no cred_expire (SLURM's default)")  # fmt: skip

"""A SLURM job's state as the driver reads it: the controller's view while it knows the job, accounting's after
it forgot it; UNREACHABLE when nobody answered (never taken as "submit anew"), GONE when both are known to have no
trace. Shared by the poller (every waiting job in one call: launch/poller.py) and the one-off questions of
launch/slurm.py (re-attaching, a state that could not be learned). Imports no torch."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

# SLURM states (controller's view) in which a job may still deliver its result: wait, never resubmit.
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
               "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip


@dataclass(frozen=True)
class SlurmState:
    state: str  # SLURM's state name, UNREACHABLE (nobody answered) or GONE (known to have left no trace)
    source: str  # controller | accounting | none
    restarts: int | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def known(self) -> bool:
        return self.state != "UNREACHABLE"


def run_cmd(cmd: list[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 255, "", f"{type(exc).__name__}: {exc}"
    return out.returncode, out.stdout, out.stderr


def accounting_states(job_ids: list[str]) -> dict[str, SlurmState]:
    """Accounting's last state of each job (one sacct call), for jobs the controller no longer knows."""
    rc, out, err = run_cmd(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,State"])
    if rc != 0:
        if "accounting storage is disabled" in err.lower():
            why = "the controller forgot the job and this site keeps no accounting"
            return {j: SlurmState("GONE", "none", reason=why) for j in job_ids}
        return {j: SlurmState("UNREACHABLE", "accounting", reason=err.strip()[:300]) for j in job_ids}
    last: dict[str, str] = {}
    for line in out.splitlines():
        jid, _, state = line.partition("|")
        if state.strip():
            last[jid.strip()] = state.split()[0].upper()  # a requeued job has a row per start: the last is now
    gone = "neither the controller nor accounting knows the job"
    return {j: SlurmState(last[j], "accounting") if j in last else SlurmState("GONE", "accounting", reason=gone)
            for j in job_ids}  # fmt: skip


def slurm_state(job_id: str) -> SlurmState:
    """One job's state, asked on its own (re-attaching; the poller asks for every waiting job at once)."""
    rc, out, err = run_cmd(["scontrol", "show", "job", "-o", str(job_id)])
    if rc == 0 and "JobState=" in out:
        fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
        restarts = fields.get("Restarts")
        return SlurmState(fields["JobState"].upper(), "controller", int(restarts) if restarts and restarts.isdigit()
                          else None, fields.get("Reason"))  # fmt: skip
    if "invalid job id" not in (err + out).lower():
        return SlurmState("UNREACHABLE", "controller", reason=(err or out).strip()[:300])
    return accounting_states([str(job_id)])[str(job_id)]

"""The driver's share of the scheduler's queue: a site caps how many jobs a user may have queued (a QOS's
MaxSubmitJobsPerUser, an association's MaxSubmitJobs), and a study's grid has thousands of cells. A sweep that
submits a job per free Snakemake slot hits that cap at once; sbatch then refuses the rest ("job submit limit"),
which is back-pressure, never a failed cell.

So the driver keeps at most `max_queued_jobs` of its own jobs queued or running (`Slots`: the site file's key, else
the cap the scheduler states for the job's account and QOS, read once with `sacctmgr`), and a refusal for a submit
limit all the same (the user's other jobs count too) waits and asks again. A cell waiting for either says so in its
state record (`waiting`), which `pretrain-planner status` counts. Imports no torch.
"""

from __future__ import annotations

import functools
import getpass
import threading
from collections.abc import Callable
from typing import Any

from pretrain_planner.launch.slurm_state import run_cmd
from pretrain_planner.planning.site import driver_settings

# sbatch's words for a refusal that waiting clears: the user's (or account's) queued jobs at their cap
SUBMIT_LIMIT = ("maxsubmitjob", "job submit limit", "submit limit")


def is_submit_limit(message: str) -> bool:
    text = message.lower()
    return any(m in text for m in SUBMIT_LIMIT)


def _sacctmgr(args: list[str]) -> list[list[str]] | None:
    rc, out, _ = run_cmd(["sacctmgr", "-n", "-P", *args])
    return [ln.split("|") for ln in out.splitlines() if ln.strip()] if rc == 0 else None


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


@functools.cache
def scheduler_cap(account: str | None, qos: str | None) -> tuple[int | None, str]:
    """(the fewest jobs the scheduler lets this user have queued with this account and QOS, where it says so),
    from the user's associations (MaxSubmitJobs; the account's, or every one when the job names none) and the QOS
    (MaxSubmitJobsPerUser; the job's, else each association's default). (None, why) where nothing is stated or
    sacctmgr cannot be asked (a site without accounting, a login node without the client)."""
    user = getpass.getuser()
    assoc = _sacctmgr(["show", "assoc", "where", f"user={user}", "format=account,maxsubmit,defaultqos"])
    if assoc is None:
        return None, "sacctmgr could not be asked"
    rows = [r for r in assoc if len(r) == 3 and (account is None or r[0] == account)]
    caps = [(n, f"association {user}@{r[0]} MaxSubmitJobs") for r in rows if (n := _int(r[1])) is not None]
    qos_names = {qos} if qos else {r[2] for r in rows if r[2]} or {"normal"}
    for name in sorted(qos_names):
        found = _sacctmgr(["show", "qos", name, "format=name,maxsubmitpu"])
        for r in found or []:
            if len(r) == 2 and r[0] == name and (n := _int(r[1])) is not None:
                caps.append((n, f"QOS {name} MaxSubmitJobsPerUser"))
    if not caps:
        return None, "the scheduler states no submit limit for you"
    return min(caps)


def queue_cap(settings: dict[str, Any]) -> tuple[int | None, str]:
    """How many of its jobs the driver keeps queued for jobs of these site settings, and where that comes from: the
    site file's max_queued_jobs (read now: an edit applies to a running driver), else the scheduler's cap."""
    cap = driver_settings(settings.get("site"))["max_queued_jobs"]
    if cap is not None:
        return int(cap), f"max_queued_jobs in {settings.get('site')}"
    return scheduler_cap(settings.get("account"), settings.get("qos"))


class Slots:
    """The driver's jobs in the queue (queued or running), by job name: a new one waits while `cap` are held."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()

    def take(self, key: str, cap: int | None, stop: threading.Event, waiting: Callable[[int], None]) -> bool:
        """Hold a slot for `key` once fewer than `cap` are held (None: no cap); `waiting(held)` is called once
        if it must wait. False if `stop` was set while waiting."""
        with self._cond:
            said = False
            while cap is not None and key not in self._held and len(self._held) >= cap:
                if not said:
                    waiting(len(self._held))
                    said = True
                self._cond.wait(1.0)
                if stop.is_set():
                    return False
            self._held.add(key)
            return True

    def hold(self, key: str) -> None:
        """A job already in the queue (re-attached to) counts, whatever the cap."""
        with self._cond:
            self._held.add(key)

    def release(self, key: str) -> None:
        with self._cond:
            self._held.discard(key)
            self._cond.notify_all()

    def wait_release(self, timeout: float) -> None:
        """Until one of the driver's jobs leaves the queue (room for a refused one, perhaps), or `timeout`."""
        with self._cond:
            self._cond.wait(timeout)

    def held(self) -> int:
        with self._cond:
            return len(self._held)


SLOTS = Slots()

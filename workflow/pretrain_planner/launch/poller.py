"""One poller per driver: the state of every SLURM job the driver waits on, from one `squeue` call per interval
(and one `sacct` call for the jobs the controller no longer knows), whatever the number of cells.

A sweep of 256 waiting cells that each asked `scontrol show job` on its own back-off made thousands of controller
calls in its first minutes; site administrators watch that load (`sdiag`). Here each waiting cell asks the
poller for its job's next state and blocks until the next round answers it. A round runs soon after a job is added
or a state changes (1 s), backing off by 1.5x to the site's `poll_max_s` while nothing changes: the controller
sees at most one `squeue` (and one `sacct`) per round. Imports no torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pretrain_planner.launch.slurm_state import SlurmState, accounting_states, run_cmd

FIRST_S = 1.0  # the interval after a job was added or a state changed
FIELDS = "JobID:40|,State:30|,RestartCnt:10|,Reason:300|"  # squeue --Format: each field ends with `|`


def controller_states(job_ids: list[str], run: Callable = run_cmd) -> dict[str, SlurmState] | None:
    """The controller's state of each job it still knows (one squeue call); None when nobody answered."""
    rc, out, err = run(["squeue", "-h", f"--jobs={','.join(job_ids)}", "--states=all", f"--Format={FIELDS}"])
    if rc != 0:
        if "invalid job id" in (err + out).lower():
            return {}
        return None
    states = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 4 or not parts[0]:
            continue
        jid, state, restarts, reason = parts[:4]
        states[jid] = SlurmState(state.upper(), "controller", int(restarts) if restarts.isdigit() else None, reason)
    return states


class Poller:
    """The driver's poller thread and what its last round learned; started on the first `watch`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: set[str] = set()
        self._states: dict[str, SlurmState] = {}
        self._round = 0
        self._hurry = False
        self._thread: threading.Thread | None = None
        self.poll_max_s = 60.0

    def watch(self, job_id: str, poll_max_s: float) -> int:
        """Add a job to every round from now on; the round a later `next_state` must be newer than."""
        with self._cond:
            self._watched.add(str(job_id))
            self.poll_max_s = float(poll_max_s)  # the site file's, as read for the newest job
            self._hurry = True  # a round soon (not at once: rounds stay FIRST_S apart)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pp-slurm-poller", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self._round

    def unwatch(self, job_id: str) -> None:
        with self._cond:
            self._watched.discard(str(job_id))
            self._states.pop(str(job_id), None)

    def next_state(self, job_id: str, after: int, stop: threading.Event) -> tuple[SlurmState, int] | None:
        """The job's state from the first round after `after` (and that round), or None once `stop` is set."""
        job_id = str(job_id)
        with self._cond:
            while self._round <= after or job_id not in self._states:
                if stop.is_set():
                    return None
                self._cond.wait(0.5)
            return self._states[job_id], self._round

    def _ask(self, ids: list[str]) -> dict[str, SlurmState]:
        try:
            return self._ask_once(ids)
        except Exception as exc:  # noqa: BLE001 - the thread must live on: every waiting cell depends on it
            why = f"the poller could not read the states: {type(exc).__name__}: {exc}"[:300]
            return {j: SlurmState("UNREACHABLE", "controller", reason=why) for j in ids}

    def _ask_once(self, ids: list[str]) -> dict[str, SlurmState]:
        known = controller_states(ids)
        if known is None:
            return {j: SlurmState("UNREACHABLE", "controller", reason="squeue did not answer") for j in ids}
        gone = [j for j in ids if j not in known]
        if gone:
            known.update(accounting_states(gone))
        return known

    def _loop(self) -> None:
        interval = FIRST_S
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait(5.0)
                ids = sorted(self._watched)
                self._hurry = False
            started = time.time()
            states = self._ask(ids)
            with self._cond:
                changed = any(self._states.get(j) != s for j, s in states.items())
                self._states.update({j: s for j, s in states.items() if j in self._watched})
                self._round += 1
                self._cond.notify_all()
            interval = FIRST_S if changed else min(self.poll_max_s, interval * 1.5)
            # the next round: after `interval`, or FIRST_S after this one when a job was added meanwhile (never
            # sooner: the rate of rounds is bounded whatever the number of cells)
            with self._cond:
                while True:
                    wait = (FIRST_S if self._hurry else interval) - (time.time() - started)
                    if wait <= 0:
                        break
                    self._cond.wait(wait)


POLLER = Poller()

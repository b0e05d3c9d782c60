"""A cell's state record, `state.json` in its folder: where its measurement stands, as data.

The driver (launch.cell.run_cell) writes it atomically at each change, so `pretrain-planner status`, its
`--watch` view and a re-attaching driver read a fact instead of matching the wording of log lines:

    {"format": 1, "state": "running", "launcher": "slurm", "job_id": "4242", "job_ids": ["4240", "4242"],
     "attempt": 2, "started_at": ..., "submitted_at": ..., "running_at": ..., "finished_at": null,
     "updated_at": ..., "result_status": null, "error": null,
     "driver": {"pid": 123, "start": 456, "host": "login1"}, "log": "cell.log"}

States: `submitted` (handed to the launcher: waiting for devices, queued, starting; `job_id` once known),
`running` (rank 0 reported its first progress), `done` (result.json written; `result_status` is its status),
`failed` (the attempt raised; `error`). `attempt` counts run_cell calls since the cell was last done (a
Snakemake retry, a re-run after a failure or a killed driver); `job_ids` every job those attempts used.
Imports no torch.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch.hostpool import alive, start_time
from pretrain_planner.results import atomic_write_text

STATE_FILE = layout.CELL_STATE
FORMAT = 1
STATES = ("submitted", "running", "done", "failed")
LIVE = ("submitted", "running")


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def read_state(folder: str | Path) -> dict[str, Any] | None:
    """The cell's record, or None (no record: results of an older version, or never started)."""
    try:
        data = json.loads((Path(folder) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("state") in STATES else None


def write_state(folder: str | Path, state: str, **fields: Any) -> dict[str, Any]:
    """Write a whole record (tests and tools; run_cell keeps one through `StateRecord`)."""
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    record = {"format": FORMAT, "state": state, **fields, "updated_at": fields.get("updated_at") or now()}
    atomic_write_text(Path(folder) / STATE_FILE, json.dumps(record, indent=1) + "\n")
    return record


def driver_gone(record: dict[str, Any]) -> bool:
    """Whether the driver that wrote a live record has ended (known on its own host only)."""
    d = record.get("driver") or {}
    if record.get("state") not in LIVE or not d.get("pid") or d.get("host") != socket.gethostname():
        return False
    return not alive(int(d["pid"]), d.get("start"))


class StateRecord:
    """The record of one attempt of a cell, updated from run_cell's thread and its watcher thread."""

    def __init__(self, folder: str | Path, launcher: str, log_name: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.previous = read_state(self.folder)
        prev = self.previous or {}
        carried = prev.get("state") != "done"  # a new measurement after a done one starts counting anew
        pid = os.getpid()
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {
            "format": FORMAT, "state": "submitted", "launcher": launcher, "job_id": None,
            "job_ids": list(prev.get("job_ids") or []) if carried else [],
            "attempt": int(prev.get("attempt") or 0) + 1 if carried else 1,
            "started_at": now(), "submitted_at": None, "running_at": None, "finished_at": None,
            "updated_at": None, "result_status": None, "error": None,
            "driver": {"pid": pid, "start": start_time(pid), "host": socket.gethostname()}, "log": log_name,
        }  # fmt: skip

    def previous_note(self) -> str | None:
        """What an earlier attempt left, for the log: a record still live means its driver was stopped or
        killed (a SLURM job may still run and is re-attached to; a local one was ended)."""
        p = self.previous
        if not p or p.get("state") not in (*LIVE, "failed"):
            return None
        job = f"job {p['job_id']}" if p.get("job_id") else "no job yet"
        if p["state"] == "failed":
            return f"attempt {p.get('attempt')} failed ({job}): {p.get('error')}"
        d = p.get("driver") or {}
        since = p.get("running_at") or p.get("submitted_at") or p.get("started_at")
        return (f"attempt {p.get('attempt')} was left {p['state']} ({job}, {p.get('launcher')} launcher, since "
                f"{since}) by driver pid {d.get('pid')} on {d.get('host')}, which did not finish it")  # fmt: skip

    def was_running(self, job_id: Any) -> bool:
        """Whether the earlier attempt's record had this job running (a re-attached job runs on)."""
        p = self.previous or {}
        return p.get("state") == "running" and p.get("job_id") is not None and str(p["job_id"]) == str(job_id)

    def update(self, state: str | None = None, **fields: Any) -> None:
        with self._lock:
            if state is not None:
                if state not in STATES:
                    raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
                self.data["state"] = state
                stamp = {"submitted": "submitted_at", "running": "running_at"}.get(state, "finished_at")
                self.data[stamp] = self.data.get(stamp) or now()
            job_id = fields.pop("job_id", None)
            if job_id is not None:
                self.data["job_id"] = str(job_id)
                if str(job_id) not in self.data["job_ids"]:
                    self.data["job_ids"].append(str(job_id))
            self.data.update(fields)
            self.data["updated_at"] = now()
            atomic_write_text(self.folder / STATE_FILE, json.dumps(self.data, indent=1) + "\n")

    @property
    def state(self) -> str:
        return self.data["state"]

"""The processes of a part: each group of plans in a worker process of its own (worker.py), up to `lanes` at once,
each cell stopped at its own time cap and every worker at the part's deadline. Imports no torch: a CUDA fault, a
hang or an out-of-memory kill ends a worker, never the runner.

A worker that dies or is stopped while a cell runs leaves that cell a record (`crashed` with the exit status and
the end of the worker's log, or `timeout` with the cap it ran past); the group's cells after it run in a fresh
worker while the part has time, and are `skipped` (with the reason) once it has none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cells import Settings, write_record
from .plans import Plan

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent


def worker_env() -> dict[str, str]:
    """A worker process's environment: this one, with benchmarks/ and workflow/ first on the path, unbuffered."""
    path = [str(BENCHMARKS), str(REPO / "workflow"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "PYTHONUNBUFFERED": "1"}


@dataclass
class _Worker:
    proc: subprocess.Popen
    plans: list[Plan]  # not ended yet, in order
    rows: Path
    log: Path
    offset: int = 0
    current: tuple[str, float] | None = None  # (label, started at)
    others: int = 0  # the most other workers alive while the current cell ran
    buffer: str = ""
    began: bool = False  # a cell started (a worker that dies before its first is not restarted)


@dataclass
class Runner:
    """Run groups of plans; `on_record(rec)` is called with each cell's record the moment it ends."""

    part_dir: Path
    settings: Settings
    python: str
    models: str
    gpus: str
    log: Callable[[str], None]
    on_record: Callable[[dict[str, Any]], None]
    caps: dict[str, float] = field(default_factory=dict)  # label -> seconds a cell may run
    predicted: dict[str, float] = field(default_factory=dict)  # label -> predicted seconds (for the reasons)
    poll_s: float = 0.25
    _n: int = 0

    def _start(self, plans: list[Plan]) -> _Worker:
        self._n += 1
        name = f"worker{self._n:02d}"
        rows, log, job = (self.part_dir / f"{name}.{ext}" for ext in ("rows.jsonl", "log", "job.json"))
        job.write_text(
            json.dumps(
                {
                    "plans": [p.to_json() for p in plans],
                    "settings": asdict(self.settings),
                    "rows": str(rows),
                    "models": self.models,
                    "gpus": self.gpus,
                },
                indent=1,
            )
        )
        rows.touch()
        fh = log.open("w")
        proc = subprocess.Popen(
            [self.python, "-m", "gpucheck.worker", str(job)],
            cwd=REPO,
            env=worker_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        fh.close()
        self.log(f"  {name} (pid {proc.pid}): {', '.join(p.label for p in plans)}")
        return _Worker(proc, list(plans), rows, log)

    def _read(self, w: _Worker, alive: int) -> None:
        """Take in the worker's new rows: a start marks its current cell, an end hands the record on."""
        with w.rows.open() as fh:
            fh.seek(w.offset)
            w.buffer += fh.read()
            w.offset = fh.tell()
        *lines, w.buffer = w.buffer.split("\n")
        for line in lines:
            if not line.strip():
                continue
            ev = json.loads(line)
            if ev["event"] == "start":
                w.current, w.others, w.began = (ev["label"], time.time()), alive - 1, True
            elif ev["event"] == "end":
                rec = ev["record"]
                rec["concurrent_workers"] = w.others
                w.plans = [p for p in w.plans if p.label != ev["label"]]
                w.current = None
                self.on_record(rec)
        if w.current is not None:
            w.others = max(w.others, alive - 1)

    def _tail(self, w: _Worker, n: int = 3000) -> str:
        try:
            return w.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _stop(self, w: _Worker) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGTERM)
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()

    def _ended(self, w: _Worker, status: str, reason: str) -> None:
        """The record of the cell `w` was running when it died or was stopped."""
        label, t0 = w.current  # type: ignore[misc]
        plan = next(p for p in w.plans if p.label == label)
        rec = {
            "label": label,
            "plan": plan.to_json(),
            "status": status,
            "reason": reason,
            "cell_wall_s": round(time.time() - t0, 1),
            "worker_log_tail": self._tail(w),
            "concurrent_workers": w.others,
        }
        write_record(self.settings, rec)
        w.plans = [p for p in w.plans if p.label != label]
        w.current = None
        self.on_record(rec)

    def _skip(self, plans: list[Plan], reason: str) -> None:
        for plan in plans:
            rec = {"label": plan.label, "plan": plan.to_json(), "status": "skipped", "reason": reason}
            write_record(self.settings, rec)
            self.on_record(rec)

    def run(self, groups: list[list[Plan]], deadline: float, lanes: int = 1, min_start_s: float = 5.0) -> None:
        """Run `groups` (each in one worker, in order, at most `lanes` workers at once) until done or `deadline`
        (time.time()); every plan ends with a record."""
        pending = [list(g) for g in groups if g]
        running: list[_Worker] = []
        try:
            self._loop(pending, running, deadline, lanes, min_start_s)
        finally:  # whatever happens here (a SIGTERM of the whole command), no worker outlives the part
            for w in running:
                if w.proc.poll() is None:
                    self._stop(w)
                    # what it wrote since the last poll (a cell it began within poll_s: else not recorded stopped)
                    self._read(w, len(running))
                    if w.current:
                        self._ended(w, "stopped", "the command was stopped while it ran")

    def _loop(self, pending: list[list[Plan]], running: list[_Worker], deadline: float, lanes: int,
              min_start_s: float) -> None:  # fmt: skip
        while pending or running:
            now = time.time()
            while pending and len(running) < lanes and deadline - now >= min_start_s:
                running.append(self._start(pending.pop(0)))
            if not running:  # too little time left to start what is pending
                for g in pending:
                    self._skip(
                        g,
                        f"the part's time ran out ({max(0.0, deadline - now):.0f} s left, a process "
                        f"needs {min_start_s:.0f} s to start)",
                    )
                return
            time.sleep(self.poll_s)
            now = time.time()
            for w in list(running):
                self._read(w, len(running))
                code = w.proc.poll()
                cap = self.caps.get(w.current[0]) if w.current else None
                if code is None and w.current and cap is not None and now - w.current[1] > cap:
                    self._stop(w)
                    self._read(w, len(running))
                    if w.current:
                        pred = self.predicted.get(w.current[0])
                        self._ended(
                            w,
                            "timeout",
                            f"stopped after {now - w.current[1]:.0f} s: past its cap of {cap:.0f} "
                            f"s" + (f" (predicted {pred:.0f} s)" if pred else ""),
                        )
                    code = w.proc.returncode
                elif code is None and now > deadline:
                    self._stop(w)
                    self._read(w, len(running))
                    if w.current:
                        self._ended(w, "timeout", f"stopped after {now - w.current[1]:.0f} s: the part's time ran out")
                    code = w.proc.returncode
                if code is None:
                    continue
                self._read(w, len(running))
                if w.current:  # died inside a cell: a CUDA fault, an out-of-memory kill, an abort
                    why = f"signal {-code}" if code < 0 else f"exit status {code}"
                    self._ended(w, "crashed", f"the worker process ended with {why} during this cell")
                running.remove(w)
                if w.plans and not w.began:  # it never got to a cell (an import error?): a restart would too
                    for plan in w.plans:
                        w.current = (plan.label, now)
                        self._ended(
                            w, "crashed", f"the worker process ended with exit status {code} before its first cell"
                        )
                elif w.plans:  # the group's cells after it: a fresh process
                    self.log(f"  {w.plans[0].label} and after: in a fresh process (the last one ended with {code})")
                    pending.insert(0, w.plans)
        return

"""When one rank fails, every rank fails at once, with the first failure's reason.

Without this, a rank that raised (or was killed) leaves its peers blocked in a collective or in the
out-of-memory protocol's arrival wait until the process group's timeout (10 minutes), and a SLURM job then
sits until its time limit. `PeerWatch` is a thread on every rank of a multi-rank run:

- a rank that fails (`announce`) writes `pp/failed` to the run's TCPStore (which lives beside the process
  groups, not in them) and aborts its own groups;
- every rank polls that key; a rank that sees it aborts its groups, so a collective it is blocked in fails at
  once, and the failure it then raises names the first rank's reason (`failure`);
- every rank beats (`pp/beat/<rank>`, a counter), and rank 0 checks the others' beats: a rank whose beat
  stopped for `stale_s` is dead (SIGKILL, a host out-of-memory kill): rank 0 announces it for that rank, and
  says whether this host's cgroup counted an out-of-memory kill meanwhile (`host_oom`);
- a rank that cannot reach the store any more has lost rank 0 (the store's host): it fails too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from pretrain_planner.launch.hostpool import cgroup_oom_kills

FAILED_KEY = "pp/failed"
BEAT_PREFIX = "pp/beat/"
POLL_S = 0.25
BEAT_S = 1.0
DONE = "done"  # a finished rank's last beat
STORE_LOST_S = 10.0  # the store unreachable this long: rank 0 is gone
STALE_S = 90.0  # a rank whose beat stopped this long is dead (a Python thread beats even during a compile)


class PeerWatch:
    def __init__(self, env: Any, stale_s: float = STALE_S) -> None:
        self.env = env
        self.stale_s = stale_s
        self.failure: str | None = None  # the first failure of any rank, as announced
        self.host_oom = False  # a dead rank coincided with an out-of-memory kill in this host's cgroup
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._announced = False
        self._oom_kills_at_start = cgroup_oom_kills()

    def start(self) -> PeerWatch:
        self._thread = threading.Thread(target=self._run, name="pp-peer-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """This rank is done: stop watching, and say so (rank 0 must not take a finished rank for a dead one)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.env.store.set(f"{BEAT_PREFIX}{self.env.rank}", DONE)

    def oom_killed(self) -> str | None:
        """If the kernel killed a process of this job's cgroup for memory since the watch started: how we know."""
        kills = cgroup_oom_kills()
        if kills is None or self._oom_kills_at_start is None or kills <= self._oom_kills_at_start:
            return None
        self.host_oom = True
        return f"cgroup memory.events oom_kill {self._oom_kills_at_start} -> {kills}"

    def announce(self, reason: str) -> None:
        """This rank failed: tell every rank (first reason wins) and abort this rank's groups."""
        if self._announced:
            return
        self._announced = True
        msg = f"rank {self.env.rank}: {reason}"[:1000]
        with contextlib.suppress(Exception):
            if not self.env.store.check([FAILED_KEY]):
                self.env.store.set(FAILED_KEY, msg)
        self.failure = self.failure or msg
        with contextlib.suppress(Exception):
            self.env.abort_group()

    def check(self) -> str | None:
        """The announced failure, if any (None while every rank is well)."""
        if self.failure is None:
            with contextlib.suppress(Exception):
                if self.env.store.check([FAILED_KEY]):
                    self.failure = self.env.store.get(FAILED_KEY).decode(errors="replace")
        return self.failure

    def _peer_failed(self, msg: str) -> None:
        self.failure = self.failure or msg
        with contextlib.suppress(Exception):
            self.env.abort_group()

    def _run(self) -> None:
        env = self.env
        beats = 0
        last_beat = 0.0
        start = time.monotonic()
        lost_since: float | None = None
        seen: dict[int, tuple[bytes | None, float]] = {r: (None, start) for r in range(1, env.world_size)}
        keys = [f"{BEAT_PREFIX}{r}" for r in range(env.world_size)]
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            try:
                if now - last_beat >= BEAT_S:
                    beats += 1
                    env.store.set(keys[env.rank], str(beats))
                    last_beat = now
                if env.store.check([FAILED_KEY]):
                    self._peer_failed(env.store.get(FAILED_KEY).decode(errors="replace"))
                    return
                if env.rank == 0:
                    self._check_beats(keys, seen, now)
            except Exception as exc:  # noqa: BLE001 - the store is unreachable: rank 0 may be gone
                lost_since = lost_since or now
                if self._stop.is_set():
                    return
                if now - lost_since >= STORE_LOST_S:  # not a hiccup, nor rank 0 having just finished first
                    self._peer_failed(f"rank 0 (the TCPStore's host) is gone: {type(exc).__name__}: {exc}"[:500])
                    return
                continue
            lost_since = None

    def _check_beats(self, keys: list[str], seen: dict[int, tuple[bytes | None, float]], now: float) -> None:
        """Rank 0: a rank whose beat did not change (or never came) for `stale_s` is dead."""
        env = self.env
        present = [k for k in keys[1:] if env.store.check([k])]
        values = dict(zip(present, env.store.multi_get(present) if present else [], strict=True))
        for rank in range(1, env.world_size):
            value = values.get(keys[rank])
            if value == DONE.encode():
                continue
            if seen[rank][0] != value:
                seen[rank] = (value, now)
            elif now - seen[rank][1] > self.stale_s:
                killed = self.oom_killed()
                why = (
                    f"host out of memory: the kernel killed a process of this job ({killed})"
                    if killed
                    else "killed or hung (no out-of-memory kill counted in this host's cgroup)"
                )
                msg = f"rank {rank}: stopped responding for {self.stale_s:.0f} s: {why}"
                with contextlib.suppress(Exception):
                    if not env.store.check([FAILED_KEY]):
                        env.store.set(FAILED_KEY, msg)
                self._peer_failed(msg)
                self._stop.set()
                return

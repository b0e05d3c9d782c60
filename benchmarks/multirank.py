"""Run one function on N ranks as separate local processes, as the local launcher would, without Snakemake.

Each rank gets the environment submitit's LocalExecutor gives a task (SUBMITIT_EXECUTOR=local, its global and
local ids, MASTER_ADDR / MASTER_PORT), so `trainer.parallel.init_rank` and the budget stage's `Ranks` start
their process groups exactly as in a real job. The tests (two gloo ranks on CPU) and benchmarks/gpucheck/cells.py
(two NCCL ranks, one GPU each or both visible) use it; `extra_env(rank)` sets per-rank variables such as
CUDA_VISIBLE_DEVICES. A run that outlives `timeout_s` is killed, the whole process group of every rank,
and says so: a hang can neither block a test nor leave processes behind.

    results = run_ranks("mymodule:fn", 2, {"x": 1}, timeout_s=120)  # fn(payload) -> JSON-able, on each rank

A rank leaves as soon as its outcome is written, without the interpreter's teardown (`leave`): process groups can
live to the end of the process (held by a library's engine: ZeRO-3's were, until trainer/zero.py freed them), and a
gloo worker thread that drops a finished collective's tensors while the interpreter is finalising takes the GIL and
aborts the process (pytorch/pytorch#190489). CI saw it once: the ZeRO-3 rank that had recovered from an
out-of-memory error ended with SIGABRT after its peer had written an `ok` result. Each rank's Python traceback on a
fatal signal goes to its stderr (PYTHONFAULTHANDLER).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    target: str,
    world: int,
    payload: dict[str, Any],
    timeout_s: float,
    extra_env: Callable[[int], dict[str, str]] | None = None,
    workdir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """`target` ("module:function", importable with benchmarks/ and workflow/ on the path) called with
    `payload` on `world` ranks. Returns per rank: {"rank", "returncode", "wall_s", "timed_out", "result" (the
    function's return value) or "error" + "traceback", "stderr" (its tail)}."""
    tmp = Path(tempfile.mkdtemp(prefix="multirank-", dir=workdir))
    (tmp / "payload.json").write_text(json.dumps(payload))
    port = free_port()
    # an inherited PYTHONPATH first (it may put another checkout of the package before this one)
    # and the repository, for a worker in tests/ when the caller runs elsewhere (the chaos soak from its work folder)
    path = os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO / "benchmarks"), str(REPO / "workflow"),
                            str(REPO)])  # fmt: skip
    procs = []
    t0 = time.monotonic()
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONPATH": path.strip(os.pathsep),
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_JOB_ID": str(os.getpid()),
            "SUBMITIT_LOCAL_NTASKS": str(world),
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_GLOBALID": str(rank),
            "SUBMITIT_LOCAL_LOCALID": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "HF_HUB_OFFLINE": "1",
            "PYTHONFAULTHANDLER": "1",
            **(extra_env(rank) if extra_env else {}),
        }
        err = (tmp / f"rank{rank}.err").open("w")
        cmd = [sys.executable, "-m", "multirank", target, str(tmp / "payload.json"), str(tmp / f"rank{rank}.json")]
        procs.append((subprocess.Popen(cmd, env=env, stdout=err, stderr=err, start_new_session=True), err))
    timed_out = False
    for proc, _ in procs:
        left = max(0.1, timeout_s - (time.monotonic() - t0))
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for proc, _ in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = []
    for rank, (proc, err) in enumerate(procs):
        err.close()
        rec: dict[str, Any] = {"rank": rank, "returncode": proc.returncode, "timed_out": timed_out}
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        res = tmp / f"rank{rank}.json"
        if res.is_file():
            rec.update(json.loads(res.read_text()))
        rec["stderr"] = stderr_tail((tmp / f"rank{rank}.err").read_text(errors="replace"))
        out.append(rec)
    return out


def stderr_tail(text: str, limit: int = 4000) -> str:
    """The last `limit` characters of a rank's stderr with every line that already appeared left out: DeepSpeed's
    deprecation warnings repeat hundreds of times (one per collective) and would push out what the rank said last
    (a fatal signal's traceback, a C++ abort's message)."""
    seen: set[str] = set()
    kept, dropped = [], 0
    for line in text.splitlines():
        if line in seen:
            dropped += 1
            continue
        seen.add(line)
        kept.append(line)
    note = [f"({dropped} repeated lines left out)"] if dropped else []
    return "\n".join(note + kept)[-limit:]


def failure(rec: dict[str, Any]) -> str | None:
    """Why one rank of `run_ranks` failed, for an error message (None: it did not): how it ended (an exit status,
    the signal that ended it, a timeout), its error and traceback, its stderr's tail."""
    code = rec["returncode"]
    if code == 0 and not rec.get("timed_out"):
        return None
    if rec.get("timed_out"):
        how = "timed out (a hang?)"
    elif code is not None and code < 0:
        how = f"ended by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"exit {code}"
    else:
        how = f"exit {code}"
    parts = [f"rank {rec['rank']} {how}: {rec.get('error') or 'no Python error (its outcome file says none)'}"]
    parts += [rec.get("traceback") or "", rec["stderr"][-3000:]]
    return "\n".join(p for p in parts if p)


def tiny_step_s() -> float:
    """Seconds of the quickest tiny-gptneox benchmark step on this machine (micro-batch 4, one thread;
    tests/rank_workers.py:tiny_step_time): what a run that must last some seconds is sized by, so that it lasts as
    long on a fast CPU as on a slow one (the tests' `step_s`, the chaos soak's stage runs)."""
    (rank,) = run_ranks("tests.rank_workers:tiny_step_time", 1, {"model": "tiny-gptneox"}, 300)
    why = failure(rank)
    if why:
        raise RuntimeError(f"measuring a step failed: {why}")
    return float(rank["result"]["step_s"])


def _main(argv: list[str]) -> int:
    target, payload_path, out_path = argv
    module, fn_name = target.split(":")
    try:
        import importlib

        fn = getattr(importlib.import_module(module), fn_name)
        result = fn(json.loads(Path(payload_path).read_text()))
        Path(out_path).write_text(json.dumps({"result": result}, default=str))
        return 0
    except BaseException as exc:  # noqa: BLE001 - report anything, then fail
        Path(out_path).write_text(
            json.dumps({"error": f"{type(exc).__name__}: {exc}"[:3000], "traceback": traceback.format_exc()[-6000:]})
        )
        return 1


def leave(code: int) -> None:
    """End this rank's process now that its outcome is on disk: flush what it printed and logged, then exit
    without the interpreter's teardown (see the module docstring: the teardown can abort a rank that succeeded)."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(_main(sys.argv[1:]))

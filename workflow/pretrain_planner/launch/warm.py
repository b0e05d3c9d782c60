"""Ranks of local CPU jobs forked from a warm interpreter: a rank process spends ~4 s of a core importing torch,
transformers and the trainer before it does anything (measured: benchmarks/results/warm_ranks.md), and a local sweep
starts hundreds of them. A driver starts one server per process (`server_command`) that makes those imports once
and forks a rank per request; submitit's local controller starts `python -m pretrain_planner.launch.warm run SOCKET
-u -m submitit.core._submit FOLDER` instead of `python -u -m submitit.core._submit FOLDER`, a client that hands its
standard streams, environment and directory to the server, forwards every signal it gets to the forked rank and
exits as the rank did. What the controller, the driver's failure checks and `end_orphans` rely on holds: the client
is the controller's task (its pid, its exit code, the signals the controller sends), the rank records its own pid
(rank*.json) and dies within half a second of its client (a SIGKILLed client cannot forward its own death).

Only for jobs that use no GPU: CUDA cannot be used in a process forked from one that initialised it, and the server
imports torch with no GPU visible. A rank's start-up stays honest: it starts at its fork, and the imports it did
not pay are added to its `process_to_rank_s` (PRELOAD_ENV: the server's own start to its imports' end), so the
calendar prices a restart as a fresh process would pay it. When the server cannot be reached the client starts the
rank the ordinary way (exec), so a warm start is never a failure. The client imports the standard library and
launch/hostpool alone (~50 ms): it is every local rank's first process.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pretrain_planner.launch.hostpool import alive, start_epoch

# In the environment of a rank forked here: the seconds its server spent starting and importing what a rank imports,
# which the rank did not pay but a fresh process (a restart) does (trainer/startup.Clock adds them back).
PRELOAD_ENV = "PP_WARM_PRELOAD_S"

# What a rank imports before it runs (trainer.run: torch, the trainer; modeling_utils: most of transformers' cost,
# each family's module is then ~0.1 s); submitit's job runner, which the rank calls.
PRELOAD = ("submitit.core.submission", "torch", "torch.distributed", "transformers.modeling_utils",
           "pretrain_planner.trainer.run", "pretrain_planner.launch.rankjob")  # fmt: skip
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGCONT)
_LOCK = threading.Lock()
_SERVER: dict[str, object] = {}


# ---------------------------------------------------------------- the driver's side
def server_command(log=None) -> str | None:
    """The `python` submitit's LocalExecutor should start ranks with: this process's warm server's client (the
    server started on first use, once per process), or None where it could not start (ranks start cold)."""
    with _LOCK:
        if "failed" in _SERVER:
            return None
        proc = _SERVER.get("proc")
        if proc is None or proc.poll() is not None:  # type: ignore[attr-defined]
            try:
                _start_server()
            except (OSError, RuntimeError) as exc:
                _SERVER["failed"] = str(exc)
                if log is not None:
                    log(f"warm ranks: the server did not start ({exc}); ranks start as fresh processes")
                return None
        return f"{sys.executable} -m pretrain_planner.launch.warm run {_SERVER['socket']}"


def _start_server() -> None:
    folder = Path(tempfile.mkdtemp(prefix="pp-warm-"))
    sock = folder / "s"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the server never sees a GPU (see the docstring)
    with open(folder / "server.log", "w") as err:  # the server keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "pretrain_planner.launch.warm", "serve", str(sock),
                                 str(os.getpid())], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                env=env, start_new_session=True)  # fmt: skip
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline().decode() if ready else ""  # type: ignore[union-attr]
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"no answer in 120 s (its log: {folder / 'server.log'})" if not ready else
                           f"it said {line.strip()!r} (its log: {folder / 'server.log'})")  # fmt: skip
    if not _SERVER:  # once per process, whichever server is then running
        atexit.register(stop_server)
    _SERVER.update(proc=proc, socket=str(sock))


def stop_server() -> None:
    """End this process's server (its ranks keep running: each ends with its client)."""
    with _LOCK:
        proc = _SERVER.pop("proc", None)
        if proc is not None and proc.poll() is None:  # type: ignore[attr-defined]
            proc.terminate()  # type: ignore[attr-defined]
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)  # type: ignore[attr-defined]
        _SERVER.pop("failed", None)


# ---------------------------------------------------------------- the wire: length-prefixed JSON, fds beside
def _send(conn: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    head = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(conn, [head + data], fds)
    else:
        conn.sendall(head + data)


def _exactly(conn: socket.socket, n: int, got: bytes = b"") -> bytes | None:
    """`n` bytes (`got` first), no more: a rank that ends at once has its end sent right behind its pid."""
    while len(got) < n:
        more = conn.recv(n - len(got))
        if not more:
            return None
        got += more
    return got


def _recv(conn: socket.socket, want_fds: int = 0) -> tuple[dict | None, list[int]]:
    fds: list[int] = []
    first = b""
    if want_fds:
        first, fds, _, _ = socket.recv_fds(conn, 4, want_fds)
    head = _exactly(conn, 4, first)
    body = _exactly(conn, struct.unpack("!I", head)[0]) if head is not None else None
    return (json.loads(body) if body is not None else None), fds


# ---------------------------------------------------------------- the client: submitit's task
def client(sock_path: str, argv: list[str]) -> None:
    """Be the rank: ask the server for it, forward signals to it, exit as it did. Starts it the ordinary way
    (exec) where the server cannot be reached."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        _send(conn, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid()}, [0, 1, 2])
        reply, _ = _recv(conn)
    except OSError:
        reply = None
    if not reply or "pid" not in reply:
        conn.close()
        os.execv(sys.executable, [sys.executable, *argv])
    pid = int(reply["pid"])

    def forward(signum, _frame):
        with contextlib.suppress(OSError):
            os.kill(pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    end, _ = _recv(conn)  # the rank's end (recv retries after a forwarded signal: PEP 475)
    if end is None:  # the server ended (its driver was killed): the rank goes on; wait for it, exit code unknown
        while alive(pid, None):
            time.sleep(0.5)
        sys.exit(0)  # submitit reads the rank's result file, not this code
    if end.get("signal"):
        signal.signal(end["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), end["signal"])
    sys.exit(int(end.get("code") or 0))


# ---------------------------------------------------------------- the server
def serve(sock_path: str, parent: int) -> None:
    """Import PRELOAD, then fork a rank per request until the process that started it ends."""
    t0 = time.time()
    for name in PRELOAD:
        __import__(name)
    started = start_epoch(os.getpid()) or t0
    preload_s = time.time() - started
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(64)
    sys.stdout.write(f"ready {preload_s:.3f}\n")
    sys.stdout.flush()
    ranks: dict[int, socket.socket] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # its folder is removed on the way out
    try:
        _serve(srv, parent, ranks, preload_s)
    finally:  # its folder (the socket, an empty log) goes with it; a log with something in it stays
        srv.close()
        folder = Path(sock_path).parent
        with contextlib.suppress(OSError):
            os.unlink(sock_path)
            if (folder / "server.log").stat().st_size == 0:
                (folder / "server.log").unlink()
                folder.rmdir()


def _serve(srv: socket.socket, parent: int, ranks: dict[int, socket.socket], preload_s: float) -> None:
    """Fork a rank per request (`_rank`), tell each client its rank's end, until the parent process ends."""
    while os.getppid() == parent:
        ready, _, _ = select.select([srv], [], [], 0.2)
        if ready:
            conn, _ = srv.accept()
            try:
                req, fds = _recv(conn, 3)
            except OSError:
                conn.close()
                continue
            if req is None or len(fds) != 3:
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                srv.close()
                for other in ranks.values():
                    other.close()
                _rank(req, fds, conn, preload_s)  # never returns
            for fd in fds:
                os.close(fd)
            try:
                _send(conn, {"pid": pid})
                ranks[pid] = conn
            except OSError:
                os.kill(pid, signal.SIGKILL)
                conn.close()
        while ranks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = ranks.pop(pid, None)
            if conn is None:
                continue
            end = (
                {"signal": os.WTERMSIG(status)}
                if os.WIFSIGNALED(status)
                else {"code": os.waitstatus_to_exitcode(status)}
            )
            with contextlib.suppress(OSError):
                _send(conn, end)
            conn.close()


def _rank(req: dict, fds: list[int], conn: socket.socket, preload_s: float) -> None:
    """In the forked child: become the rank the client asked for (its streams, directory, environment), watch the
    client, run submitit's job, exit with its code."""
    code = 1
    try:
        conn.close()
        for fd, target in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.setpgrp()  # the server's group is not the rank's: a signal to one is not a signal to the other
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[PRELOAD_ENV] = f"{preload_s:.3f}"
        # unbuffered, as `python -u` (a killed rank's last lines are in its log)
        sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
        sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        client = int(req["client"])
        threading.Thread(target=_watch, args=(client,), daemon=True).start()
        argv = list(req["argv"])
        folder = argv[-1]
        sys.argv = ["submitit.core._submit", folder]
        from submitit.core.submission import process_job

        process_job(folder)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as a fresh process would, then the exit code
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch(client: int) -> None:
    """A rank outlives no client: a SIGKILLed client (the controller's last resort) cannot forward its death."""
    while alive(client, None):
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        serve(argv[1], int(argv[2]))
    elif argv[:1] == ["run"]:
        client(argv[1], argv[2:])
    else:
        sys.exit("usage: python -m pretrain_planner.launch.warm serve SOCKET PARENT_PID | run SOCKET ARGV...")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Bad environments (issue 26): a full disk under results/ (a small tmpfs), results/ shared by two hosts, and a frozen
driver (SIGSTOP longer than its heartbeat).

"Another host" is a process in its own UTS and mount namespaces (`unshare`: another hostname) that sees the same
results folder through a second FUSE mount of it (`bindfs`): the same files, but flock on one mount does not reach
the other, as on a network file system without lock propagation. Needs root; skipped where mounts cannot be made."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pretrain_planner.results import parse_result

from .conftest import BIN, PACED, REPO, bench, wait_for, write_config

pytestmark = pytest.mark.slow
CELLS = ["tiny-gptneox/cpu/1x1/naive", "tiny-gptneox/cpu/1x1/fl"]


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounts (tmpfs, bindfs) and namespaces (unshare) need root")


def _mount(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(cmd)}): {proc.stderr.strip()[:300]}")


def _umount(path: Path) -> None:
    for cmd in (["fusermount", "-u", "-z", str(path)], ["umount", "-l", str(path)]):
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return


def _env(work: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PP_HOST_LOCKS": str(work / "host-locks"), **more}


def _snakemake(work: Path, cfg: Path, *extra: str, target: str = "cells") -> list[str]:
    """Snakemake on `work` building `target` (the cells: what these drills look at; "" for everything)."""
    return [str(BIN / "snakemake"), *([target] if target else []), "-s", str(REPO / "Snakefile"), "-d", str(work),
            "--configfile", str(cfg), "--cores", "2", "--force-use-threads", *extra]  # fmt: skip


# ---------------------------------------------------------------- a full disk


def _usable(results: Path) -> list[str]:
    """Every result, steps and table file under results/ that does not parse, and every temporary file left."""
    import polars as pl

    bad = []
    for p in results.rglob("*"):
        if not p.is_file() or p.name == "filler":
            continue
        try:
            if p.name.startswith(".") and not p.name.endswith((".attempts", ".lock", ".snakemake_timestamp")):
                bad.append(f"{p}: a temporary file left behind")
            elif p.name == "result.json":
                row, why = parse_result(p)
                if row is None:
                    bad.append(f"{p}: {why}")
            elif p.suffix == ".json":
                json.loads(p.read_text())
            elif p.name == "steps.jsonl":
                [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
            elif p.suffix == ".csv":
                rows = list(csv.reader(p.open(newline="")))
                if not rows or len({len(r) for r in rows}) != 1:
                    bad.append(f"{p}: ragged or empty CSV")
            elif p.suffix == ".parquet":
                pl.read_parquet(p)
        except (ValueError, OSError, pl.exceptions.PolarsError) as exc:
            bad.append(f"{p}: {type(exc).__name__}: {exc}")
    return bad


class Filler(threading.Thread):
    """Fills the file system of `results` to the last byte once `trigger()` is true."""

    def __init__(self, results: Path, trigger) -> None:
        super().__init__(daemon=True)
        self.results, self.trigger, self.filled = results, trigger, threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set() and not self.trigger():
            time.sleep(0.05)
        if self.halt.is_set():
            return
        fd = os.open(self.results / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 20, 65536, 4096, 1):  # to the last byte
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        self.filled.set()


def _run_filling(work: Path, cfg: Path, trigger) -> subprocess.CompletedProcess:
    filler = Filler(work / "results", trigger)
    filler.start()
    try:
        return subprocess.run(_snakemake(work, cfg, target=""), cwd=work, capture_output=True, text=True,
                              env=_env(work), timeout=900)  # fmt: skip
    finally:
        filler.halt.set()
        filler.join()
        assert filler.filled.is_set(), "the disk was never filled: the trigger did not happen"


def test_a_full_disk_fails_naming_the_path_and_space_and_a_rerun_completes(tmp_path):
    """results/ is a 16 MiB tmpfs. Filled when the first cell's result is written: the second cell fails with a
    message naming the file and the free space; nothing under results/ is partial. Space freed, then filled again
    when the tables start: the aggregate fails the same way and leaves no partial table. Freed: the rerun
    completes with both cells measured once."""
    _need_root()
    results = tmp_path / "results"
    results.mkdir()
    _mount("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(results))
    try:
        cfg = write_config(tmp_path / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods":
                           ["naive", "fl"]}, launcher={"kind": "debug"},
                           benchmark=bench(3))  # fmt: skip
        done = [results / "cells" / c / "result.json" for c in CELLS]
        first = _run_filling(tmp_path, cfg, lambda: any(p.is_file() for p in done))
        out = first.stdout + first.stderr
        assert first.returncode != 0, out[-3000:]
        assert "no space left on device writing " + str(results) in out, out[-4000:]
        assert f"free of 16.0 MiB on {results}" in out, out[-4000:]
        assert _usable(results) == []
        (kept,) = [p for p in done if p.is_file()]  # the first cell's result is kept
        kept_text = kept.read_text()
        (results / "filler").unlink()

        second = _run_filling(tmp_path, cfg, lambda: (results / "logs/aggregate.log").is_file())
        out = second.stdout + second.stderr
        assert second.returncode != 0, out[-3000:]
        assert "no space left on device writing " + str(results) in out, out[-4000:]
        assert _usable(results) == [] and all(p.is_file() for p in done)
        (results / "filler").unlink()

        third = subprocess.run(_snakemake(tmp_path, cfg, target=""), cwd=tmp_path, capture_output=True, text=True,
                               env=_env(tmp_path), timeout=900)  # fmt: skip
        assert third.returncode == 0, (third.stdout + third.stderr)[-4000:]
        assert _usable(results) == []
        rows = list(csv.DictReader((results / "tables/cells.csv").open(newline="")))
        assert sorted((r["method"], r["status"]) for r in rows) == [("fl", "ok"), ("naive", "ok")]
        states = [json.loads((results / "cells" / c / "state.json").read_text()) for c in CELLS]
        assert all(s["state"] == "done" for s in states)
        assert sorted(s["attempt"] for s in states) == [1, 2]  # the second cell: its failed attempt, then this one
        assert kept.read_text() == kept_text  # the first cell was not measured again
    finally:
        _umount(results)


# ---------------------------------------------------------------- two hosts, one results folder


@pytest.fixture
def two_hosts(tmp_path):
    """`shared` (this host's view of the store through one bindfs mount) and a command prefix that runs on
    "login2": its own hostname, and the same path mounted through a second bindfs mount of the store."""
    _need_root()
    if shutil.which("bindfs") is None or shutil.which("unshare") is None:
        pytest.skip("bindfs and unshare are needed (cluster/testbed/install.sh installs bindfs)")
    store, shared, other = tmp_path / "store", tmp_path / "shared", tmp_path / "other-view"
    for d in (store, shared, other):
        d.mkdir()
    _mount("bindfs", str(store), str(shared))
    try:
        _mount("bindfs", str(store), str(other))
    except BaseException:
        _umount(shared)
        raise

    def on_login2(cmd: list[str]) -> list[str]:
        inner = f"mount --bind {shlex.quote(str(other))} {shlex.quote(str(shared))} && hostname login2 && exec "
        return ["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", inner + shlex.join(cmd)]

    yield shared, on_login2
    _umount(other)
    _umount(shared)


def _long_cell(work: Path) -> Path:
    return write_config(work / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
                        launcher={"kind": "local"},
                        benchmark=bench(100000))  # fmt: skip


def _start(cmd: list[str], work: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    log = open(work.parent / f"{name}.log", "a")  # noqa: SIM115 - the driver outlives this function
    return subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _rank(work: Path) -> dict | None:
    p = work / "results/cells" / CELLS[0] / "local_ranks/rank0.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_ranks(work: Path, *seen: dict | None) -> None:
    """SIGKILL the ranks the test saw and the cell's current one: a takeover's run rewrites rank0.json, so the first
    driver's orphan (100,000 steps) is known only by the pid read before it, and would run on after the test."""
    for r in (*seen, _rank(work)):
        if r and _alive(r["pid"]):
            os.kill(r["pid"], signal.SIGKILL)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_results_shared_by_two_hosts_the_lock_sees_the_other_hosts_driver(two_hosts):
    """A driver on this host measures a cell (flock cannot reach from the other host's mount); a driver on login2,
    after `--unlock`, is refused naming this host's driver. Once this host's driver died (kill -9) and its heartbeat
    went stale, login2's driver takes over, and leaves this host's orphaned rank alone: its pid means nothing on
    login2 (only a driver on this host may end it)."""
    shared, on_login2 = two_hosts
    cfg = _long_cell(shared)
    env = _env(shared, PP_DRIVER_HEARTBEAT_S="1", **PACED)  # the long cell's steps paced: it keeps no core busy
    here = _start(_snakemake(shared, cfg), shared, "here", env)
    rank = None
    try:
        rank = wait_for(lambda: _rank(shared), 180, "this host's cell to run")
        unlock = subprocess.run(on_login2(_snakemake(shared, cfg, "--unlock")), capture_output=True, text=True,
                                env=env, cwd=shared, timeout=120)  # fmt: skip
        assert unlock.returncode == 0, unlock.stderr[-2000:]
        other = subprocess.run(on_login2(_snakemake(shared, cfg)), capture_output=True, text=True,
                               env={**env, "PP_HOST_LOCKS": str(shared.parent / "login2-locks")}, cwd=shared,
                               timeout=300)  # fmt: skip
        assert other.returncode != 0
        want = f"another driver is working on results: pid {here.pid} on host {socket.gethostname()}"
        assert want in other.stderr, other.stderr[-3000:]
        os.kill(here.pid, signal.SIGKILL)  # the driver only: its rank runs on, an orphan on this host
        here.wait()
        time.sleep(6 * 1 + 2)  # the dead driver's heartbeat goes stale
        assert _alive(rank["pid"])
        # login2 now takes over: a short cell, so that its run ends
        short = write_config(shared / "short.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"],
                             "methods": ["naive"]}, launcher={"kind": "local"},
                             benchmark=bench(3))  # fmt: skip
        subprocess.run(on_login2(_snakemake(shared, short, "--unlock")), env=env, cwd=shared, capture_output=True)
        takeover = subprocess.run(on_login2(_snakemake(shared, short, "--rerun-incomplete")), capture_output=True,
                                  text=True, env={**env, "PP_HOST_LOCKS": str(shared.parent / "login2-locks")},
                                  cwd=shared, timeout=600)  # fmt: skip
        assert takeover.returncode == 0, takeover.stderr[-4000:]
        assert _alive(rank["pid"]), "login2's driver ended a process of this host's (by a pid that is not its own)"
        log = (shared / "results/cells" / CELLS[0] / "cell.log").read_text()
        assert f"a local job of a driver on host {socket.gethostname()}" in log, log[-3000:]
    finally:
        _stop(here)
        _kill_ranks(shared, rank)


def test_a_frozen_driver_is_not_replaced_here_and_steps_aside_when_another_host_took_over(two_hosts):
    """SIGSTOP of the driver for longer than its heartbeat: a second driver on this host is refused (the stopped one
    is alive); one on login2 cannot tell stopped from dead and takes over once the heartbeat is stale. On SIGCONT the
    first driver sees that, ends its own rank and leaves without writing; login2's driver completes the cell."""
    shared, on_login2 = two_hosts
    cfg = write_config(shared / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
                       launcher={"kind": "local"},
                       benchmark=bench(3000))  # fmt: skip
    env = _env(shared, PP_DRIVER_HEARTBEAT_S="1", **PACED)  # the long cell's steps paced: it keeps no core busy
    first = _start(_snakemake(shared, cfg), shared, "first", env)
    cell = shared / "results/cells" / CELLS[0]
    rank = second = None
    try:
        rank = wait_for(lambda: _rank(shared), 180, "the cell to run")
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(6 * 1 + 3)  # longer than the stale limit (6 heartbeats)
        subprocess.run(_snakemake(shared, cfg, "--unlock"), env=env, cwd=shared, capture_output=True, timeout=120)
        same = subprocess.run(_snakemake(shared, cfg), capture_output=True, text=True, env=env, cwd=shared,
                              timeout=120)  # fmt: skip
        assert same.returncode != 0 and f"pid {first.pid} on host {socket.gethostname()}" in same.stderr, same.stderr
        short = write_config(shared / "short.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"],
                             "methods": ["naive"]}, launcher={"kind": "local"},
                             benchmark=bench(3))  # fmt: skip
        second = _start(on_login2(_snakemake(shared, short, "--rerun-incomplete")), shared, "second",
                        {**env, "PP_HOST_LOCKS": str(shared.parent / "login2-locks")})  # fmt: skip
        wait_for(
            lambda: '"login2"' in (shared / "results/.driver.json").read_text(), 120, "login2's driver to take over"
        )
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=60) == 75
        out = (shared.parent / "first.log").read_text()
        assert "another driver has taken over" in out and "Leaving now without writing anything" in out, out[-3000:]
        assert not _alive(rank["pid"]), "the first driver ended its own rank"
        assert "cell tiny-gptneox/cpu/1x1/naive:" not in out.split("another driver has taken over")[-1]
        assert second.wait(timeout=600) == 0, (shared.parent / "second.log").read_text()[-4000:]
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok" and result["timed_steps"] == 3 and result["hostname"] == "login2"
        state = json.loads((cell / "state.json").read_text())
        assert state["state"] == "done" and state["driver"]["host"] == "login2"
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        _kill_ranks(shared, rank)

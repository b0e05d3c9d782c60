"""Where the test suite's time goes: each module's and unit's time, each xdist worker's timeline, the critical path
and, from a CPU sampler run beside the suite, the CPU each unit used. Read from the phases tests/conftest.py records
for every run of pytest (.pytest_cache/suite_times/<subset>.jsonl: each test's setup, call and teardown with its
start, end and worker).

    .venv/bin/python benchmarks/suite_time.py sample /tmp/cpu.jsonl &      # optional: every process's CPU, each second
    .venv/bin/python -m pytest -m "not slow" && .venv/bin/python -m pytest -m slow   # the README's test command
    kill %1
    .venv/bin/python benchmarks/suite_time.py report --cpu /tmp/cpu.jsonl --label "2 cores, one kept busy"
                                                    # -> appended to benchmarks/results/suite_time.md

A worker runs whole units (tests/conftest.py `unit_of`: a module, two modules that share a sweep, one SLURM
testbed cluster's modules), so the suite cannot end before its longest unit does, whatever the number of workers; on a
2-core host the workers share two cores, so the suite also cannot end before the CPU its units need is spent.
The report names both floors: the longest unit, and the CPU seconds over the cores. A new test's cost is the wall
time it adds to its unit and the CPU it adds to the whole.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import json
import os
import signal
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.tables import markdown  # noqa: E402

SUBSETS = ("not-slow", "slow")
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd", "mysqld")


def unit_of(nodeid: str) -> str:
    from tests.conftest import unit_of as of

    return of(nodeid)


@dataclass
class Unit:
    name: str
    worker: str
    start: float
    stop: float
    tests: int = 0
    modules: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class Run:
    subset: str
    session: dict
    phases: list[dict]

    @property
    def start(self) -> float:
        return self.session.get("start") or min(p["start"] for p in self.phases)

    @property
    def stop(self) -> float:
        return self.session.get("stop") or max(p["stop"] for p in self.phases)

    @property
    def wall_s(self) -> float:
        return self.stop - self.start

    def units(self) -> list[Unit]:
        out: dict[tuple[str, str], Unit] = {}
        for p in self.phases:
            key = (unit_of(p["nodeid"]), p["worker"])
            u = out.setdefault(key, Unit(key[0], key[1], p["start"], p["stop"]))
            u.start, u.stop = min(u.start, p["start"]), max(u.stop, p["stop"])
            u.modules[p["nodeid"].split("::", 1)[0]] += p["duration"]
            u.tests += p["when"] == "call"
        return sorted(out.values(), key=lambda u: (u.worker, u.start))

    def tests(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for p in self.phases:
            out[p["nodeid"]] += p["duration"]
        return out

    def test_at(self) -> dict[str, tuple[list[float], list[tuple[float, float, str]]]]:
        """worker -> (phase starts, phases): what `cpu_by_unit` looks a sample's time up in."""
        by: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for p in self.phases:
            by[p["worker"]].append((p["start"], p["stop"], p["nodeid"]))
        return {w: ([x[0] for x in sorted(v)], sorted(v)) for w, v in by.items()}


def read(folder: Path, subset: str) -> Run | None:
    path = folder / f"{subset}.jsonl"
    if not path.is_file():
        return None
    session, phases = {}, []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "session" in rec:
            session.update(rec["session"])
        else:
            phases.append(rec)
    return Run(subset, session, phases) if phases else None


def minutes(s: float) -> str:
    return f"{int(s // 60)} min {int(round(s % 60)):02d} s" if s >= 60 else f"{s:.0f} s"


# ------------------------------------------------------------------------------------------------ the CPU sampler
def sample(out: Path, interval: float = 1.0) -> None:
    """Every process's CPU seconds each `interval` until SIGTERM/SIGINT, as JSON lines: a process when first seen (its
    parent, command, the xdist worker in its environment, the CPU it had used) and each sample's CPU used since."""
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict[str, float] = {}
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    with open(out, "w") as fh:
        while not stop:
            now, deltas = time.time(), {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    rest = stat[stat.rindex(")") + 2 :].split()
                    cpu, key = (int(rest[11]) + int(rest[12])) / hz, f"{pid}:{rest[19]}"
                    if key not in seen:
                        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                        worker = next((e[20:].decode() for e in env if e.startswith(b"PYTEST_XDIST_WORKER=")), None)
                        fh.write(json.dumps({"proc": key, "ppid": int(rest[1]), "comm": comm, "cmd": cmd[:300],
                                             "worker": worker, "t": now, "cpu0": cpu}) + "\n")  # fmt: skip
                        seen[key] = cpu
                    elif cpu > seen[key]:
                        deltas[key], seen[key] = round(cpu - seen[key], 2), cpu
                except (OSError, ValueError, IndexError):
                    continue
            if deltas:
                fh.write(json.dumps({"t": now, "d": deltas}) + "\n")
            fh.flush()
            time.sleep(interval)


def kind(proc: dict) -> str:
    """What a sampled process is, by its command."""
    c, cmd = proc["comm"], proc["cmd"]
    ranks = ("submitit", "multirank", "torch.distributed.run", "pretrain_planner.train", "pretrain_planner.launch.warm")
    if any(r in cmd for r in ranks):  # a warm rank (and its server) carries the server's command line
        return "ranks (training, benchmark, check)"
    if "snakemake" in cmd:
        return "snakemake drivers"
    if "exec(eval(sys.stdin" in cmd:
        return "pytest workers"
    if c in ("cc1plus", "cc1", "g++", "as", "ld", "collect2"):
        return "C++ compiler (inductor)"
    if c in DAEMONS:
        return "SLURM testbed daemons"
    if "python" in c or "python" in cmd or c == "pretrain-planne":
        return "other Python (CLI, benchmarks)"
    return "other"


def cpu_by_unit(samples: Path, runs: list[Run]) -> tuple[dict[str, float], dict[str, float], float]:
    """(CPU seconds by unit, by kind of process, the samples' span): each sample's CPU goes to the test its process's
    xdist worker ran at that moment (a process without a worker: the daemons, a busy-loop neighbour: by kind)."""
    procs, deltas, pid_key = {}, [], {}
    for line in samples.read_text().splitlines():
        r = json.loads(line)
        if "proc" in r:
            procs[r["proc"]] = r
            pid_key.setdefault(int(r["proc"].split(":")[0]), r["proc"])
            deltas.append((r["t"], r["proc"], r["cpu0"]))
        else:
            deltas += [(r["t"], k, d) for k, d in r["d"].items()]
    first = min((p["t"] for p in procs.values()), default=0.0)
    for p in procs.values():  # an xdist worker has no worker in its own environment: its children tell it
        parent = procs.get(pid_key.get(p["ppid"], ""))
        if p["worker"] and parent is not None and "exec(eval(sys.stdin" in parent["cmd"]:
            parent["own_worker"] = p["worker"]

    def worker(key: str, depth: int = 0) -> str | None:
        p = procs.get(key)
        if p is None or depth > 40 or p["comm"] in DAEMONS:
            return None
        return p.get("own_worker") or p["worker"] or worker(pid_key.get(p["ppid"], ""), depth + 1)

    timelines = [r.test_at() for r in runs]
    by_unit: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for t, key, d in deltas:
        if t - first < 2 and procs[key]["t"] == t and d == procs[key]["cpu0"]:
            continue  # a process found running when the sampler started: its CPU before is not the suite's
        by_kind[kind(procs[key])] += d
        w, unit = worker(key), None
        for tl in timelines:
            if w in tl:
                starts, phases = tl[w]
                i = bisect.bisect_right(starts, t) - 1
                if i >= 0 and t <= phases[i][1] + 1.5:  # a sample lands up to an interval after its phase
                    unit = unit_of(phases[i][2])
        by_unit[unit or (f"{w}: between tests (collection, start-up)" if w else f"no test: {kind(procs[key])}")] += d
    span = max((t for t, _k, _d in deltas), default=first) - first
    return dict(by_unit), dict(by_kind), span


# ------------------------------------------------------------------------------------------------ the report
def report(runs: list[Run], label: str, top: int, cpu: tuple[dict, dict, float] | None = None) -> str:
    lines = [f"## {dt.date.today().isoformat()}, {label}", ""]
    total = sum(r.wall_s for r in runs)
    rows = [[r.subset, minutes(r.wall_s), str(sum(p["when"] == "call" for p in r.phases)),
             str(r.session.get("workers") or len({p["worker"] for p in r.phases}))] for r in runs]  # fmt: skip
    lines += [f"Both subsets: **{minutes(total)}** (pytest's start-up and collection included; setting up the "
              "environment not).", "", markdown.table(["subset", "wall", "tests", "workers"], rows), ""]  # fmt: skip
    for r in runs:
        units = r.units()
        end = max(u.stop for u in units)
        last = max(units, key=lambda u: u.stop)
        longest = max(units, key=lambda u: u.stop - u.start)
        first = min(p["start"] for p in r.phases)
        lines += [f'### `-m "{r.subset.replace("-", " ")}"`: {minutes(r.wall_s)}', "",
                  f"- The first test started {minutes(first - r.start)} after the session (the workers' start and "
                  f"collection); the last ended {minutes(r.stop - end)} before its end.",
                  f"- Critical path: worker {last.worker} ended last, {minutes(end - r.start)} after the start; its "
                  "units in order: " + ", ".join(f"{u.name} ({minutes(u.stop - u.start)})"
                                                 for u in units if u.worker == last.worker) + ".",
                  f"- Longest unit (the floor of the wall time on any number of workers): {longest.name}, "
                  f"{minutes(longest.stop - longest.start)}.", ""]  # fmt: skip
        wrows = []
        for w in sorted({u.worker for u in units}):
            mine = [u for u in units if u.worker == w]
            busy = sum(u.stop - u.start for u in mine)
            wrows.append([w, minutes(max(u.stop for u in mine) - r.start), minutes(busy), str(len(mine))])
        lines += [markdown.table(["worker", "ends after", "in its units", "units"], wrows), ""]
        urows = [[u.name, u.worker, f"{u.start - r.start:.0f}", f"{u.stop - u.start:.0f}", str(u.tests)]
                 for u in sorted(units, key=lambda u: -(u.stop - u.start))[:top]]  # fmt: skip
        lines += [f"The {min(top, len(units))} longest units (start: seconds after the session's):", "",
                  markdown.table(["unit", "worker", "start s", "wall s", "tests"], urows), ""]  # fmt: skip
        modules: dict[str, float] = defaultdict(float)
        for u in units:
            for m, s in u.modules.items():
                modules[m] += s
        mrows = [[m, f"{s:.0f}"] for m, s in sorted(modules.items(), key=lambda x: -x[1])[:top]]
        lines += [f"The {min(top, len(modules))} modules that took longest (their tests' setup + call + teardown; a "
                  "shared sweep is counted in the module whose test asked it first):", "",
                  markdown.table(["module", "s"], mrows), ""]  # fmt: skip
        lines += [f"The {top} longest tests (s):", ""]
        lines += [f"- {s:.0f} `{t}`" for t, s in sorted(r.tests().items(), key=lambda x: -x[1])[:top]] + [""]
    if cpu is not None:
        by_unit, by_kind, span = cpu
        used = sum(by_kind.values())
        unit_rows = [[u, f"{s:.0f}"] for u, s in sorted(by_unit.items(), key=lambda x: -x[1])[:top]]
        kind_rows = [[k, f"{s:.0f}"] for k, s in sorted(by_kind.items(), key=lambda x: -x[1])]
        lines += ["### CPU", "", f"{used:.0f} CPU seconds over {minutes(span)} sampled ({used / max(span, 1):.2f} "
                  f"cores busy on average, of {os.cpu_count()}), by unit and by kind of process:", "",
                  markdown.table(["unit", "CPU s"], unit_rows), "", markdown.table(["kind of process", "CPU s"],
                                                                                    kind_rows), ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="sample every process's CPU each second until stopped")
    s.add_argument("out", type=Path)
    s.add_argument("--interval", type=float, default=1.0)
    r = sub.add_parser("report", help="the report of the last run of each subset")
    r.add_argument("--times", type=Path, default=REPO / ".pytest_cache/suite_times",
                   help="the folder tests/conftest.py writes (default: .pytest_cache/suite_times)")  # fmt: skip
    r.add_argument("--cpu", type=Path, help="the samples of `sample` taken while the suite ran")
    r.add_argument("--label", default="this host", help="what the host was (the section's heading)")
    r.add_argument("--top", type=int, default=15)
    r.add_argument("--out", type=Path, default=REPO / "benchmarks/results/suite_time.md",
                   help="appended to (default: benchmarks/results/suite_time.md)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.command == "sample":
        sample(args.out, args.interval)
        return 0
    runs = [x for x in (read(args.times, s) for s in SUBSETS) if x is not None]
    if not runs:
        print(f"suite_time: no recorded run in {args.times} (run the README's test command first)", file=sys.stderr)
        return 2
    text = report(runs, args.label, args.top, cpu_by_unit(args.cpu, runs) if args.cpu else None)
    print(text)
    new = not args.out.exists()
    with open(args.out, "a") as fh:
        if new:
            fh.write("# Where the test suite's time goes (benchmarks/suite_time.py)\n\n")
        fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What waiting on many SLURM jobs costs the controller (issue 53 item 4), on the testbed (cluster/testbed):

    flock /work/slurm.lock .venv/bin/python benchmarks/slurm_rpc.py --jobs 24 --seconds 30

`--jobs` jobs (`sbatch --wrap "sleep ..."` on the `cpu` partition: 8 run, the rest pend for Resources, as on a busy
site) are waited on by one thread each for `--seconds`, twice:
- `driver`: the driver's own wait (launch/slurm.py `_wait_slurm`): every waiting job's state from the one poller
  (launch/poller.py: one `squeue` per round);
- `per_job`: each thread asks `scontrol show job` for its own job on the back-off the driver used before issue 53
  (1 s, x1.5, at most poll_max_s): what a sweep of that many waiting cells asked before.
slurmctld's RPC counts (`sdiag`: job-information calls, and every call of this user) are read before and after
each; the figures (calls, calls per poll interval, per job) are printed and written to `--out` (default
benchmarks/results/slurm_rpc.md, replaced). Run as root on the testbed (it submits and cancels jobs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.launch import driver, slurm  # noqa: E402
from pretrain_planner.launch.request import JobRequest, RuleLog  # noqa: E402
from pretrain_planner.launch.slurm_state import slurm_state  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402

JOB_INFO = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE")


def sdiag() -> tuple[dict[str, int], dict[str, int]]:
    """slurmctld's RPC counts so far: (by message type, by user)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    by_type, rest = out.split("by message type", 1)[1].split("by user", 1)
    pattern = r"^\s*([\w.-]+)\s+\(\s*\d+\)\s+count:(\d+)"
    counts = lambda text: {k: int(v) for k, v in re.findall(pattern, text, re.M)}  # noqa: E731
    return counts(by_type), counts(rest.split("Pending RPC", 1)[0])


def per_job_wait(job_id: str, poll_max_s: float, stop: threading.Event) -> None:
    """The wait before issue 53: this job's own `scontrol show job`, its own back-off."""
    poll = 1.0
    while not stop.is_set():
        slurm_state(job_id)
        stop.wait(poll)
        poll = min(poll_max_s, poll * 1.5)


def measure(mode: str, jobs: int, seconds: float, poll_max_s: float, folder: Path) -> dict:
    import submitit

    ids = []
    for i in range(jobs):
        cmd = ["sbatch", "--parsable", "-p", "cpu", "-t", "5", "-J", f"pp-rpc-{i}", "-o", "/dev/null", "--wrap",
               f"sleep {int(seconds) + 60}"]  # fmt: skip
        ids.append(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().split(";")[0])
    site = folder / "site.yaml"  # the testbed's site file with this poll_max_s (where the driver reads it)
    site.write_text((REPO / "tests/data/site-testbed.yaml").read_text().replace("poll_max_s: 2", f"poll_max_s: "
                                                                                f"{int(poll_max_s)}"))  # fmt: skip
    req = JobRequest(fn=None, name="rpc", kind="slurm", folder=folder, nodes=1, gpus_per_node=1,
                     slurm={"site": str(site)})  # fmt: skip
    log, stop = RuleLog(folder / f"{mode}.log"), threading.Event()

    def wait(job_id: str) -> None:
        if mode == "per_job":
            per_job_wait(job_id, poll_max_s, stop)
            return
        with contextlib.suppress(driver.DriverStopped):
            slurm._wait_slurm(submitit.SlurmJob(folder=folder, job_id=job_id), req, log)

    threads = [threading.Thread(target=wait, args=(j,), daemon=True) for j in ids]
    (t_before, u_before), t0 = sdiag(), time.time()
    try:
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        driver.STOP.set()
        for t in threads:
            t.join(60)
        window = time.time() - t0
        t_after, u_after = sdiag()
    finally:
        driver.STOP.clear()
        subprocess.run(["scancel", *ids], check=False)
    asked = sum(t_after.get(k, 0) - t_before.get(k, 0) for k in JOB_INFO)
    user = sum(u_after.values()) - sum(u_before.values())
    return {"mode": mode, "jobs": jobs, "window_s": window, "job_info_calls": asked, "user_calls": user,
            "per_poll_interval": asked / (window / poll_max_s), "per_job": asked / jobs}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--poll-max-s", type=int, default=2, help="the site's poll_max_s (the testbed's: 2)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/slurm_rpc.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("driver", "per_job"):
            rows.append(measure(mode, args.jobs, args.seconds, args.poll_max_s, Path(tmp)))
            print(rows[-1], flush=True)
            time.sleep(5)  # the cancelled jobs leave the controller
    columns = ["wait", "jobs", "window s", "job-information calls", "per poll interval", "per job",
               "all calls of the user"]  # fmt: skip
    table = [[r["mode"], r["jobs"], f"{r['window_s']:.0f}", r["job_info_calls"], f"{r['per_poll_interval']:.1f}",
              f"{r['per_job']:.2f}", r["user_calls"]] for r in rows]  # fmt: skip
    lines = [
        "# What waiting on SLURM jobs costs the controller (benchmarks/slurm_rpc.py)",
        "",
        f"{dt.date.today().isoformat()}, the single-host testbed (cluster/testbed, slurm-wlm "
        f"{subprocess.run(['sinfo', '-V'], capture_output=True, text=True).stdout.split()[-1]}): {args.jobs} jobs "
        f"waited on for {args.seconds:g} s each, poll_max_s {args.poll_max_s:g}; slurmctld's counts from `sdiag`.",
        "",
        *markdown.plain(columns, table),
    ]
    lines += ["", "`driver`: launch/slurm.py's wait (one poller, one `squeue` per round for every job); `per_job`: "
              "each job's own `scontrol show job` on its own back-off, the wait before issue 53. `all calls` "
              "include sbatch, scancel and sdiag itself."]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

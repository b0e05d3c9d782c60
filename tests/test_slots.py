"""Issue 53 item 1 without a scheduler: the driver's queue slots, the refusals that are back-pressure, where the cap
comes from, what `status` says of cells waiting for a slot, and that the driver's own settings change no job's
identity. The same on the real daemons with a QOS cap: tests/test_slurm.py (the restrictive multi-node sweep)."""

from __future__ import annotations

import os
import threading
import time

from pretrain_planner.launch import slots
from pretrain_planner.launch.request import spec_hash
from pretrain_planner.launch.state import write_state
from pretrain_planner.planning.site import driver_settings, gpu_settings, read_site, sbatch_parameters
from pretrain_planner.tables import status

from .conftest import REPO


def test_no_more_than_the_cap_of_jobs_are_held_and_each_waiter_says_so_once():
    """Six jobs, a cap of 2: the first two hold their slots until the other four are seen waiting (no sleep: a loaded
    host cannot change what is observed), then each ends and the next takes its slot."""
    pool, stop, lock, go = slots.Slots(), threading.Event(), threading.Lock(), threading.Event()
    most, said = [0], []

    def job(i: int) -> None:
        assert pool.take(f"cell{i}", 2, stop, lambda held: said.append((i, held)))
        with lock:
            most[0] = max(most[0], pool.held())
        go.wait(30)
        pool.release(f"cell{i}")

    threads = [threading.Thread(target=job, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    end = time.time() + 30
    while len(said) < 4 and time.time() < end:
        time.sleep(0.01)
    assert len(said) == 4 and pool.held() == 2  # two hold, four wait, each said so once
    go.set()
    for t in threads:
        t.join(30)
    assert most[0] == 2 and pool.held() == 0
    assert len({i for i, _ in said}) == len(said) == 4  # the ones that waited, once each
    assert all(held == 2 for _, held in said)


def test_a_held_slot_is_given_up_when_the_driver_stops():
    pool, stop = slots.Slots(), threading.Event()
    pool.hold("running")
    got = []
    t = threading.Thread(target=lambda: got.append(pool.take("next", 1, stop, lambda held: None)))
    t.start()
    time.sleep(0.3)
    stop.set()
    t.join(10)
    assert got == [False] and pool.held() == 1


def test_submit_limit_refusals_are_told_from_other_refusals():
    # sbatch's own words (SLURM 22.05, a QOS's MaxSubmitJobsPerUser and an association's MaxSubmitJobs)
    assert slots.is_submit_limit("sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission "
                                 "failed: Job violates accounting/QOS policy (job submit limit, user's size and/or "
                                 "time limits)")  # fmt: skip
    assert slots.is_submit_limit("sbatch: error: AssocMaxSubmitJobLimit")
    assert not slots.is_submit_limit("sbatch: error: Batch job submission failed: Invalid account or "
                                     "account/partition combination specified")  # fmt: skip
    assert not slots.is_submit_limit("sbatch: error: invalid partition specified: gpu")


def test_the_site_key_sets_the_cap_read_when_asked_and_changes_no_job(tmp_path):
    """max_queued_jobs (and poll_max_s) are the driver's, not a job's: not in a job's settings (its Snakemake params
    and identity: changing them re-runs no cell), read from the site file when the launcher asks (an edit applies
    to a running driver)."""
    path = tmp_path / "site.yaml"
    text = (REPO / "tests/data/site-testbed.yaml").read_text()
    path.write_text(text)
    settings = gpu_settings(read_site(path), "a100")
    assert "max_queued_jobs" not in settings and "poll_max_s" not in settings
    assert driver_settings(path) == {"poll_max_s": 2, "max_queued_jobs": None}
    path.write_text(text + "max_queued_jobs: 3\n")
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a later edit
    cap, source = slots.queue_cap(gpu_settings(read_site(path), "a100"))
    assert cap == 3 and source == f"max_queued_jobs in {path}"
    edited = gpu_settings(read_site(path), "a100")
    assert spec_hash({"cell": 1, "slurm": settings}) == spec_hash({"cell": 1, "slurm": edited})
    assert driver_settings(None) == {"poll_max_s": 60, "max_queued_jobs": None}  # the schema's defaults


def test_every_job_asks_requeue_unless_the_site_says_no():
    site = read_site(REPO / "tests/data/site-testbed.yaml")
    settings = gpu_settings(site, "a100")
    assert sbatch_parameters(settings, 1, 1, "j")["additional_parameters"]["requeue"] is True
    no = {**settings, "extra_sbatch": {"no-requeue": True}}
    assert "requeue" not in sbatch_parameters(no, 1, 1, "j")["additional_parameters"]


def test_status_counts_the_cells_waiting_for_a_slot(tmp_path):
    import polars as pl

    cells = tmp_path / "cells/m/h100"
    for gpn, waiting in ((1, "a queue slot (2 of at most 2 jobs queued: QOS pp-cap MaxSubmitJobsPerUser)"),
                         (2, None)):  # fmt: skip
        write_state(cells / f"1x{gpn}/fl", "submitted", launcher="slurm", job_id=None, attempt=1,
                    submitted_at="2026-01-01T00:00:00", waiting=waiting)  # fmt: skip
    one = status.cell_state(cells / "1x1/fl")
    assert one.waiting and one.detail.startswith("waiting for a queue slot (2 of at most 2")
    assert status.cell_state(cells / "1x2/fl").waiting is None
    plan = pl.DataFrame({"model": ["m", "m"], "gpu": ["h100", "h100"], "nodes": [1, 1], "gpus_per_node": [1, 2],
                         "method": ["fl", "fl"], "valid": [True, True], "path": ["cells/m/h100/1x1/fl",
                         "cells/m/h100/1x2/fl"], "gpu_hours_max": [0.1, 0.1]})  # fmt: skip
    summary, frame = status.sweep_status(tmp_path, plan)
    text = status.format_status(summary, frame, str(tmp_path), "plan.csv")
    assert "1 submitted cell(s) wait for a queue slot" in text
    watch = status.watch_frame(frame, str(tmp_path), "plan.csv", 5, "driver")
    assert "1 submitted cell(s) wait for a queue slot" in watch

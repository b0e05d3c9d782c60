"""Calendar time (issue 38): the segment arithmetic of a training on a time-limited partition, the waits that make a
finish date, and SLURM's words for both (a partition's MaxTime, `sbatch --test-only`'s expected start)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from pretrain_planner.planning.calendar import (
    NO_QUEUE,
    Calendar,
    Wait,
    expected_start,
    max_time_hours,
    requeue_wait,
    segments,
    warning_margin_s,
)
from pretrain_planner.schema import ConfigError


def test_a_long_training_is_cut_into_jobs_that_each_pay_a_restart():
    """30 compute-days on a 24 h partition, 10 min to start and 5 min to checkpoint: a job trains 23.75 h, so 31
    jobs (30 x 24 h would leave the last 7.75 h out); 31 start-ups and 30 checkpoints lost."""
    s = segments(30 * 24, 24, checkpoint_s=300, restart_s=600, partition="gpu")
    assert s.count == 31
    assert s.lost_h == pytest.approx((31 * 600 + 30 * 300) / 3600)
    assert s.wall_h == pytest.approx(720 + s.lost_h)
    assert s.text() == "31 segments, 7.67 h lost to restarts"
    exact = segments(2 * 23.75, 24, 300, 600)  # exactly two jobs' worth: two, not three
    assert exact.count == 2


def test_no_limit_is_one_segment_and_a_short_training_one_too():
    assert segments(500, None, 300, 600).count == 1
    assert segments(0.5, 24, 300, 600).count == 1
    assert segments(0.5, 24, 300, 600).lost_h == pytest.approx(600 / 3600)  # one start-up, no checkpoint


def test_a_limit_shorter_than_a_restart_names_the_partition():
    says = (r"partition debug's time limit of 10 min \(site.yaml: gpus.a100\) is no longer than one start-up "
            r"\(500 s\) and one checkpoint write \(120 s\)")  # fmt: skip
    with pytest.raises(ConfigError, match=says):
        segments(10, 10 / 60, checkpoint_s=120, restart_s=500, partition="debug", where="site.yaml: gpus.a100")


def test_an_unknown_wait_makes_the_calendar_unknown_never_zero():
    s = segments(48, 24, 300, 600)
    assert s.count == 3
    known = Calendar(s, Wait(5.0, "asked"), Wait(2.0, "site"))
    assert known.hours == pytest.approx(5 + s.wall_h + 2 * 2)
    assert known.finish(datetime(2027, 1, 1)) > datetime(2027, 1, 3)
    unknown_first = Calendar(s, Wait(None, "no estimate"), Wait(2.0, "site"))
    assert unknown_first.hours is None and unknown_first.finish(datetime(2027, 1, 1)) is None
    assert Calendar(s, Wait(1.0, "asked"), Wait(None, "no estimate")).hours is None
    one = segments(10, 24, 300, 600)  # one segment: the requeue wait does not matter
    assert Calendar(one, Wait(1.0, "asked"), Wait(None, "no estimate")).hours == pytest.approx(1 + one.wall_h)
    assert Wait(None, "x").text() == "wait unknown"
    assert Calendar(one, NO_QUEUE, NO_QUEUE).hours == pytest.approx(one.wall_h)


@pytest.mark.parametrize(
    ("value", "hours"),
    [("UNLIMITED", None), ("INFINITE", None), ("30", 0.5), ("30:00", 0.5), ("1:30:00", 1.5), ("2-00:00:00", 48.0),
     ("1-12", 36.0), ("1-12:30", 36.5), ("0:45", 0.75 / 60)],
)  # fmt: skip
def test_slurm_time_limits_in_hours(value, hours):
    got = max_time_hours(value)
    assert got == (None if hours is None else pytest.approx(hours))


def test_a_malformed_time_limit_is_an_error():
    with pytest.raises(ValueError, match="not a SLURM time"):
        max_time_hours("a day")


def test_sbatch_test_only_gives_the_expected_start():
    now = datetime(2026, 12, 3, 12, 0, 0)
    out = "sbatch: Job 4242 to start at 2026-12-03T15:30:00 using 2 processors on nodes node-a100 in partition a100"
    w = expected_start(out, now)
    assert w.hours == pytest.approx(3.5) and "2026-12-03T15:30:00" in w.how
    assert expected_start(out.replace("15:30", "11:00"), now).hours == 0.0  # already free: no wait
    none = expected_start("sbatch: error: Batch job submission failed: Requested node configuration is not available",
                          now)  # fmt: skip
    assert none.hours is None and "Requested node configuration" in none.how


# ------------------------------------------------------------------ the calendar table (tables/calendar.py)

import polars as pl  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.planning.configtypes import SiteFile, TrainSection  # noqa: E402
from pretrain_planner.planning.queue import ask_start, asking_command  # noqa: E402
from pretrain_planner.tables import views  # noqa: E402
from pretrain_planner.tables.calendar import Site, calendar_table, settings_of  # noqa: E402

from .conftest import REPO  # noqa: E402

NOW = datetime(2026, 12, 3, 12, 0, 0)
CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def _ttt(*rows):
    """time_to_train rows: (model, gpu, nodes, gpus_per_node, method, training_days, step_time_s)."""
    cols = ["model", "gpu", "nodes", "gpus_per_node", "best_method", "training_days", "step_time_s"]
    return pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


def _cells(*rows):
    """cells rows: (model, gpu, nodes, gpus_per_node, method, startup_s)."""
    cols = ["model", "gpu", "nodes", "gpus_per_node", "method", "startup_s"]
    return pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


def _site(**a100):
    base = {"partition": "a100", "constraint": None, "gpu_request": "gres", "gres_type": "a100", "account": None,
            "qos": None, "reservation": None, "time_limit_min": 24 * 60, "cpus_per_gpu": 8, "mem_per_gpu_gb": None,
            "signal_delay_s": 120, "extra_sbatch": {}, "setup": [], "requeue_wait_h": None, "checkpoint_gb_s": 1.0,
            "limits": {}}  # fmt: skip
    gpus = {"a100": {**base, **a100}, "h100": {**base, "partition": "h100", "gres_type": "h100"}}
    return SiteFile("site.yaml", {}, gpus, ask_scheduler=False, poll_max_s=60, max_queued_jobs=None)


def _scheduler(starts: dict[str, str | None]):
    """A scheduler's answers to `sbatch --test-only` per partition: its start time, or None (a refusal)."""
    asked = []

    def ask(cmd):
        if cmd[:3] == ["scontrol", "show", "config"]:
            return 0, "AuthAltTypes            = (null)\nAuthInfo                = cred_expire=30\n"
        asked.append(cmd)
        part = next(a.split("=", 1)[1] for a in cmd if a.startswith("--partition="))
        if starts.get(part) is None:
            return 1, "sbatch: error: Batch job submission failed: Requested node configuration is not available"
        return 0, f"sbatch: Job 77 to start at {starts[part]} using 8 processors on nodes n1 in partition {part}"

    return ask, asked


def test_locally_the_calendar_is_the_compute_and_one_start_up_said_as_such():
    table = calendar_table(settings_of(_ttt(("pythia-160m", "cpu", 1, 1, "fl", 2.0, 0.5)),
                                       _cells(("pythia-160m", "cpu", 1, 1, "fl", 90.0))),
                           CATALOG, Site(None, 1.0, "measured here", None, NOW))  # fmt: skip
    (r,) = table.to_dicts()
    assert r["segments"] == 1 and r["first_wait_h"] == 0.0 and "local processes" in r["wait_basis"]
    assert r["restart_loss_h"] == pytest.approx(90 / 3600)  # one start-up, no checkpoint read or write
    assert r["calendar_days"] == pytest.approx(2.0 + 90 / 86400)
    assert "local processes: no queue" in r["note"] and r["finishes_first"]
    assert r["expected_finish"] == (NOW + timedelta(days=2.0, seconds=90)).isoformat(timespec="minutes")


def test_on_slurm_a_training_is_cut_into_jobs_and_the_scheduler_asked_for_the_jobs_exact_request():
    ask, asked = _scheduler({"a100": "2026-12-03T15:00:00"})
    site = Site(_site(requeue_wait_h=1.0), 1.0, "measured", ask, NOW)
    ttt, cells = (
        _ttt(("pythia-1b", "a100", 1, 8, "fl+zero2", 3.0, 1.0)),
        _cells(("pythia-1b", "a100", 1, 8, "fl+zero2", 120.0)),
    )
    table = calendar_table(settings_of(ttt, cells), CATALOG, site)
    (r,) = table.to_dicts()
    (cmd,) = asked
    assert cmd[:2] == ["sbatch", "--test-only"] and cmd[-2:] == ["--wrap", "true"]
    for flag in ("--partition=a100", "--nodes=1", "--ntasks-per-node=8", "--gres=gpu:a100:8", f"--time={24 * 60}",
                 "--cpus-per-task=8"):  # fmt: skip
        assert flag in cmd, (flag, cmd)
    ckpt_s = r["checkpoint_gib"] * 2**30 / 1e9  # at 1 GB/s
    assert r["checkpoint_gib"] == pytest.approx(14 * CATALOG_PARAMS("pythia-1b") / 2**30)  # ZeRO: + 16-bit weights
    assert r["segments"] == 4  # 72 h of compute in jobs of 24 h less the warning, a start-up and a read
    assert r["first_wait_h"] == pytest.approx(3.0) and r["requeue_wait_h"] == pytest.approx(1.0)
    lost_h = (4 * 120 + 3 * 2 * ckpt_s) / 3600
    assert r["restart_loss_h"] == pytest.approx(lost_h)
    assert r["calendar_days"] * 24 == pytest.approx(3.0 + 72 + lost_h + 3 * 1.0)
    assert r["expected_start"] == "2026-12-03T15:00"


def CATALOG_PARAMS(model):
    from pretrain_planner.planning.flops import param_count

    return param_count(CATALOG.model(model).to_dict())


def test_the_setting_that_finishes_first_may_not_be_the_fastest_and_the_table_says_why():
    """8 a100 compute in 2 days but wait 3 days for the partition; 8 h100... the same model on the free h100
    partition computes in 2.5 days and starts now: it finishes first, and the note names the a100's wait."""
    ask, _ = _scheduler({"a100": "2026-12-06T12:00:00", "h100": "2026-12-03T12:00:00"})
    site = Site(_site(), 1.0, "measured", ask, NOW)
    ttt = _ttt(("pythia-160m", "a100", 1, 8, "fl", 2.0, 0.2), ("pythia-160m", "h100", 1, 8, "fl", 2.5, 0.3))
    cells = _cells(("pythia-160m", "a100", 1, 8, "fl", 60.0), ("pythia-160m", "h100", 1, 8, "fl", 60.0))
    rows = {r["gpu"]: r for r in calendar_table(settings_of(ttt, cells), CATALOG, site).to_dicts()}
    assert rows["h100"]["finishes_first"] and not rows["a100"]["finishes_first"]
    assert rows["a100"]["compute_days"] < rows["h100"]["compute_days"]
    assert "finishes first although 1x8 a100 (fl) computes faster" in rows["h100"]["note"]
    assert "it waits 72 h to start, this 0 h" in rows["h100"]["note"]


def test_a_wait_the_scheduler_does_not_estimate_is_unknown_and_so_is_the_finish():
    ask, _ = _scheduler({"a100": None})
    site = Site(_site(), 1.0, "measured", ask, NOW)
    table = calendar_table(settings_of(_ttt(("pythia-160m", "a100", 1, 8, "fl", 2.0, 0.2)),
                                       _cells(("pythia-160m", "a100", 1, 8, "fl", 60.0))), CATALOG, site)  # fmt: skip
    (r,) = table.to_dicts()
    assert r["first_wait_h"] is None and r["calendar_days"] is None and r["expected_finish"] == "unknown"
    assert "Requested node configuration is not available" in r["wait_basis"]
    assert r["expected_start"] == "wait unknown" and r["segments"] == 3  # the arithmetic is still shown
    (shown,) = views.view("calendar", table).to_dicts()
    assert shown["first wait"] == "wait unknown" and shown["calendar"] == "" and shown["finish"] == "unknown"


def test_a_restart_that_was_not_measured_is_not_priced_as_free():
    """Results older than the start-up record: no cell measured one, so the calendar is unknown, not compute only;
    a cell that has none takes the median of those that do, and says so."""
    site = Site(None, 1.0, "measured", None, NOW)
    ttt, cells = _ttt(("pythia-160m", "cpu", 1, 1, "fl", 2.0, 0.5)), _cells(("pythia-160m", "cpu", 1, 1, "fl", None))
    (r,) = calendar_table(settings_of(ttt, cells), CATALOG, site).to_dicts()
    assert r["calendar_days"] is None and r["segments"] is None and "no start-up measured" in r["note"]
    ttt = _ttt(("pythia-160m", "cpu", 1, 1, "fl", 2.0, 0.5), ("pythia-160m", "cpu", 1, 2, "fl", 1.0, 0.3))
    cells = _cells(("pythia-160m", "cpu", 1, 1, "fl", 30.0), ("pythia-160m", "cpu", 1, 2, "fl", None))
    rows = {r["gpus_per_node"]: r for r in calendar_table(settings_of(ttt, cells), CATALOG, site).to_dicts()}
    assert "median of the sweep's cells" in rows[2]["restart_basis"] and rows[2]["restart_s"] == pytest.approx(
        30.0 + rows[2]["checkpoint_s"]
    )


def test_a_train_stage_budget_is_its_own_row():
    site = Site(_site(time_limit_min=60, signal_delay_s=600), 1.0, "measured", None, NOW)
    train = replace(TrainSection.defaults(), time_budget_hours=2.0)
    (r,) = calendar_table(settings_of(_ttt(("pythia-160m", "a100", 1, 8, "fl", None, 0.2)),
                                      _cells(("pythia-160m", "a100", 1, 8, "fl", 60.0)), train),
                          CATALOG, site).to_dicts()  # fmt: skip
    assert r["run"] == "train stage" and r["compute_days"] == pytest.approx(2 / 24)
    assert r["segments"] == 3  # 2 h in jobs of 60 min warned 10 min early: 60 - 10 - 1 - read = ~48.9 min each
    assert r["wait_basis"] == "the scheduler was not asked" and r["calendar_days"] is None


def test_the_scheduler_unreachable_is_an_unknown_wait():
    w, cmd = ask_start(_site().gpus["a100"], 1, 2, "x", lambda c: (127, "FileNotFoundError: sbatch"), NOW)
    assert w.hours is None and "not reachable" in w.how and cmd == asking_command(_site().gpus["a100"], 1, 2, "x")


@pytest.mark.parametrize(("delay", "margin"), [(0, 0), (5, 30), (29, 30), (30, 60), (120, 150)])
def test_a_job_is_warned_at_slurms_time_limit_check_not_at_its_signal_delay(delay, margin):
    """slurmctld checks time limits every 30 s: a requeued job (started in step with the checks) is warned at the
    first check with at most signal_delay_s + 30 s left (measured on the testbed: docs/cluster.md)."""
    assert warning_margin_s(delay) == margin


def test_a_requeued_job_waits_out_slurms_hold_unless_the_site_says_how_long():
    """After a requeue SLURM holds the job cred_expire + 1 s (asked of the controller), then a scheduler pass; the
    site's requeue_wait_h replaces the estimate; the controller not answering falls back on SLURM's default."""
    ask, _ = _scheduler({"a100": "2026-12-03T12:00:00"})
    table = calendar_table(settings_of(_ttt(("pythia-160m", "a100", 1, 8, "fl", 3.0, 0.2)),
                                       _cells(("pythia-160m", "a100", 1, 8, "fl", 60.0))),
                           CATALOG, Site(_site(), 1.0, "measured", ask, NOW))  # fmt: skip
    (r,) = table.to_dicts()
    assert r["segments"] == 4 and r["requeue_wait_h"] * 3600 == pytest.approx(30 + 1 + 30)
    assert "cred_expire=30" in r["note"]
    assert requeue_wait({}, Wait(1.0, "asked")).hours == pytest.approx(1 + (120 + 1 + 30) / 3600)
    assert requeue_wait({"requeue_wait_h": 5.0, "gpu_type": "a100"}, Wait(1.0, "asked")).hours == 5.0
    assert requeue_wait({}, Wait(None, "no estimate")).hours is None  # never a number without the first wait


def test_where_the_site_refuses_requeue_each_segment_is_a_new_job_with_the_first_wait_again():
    """extra_sbatch no-requeue: the driver submits a new job per segment (issue 53), so the wait to start again is
    the first job's wait from its submission, up to one poll after the last job ends: no SLURM requeue hold."""
    ask, _ = _scheduler({"a100": "2026-12-03T12:00:00"})
    site = _site(extra_sbatch={"no-requeue": True})
    table = calendar_table(settings_of(_ttt(("pythia-160m", "a100", 1, 8, "fl", 3.0, 0.2)),
                                       _cells(("pythia-160m", "a100", 1, 8, "fl", 60.0))),
                           CATALOG, Site(site, 1.0, "measured", ask, NOW))  # fmt: skip
    (r,) = table.to_dicts()
    assert r["segments"] == 4
    assert r["requeue_wait_h"] == pytest.approx(r["first_wait_h"] + 60 / 3600)  # the site's poll_max_s, no hold
    assert "a new job per segment" in r["note"] and "no-requeue" in r["note"]
    assert requeue_wait({"extra_sbatch": {"no-requeue": True}}, Wait(None, "no estimate")).hours is None


def test_a_file_system_too_full_to_measure_gives_no_rate_and_the_restart_is_not_priced(tmp_path):
    """The disk probe writes at most a quarter of the free space; with none to spare it says so instead of failing
    the calendar rule (seen: a 16 MiB tmpfs filled by a test), and the calendar leaves that restart unknown."""
    from pretrain_planner.planning.calendar import disk_write_rate

    rate, how = disk_write_rate(str(tmp_path), 2 * 2**20)
    assert rate and rate > 0 and "2 MiB written and fsynced" in how
    assert not list(tmp_path.iterdir())  # the probe is gone
    site = Site(None, None, "not measured: /x has too little free space to write a probe", None, NOW)
    ttt, cells = _ttt(("pythia-160m", "cpu", 1, 1, "fl", 2.0, 0.5)), _cells(("pythia-160m", "cpu", 1, 1, "fl", 60.0))
    (r,) = calendar_table(settings_of(ttt, cells), CATALOG, site).to_dicts()
    assert r["calendar_days"] is None and "the checkpoint rate is unknown (not measured: /x" in r["note"], r

"""Out of memory on one rank of two: both learn it, free memory and halve the micro-batch together, with no
hang and no process left behind; when even micro-batch 1 fails the cell is `oom`.

The OOM is forced with the documented test hook PRETRAIN_PLANNER_FAKE_OOM_ABOVE (trainer/oom.py): the
model's last block raises torch.cuda.OutOfMemoryError on rank 1 for micro-batches above the given size,
in the middle of the forward, after FSDP's and ZeRO-3's collectives for the earlier blocks have started,
so rank 0 is left waiting inside a collective. Every Snakemake run here is bounded: a hang fails the test
and its whole process tree is killed.
"""

from __future__ import annotations

import pytest
from pretrain_planner.trainer.oom import FAKE_OOM_ENV, FakeOom

from .conftest import HAVE_DS, cell, leftover_processes, losses, run_sweep

MODEL = "tiny-gptneox"  # with gradient clipping (fp32; the bf16 paths: tests/test_cpu_bf16.py)
HALVED = ["naive", "naive+fsdp-full"] + (["naive+zero3"] if HAVE_DS else [])
BOUND_S = 420  # the whole run; a hang would otherwise last the process group's 10-minute timeout


@pytest.fixture(scope="module")
def halved(tmp_path_factory):
    work = tmp_path_factory.mktemp("oom_halved")
    return run_sweep(work, [MODEL], HALVED, env={FAKE_OOM_ENV: "2:1"}, timeout=BOUND_S)


@pytest.fixture(scope="module")
def nothing_fits(tmp_path_factory):
    work = tmp_path_factory.mktemp("oom_none")
    return run_sweep(work, ["tiny-bert"], ["naive+fsdp-grad"], env={FAKE_OOM_ENV: "0:1"}, timeout=BOUND_S)


@pytest.mark.slow
@pytest.mark.parametrize("method", HALVED)
def test_both_ranks_halve_together(halved, method):
    result, steps = cell(halved, MODEL, method)
    assert result["status"] == "ok", result.get("reason")
    first, second = result["micro_batch_trials"][:2]
    # rank 0 writes the result: it learned of rank 1's OOM at micro-batch 4
    assert first["micro_batch"] == 4 and first["fits"] is False and first["oom_ranks"] == [1]
    assert "PRETRAIN_PLANNER_FAKE_OOM_ABOVE" in first["error"]
    assert second == {**second, "micro_batch": 2, "fits": True}
    assert (result["micro_batch"], result["grad_accum_steps"]) == (2, 4)
    settings = result["method_settings"]
    assert settings["process_group_rebuilds"] == 1  # the group rank 1 aborted was replaced, on both ranks
    assert "fake_oom" in settings["test_hooks"]
    assert len(steps) == 3 and all(s["micro_batch"] == 2 for s in steps)


@pytest.mark.slow
def test_losses_agree_after_recovery(halved):
    """After the recovery every method trains the same model on the same data."""
    reference = losses(cell(halved, MODEL, "naive")[1])
    for method in HALVED[1:]:
        assert losses(cell(halved, MODEL, method)[1]) == pytest.approx(reference, rel=2e-3), method


@pytest.mark.slow
def test_micro_batch_one_oom_is_a_result(nothing_fits):
    result, steps = cell(nothing_fits, "tiny-bert", "naive+fsdp-grad")
    assert result["status"] == "oom"
    assert "rank 1" in result["reason"]
    assert [t["micro_batch"] for t in result["micro_batch_trials"]] == [4, 2, 1]
    assert not any(t["fits"] for t in result["micro_batch_trials"])
    assert steps == []
    assert result["method_settings"]["parallel"] == "fsdp2"


@pytest.mark.slow
def test_no_process_left(halved, nothing_fits):
    assert leftover_processes(str(halved)) == []
    assert leftover_processes(str(nothing_fits)) == []


def test_fake_oom_hook_is_explicit(monkeypatch):
    monkeypatch.delenv(FAKE_OOM_ENV, raising=False)
    assert FakeOom.from_env() is None  # off unless the variable is set
    monkeypatch.setenv(FAKE_OOM_ENV, "2:1")
    assert FakeOom.from_env() == FakeOom(2, 1)
    monkeypatch.setenv(FAKE_OOM_ENV, "8")
    assert FakeOom.from_env() == FakeOom(8, None)
    for bad in ("", "yes", "2:x", "-1", "2:1:0"):
        monkeypatch.setenv(FAKE_OOM_ENV, bad)
        with pytest.raises(ValueError, match=FAKE_OOM_ENV):
            FakeOom.from_env()


def test_fake_oom_raises_only_above_the_size_on_its_rank():
    import torch
    from pretrain_planner.trainer.oom import is_oom

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert FakeOom(2, 1).install(net, rank=0) is None  # another rank's hook
    handle = FakeOom(2, 1).install(net, rank=1)
    net(torch.zeros(2, 4))  # micro-batch 2: fits
    with pytest.raises(torch.cuda.OutOfMemoryError) as err:
        net(torch.zeros(3, 4))
    assert is_oom(err.value) and FAKE_OOM_ENV in str(err.value)
    handle.remove()
    net(torch.zeros(3, 4))

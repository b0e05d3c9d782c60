"""The train stage's multi-rank plan through a launcher (found by the chaos soak, issue 26): the job's tasks form
one process group of the plan's world size. Before, each submitit task trained alone as "rank 0" of a world of
one, all of them writing the same checkpoint, step log and result (a checkpoint rename failed on a race)."""

from __future__ import annotations

import json

import pytest
from pretrain_planner import cli

from .conftest import steps_of, write_plan


@pytest.mark.slow
def test_a_two_rank_plan_runs_as_one_two_rank_group_through_the_local_launcher(tmp_path, capsys):
    write_plan(tmp_path / "plan", "tiny-gptneox", mb=4, gpus_per_node=2)
    out = tmp_path / "out"
    rc = cli.main(["train", "--plan", str(tmp_path / "plan"), "--launcher", "local", "--device", "cpu", "--steps",
                   "4", "--threads", "2", "--out", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err[-3000:]
    res = json.loads((out / "result.json").read_text())
    assert (res["world_size"], res["launched_by"], res["grad_accum_steps"]) == (2, "submitit", 2)
    assert res["method_settings"]["parallel"] == "ddp"
    assert [s["step"] for s in steps_of(out)] == [1, 2, 3, 4]
    assert "on 2 rank(s)" in (out / "train.log").read_text()

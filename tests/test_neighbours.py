"""Issue 53 item 5 without a scheduler: what a cell measured beside other jobs becomes. On the testbed's daemons (two
cells on one node, each seeing the other): tests/test_slurm.py, the killed-driver sweep."""

from __future__ import annotations

import os

from pretrain_planner.launch import neighbours


def _rank(node: str, start: list | None, end: list | None) -> dict:
    return neighbours.placement({"node": node, "cores": [0], "others": start}, {"node": node, "cores": [0],
                                                                               "others": end})  # fmt: skip


def test_a_cell_beside_another_job_is_noisy_naming_it_unless_nodes_are_shared_by_design():
    bob = {"job_id": "77", "user": "bob", "name": "train"}
    ranks = [_rank("gpu01", [bob], [bob]), _rank("gpu02", [], [])]
    ok = {"status": "ok", "step_time_s": 0.1}
    judged = neighbours.judge(ok, ranks, shared_by_design=False)
    assert judged["status"] == "noisy" and "77 (bob, train) on gpu01" in judged["reason"]
    assert "exclusive: true" in judged["reason"] and "shared_nodes: true" in judged["reason"]
    assert judged["placement"]["co_tenants"] == ["77 (bob, train) on gpu01"]  # once, though seen twice
    shared = neighbours.judge(ok, ranks, shared_by_design=True)
    assert shared["status"] == "ok" and shared["placement"]["co_tenants"] == ["77 (bob, train) on gpu01"]
    alone = neighbours.judge(ok, [_rank("gpu01", [], [])], shared_by_design=False)
    assert alone["status"] == "ok" and alone["placement"]["co_tenants"] == []
    oom = neighbours.judge({"status": "oom", "reason": "CUDA"}, ranks, shared_by_design=False)
    assert oom["status"] == "oom" and oom["reason"] == "CUDA"  # only a timing is made untrustworthy


def test_a_rank_outside_slurm_records_its_cores_and_asks_nobody(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    seen = neighbours.look()
    assert seen["cores"] == sorted(os.sched_getaffinity(0)) and "others" not in seen
    assert "others_start" not in neighbours.placement(seen, seen)

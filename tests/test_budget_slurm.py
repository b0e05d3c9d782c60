"""Budget stage on the real SLURM testbed: the pre-training is one job on the partition of train.gpu (one task
per GPU, two gloo ranks); submitit's pre-emption signal (USR2) makes it finish its step, checkpoint and
requeue itself, and the requeued job resumes and completes within the budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import yaml
from pretrain_planner.tables import units

from .conftest import BIN, PROFILE, REPO, SITE, last_job_id, sacct, wait_for, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_pretrain_job_on_the_gpu_partition_requeues_and_resumes(slurm_cluster, tmp_path):
    since = last_job_id()
    cfg = yaml.safe_load((REPO / "config/budget.yaml").read_text())
    cfg["corpus"]["files"] = [str(REPO / "tests/data/corpus/*.txt")]
    cfg["glue"]["data_dir"] = str(REPO / "tests/data/glue")
    # real clock: 25 s of training on 2 ranks of the a100 partition (CPU tensors: the testbed's GPUs are fake)
    cfg["train"].update(budget_hours=25 / 3600, gpu="a100", gpus_per_node=2, micro_batch=8, device="cpu",
                        checkpoint_every_s=5, finetune_checkpoints=[], early_stop=[])  # fmt: skip
    (tmp_path / "budget.yaml").write_text(yaml.safe_dump(cfg))
    main = write_config(tmp_path / "main.yaml", budget=str(tmp_path / "budget.yaml"),
                        sweep={"models": ["tiny-bert"], "gpus": ["a100"]},
                        launcher={"kind": "slurm", "site": SITE})  # fmt: skip
    target = "results/budget/pretrain/result.json"
    cmd = [str(BIN / "snakemake"), target, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--profile", PROFILE,
           "--configfile", str(main)]  # fmt: skip
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    name = "pp-budget-pretrain-tiny-bert-24h-a100-1x2"
    steps = tmp_path / "results/budget/pretrain/run/steps.jsonl"

    def running():
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-5000:]
        return [j for j in sacct(since, name) if j["State"] == "RUNNING"]

    try:
        job = wait_for(running, 180, "the pretrain job")[0]
        wait_for(lambda: steps.is_file() and len(steps.read_text().splitlines()) > 20, 120, "training to start")
        subprocess.run(["scancel", "--signal", "USR2", job["JobID"]], check=True)
        assert driver.wait(timeout=400) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    result = json.loads((tmp_path / target).read_text())
    assert result["stop_reason"] == "budget" and result["world_size"] == 2 and result["slurm_job_id"] == job["JobID"]
    # the budget (wall clock, 25 s) ends the run at the first check after the step that used it up: the check before
    # the last step saw less than 25 s (the step before it ended earlier), the stop came at or after 25 s; what came
    # after it (the last validation, checkpoint, model write) is measured apart, in result.json and summary.md
    records = [json.loads(ln) for ln in steps.read_text().splitlines()]
    assert records[-2]["wall_s"] < 25 <= result["stopped_s"], (records[-2:], result["stopped_s"])
    assert result["elapsed_s"] == pytest.approx(result["stopped_s"] + result["finish_s"]) and result["finish_s"] < 60
    summary = (tmp_path / target).with_name("summary.md").read_text()
    assert f"took {units.duration_s(result['finish_s'])} more" in summary, summary
    assert result["loss_last"] < result["loss_first"]
    log = (tmp_path / "results/logs/budget/pretrain.log").read_text()
    assert "submitted SLURM job" in log and "resumed at step" in log, log[-3000:]
    done = wait_for(lambda: [j for j in sacct(since, name) if j["State"] == "COMPLETED"], 30, "sacct to see it end")
    assert len(sacct(since, name)) == 1, "requeued in place: one job"
    again = done[0]
    assert again["State"] == "COMPLETED" and again["Partition"] == "a100" and "gres/gpu:a100=2" in again["AllocTRES"]
    out = next((tmp_path / "results/budget/pretrain/submitit").glob("*_0_log.out")).read_text()
    assert f"Requeued job {job['JobID']}" in out and out.count("Starting with JobEnvironment") == 2, out[-3000:]
    got = [json.loads(ln)["step"] for ln in steps.read_text().splitlines()]
    assert got == list(range(1, len(got) + 1))  # the lost steps after the checkpoint were dropped, none repeated

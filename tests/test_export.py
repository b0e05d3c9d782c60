"""The exported plan: TrainingArguments that load, a DeepSpeed config for ZeRO, a launch script; written
without torch or transformers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from pretrain_planner.tables import aggregate, export

from .conftest import CATALOG, COSTS, REPO, P, cell_result, write_set

SET = [
    cell_result(P, "a100", 1, 4, "fl+zero1", "ok", 17.57, mb=16),
    cell_result(P, "a100", 1, 4, "fl", "ok", 20.0, mb=16),
    cell_result(P, "h100", 1, 8, "fl+ac+zero3+off", "ok", 9.0, mb=8),
    cell_result(P, "a100", 2, 4, "fl+fsdp-full", "ok", 9.0, mb=16),
    cell_result(P, "rtx3090", 1, 1, "naive", "oom"),
    cell_result("pythia-160m", "a100", 1, 1, "naive", "ok", 30.0, mb=8),
    cell_result("bert-24h", "a100", 1, 1, "fl", "ok", None, mb=64),
    cell_result("tiny-gptneox", "cpu", 1, 2, "fl", "ok", 0.01, mb=4),
    cell_result("tiny-bert", "cpu", 1, 1, "naive", "ok", 0.01, mb=4),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export") / "results"
    plan, paths = write_set(root, SET)
    out = aggregate.table_files(str(root / "tables"))
    aggregate.build_tables(plan, paths, out, str(root / "aggregate.log"), CATALOG, COSTS)
    index = export.export_plans(out["time_to_train_csv"], out["feasibility_csv"], str(root / "optimal"),
                                str(root / "export.log"), CATALOG, seed=7)  # fmt: skip
    return root / "optimal", index


def _args(folder, rel):
    return json.loads((folder / rel / "training_arguments.json").read_text())


@pytest.fixture(scope="module")
def TrainingArguments():
    transformers = pytest.importorskip("transformers")
    return transformers.TrainingArguments


def _load(TrainingArguments, args, tmp_path, monkeypatch=None, gpu=False):
    """TrainingArguments(**args) in a scratch folder; `gpu` pretends the host has an Ampere+ GPU (this test
    machine has none: TrainingArguments refuses tf32/bf16 without one)."""
    import transformers.training_args as ta

    if gpu:
        monkeypatch.setattr(ta, "is_torch_tf32_available", lambda: True)
        monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)
        monkeypatch.setattr(ta, "enable_tf32", lambda on: None)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):  # the name transformers 5.0 knows
        return TrainingArguments(**args)


def test_index_and_files(exported):
    folder, index = exported
    by = {e["folder"]: e for e in index}
    assert by[f"{P}/a100/1x4"]["best_method"] == "fl+zero1"
    assert by[f"{P}/a100/1x4"]["files"] == "training_arguments.json launch.sh plan.json deepspeed.json"
    assert (folder / P / "a100/1x4/deepspeed.json").is_file()
    assert not (folder / P / "a100/2x4/deepspeed.json").is_file()  # FSDP, not ZeRO
    assert not (folder / "pythia-160m/a100/1x1/deepspeed.json").is_file()
    nothing = by[f"{P}/rtx3090/1x1"]
    assert nothing["best_method"] is None and "no feasible method: out of memory" in nothing["note"]
    assert "no feasible method" in (folder / P / "rtx3090/1x1/README.md").read_text()
    assert (folder / "index.csv").read_text().startswith("model,gpu,nodes,gpus_per_node,world_size,best_method")


def test_training_arguments_follow_the_recipe_and_the_measurement(exported):
    folder, _ = exported
    a = _args(folder, f"{P}/a100/1x4")
    assert (a["per_device_train_batch_size"], a["gradient_accumulation_steps"]) == (16, 16)  # 16 x 16 x 4 = 1024
    assert a["max_steps"] == 143_000 and a["learning_rate"] == 3e-4
    assert (a["adam_beta1"], a["adam_beta2"], a["adam_epsilon"], a["weight_decay"]) == (0.9, 0.95, 1e-8, 0.01)
    assert a["bf16"] is True and a["fp16"] is False and a["tf32"] is True and a["torch_compile"] is True
    assert a["gradient_checkpointing"] is False and a["max_grad_norm"] == 1.0
    assert a["lr_scheduler_type"] == "cosine_with_min_lr" and a["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert a["warmup_steps"] == 1430 and a["seed"] == 7 and a["optim"] == "adamw_torch_fused"
    assert a["deepspeed"] == json.loads((folder / P / "a100/1x4/deepspeed.json").read_text())
    naive = _args(folder, "pythia-160m/a100/1x1")
    assert naive["fp16"] is True and naive["tf32"] is False and naive["torch_compile"] is False
    assert naive["optim"] == "adamw_torch" and naive["per_device_train_batch_size"] == 8
    assert naive["gradient_accumulation_steps"] == 128
    bert = _args(folder, "bert-24h/a100/1x1")  # time-budgeted: the steps that fit in 24 h
    assert bert["max_steps"] == int(24 * 3600 / 0.5) and bert["lr_scheduler_type"] == "linear"
    assert bert["warmup_steps"] == pytest.approx(0.06) and bert["max_grad_norm"] == 0.0
    plan = json.loads((folder / "bert-24h/a100/1x1/plan.json").read_text())
    assert any("wall-clock" in n for n in plan["notes"]) and plan["attn_implementation"] == "sdpa"


def test_deepspeed_configs(exported):
    folder, _ = exported
    ds = json.loads((folder / P / "a100/1x4/deepspeed.json").read_text())
    assert ds["zero_optimization"]["stage"] == 1 and "offload_optimizer" not in ds["zero_optimization"]
    assert ds["train_batch_size"] == 1024 and ds["train_micro_batch_size_per_gpu"] == 16
    assert ds["gradient_accumulation_steps"] == 16 and ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    # the recipe's torch optimizer as DeepSpeed's client optimizer, as the measured cell ran it
    assert ds["gradient_clipping"] == 1.0 and "optimizer" not in ds
    assert _args(folder, f"{P}/a100/1x4")["optim"] == "adamw_torch_fused"
    ds = json.loads((folder / P / "h100/1x8/deepspeed.json").read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]
    assert zero["overlap_comm"] and zero["reduce_bucket_size"] == 2048 * 2048  # the study's ZeRO-3, written out
    assert ds["optimizer"]["type"] == "Adam" and ds["optimizer"]["params"]["adam_w_mode"] is False  # the recipe's Adam
    assert _args(folder, f"{P}/h100/1x8")["gradient_checkpointing"] is True
    fsdp = _args(folder, f"{P}/a100/2x4")
    assert fsdp["fsdp"] is True and fsdp["fsdp_config"]["reshard_after_forward"] is True
    assert "deepspeed" not in fsdp


def test_every_key_is_a_training_argument(exported, TrainingArguments):
    folder, index = exported
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    paths = sorted(folder.glob("**/training_arguments.json"))
    # every planned setting has one (an empty glob passed before), and only those
    assert [str(p.parent.relative_to(folder)) for p in paths] == sorted(e["folder"] for e in index if e["best_method"])
    assert len(paths) == 7
    for path in paths:
        assert set(json.loads(path.read_text())) <= fields, path


def test_cpu_plans_load(exported, TrainingArguments, tmp_path, monkeypatch):
    folder, _ = exported
    args = _load(TrainingArguments, _args(folder, "tiny-gptneox/cpu/1x2"), tmp_path, monkeypatch)
    assert args.use_cpu and not args.bf16 and not args.fp16 and args.per_device_train_batch_size == 4  # fp32 recipe
    assert args.gradient_accumulation_steps == 2 and args.max_steps == 1000
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.ddp_find_unused_parameters is False
    args = _load(TrainingArguments, _args(folder, "tiny-bert/cpu/1x1"), tmp_path, monkeypatch)
    assert not args.bf16 and not args.fp16 and args.max_grad_norm == 0.0


@pytest.mark.parametrize("rel", [f"{P}/a100/2x4", "pythia-160m/a100/1x1", "bert-24h/a100/1x1", f"{P}/a100/1x4"])
def test_gpu_plans_load(exported, TrainingArguments, tmp_path, monkeypatch, rel):
    folder, _ = exported
    args = _args(folder, rel)
    ds = args.pop("deepspeed", None)
    if ds is not None:  # DeepSpeed plans need deepspeed installed to load (as the run does)
        try:
            import deepspeed  # noqa: F401

            args["deepspeed"] = ds
        except ImportError:
            pass
    loaded = _load(TrainingArguments, args, tmp_path, monkeypatch, gpu=True)
    assert loaded.per_device_train_batch_size == args["per_device_train_batch_size"]
    assert loaded.tf32 == args["tf32"] and loaded.max_steps == args["max_steps"]


def test_launch_script(exported):
    folder, _ = exported
    one = folder / P / "a100/1x4/launch.sh"
    assert one.stat().st_mode & 0o111
    text = one.read_text()
    assert subprocess.run(["bash", "-n", str(one)]).returncode == 0
    assert '"${RUN[@]}" -m torch.distributed.run --standalone --nnodes=1' in text and "NPROC_PER_NODE=4" in text
    assert f"PYTHON=${{PYTHON:-{sys.executable}}}" in text  # the exporting interpreter: no PATH needed
    assert f"PLAN_DIR={one.parent.resolve()}" in text  # under sbatch, when the spool copy's folder has no plan
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gpus-per-node=4" in text
    assert "srun" in text and '"$PLAN_DIR/training_arguments.json"' in text
    assert "about 18 d for" in text and "#SBATCH --time=19-08:00:00" in text  # 17.57 days + 10%, whole hours
    two = (folder / P / "a100/2x4/launch.sh").read_text()
    assert "NNODES=2" in two and "--rdzv-backend=c10d" in two and "#SBATCH --nodes=2" in two
    cpu = (folder / "tiny-gptneox/cpu/1x2/launch.sh").read_text()
    assert "--gpus-per-node" not in cpu


def _blocking(tmp_path, *names: str) -> dict[str, str]:
    """An environment in which importing any of `names` fails (a blocker package of that name first on the path),
    and the package is this checkout's (its catalog's families are the ones the code knows), not an installed one."""
    for name in names:
        (tmp_path / "blocker" / name).mkdir(parents=True)
        (tmp_path / "blocker" / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked')\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "blocker"), str(REPO / "workflow")]), "HF_HUB_OFFLINE": "1"}


def test_export_imports_neither_torch_nor_transformers(tmp_path):
    """Planning modules stay light: a login node has no torch (a blocker package makes any import fail)."""
    env = _blocking(tmp_path, "torch", "transformers")
    code = (
        "import sys\n"
        "import pretrain_planner.tables.aggregate, pretrain_planner.report.plots, pretrain_planner.tables.costs\n"
        "import pretrain_planner.tables.export, pretrain_planner.tables.status, pretrain_planner.cli\n"
        "from pretrain_planner.planning.catalog import load_catalog\n"
        f"cat = load_catalog('{REPO}/config/models.yaml', '{REPO}/config/gpus.yaml')\n"
        "row = {'best_method': 'fl+zero3+off', 'micro_batch': 16, 'grad_accum_steps': 16, 'nodes': 1,\n"
        "       'gpus_per_node': 4, 'step_time_s': 1.0, 'training_days': 2.0}\n"
        "from pretrain_planner.tables.export import training_arguments\n"
        "args, ds, _ = training_arguments(cat.models['pythia-1b'], cat.gpus['a100'], row)\n"
        "assert ds['zero_optimization']['stage'] == 3\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_one_plan_is_written_without_polars_snakemake_or_torch(tmp_path):
    """Issue 28: a GPU machine has neither polars nor Snakemake: `export.write_plan` writes a setting's plan from
    a time_to_train row and the cell's recorded settings with only the planner's light imports (blockers make
    any import of polars, snakemake, torch or transformers fail)."""
    env = _blocking(tmp_path, "polars", "snakemake", "torch", "transformers")
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from pretrain_planner.tables import export\n"
        "from pretrain_planner.planning.catalog import load_catalog\n"
        f"cat = load_catalog('{REPO}/config/models.yaml', '{REPO}/config/gpus.yaml')\n"
        "row = {'model': 'pythia-410m', 'gpu': 'h200', 'nodes': 1, 'gpus_per_node': 1, 'best_method': 'fl+flce',\n"
        "       'micro_batch': 16, 'grad_accum_steps': 64, 'step_time_s': 30.0, 'training_days': 50.0}\n"
        f"target = Path('{tmp_path}') / 'plan'\n"
        "target.mkdir()\n"
        "entry = export.write_plan(target, cat.model('pythia-410m'), cat.gpu('h200'), row, None)\n"
        "plan = json.loads((target / 'plan.json').read_text())\n"
        "assert plan['method'] == 'fl+flce' and plan['measured']['micro_batch'] == 16, plan\n"
        "assert entry['files'] == 'training_arguments.json launch.sh plan.json', entry\n"
        "assert not {'polars', 'snakemake', 'torch'} & set(sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_launch_script_asks_what_the_sites_jobs_asked_and_runs_their_interpreter(tmp_path):
    """Issue 52: exported from a sweep on SLURM, launch.sh asks what the GPU type's cells asked (partition, account,
    QOS, GPU request, CPUs for its torchrun task, memory, extra options), runs the site's modules, env and setup
    lines, starts the site's interpreter behind its container prefix, and takes its rendezvous port from the job id
    (torchrun's fixed 29500 collides with other users' runs on a shared node). A GPU type's free-text label with a
    newline stays one comment line."""
    from pretrain_planner.planning.catalog import load_catalog
    from pretrain_planner.planning.site import load_site

    site_file = tmp_path / "site.yaml"
    site_file.write_text(json.dumps({"defaults": {"cpus_per_gpu": 6, "mem_per_gpu_gb": 40}, "gpus": {"a100": {
        "partition": "gpu-a100", "account": "lab1", "qos": "normal", "gres_type": "a100",
        "python": "/opt/venv/bin/python", "container": "apptainer exec --nv /img/pp.sif", "modules": ["cuda/12.4"],
        "env": {"NCCL_SOCKET_IFNAME": "ib0", "NOTE": "$(touch pwned)"}, "setup": ["echo ready"],
        "extra_sbatch": {"exclusive": True, "comment": "grant 7"}}}}))  # fmt: skip
    site = load_site(site_file, ["a100"]).gpus["a100"]
    cat = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    gpu = dataclasses.replace(cat.gpus["a100"], label="A100\nrm -rf ~")
    row = {"model": "pythia-1b", "gpu": "a100", "best_method": "naive", "micro_batch": 8, "grad_accum_steps": 2,
           "nodes": 2, "gpus_per_node": 4, "step_time_s": 1.0, "training_days": 1.0}  # fmt: skip
    text = export.launch_script(cat.models["pythia-1b"], gpu, row, site=site)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    header = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    for line in ("--partition=gpu-a100", "--account=lab1", "--qos=normal", "--gres=gpu:a100:4", "--cpus-per-task=24",
                 "--mem=160G", "--exclusive", "--comment=grant 7", "--nodes=2", "--ntasks-per-node=1"):  # fmt: skip
        assert f"#SBATCH {line}" in header, (line, header)
    assert not any(ln.startswith("rm -rf") for ln in text.splitlines())  # the label's newline: still a comment
    lines = text.splitlines()
    first_cmd = lines.index("module load cuda/12.4")
    assert lines[first_cmd : first_cmd + 4] == ["module load cuda/12.4", "export NCCL_SOCKET_IFNAME=ib0",
                                                "export NOTE='$(touch pwned)'", "echo ready"]  # fmt: skip
    assert "PYTHON=${PYTHON:-/opt/venv/bin/python}" in text
    assert "CONTAINER=${CONTAINER-'apptainer exec --nv /img/pp.sif'}" in text
    assert ":29500" not in text and '--rdzv-endpoint="$MASTER_ADDR:$PORT"' in text
    # the interpreter line as bash runs it: the container's words, then the interpreter
    probe = text.split("set -euo pipefail", 1)[1].split("# The plan's folder", 1)[0]
    out = subprocess.run(["bash", "-c", probe + 'printf "%s|" "${RUN[@]}"'], capture_output=True, text=True)
    assert out.stdout == "apptainer|exec|--nv|/img/pp.sif|/opt/venv/bin/python|", out.stdout + out.stderr
    no_site = export.launch_script(cat.models["pythia-1b"], cat.gpus["a100"], row)
    assert "#SBATCH --gpus-per-node=4" in no_site and "--partition" not in no_site and "module load" not in no_site

"""One translation from a method to concrete settings (planning.settings): what a cell builds is what its
settings say (the applied state, read from the objects), what it records is what the export writes (for cells
that really ran: test_sharding.py and test_deepspeed.py call `assert_recorded_is_exported` on their sweeps), every
valid cell of the study's grid reaches the export as the run the trainer reads; a plan whose cell ran other
settings is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pretrain_planner.planning.methods import parse
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.planning.settings import differences, resolve
from pretrain_planner.results import write_result
from pretrain_planner.tables import aggregate, export

from .conftest import CATALOG, COSTS, P, cell_result, plan_row, write_set


def test_every_paper_cell_exports_its_settings(paper):
    """For each valid cell of config/paper.yaml: the job spec the planner hands the cell is, read back as the
    trainer reads it (JSON -> RunConfig -> RunSpec on a CUDA rank), the very run the export resolves; and the
    exported Trainer arguments carry its settings (DeepSpeed dict, FSDP2 policy, optimizer, compile, TF32)."""
    import torch
    from pretrain_planner.planning.spec import cell_spec
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.rank import RankEnv

    valid = [p.cell for p in paper.planned if p.valid]
    assert len(valid) == 2952
    checked = 0
    for cell in valid:
        spec = cell_spec(cell, paper.catalog, paper.benchmark, paper.launcher, "/nonexistent/r.json", "s.jsonl")
        world = cell.nodes * cell.gpus_per_node
        trainer_side = RunConfig.from_spec(json.loads(json.dumps(spec))).run_spec(
            RankEnv(0, world, 0, torch.device("cuda", 0))
        )
        model, gpu = paper.catalog.model(cell.model), paper.catalog.gpus[cell.gpu]
        assert trainer_side == RunSpec(model, gpu, parse(cell.method), world, cuda=True), cell
        mb = 2
        row = plan_row(
            cell.method, cell.nodes, cell.gpus_per_node, mb, max(1, model.recipe.global_batch // world // mb)
        )
        exported = export.settings_for(model, gpu, row)
        args, ds, _ = export.training_arguments(model, gpu, row, settings=exported)
        assert args.get("deepspeed") == ds == exported["deepspeed_config"]
        assert ("fsdp" in args) is (exported["fsdp_policy"] is not None)
        assert args["optim"] == ("adamw_torch_fused" if exported["fused_optimizer"] else "adamw_torch")
        assert args["tf32"] is exported["tf32"] and args["torch_compile"] is exported["compile"]
        checked += 1
    assert checked == 2952 and len({c.method for c in valid}) == 23  # 25 methods, less fl(+ac)+off


APPLIED_CASES = [  # (model, method, precision): one rank on this CPU, in this process
    ("tiny-gptneox", "naive", "fp32"),
    ("tiny-gptneox", "fl+ac", "bf16"),
    ("tiny-bert", "naive+fsdp-grad+off", "bf16"),
    ("tiny-gptneox", "naive+fsdp-full+off", "fp32"),
    ("tiny-gptneox", "naive+zero2+off", "bf16"),
    ("tiny-bert", "naive+zero3+off", "bf16"),
]


def _built(model: str, method: str, precision: str, mb: int = 2, accum: int = 4):
    """The cell's step as the benchmark builds it (trainer/methodbuild.py), with the settings it was built from."""
    import torch
    from pretrain_planner.trainer.rank import init_rank

    from .rank_workers import run_config

    cfg, _ = run_config(model, method, 1, precision=precision)
    env = init_rank(cfg)
    if "zero" in method:
        from pretrain_planner.trainer.zero import import_deepspeed

        try:
            import_deepspeed(env).ops.op_builder.CPUAdamBuilder().load(verbose=False)
        except Exception as exc:  # noqa: BLE001 - no DeepSpeed (or its CPU Adam) here
            from pretrain_planner.trainer.rank import close_rank

            close_rank(env)
            pytest.skip(f"DeepSpeed's CPU Adam does not load here: {exc}"[:200])
    spec = cfg.run_spec(env)
    settings = resolve(spec, mb, accum)
    from pretrain_planner.trainer.run import make_builder

    recorded: list[dict] = []
    step = make_builder(cfg, env, recorded)(mb, accum)
    torch.manual_seed(0)
    return env, step, settings, recorded[-1]


@pytest.mark.parametrize(("model", "method", "precision"), APPLIED_CASES)
def test_what_runs_is_the_settings(model, method, precision):
    """The applied state, read from the objects a cell builds, against the settings they were built from: the
    model's dtype (parameters, autocast, the FSDP2 policy on every sharded block, ZeRO-3's 16-bit partitions), the
    optimizer's class and fused flag, the DeepSpeed engine's own config, activation checkpointing, the attention;
    and the recorded method_settings are those settings (no difference)."""
    import torch
    from pretrain_planner.trainer.rank import close_rank

    env, step, s, recorded = _built(model, method, precision)
    try:
        net = step.applied.raw
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
        assert net.config._attn_implementation == s.attn_implementation
        assert bool(net.is_activation_checkpointing) is s.activation_checkpointing
        if s.parallel == "deepspeed":
            engine = step.engine
            assert engine.zero_optimization_stage() == s.deepspeed_config["zero_optimization"]["stage"]
            assert engine.train_micro_batch_size_per_gpu() == s.deepspeed_config["train_micro_batch_size_per_gpu"]
            assert engine.gradient_accumulation_steps() == s.deepspeed_config["gradient_accumulation_steps"]
            assert engine.bfloat16_enabled() is (precision == "bf16")
            base = getattr(engine.optimizer, "optimizer", engine.optimizer)
            assert type(base).__name__ == s.optimizer == "DeepSpeedCPUAdam"  # ZeRO-Offload's, from the config
            if engine.zero_optimization_stage() == 3:  # the partitions hold the recipe's 16-bit weights
                assert {p.ds_tensor.dtype for p in net.parameters()} == {dtype}
            assert engine.zero_offload_optimizer() is not None
        else:
            opt = step.optimizer
            assert type(opt).__name__ == s.optimizer and bool(opt.defaults.get("fused")) is s.fused_optimizer
            assert opt.defaults["lr"] == s.lr and list(opt.defaults["betas"]) == s.betas
            if s.parallel == "fsdp2":
                from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

                policy = s.fsdp_policy
                groups = [m._get_fsdp_state()._fsdp_param_group for m in net.modules()
                          if isinstance(m, FSDPModule) and m is not net]  # fmt: skip
                assert groups and all(g is not None for g in groups)
                want = dtype if policy["mixed_precision"] else None
                assert {g.mp_policy.param_dtype for g in groups} == {want}
                assert {g._reshard_after_forward for g in groups} == {policy["reshard_after_forward"]}
                assert {isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups} == {policy["cpu_offload"]}
                assert step.applied.autocast_dtype == (None if policy["mixed_precision"] else dtype)
            else:
                assert {p.dtype for p in net.parameters()} == {torch.float32}  # fp32 master weights
                assert step.applied.autocast_dtype == dtype and (step.applied.ddp is None)
            assert (step.scaler is not None) is (s.grad_scaler is not None)
        assert differences(s.as_dict(), recorded) == []
    finally:
        step.close()
        close_rank(env)


def test_a_setting_not_applied_shows_as_a_difference(monkeypatch):
    """What is recorded is read back from what was built: a trainer that built another optimizer than the
    settings say records that one, and the difference is named (the export would refuse the plan)."""
    import torch
    from pretrain_planner.trainer import parallel
    from pretrain_planner.trainer.rank import close_rank

    monkeypatch.setitem(parallel.OPTIMIZERS, "AdamW", torch.optim.Adam)
    env, step, s, recorded = _built("tiny-gptneox", "naive", "fp32")
    try:
        assert s.optimizer == "AdamW" and recorded["optimizer"] == "Adam"
        assert differences(s.as_dict(), recorded) == ["optimizer: measured 'Adam', planned 'AdamW'"]
    finally:
        step.close()
        close_rank(env)


def test_zero_configs_are_chosen_deliberately():
    """ZeRO-2 takes the study's communication settings; ZeRO-3's "auto" values are written out; no optimizer in the
    config unless ZeRO-Offload needs DeepSpeed's CPU Adam; pinned memory on CUDA only."""
    m, a100 = CATALOG.model("pythia-1b"), CATALOG.gpus["a100"]
    two = resolve(RunSpec(m, a100, parse("fl+zero2"), 4), 16, 16).deepspeed_config
    z = two["zero_optimization"]
    assert z["overlap_comm"] and z["reduce_bucket_size"] == z["allgather_bucket_size"] == 200_000_000
    assert "optimizer" not in two and two["train_batch_size"] == 16 * 16 * 4
    three = resolve(RunSpec(m, a100, parse("fl+zero3+off"), 4), 16, 16).deepspeed_config
    assert three["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * 2048
    assert three["optimizer"]["type"] == "Adam" and three["zero_optimization"]["offload_param"]["pin_memory"]
    cpu = resolve(RunSpec(m, a100, parse("fl+zero3+off"), 4, cuda=False), 16, 16).deepspeed_config
    assert cpu["zero_optimization"]["offload_param"]["pin_memory"] is False


def test_zero3_buckets_are_hugging_faces_auto_values_for_every_family():
    """The study leaves ZeRO-3's three bucket sizes "auto" (src/train.py) and Hugging Face's Trainer fills them from
    the model's config (transformers integrations/deepspeed.py trainer_config_finalize: `hidden_size`, else the
    largest of `hidden_sizes`): run that very code on every catalog model's config and compare. ConvNeXt-XL's
    widths 256..2048 give buckets of 2048^2 = 4.19M, not 1024^2 (the old `hidden_size or 1024`)."""
    from types import SimpleNamespace

    import transformers as tf
    from pretrain_planner.planning.families import FAMILIES
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    keys = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    a100 = CATALOG.gpus["a100"]
    for name, spec in CATALOG.models.items():
        m = spec.to_dict()
        arch = {k: v for k, v in m["arch"].items() if k != "sparse_prediction"}
        model = SimpleNamespace(config=getattr(tf, FAMILIES[spec.family].config_class)(**arch))
        hf = HfTrainerDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1,
                                       "zero_optimization": {"stage": 3, **dict.fromkeys(keys, "auto")}})  # fmt: skip
        hf.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda n: 1), model, 10)
        ours = resolve(RunSpec(spec, a100, parse("fl+zero3"), 8), 1, 1).deepspeed_config["zero_optimization"]
        assert {k: ours[k] for k in keys} == {k: hf.config["zero_optimization"][k] for k in keys}, name
    convnext = resolve(RunSpec(CATALOG.model("convnext-xlarge-22k"), a100, parse("fl+zero3"), 8), 1, 1)
    assert convnext.deepspeed_config["zero_optimization"]["reduce_bucket_size"] == 2048 * 2048


def test_export_refuses_a_plan_whose_cell_ran_other_settings(tmp_path):
    """A cell measured with other settings (an older version, a hand-edited result) gets no plan: the README says
    which setting differs; the same cell with matching settings gets its plan and plan.json says so."""
    cells = [
        cell_result(P, "a100", 1, 4, "fl", "ok", 20.0, mb=16),
        cell_result(P, "h100", 1, 4, "fl", "ok", 9.0, mb=16),
    ]
    root = tmp_path / "results"
    plan, paths = write_set(root, cells)
    for path in paths:  # record the settings the trainer would have applied
        result = json.loads(Path(path).read_text())
        gpu = "a100" if "/a100/" in path else "h100"
        row = plan_row("fl", 1, 4, 16, result["grad_accum_steps"])
        settings = export.settings_for(CATALOG.model(P), CATALOG.gpus[gpu], row)
        if gpu == "h100":
            settings["tf32"] = not settings["tf32"]  # this cell ran without what the plan would set
        write_result(path, {**result, "method_settings": settings})
    out = aggregate.table_files(str(root / "tables"))
    aggregate.build_tables(plan, paths, out, str(root / "aggregate.log"), CATALOG, COSTS)
    index = export.export_plans(out["time_to_train_csv"], out["feasibility_csv"], str(root / "optimal"),
                                str(root / "export.log"), CATALOG)  # fmt: skip
    by = {(e["gpu"]): e for e in index}
    assert by["a100"]["best_method"] == "fl" and by["a100"]["files"].startswith("training_arguments.json")
    assert by["h100"]["best_method"] is None and "tf32: measured" in by["h100"]["note"]
    readme = (root / "optimal" / P / "h100/1x4/README.md").read_text()
    assert "re-measure" in readme and "tf32" in readme
    plan_json = json.loads((root / "optimal" / P / "a100/1x4/plan.json").read_text())
    assert plan_json["method_settings"]["tf32"] is True and plan_json["method_settings"]["method"] == "fl"
    parts = {e["part"] for e in plan_json["not_expressible"]}
    assert {"attn_implementation", "optimizer", "cudnn_benchmark"} <= parts  # pythia's recipe: Adam (L2)


def test_every_method_part_reaches_the_export():
    """The issue's example: `fl+fa2+flce+cg` exported only `torch_compile: true` and said `sdpa`. Now flash-attn 2
    is the model's attn_implementation, CUDA graphs the compile mode, Liger the Trainer's switch, and what the
    Trainer cannot express (the fused CE head, the compiled optimizer step) is listed with the reason."""
    model, gpu = CATALOG.model(P), CATALOG.gpus["a100"]
    row = plan_row("fl+fa2+flce+cg", 1, 1, 4, 256)
    settings = export.settings_for(model, gpu, row)
    args, _, notes = export.training_arguments(model, gpu, row, settings=settings)
    record = export._plan_record(model, gpu, row, notes, settings)
    assert record["attn_implementation"] == "flash_attention_2" == record["model_init_kwargs"]["attn_implementation"]
    assert args["torch_compile"] and args["torch_compile_mode"] == "reduce-overhead" and settings["cuda_graphs"]
    assert "flce" in {e["part"] for e in record["not_expressible"]}
    row = plan_row("fl+liger+cstep", 1, 1, 4, 256)
    settings = export.settings_for(model, gpu, row)
    args, _, notes = export.training_arguments(model, gpu, row, settings=settings)
    assert args["use_liger_kernel"] is True and "torch_compile_mode" not in args
    assert "cstep" in {e["part"] for e in export.not_expressible(model, settings)}

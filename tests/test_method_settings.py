"""One translation from a method to concrete settings (planning.settings): what a cell records is what the export
writes, for every valid cell of the study's grid and for cells that really ran (test_sharding.py and
test_deepspeed.py call `assert_recorded_is_exported` on their sweeps); a plan whose cell ran other settings is
refused."""

from __future__ import annotations

import json
from pathlib import Path

from pretrain_planner import layout
from pretrain_planner.planning.settings import KEYS, differences, resolve
from pretrain_planner.results import write_result
from pretrain_planner.tables import aggregate, export

from .test_aggregate import CATALOG, COSTS, P, cell_result, write_set
from .test_paper_grid import paper  # noqa: F401, F811 - the fixture: config/paper.yaml as Snakemake builds it


def _row(method: str, nodes: int, gpn: int, mb: int, accum: int) -> dict:
    return {"best_method": method, "nodes": nodes, "gpus_per_node": gpn, "micro_batch_size": mb,
            "grad_accum_steps": accum, "step_time_s": 1.0, "training_days": 1.0}  # fmt: skip


def _json(value):
    return json.loads(json.dumps(value))


def assert_recorded_is_exported(work: Path, model: str, method: str, ranks: int, gpu: str = "cpu") -> None:
    """The cell's result.json method_settings hold, for every key of planning.settings, the value the export
    writes into plan.json for that cell; and the exported arguments carry the same DeepSpeed dict / FSDP policy."""
    folder = layout.setting_folder(model, gpu, 1, ranks)
    result = json.loads(Path(layout.cell_file(work / "results", folder, method)).read_text())
    recorded = result["method_settings"]
    row = _row(method, 1, ranks, result["micro_batch_size"], result["grad_accum_steps"])
    spec_model, spec_gpu = CATALOG.model(model), CATALOG.gpus[gpu]
    planned = export.settings_for(spec_model, spec_gpu, row, recorded)
    assert set(KEYS) <= set(recorded), sorted(set(KEYS) - set(recorded))
    assert {k: _json(recorded[k]) for k in KEYS} == _json(planned), differences(planned, recorded)
    args, ds, _ = export.training_arguments(spec_model, spec_gpu, row, settings=planned)
    assert args.get("deepspeed") == recorded["deepspeed_config"] == ds
    assert (
        args["torch_compile"] is recorded["compile"]
        and args["gradient_checkpointing"] is recorded["activation_checkpointing"]
    )


def test_every_paper_cell_records_what_the_export_writes(paper):  # noqa: F811 - the imported fixture
    """For each valid cell of config/paper.yaml: the settings the trainer applies (its RunConfig, built from the job
    spec the planner hands the cell, on a CUDA rank) equal the export's for that cell, and the exported Trainer
    arguments carry them (DeepSpeed dict, FSDP2 policy, optimizer, compile, TF32, checkpointing)."""
    import torch
    from pretrain_planner.planning.spec import cell_spec
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.parallel import planned
    from pretrain_planner.trainer.rank import RankEnv

    valid = [p.cell for p in paper.planned if p.valid]
    assert len(valid) == 2952
    checked = 0
    for cell in valid:
        spec = cell_spec(cell, paper.catalog, paper.config, "/nonexistent/r.json", "s.jsonl")
        cfg = RunConfig.from_spec(spec)
        world = cell.nodes * cell.gpus_per_node
        mb = 2
        accum = max(1, cfg.recipe["global_batch"] // world // mb)
        env = RankEnv(0, world, 0, torch.device("cuda", 0))
        trainer_side = planned(cfg, env, mb, accum)
        model, gpu = paper.catalog.model(cell.model), paper.catalog.gpus[cell.gpu]
        row = _row(cell.method, cell.nodes, cell.gpus_per_node, mb, accum)
        exported = export.settings_for(model, gpu, row)
        assert _json(trainer_side) == _json(exported), (cell, differences(exported, trainer_side))
        args, ds, _ = export.training_arguments(model, gpu, row, settings=exported)
        assert args.get("deepspeed") == ds == exported["deepspeed_config"]
        assert ("fsdp" in args) is (exported["fsdp_policy"] is not None)
        assert args["optim"] == ("adamw_torch_fused" if exported["fused_optimizer"] else "adamw_torch")
        assert args["tf32"] is exported["tf32"] and args["torch_compile"] is exported["compile"]
        checked += 1
    assert checked == 2952 and len({c.method for c in valid}) == 23  # 25 methods, less fl(+ac)+off


def test_zero_configs_are_chosen_deliberately():
    """ZeRO-2 takes the study's communication settings; ZeRO-3's "auto" values are written out; no optimizer in the
    config unless ZeRO-Offload needs DeepSpeed's CPU Adam; pinned memory on CUDA only."""
    m = CATALOG.model("pythia-1b").to_dict()
    a100 = CATALOG.gpus["a100"].to_dict()
    two = resolve("fl+zero2", m, a100, 4, 16, 16)["deepspeed_config"]
    z = two["zero_optimization"]
    assert z["overlap_comm"] and z["reduce_bucket_size"] == z["allgather_bucket_size"] == 200_000_000
    assert "optimizer" not in two and two["train_batch_size"] == 16 * 16 * 4
    three = resolve("fl+zero3+off", m, a100, 4, 16, 16)["deepspeed_config"]
    assert three["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * 2048
    assert three["optimizer"]["type"] == "Adam" and three["zero_optimization"]["offload_param"]["pin_memory"]
    cpu = resolve("fl+zero3+off", m, a100, 4, 16, 16, cuda=False)["deepspeed_config"]
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
    a100 = CATALOG.gpus["a100"].to_dict()
    for name, spec in CATALOG.models.items():
        m = spec.to_dict()
        arch = {k: v for k, v in m["arch"].items() if k != "sparse_prediction"}
        model = SimpleNamespace(config=getattr(tf, FAMILIES[spec.family].config_class)(**arch))
        hf = HfTrainerDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1,
                                       "zero_optimization": {"stage": 3, **dict.fromkeys(keys, "auto")}})  # fmt: skip
        hf.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda n: 1), model, 10)
        ours = resolve("fl+zero3", m, a100, 8, 1, 1)["deepspeed_config"]["zero_optimization"]
        assert {k: ours[k] for k in keys} == {k: hf.config["zero_optimization"][k] for k in keys}, name
    convnext = resolve("fl+zero3", CATALOG.model("convnext-xlarge-22k").to_dict(), a100, 8, 1, 1)
    assert convnext["deepspeed_config"]["zero_optimization"]["reduce_bucket_size"] == 2048 * 2048


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
        row = _row("fl", 1, 4, 16, result["grad_accum_steps"])
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
    row = _row("fl+fa2+flce+cg", 1, 1, 4, 256)
    settings = export.settings_for(model, gpu, row)
    args, _, notes = export.training_arguments(model, gpu, row, settings=settings)
    record = export._plan_record(model, gpu, row, notes, settings)
    assert record["attn_implementation"] == "flash_attention_2" == record["model_init_kwargs"]["attn_implementation"]
    assert args["torch_compile"] and args["torch_compile_mode"] == "reduce-overhead" and settings["cuda_graphs"]
    assert "flce" in {e["part"] for e in record["not_expressible"]}
    row = _row("fl+liger+cstep", 1, 1, 4, 256)
    settings = export.settings_for(model, gpu, row)
    args, _, notes = export.training_arguments(model, gpu, row, settings=settings)
    assert args["use_liger_kernel"] is True and "torch_compile_mode" not in args
    assert "cstep" in {e["part"] for e in export.not_expressible(model, settings)}

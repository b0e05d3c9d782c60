"""The grid: cells, their paths, and the "$100K" study's validity rules (Khandelwal et al. 2024), one test per rule."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pretrain_planner import schema
from pretrain_planner.layout import CELL_PATTERN
from pretrain_planner.planning import grid
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.configtypes import LauncherSection, SweepSection
from pretrain_planner.planning.grid import WILDCARD_CONSTRAINTS, Cell, PlannedCell
from pretrain_planner.schema import ConfigError

from .conftest import GPUS_YAML, MODELS_YAML, TINY_GPTNEOX_ARCH

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(MODELS_YAML, GPUS_YAML)


def _tiny(global_batch=16, precision="fp32", checkpointing=True):
    model = {
        "family": "gptneox",
        "arch": dict(TINY_GPTNEOX_ARCH),
        "recipe": {
            "global_batch": global_batch,
            "steps": 10,
            "sequence_length": 32,
            "precision": precision,
            "optimizer": {"name": "adamw", "lr": 1.0e-3},
        },
    }
    if not checkpointing:
        model["supports"] = {"activation_checkpointing": False}
    return model


@pytest.fixture
def tmp_catalog(tmp_path):
    """A catalog of small made-up models (with the real GPU types)."""
    models = {
        "tiny": _tiny(),
        "batch-24": _tiny(global_batch=24),
        "batch-6": _tiny(global_batch=6),
        "no-ac": _tiny(checkpointing=False),
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return load_catalog(path, GPUS_YAML)


def _reason(catalog, model, gpu, nodes=1, gpn=1, method="fl", launcher="slurm"):
    cell = Cell(model, gpu, nodes, gpn, method)
    return grid.invalid_reason(cell, catalog.model(model), catalog.gpu(gpu), launcher, catalog)


def _config(**sweep):
    cfg = {"sweep": sweep, "launcher": {"kind": sweep.pop("launcher", "slurm")}}
    return schema.validate(cfg, "config", "test")


def _expand(cfg, catalog, source="config"):
    """The grid of a validated config, its sections typed as the facade types them."""
    return grid.expand(SweepSection.of(cfg["sweep"]), LauncherSection.of(cfg["launcher"]), catalog, source)


# ------------------------------------------------------------------------------------------ validity rules


def test_global_batch_not_divisible(catalog):
    reason = _reason(catalog, "tiny-gptneox", "cpu", gpn=3)  # 16 samples on 3 GPUs
    assert reason is not None
    assert "not divisible by 3 GPUs" in reason
    assert "global_batch=16" in reason
    assert catalog.models_path in reason


def test_global_batch_not_divisible_across_nodes(catalog):
    reason = _reason(catalog, "pythia-1b", "a100", nodes=3, gpn=1)
    assert reason is not None and "not divisible by 3 GPUs" in reason


def test_per_gpu_batch_not_power_of_two(tmp_catalog):
    reason = _reason(tmp_catalog, "batch-24", "a100", gpn=2)  # 24 / 2 = 12
    assert reason is not None
    assert "not a power of two" in reason
    assert "24/2 = 12" in reason
    assert "global_batch=24" in reason
    # 24 / 8 = 3 is divisible but not a power of two either; 24 / 1 = 24 neither
    assert "not a power of two" in _reason(tmp_catalog, "batch-24", "a100", gpn=8)
    assert "not a power of two" in _reason(tmp_catalog, "batch-24", "a100", gpn=1)


def test_per_gpu_batch_power_of_two_is_valid(catalog):
    for gpn in (1, 2, 4, 8):
        assert _reason(catalog, "pythia-1b", "a100", gpn=gpn) is None
    assert _reason(catalog, "pythia-1b", "a100", nodes=4, gpn=8) is None  # 1024 / 32 = 32


def test_per_gpu_batch_of_one_is_valid(tmp_catalog):
    assert _reason(tmp_catalog, "tiny", "a100", nodes=2, gpn=8) is None  # 16 / 16 = 1
    assert "not divisible" in _reason(tmp_catalog, "tiny", "a100", nodes=4, gpn=8)  # 16 / 32


def test_bf16_on_v100_is_invalid(catalog):
    reason = _reason(catalog, "pythia-1b", "v100")
    assert reason is not None
    assert "bf16" in reason and "v100" in reason
    assert "v100.bf16 = false" in reason
    assert catalog.gpus_path in reason


def test_fp16_on_v100_is_valid(catalog):
    assert _reason(catalog, "pythia-410m", "v100") is None


def test_fp16_on_cpu_is_invalid(catalog):
    reason = _reason(catalog, "pythia-160m", "cpu")
    assert reason is not None
    assert "fp16" in reason and "cpu.fp16 = false" in reason


def test_fp32_on_cpu_is_valid(catalog):
    """(bf16 on `cpu` depends on the host's CPU: tests/test_cpu_bf16.py)"""
    assert _reason(catalog, "tiny-bert", "cpu") is None
    assert _reason(catalog, "tiny-gptneox", "cpu") is None


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3", "fsdp-grad", "fsdp-full"])
def test_sharding_on_one_gpu_without_offload(catalog, sharding):
    reason = _reason(catalog, "pythia-1b", "a100", method=f"fl+{sharding}")
    assert reason is not None
    assert sharding in reason and "more than 1 GPU" in reason
    # with offload, or on two GPUs, it is allowed
    assert _reason(catalog, "pythia-1b", "a100", method=f"fl+{sharding}+off") is None
    assert _reason(catalog, "pythia-1b", "a100", gpn=2, method=f"fl+{sharding}") is None


def test_offload_without_sharding(catalog):
    for method in ("fl+off", "fl+ac+off", "naive+off"):
        for gpn in (1, 4):
            reason = _reason(catalog, "pythia-1b", "a100", gpn=gpn, method=method)
            assert reason is not None and "offload needs a sharding method" in reason


def test_checkpointing_on_a_model_without_it(tmp_catalog):
    reason = _reason(tmp_catalog, "no-ac", "a100", method="fl+ac")
    assert reason is not None
    assert "no-ac does not support activation checkpointing" in reason
    assert tmp_catalog.models_path in reason
    assert _reason(tmp_catalog, "no-ac", "a100", method="fl") is None
    assert _reason(tmp_catalog, "tiny", "a100", method="fl+ac") is None


def test_local_launcher_with_several_nodes(catalog):
    reason = _reason(catalog, "pythia-1b", "a100", nodes=2, gpn=2, launcher="local")
    assert reason is not None
    assert "local launcher runs on one node" in reason and "slurm" in reason
    assert _reason(catalog, "pythia-1b", "a100", nodes=1, gpn=4, launcher="local") is None
    assert _reason(catalog, "pythia-1b", "a100", nodes=2, gpn=2, launcher="slurm") is None


def test_debug_launcher_with_several_ranks(catalog):
    reason = _reason(catalog, "tiny-bert", "cpu", gpn=2, launcher="debug")
    assert reason is not None and "debug launcher runs one rank" in reason
    reason = _reason(catalog, "tiny-bert", "cpu", nodes=2, gpn=1, launcher="debug")
    assert reason is not None and "debug" in reason
    assert _reason(catalog, "tiny-bert", "cpu", gpn=1, launcher="debug") is None


@pytest.mark.parametrize(
    ("model", "gpu", "nodes", "gpn", "method", "launcher"),
    [
        ("pythia-1b", "a100", 1, 4, "fl+zero1", "slurm"),
        ("pythia-1b", "h100", 1, 8, "fl+ac+zero3+off", "local"),
        ("pythia-1b", "a100", 1, 1, "fl+zero3+off", "local"),
        ("pythia-1b", "rtx3090", 1, 2, "naive", "local"),
        ("roberta-large", "v100", 2, 8, "fl+ac+fsdp-full", "slurm"),
        ("bert-24h", "a6000", 1, 8, "fl", "local"),
        ("vit-large-in21k", "a100", 1, 4, "fl+ac", "slurm"),
        ("tiny-gptneox", "cpu", 1, 2, "fl", "local"),
        ("tiny-bert", "cpu", 1, 1, "naive", "debug"),
    ],
)
def test_valid_cells_have_no_reason(catalog, model, gpu, nodes, gpn, method, launcher):
    assert _reason(catalog, model, gpu, nodes, gpn, method, launcher) is None


# ------------------------------------------------------------------------------------------ cells and paths


@pytest.mark.parametrize(
    "cell",
    [
        Cell("pythia-1b", "a100", 1, 4, "fl"),
        Cell("pythia-1.4b", "h100", 2, 8, "fl+ac+zero3+off"),
        Cell("tiny-gptneox", "cpu", 1, 1, "naive"),
        Cell("bert-24h", "rtx3090", 12, 16, "fl+fsdp-grad"),
    ],
)
def test_cell_path_round_trip(cell):
    assert cell.path == CELL_PATTERN.format(**cell.wildcards())
    assert Cell.from_path(cell.path) == cell
    assert Cell.from_path(f"/scratch/results/{cell.path}") == cell
    assert Cell.from_path(f"results/{cell.path}/") == cell
    assert Cell.from_wildcards(cell.wildcards()) == cell


def test_cell_path_layout():
    cell = Cell("pythia-1b", "h100", 2, 8, "fl+ac+zero3+off")
    assert cell.path == "cells/pythia-1b/h100/2x8/fl+ac+zero3+off"
    assert cell.world_size == 16
    assert cell.name == "pp-pythia-1b-h100-2x8-fl+ac+zero3+off"
    assert cell.wildcards() == {
        "model": "pythia-1b",
        "gpu": "h100",
        "nodes": "2",
        "gpus_per_node": "8",
        "method": "fl+ac+zero3+off",
    }


def test_wildcard_constraints_match_cell_paths():
    cell = Cell("pythia-1.4b", "h100", 2, 8, "fl+ac+fsdp-full+off")
    for key, value in cell.wildcards().items():
        assert re.fullmatch(WILDCARD_CONSTRAINTS[key], value), (key, value)
    assert not re.fullmatch(WILDCARD_CONSTRAINTS["nodes"], "2x8")
    assert not re.fullmatch(WILDCARD_CONSTRAINTS["gpu"], "a100/x")


def test_from_wildcards_dict_and_object():
    wc = {"model": "pythia-1b", "gpu": "a100", "nodes": "1", "gpus_per_node": "4", "method": "fl+ac"}
    expected = Cell("pythia-1b", "a100", 1, 4, "fl+ac")
    assert Cell.from_wildcards(wc) == expected
    # Snakemake passes a Wildcards object with attributes
    assert Cell.from_wildcards(SimpleNamespace(**wc)) == expected
    cell = Cell.from_wildcards(wc)
    assert isinstance(cell.nodes, int) and isinstance(cell.gpus_per_node, int)


def test_from_wildcards_rejects_non_canonical_method():
    wc = {"model": "pythia-1b", "gpu": "a100", "nodes": "1", "gpus_per_node": "4", "method": "fl+off+zero3"}
    with pytest.raises(ValueError, match="not canonical"):
        Cell.from_wildcards(wc)
    with pytest.raises(ValueError, match="not canonical"):
        Cell.from_path("cells/pythia-1b/a100/1x4/fl+off+zero3")


@pytest.mark.parametrize(
    "path",
    ["cells/pythia-1b/a100/1/fl", "cells/pythia-1b/a100/1x4", "runs/pythia-1b/a100/1x4/fl", "cells/a/b/1x4/fl/x"],
)
def test_from_path_rejects_other_paths(path):
    with pytest.raises(ValueError, match="not a cell path"):
        Cell.from_path(path)


def test_cells_sort_in_a_stable_order():
    cells = [Cell("b", "x", 1, 1, "fl"), Cell("a", "y", 2, 1, "fl"), Cell("a", "y", 1, 2, "fl")]
    assert sorted(cells) == [cells[2], cells[1], cells[0]]


# ------------------------------------------------------------------------------------------ expand


def test_expand_length_is_the_product(catalog):
    cfg = _config(
        models=["tiny-gptneox", "tiny-bert", "pythia-1b"],
        gpus=["cpu", "a100"],
        nodes=[1, 2],
        gpus_per_node=[1, 2, 4],
        methods=["naive", "fl", "fl+ac", "fl+zero3+off"],
    )
    planned = _expand(cfg, catalog, "test")
    assert len(planned) == 3 * 2 * 2 * 3 * 4
    assert all(isinstance(p, PlannedCell) for p in planned)
    assert len({p.cell for p in planned}) == len(planned)
    expected = [
        Cell(m, g, n, k, s)
        for m, g, n, k, s in itertools.product(
            cfg["sweep"]["models"], cfg["sweep"]["gpus"], [1, 2], [1, 2, 4], ["naive", "fl", "fl+ac", "fl+zero3+off"]
        )
    ]
    assert [p.cell for p in planned] == expected  # sweep order, method innermost
    assert _expand(cfg, catalog, "test") == planned  # stable


def test_expand_reasons_and_rows(catalog):
    cfg = _config(models=["pythia-1b"], gpus=["v100", "a100"], gpus_per_node=[1, 2], methods=["fl", "fl+zero1"])
    planned = {p.cell: p for p in _expand(cfg, catalog)}
    assert all(not p.valid for c, p in planned.items() if c.gpu == "v100")  # bf16
    assert planned[Cell("pythia-1b", "a100", 1, 1, "fl")].valid
    assert not planned[Cell("pythia-1b", "a100", 1, 1, "fl+zero1")].valid
    assert planned[Cell("pythia-1b", "a100", 1, 2, "fl+zero1")].valid
    p = planned[Cell("pythia-1b", "a100", 1, 2, "fl+zero1")]
    assert p.per_rank_batch == 512
    row = p.row()
    assert row == {
        "model": "pythia-1b",
        "gpu": "a100",
        "nodes": 1,
        "gpus_per_node": 2,
        "world_size": 2,
        "method": "fl+zero1",
        "valid": True,
        "reason": "",
        "per_rank_batch": 512,
        "path": "cells/pythia-1b/a100/1x2/fl+zero1",
    }
    bad = planned[Cell("pythia-1b", "v100", 1, 1, "fl")].row()
    assert bad["valid"] is False and "bf16" in bad["reason"]


def test_expand_canonicalises_and_deduplicates_methods(catalog):
    cfg = _config(models=["tiny-bert"], gpus=["cpu"], gpus_per_node=[2], methods=["fl+off+zero3", "fl+zero3+off"])
    planned = _expand(cfg, catalog)
    assert [p.cell.method for p in planned] == ["fl+zero3+off"]


def test_expand_uses_the_launcher(catalog):
    cfg = _config(models=["tiny-bert"], gpus=["cpu"], gpus_per_node=[1, 2], methods=["fl"], launcher="debug")
    valid = [p.valid for p in _expand(cfg, catalog)]
    assert valid == [True, False]


def test_default_config_sweep_is_all_valid(catalog):
    cfg = schema.validate(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), "config", "config.yaml")
    planned = _expand(cfg, catalog, "config.yaml")
    sweep = cfg["sweep"]  # 2 models x 1 GPU type x 1 node count x 2 GPU counts x 3 methods (naive, fl, fl+ac)
    assert (
        len(planned) == 2 * 1 * 1 * 2 * 3 == len(sweep["models"]) * len(sweep["gpus_per_node"]) * len(sweep["methods"])
    )
    assert all(p.valid for p in planned), [p.reason for p in planned if not p.valid]
    grid.check_plan(planned, "config.yaml")


# ------------------------------------------------------------------------------------------ check_sweep / check_plan


def test_check_sweep_unknown_model(catalog):
    cfg = _config(models=["tiny-bert", "gpt-5"], gpus=["cpu"])
    with pytest.raises(ConfigError) as info:
        grid.check_sweep(SweepSection.of(cfg["sweep"]), catalog, "config/my.yaml")
    msg = str(info.value)
    assert msg.startswith("config/my.yaml: sweep.models[1]:")
    assert "'gpt-5'" in msg and catalog.models_path in msg
    assert "tiny-bert" in msg  # lists the known ones


def test_check_sweep_unknown_gpu(catalog):
    cfg = _config(models=["tiny-bert"], gpus=["cpu", "a100", "mi300x"])
    with pytest.raises(ConfigError) as info:
        grid.check_sweep(SweepSection.of(cfg["sweep"]), catalog, "config/my.yaml")
    msg = str(info.value)
    assert "config/my.yaml" in msg
    assert "sweep.gpus[2]" in msg
    assert "'mi300x'" in msg
    assert catalog.gpus_path in msg and "gpus.yaml" in msg
    assert "h100" in msg
    with pytest.raises(ConfigError, match=r"sweep\.gpus\[2\]"):
        _expand(cfg, catalog, "config/my.yaml")


def test_check_sweep_bad_method(catalog):
    cfg = _config(models=["tiny-bert"], gpus=["cpu"], methods=["fl", "fl+bogus"])
    with pytest.raises(ConfigError, match=r"config/my\.yaml: sweep\.methods\[1\]"):
        grid.check_sweep(SweepSection.of(cfg["sweep"]), catalog, "config/my.yaml")


def test_check_sweep_accepts_known_names(catalog):
    cfg = _config(models=["pythia-1b", "tiny-bert"], gpus=["a100", "cpu"], methods=["fl+ac"])
    grid.check_sweep(SweepSection.of(cfg["sweep"]), catalog)


def test_check_plan_model_without_valid_cell(tmp_catalog):
    # batch-6: 6 samples on 4 or 8 GPUs never divide; tiny: 16 / 4 and 16 / 8 are fine
    cfg = _config(models=["tiny", "batch-6"], gpus=["a100"], gpus_per_node=[4, 8], methods=["fl"])
    planned = _expand(cfg, tmp_catalog)
    with pytest.raises(ConfigError) as info:
        grid.check_plan(planned, "config/my.yaml")
    msg = str(info.value)
    assert msg.startswith("config/my.yaml:")
    assert "'batch-6' has no valid cell" in msg
    assert "global_batch" in msg
    assert "'tiny'" not in msg


def test_check_plan_each_rule_can_empty_a_model(tmp_catalog):
    cfg = _config(models=["tiny", "batch-6"], gpus=["a100"], gpus_per_node=[2, 4], methods=["fl"])
    planned = _expand(cfg, tmp_catalog)
    assert [p.valid for p in planned] == [True, True, False, False]  # 6 / 2 = 3 is not a power of two
    with pytest.raises(ConfigError, match="batch-6"):
        grid.check_plan(planned)
    cfg = _config(models=["tiny", "batch-6"], gpus=["a100"], gpus_per_node=[1, 2], methods=["fl"])
    with pytest.raises(ConfigError, match="batch-6"):  # 6 / 1 = 6 is not a power of two either
        grid.check_plan(_expand(cfg, tmp_catalog))
    cfg = _config(models=["tiny", "batch-24"], gpus=["a100"], gpus_per_node=[1, 8], methods=["fl"])
    with pytest.raises(ConfigError, match="batch-24"):
        grid.check_plan(_expand(cfg, tmp_catalog))
    cfg = _config(models=["tiny", "no-ac"], gpus=["a100"], gpus_per_node=[1, 2], methods=["fl", "fl+ac"])
    grid.check_plan(_expand(cfg, tmp_catalog))  # no-ac has valid fl cells


# ------------------------------------------------------------------------------------------ extra method parts


@pytest.mark.parametrize("method", ["naive+flce", "naive+fa2", "naive+cstep", "naive+liger+ac"])
def test_extras_need_the_free_lunch_base(catalog, method):
    reason = _reason(catalog, "pythia-160m", "h100", method=method)
    assert reason and "free-lunch base" in reason and "use fl+" in reason


@pytest.mark.parametrize(
    ("model", "gpu", "method", "expected"),
    [
        ("mamba-2.8b", "h100", "fl+fa2", "has no attention layer"),
        ("convnext-xlarge-22k", "h100", "fl+fa2", "has no attention layer"),
        ("tiny-gptneox", "cpu", "fl+fa2", "CUDA GPUs only"),
        ("pythia-160m", "v100", "fl+fa2", "Ampere"),
        ("mamba-2.8b", "h100", "fl+liger", "no kernels for the mamba family"),
        ("tiny-gptneox", "cpu", "fl+liger", "CUDA GPUs only"),
        ("vit-large-in21k", "h100", "fl+flce", "no vocabulary head"),
        ("convnext-xlarge-22k", "h100", "fl+flce", "no vocabulary head"),
        ("tiny-gptneox", "cpu", "fl+cg", "need a CUDA GPU"),
    ],
)
def test_meaningless_extras(catalog, model, gpu, method, expected):
    reason = _reason(catalog, model, gpu, method=method, launcher="slurm")
    assert reason and expected in reason, reason


def test_fa2_needs_half_precision(tmp_catalog):
    reason = _reason(tmp_catalog, "tiny", "h100", method="fl+fa2")
    assert reason and "fp16/bf16 only" in reason and "fp32" in reason


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("fl+flce+zero3", "ZeRO-3"),
        ("fl+cstep+zero2", "owns the optimizer step"),
        ("fl+cstep+fsdp-grad+off", "offload"),
        ("fl+cg+fsdp-full", "collectives"),
    ],
)
def test_extras_with_sharding(catalog, method, expected):
    reason = _reason(catalog, "pythia-410m", "h100", nodes=1, gpn=8, method=method)
    assert reason and expected in reason, reason


def test_compile_parts_need_a_compilable_model(tmp_path):
    model = _tiny(precision="bf16")
    model["supports"] = {"compile": False}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": {"nc": model}}))
    cat = load_catalog(path, GPUS_YAML)
    for part in ("cstep", "cg"):
        reason = _reason(cat, "nc", "h100", method=f"fl+{part}")
        assert reason and "does not support torch.compile" in reason


@pytest.mark.parametrize(
    ("model", "gpu", "gpn", "method"),
    [
        ("pythia-160m", "h100", 1, "fl+fa2"),
        ("pythia-160m", "h100", 1, "fl+fa2+liger+flce+cstep"),
        ("pythia-410m", "h100", 8, "fl+flce+zero2"),
        ("pythia-410m", "h100", 8, "fl+fa2+cg+ac"),
        ("roberta-large", "a100", 1, "fl+flce+liger"),
        ("tiny-gptneox", "cpu", 1, "fl+flce+cstep"),
        ("tiny-bert", "cpu", 1, "fl+flce"),
        ("mamba-2.8b", "h100", 1, "fl+flce"),
    ],
)
def test_meaningful_extras_are_valid(catalog, model, gpu, gpn, method):
    assert _reason(catalog, model, gpu, gpn=gpn, method=method) is None


def test_family_tables_agree_with_the_trainer():
    """The torch-free family registry must say what transformers (and so trainer.models) builds: the classes
    exist and match, and `attention` is whether the model class takes an attention implementation."""
    import transformers as tf
    from pretrain_planner.planning.families import FAMILIES

    for name, fam in FAMILIES.items():
        cls, config = getattr(tf, fam.model_class), getattr(tf, fam.config_class)
        assert cls.config_class is config, name
        assert fam.attention is bool(getattr(cls, "_supports_sdpa", False)), name
        assert fam.task in ("causal_lm", "masked_lm", "image_classification"), name
    assert {n for n, f in FAMILIES.items() if f.liger} <= set(FAMILIES)


def test_the_batch_and_layout_rules_have_one_home(catalog, tmp_path):
    """A global batch that does not split over the ranks, and a sharding method on one GPU without offload, are
    judged by one rule each (planning/runspec: batch_split_reason, sharding_reason): the grid, the what-if, the
    loss check, the budget stage's config and the train stage's accumulation all give its words."""
    from pretrain_planner.budget import config as bconfig
    from pretrain_planner.planning.losscheck import plan_runs, settings
    from pretrain_planner.planning.methods import parse
    from pretrain_planner.planning.runspec import RunSpec, accumulation, batch_split_reason, sharding_reason
    from pretrain_planner.tables.predictor import Predictor

    from .conftest import budget_cfg
    from .test_whatif import cells

    rule = batch_split_reason(16, 3)  # tiny-gptneox's global batch 16 over 3 ranks
    assert rule == "global batch 16 is not divisible by 3 GPUs"
    assert rule in _reason(catalog, "tiny-gptneox", "cpu", gpn=3)
    measured = Predictor(cells({"a100": 0.45}), catalog, public=None)
    assert measured.predict("tiny-gptneox", "a100", 1, 3).why == rule
    conf = settings({"mode": "all", "global_batch": 16, "seeds": 1, "steps": 2})
    assert plan_runs({}, conf, catalog.model("tiny-gptneox").to_dict(), {}, 3, 1, False)[1] == f"the check's {rule}"
    with pytest.raises(ValueError, match=rule):
        accumulation(16, 1, 3)  # the train stage's and the budget sweep's accumulation
    path = budget_cfg(tmp_path, load=False, model="tiny-bert",
                      train={"gpus_per_node": 3, "setting": "config", "micro_batch": 4})  # fmt: skip
    with pytest.raises(ConfigError, match="is not divisible by 3 GPUs"):
        bconfig.load(path, results=tmp_path / "results")
    # a sharding method on one GPU: the study's rule (sharding_reason), asked by the grid and the what-if's fit
    # check; the method itself runs there (RunSpec.reason: the GPU check exercises FSDP and ZeRO on one GPU)
    shards = sharding_reason(parse("naive+zero2"), 1)
    assert shards == "zero2 shards across GPUs: needs more than 1 GPU (or offload)"
    assert RunSpec(catalog.model("tiny-gptneox"), catalog.gpu("a100"), parse("naive+zero2"), 1).reason() is None
    assert _reason(catalog, "tiny-gptneox", "a100", method="naive+zero2") == shards
    assert measured._fits("tiny-gptneox", "naive+zero2", "a100", 1) == (False, shards)

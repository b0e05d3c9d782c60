"""Which attention kernel ran (profiled, per cell), and kernel parts that cannot run here (`unsupported`)."""

from __future__ import annotations

import json

import pytest
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.trainer import kernels

from .conftest import GPUS_YAML, MODELS_YAML, sections

SDPA_FLASH = "aten::_scaled_dot_product_flash_attention"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(MODELS_YAML, GPUS_YAML)


def _run(catalog, tmp_path, model: str, method: str, compile_: bool | None = False, precision: str | None = None):
    """One tiny cell through the trainer's entry point (world size 1, CPU); its result.json."""
    from pretrain_planner.trainer.run import run_rank

    config = {
        "benchmark": {"warmup_steps": 0, "timed_steps": 1, "max_micro_batch": 2, "seed": 0},
        "launcher": {"kind": "debug", "timeout_min": 5},
    }
    spec = cell_spec(
        Cell(model, "cpu", 1, 1, method),
        catalog,
        *sections(config),
        str(tmp_path / "r.json"),
        str(tmp_path / "s.jsonl"),
    )
    spec["model"]["recipe"]["global_batch"] = 2
    if compile_ is not None:
        spec["model"]["supports_compile"] = compile_  # SDPA without a CPU compile (~40 s)
    if precision:
        spec["model"]["recipe"]["precision"] = precision
    run_rank(spec)
    return json.loads((tmp_path / "r.json").read_text())


@pytest.mark.parametrize(
    ("names", "kernel"),
    [
        ({"aten::bmm", "aten::softmax", "aten::_softmax", "aten::matmul"}, kernels.EAGER),
        ({"aten::scaled_dot_product_attention", f"{SDPA_FLASH}_for_cpu"}, "sdpa:flash (CPU)"),
        ({SDPA_FLASH, f"{SDPA_FLASH}_backward"}, "sdpa:flash"),
        ({"aten::_scaled_dot_product_efficient_attention"}, "sdpa:efficient"),
        ({"aten::_scaled_dot_product_cudnn_attention"}, "sdpa:cudnn"),
        ({"aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::softmax"}, "sdpa:math"),
        ({"flash_attn::_flash_attn_forward", "aten::bmm"}, "flash-attn (flash_attn package)"),
        ({"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>"}, "sdpa:flash"),
        ({"void flash::flash_fwd_kernel<Flash_fwd_kernel_traits>"}, "flash-attn (flash_attn package)"),
        ({"aten::_log_softmax", "aten::bmm", "aten::mm"}, None),  # a loss's log_softmax is not attention
    ],
)
def test_kernel_from_ops(names, kernel):
    assert kernels.kernel_from_ops(names)[0] == kernel


@pytest.mark.slow  # a training run (one cell through run_rank)
@pytest.mark.parametrize(
    ("model", "method", "attn", "kernel"),
    [
        ("tiny-gptneox", "naive", "eager", kernels.EAGER),
        ("tiny-gptneox", "fl", "sdpa", "sdpa:flash (CPU)"),
        ("tiny-bert", "naive", "eager", kernels.EAGER),
    ],
)
def test_attention_kernel_recorded_per_cell(catalog, tmp_path, model, method, attn, kernel):
    result = _run(catalog, tmp_path, model, method)
    assert result["status"] == "ok", result.get("reason")
    s = result["method_settings"]
    assert s["attn_implementation"] == attn
    assert s["attention_kernel"] == kernel
    assert s["attention"]["attention_ops"], s["attention"]


@pytest.mark.slow  # a training run (one cell through run_rank)
def test_no_attention_no_kernel(catalog, tmp_path):
    result = _run(catalog, tmp_path, "tiny-convnext", "naive")
    assert result["status"] == "ok", result.get("reason")
    assert result["method_settings"]["attention_kernel"] is None


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("fl+fa2", "fa2: flash-attn runs on CUDA GPUs only"),
        ("fl+liger", "liger: Liger's Triton kernels run on CUDA GPUs only"),
        ("fl+cg", "cg: CUDA graphs need a CUDA GPU"),
        ("fl+fa2+flce", "fa2: flash-attn runs on CUDA GPUs only"),
        # forced past the grid (which rules them out): the trainer says why too, with the grid's own rule
        (
            "fl+flce+zero3",
            "flce: ZeRO-3 gathers a layer's weights only inside that layer's forward; the fused head "
            "reads them directly",
        ),
        ("fl+cstep+zero1", "cstep: DeepSpeed's engine owns the optimizer step; it cannot be compiled with the model"),
    ],
)
def test_gpu_only_parts_are_unsupported_on_cpu(catalog, tmp_path, method, reason):
    result = _run(catalog, tmp_path, "tiny-gptneox", method, compile_=None)  # refused before anything compiles
    assert (result["status"], result["reason"]) == ("unsupported", reason)
    assert result["method"] == method


def test_fp16_on_cpu_is_unsupported(catalog, tmp_path):
    result = _run(catalog, tmp_path, "tiny-gptneox", "fl+flce", precision="fp16")
    assert result["status"] == "unsupported" and "fp16" in result["reason"]


def test_missing_packages_are_unsupported(monkeypatch):
    """On a GPU without flash-attn / liger-kernel the reason names the package (not an ImportError crash)."""
    import torch
    from pretrain_planner.planning.methods import parse
    from pretrain_planner.trainer.rank import Unsupported

    monkeypatch.setattr(kernels, "import_error", lambda module: f"ModuleNotFoundError: No module named {module!r}")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for slug, package in (("fl+fa2", "flash-attn"), ("fl+liger", "liger-kernel")):
        with pytest.raises(Unsupported, match=f"pip install {package}"):
            kernels.check_supported(parse(slug), torch.device("cuda", 0))

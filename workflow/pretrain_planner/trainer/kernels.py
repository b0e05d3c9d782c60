"""Optional kernels (flash-attn 2, Liger) and the evidence of which attention kernel really ran.

A method can ask for a kernel that cannot run where the cell runs (flash-attn not installed, an older GPU):
`check_supported` raises `Unsupported` with the reason before anything is built, so the cell's result says so
instead of crashing or being retried.

Which attention kernel ran is not what `attn_implementation` says: SDPA picks flash, memory-efficient,
cuDNN or math at run time (dtype, head size, mask, GPU). `attention_kernel` profiles one micro-batch and
names the kernel from the aten / flash-attn ops that appeared.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from pretrain_planner.trainer.rank import Unsupported
from pretrain_planner.versions import installed_version

# op name (substring of the profiler event) -> kernel, most specific first
ATTENTION_OPS = (
    ("flash_attn", "flash-attn (flash_attn package)"),  # flash_attn::_flash_attn_forward / FlashAttnFunc
    ("_scaled_dot_product_flash_attention_for_cpu", "sdpa:flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "sdpa:flash"),
    ("_scaled_dot_product_efficient_attention", "sdpa:efficient"),
    ("_scaled_dot_product_cudnn_attention", "sdpa:cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "sdpa:fused (backend override)"),
    ("_scaled_dot_product_attention_math", "sdpa:math"),
    # CUDA kernel names (what a CUDA-graph replay shows instead of aten ops)
    ("pytorch_flash::flash_fwd", "sdpa:flash"),
    ("flash::flash_fwd", "flash-attn (flash_attn package)"),
    ("fmha_cutlass", "sdpa:efficient"),
    ("cudnn_generated_fort_native_sdpa", "sdpa:cudnn"),
)
EAGER = "eager (matmul + softmax)"


def import_error(module: str) -> str | None:
    """None if `module` imports, else why not (a broken CUDA extension can raise anything)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def check_supported(method: Any, device: torch.device) -> None:
    """Raise Unsupported if a kernel part of `method` cannot run on this CUDA device: fa2 or liger whose package
    does not import, fa2 on a device older than Ampere. That they need CUDA at all is the method's own rule
    (planning/runspec.py RunSpec.reason, checked first)."""
    if device.type != "cuda":
        return
    if method.flash_attn:
        error = import_error("flash_attn")
        if error:
            raise Unsupported(f"fa2: the flash-attn package does not import ({error}); `pip install flash-attn`")
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            raise Unsupported(
                f"fa2: flash-attn 2 needs compute capability >= 8.0, {torch.cuda.get_device_name(device)}"
            )
    if method.liger:
        error = import_error("liger_kernel.transformers")
        if error:
            raise Unsupported(f"liger: the liger-kernel package does not import ({error}); `pip install liger-kernel`")


def fused_ce_impl(method: Any, device: torch.device) -> str | None:
    """Which fused linear + cross-entropy head `flce` uses here: Liger's on CUDA when it imports, else ours."""
    if not method.fused_ce:
        return None
    if device.type == "cuda" and import_error("liger_kernel.transformers") is None:
        return "liger"
    return "chunked"


def apply_liger(net: torch.nn.Module) -> dict[str, Any]:
    """Liger kernels on `net`, in place: the model type's own patch where Liger has one (Llama-like models),
    else every nn.LayerNorm becomes a LigerLayerNorm with the same weights. Returns what was done."""
    from liger_kernel.transformers import LigerLayerNorm

    model_type = getattr(getattr(net, "config", None), "model_type", None)
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        MODEL_TYPE_TO_APPLY_LIGER_FN = {}  # noqa: N806 - the library's name
    info: dict[str, Any] = {"version": installed_version("liger-kernel"), "model_type": model_type}
    fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if fn is not None:
        fn(model=net)
        info["applied"] = f"{fn.__name__}(model=...)"
        return info
    swapped = 0
    for parent in list(net.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.LayerNorm and child.elementwise_affine and len(child.normalized_shape) == 1:
                new = LigerLayerNorm(child.normalized_shape[0], eps=child.eps, bias=child.bias is not None)
                new.to(device=child.weight.device, dtype=child.weight.dtype)
                with torch.no_grad():
                    new.weight.copy_(child.weight)
                    if child.bias is not None:
                        new.bias.copy_(child.bias)
                setattr(parent, name, new)
                swapped += 1
    if not swapped:
        raise Unsupported(f"liger: no Liger kernel applies to {type(net).__name__} (no patch, no nn.LayerNorm)")
    info["applied"] = f"nn.LayerNorm -> LigerLayerNorm x {swapped}"
    return info


def kernel_from_ops(names: set[str]) -> tuple[str | None, list[str]]:
    """The attention kernel named by a set of profiled op names, and the matching ops."""
    matched = sorted(n for n in names if any(key in n for key, _ in ATTENTION_OPS))
    for key, kernel in ATTENTION_OPS:
        if any(key in n for n in matched):
            return kernel, matched
    if any("softmax" in n and "log_softmax" not in n for n in names) and any(
        n.endswith(("::matmul", "::bmm", "::baddbmm")) for n in names
    ):
        return EAGER, sorted(n for n in names if n.endswith(("::bmm", "::baddbmm", "::_softmax", "::softmax")))
    return None, matched


def profiled_names(run_micro) -> dict[str, int]:
    """Profile `run_micro()` (one forward + backward): every event name and how often it occurred."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        run_micro()
    counts: dict[str, int] = {}
    for e in prof.events():
        counts[e.name] = counts.get(e.name, 0) + 1
    return counts


COMPILED_REGION = "Torch-Compiled Region"  # the profiler's event for each entry into a dynamo-compiled frame


def compile_observed(counts: dict[str, int]) -> dict[str, Any]:
    """What compilation actually covered in one micro-batch: how often a compiled frame was entered and how many
    distinct compiled graphs ran. One whole-model graph enters once per forward; a model whose compiled forward
    breaks (ZeRO-3's dynamo-disabled parameter hooks at every submodule) enters many small ones, the rest eager."""
    regions = {n: c for n, c in counts.items() if n.startswith(COMPILED_REGION)}
    return {
        "compiled_region_entries": sum(regions.values()),
        "compiled_graphs": len(regions),
        "how": "torch.profiler over one micro-batch: 'Torch-Compiled Region' events",
    }


def attention_kernel(run_micro) -> dict[str, Any]:
    """Profile `run_micro()` (one forward + backward) and say which attention kernel ran (and, from the same
    profile, what compilation covered: `compile_observed`)."""
    counts = profiled_names(run_micro)
    kernel, ops = kernel_from_ops(set(counts))
    return {
        "attention_kernel": kernel,
        "attention_ops": ops,
        "how": "torch.profiler over one micro-batch",
        "compile_observed": compile_observed(counts),
    }

"""Build each family's transformers model from config values (never from the hub); its batches are its task's
(trainer/tasks.py).

A family's facts (its transformers classes, task, attention) are in planning/families.py; a family whose
plain transformers class needs more (ConvNeXt's checkpointing, sparse prediction) gets it here.

Two additions on top of the plain transformers classes, both selected by config values:

* `sparse_prediction: true` in a masked-LM model's `arch` (the 24-hour BERT recipe, docs/budget.md): the LM
  head and the loss run only on the masked positions (labels != -100), not on every token. The module
  keeps the interface the trainer uses, `module(**batch).loss`, and every PreTrainedModel method.
* ConvNeXt gets activation checkpointing, which transformers does not implement for it, as the "$100K" study
  added it (its src/models/convnext.py `ConvNextEncoderWithCheckpointing`): one checkpoint per *stage* (its
  downsampling and all its blocks), and FSDP units per stage too (the study's `fsdp_layers_to_wrap`:
  `ConvNextStage`), not per block.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any

import torch
import transformers as tf

from pretrain_planner.planning.families import FAMILIES, names
from pretrain_planner.versions import installed_version

# arch keys read by this module, not passed to the transformers config class
BUILDER_KEYS = ("sparse_prediction",)


class SparsePredictionMixin:
    """Masked-LM forward with sparse prediction: the encoder runs on every position, the LM head and the
    cross-entropy only on the masked ones (labels != -100), as in the 24-hour BERT recipe. The loss equals
    the dense head's (a mean over the same positions); only the masked rows' logits are returned."""

    def _mlm_head(self) -> torch.nn.Module:
        head = getattr(self, "lm_head", None)  # RoBERTa families
        return head if head is not None else self.cls  # BERT

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import MaskedLMOutput

        if labels is None:  # nothing is masked: inference needs every position's logits
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = self.base_model(input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)[0]
        flat_labels = labels.reshape(-1).to(hidden.device)
        rows = torch.nonzero(flat_labels != -100).squeeze(1)  # data-dependent size: the point of it
        masked_hidden = hidden.reshape(-1, hidden.size(-1)).index_select(0, rows)
        logits = self._mlm_head()(masked_hidden)
        loss = torch.nn.functional.cross_entropy(logits, flat_labels.index_select(0, rows))
        return MaskedLMOutput(loss=loss, logits=logits)


@functools.cache
def sparse_prediction_class(model_cls: type) -> type:
    """`model_cls` (a transformers *ForMaskedLM class) with sparse prediction; one class per base class."""
    return type(f"{model_cls.__name__}WithSparsePrediction", (SparsePredictionMixin, model_cls), {})


# The study's FSDP unit of ConvNeXt (src/models/convnext.py fsdp_layers_to_wrap): a stage, not a block
CONVNEXT_UNITS = ["ConvNextStage"]


@functools.cache
def _checkpointable_convnext() -> tuple[type, type]:
    """(the original ConvNeXt stage class, a subclass whose forward transformers can checkpoint)."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.models.convnext.modeling_convnext import ConvNextStage

    class CheckpointableConvNextStage(GradientCheckpointingLayer, ConvNextStage):
        """A ConvNeXt stage that `activation_checkpointing_enable()` recomputes in backward, whole: its
        downsampling and every block, as the study's `checkpoint(stage.__call__, ...)`."""

    return ConvNextStage, CheckpointableConvNextStage


def _convnext_per_stage(net: torch.nn.Module) -> None:
    """Let transformers' activation_checkpointing_enable() work on a ConvNeXt (it has no support of its own), once
    per stage as in the study: every stage becomes a GradientCheckpointingLayer (same parameters, same forward, off
    until enabled); and the repeated blocks `blocks()` gives FSDP are the stages alone (the study's units)."""
    plain, checkpointable = _checkpointable_convnext()
    for module in net.modules():
        if type(module) is plain:
            module.__class__ = checkpointable
    net.supports_gradient_checkpointing = True
    net._no_split_modules = list(CONVNEXT_UNITS)


def model_class(model: dict[str, Any], fused_ce: bool = False) -> type:
    """The transformers class `build_model` instantiates for `model` (a ModelSpec.to_dict()); with
    `fused_ce`, its loss comes from the fused linear + cross-entropy head (trainer.heads, method part flce)."""
    family, arch = model["family"], model["arch"]
    fam = FAMILIES[family]
    cls = getattr(tf, fam.model_class)
    sparse = bool(arch.get("sparse_prediction"))
    if sparse and not fam.masked_lm:
        raise ValueError(
            f"model {model.get('name', '?')!r}: arch.sparse_prediction is for masked-LM families "
            f"({', '.join(names(lambda f: f.masked_lm))}), not {family!r}"
        )
    if fused_ce:
        from pretrain_planner.trainer.heads import fused_head_class

        if not fam.vocab_head:
            raise ValueError(f"model {model.get('name', '?')!r}: flce needs a vocabulary head ({family!r} has none)")
        return fused_head_class(cls, fam.masked_lm, sparse)
    if sparse:
        cls = sparse_prediction_class(cls)
    return cls


def build_model(
    model: dict[str, Any], attn_implementation: str | None, fused_ce: bool = False
) -> tuple[torch.nn.Module, str | None]:
    """The model with fresh weights, and the attention implementation it actually uses (None: no attention).

    Works under `with torch.device("meta"):` (shapes and parameter counts without memory)."""
    fam = FAMILIES[model["family"]]
    has_attention = fam.attention
    arch = {k: v for k, v in model["arch"].items() if k not in BUILDER_KEYS}
    config = getattr(tf, fam.config_class)(**arch)
    kwargs = {"attn_implementation": attn_implementation} if has_attention and attn_implementation else {}
    net = model_class(model, fused_ce)._from_config(config, **kwargs)
    if model["family"] == "convnext":
        _convnext_per_stage(net)
    used = getattr(net.config, "_attn_implementation", None) if has_attention else None
    return net, used


# Fast kernels transformers uses for Mamba when they import (else its slow pure-PyTorch scan): distribution -> module
_MAMBA_KERNELS = {"mamba-ssm": "mamba_ssm", "causal-conv1d": "causal_conv1d"}


def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken CUDA extension can raise anything
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def kernel_info(model: dict[str, Any]) -> dict[str, Any]:
    """The custom kernels the model's training path uses, for method_settings; empty if none apply.

    Mamba: the versions of mamba-ssm and causal-conv1d (None: not installed), why one does not import, and
    whether transformers' fused training path (`mamba_inner_fn`, CUDA only) or its slow PyTorch scan runs."""
    if model["family"] != "mamba":
        return {}
    info: dict[str, Any] = {}
    for dist, module in _MAMBA_KERNELS.items():
        version = installed_version(dist)
        info[f"{module}_version"] = version
        error = _import_error(module) if version else "not installed"
        if error:
            info[f"{module}_error"] = error
    fast = all(f"{m}_error" not in info for m in _MAMBA_KERNELS.values())
    info["mamba_fast_kernels"] = fast
    info["mamba_path"] = (
        "fused mamba-ssm + causal-conv1d kernels (CUDA)"
        if fast
        else "transformers' PyTorch reference scan (slow): install mamba-ssm and causal-conv1d for the fast path"
    )
    return info


def blocks(net: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's repeated blocks, children before parents: modules whose class is in transformers'
    `_no_split_modules` (the units it never splits across devices), and its checkpointing layers."""
    names = set(getattr(net, "_no_split_modules", None) or ())
    gc_layer = None
    with contextlib.suppress(ImportError):
        from transformers.modeling_layers import GradientCheckpointingLayer as gc_layer
    found = [
        (name, mod)
        for name, mod in net.named_modules()
        if mod is not net and (type(mod).__name__ in names or (gc_layer is not None and isinstance(mod, gc_layer)))
    ]
    # named_modules() is pre-order; reverse depth so inner blocks are wrapped before the blocks holding them
    return sorted(found, key=lambda nm: -nm[0].count("."))

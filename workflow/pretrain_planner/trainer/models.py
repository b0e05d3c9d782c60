"""Build each family's transformers model from config values (never from the hub) and its batches.

Adding a family = one builder here + its name in catalog.FAMILY_TASK and the models schema.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as tf

# family -> (config class, model class, has attention that takes attn_implementation)
_FAMILIES = {
    "gptneox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", True),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", True),
    "roberta-prelayernorm": ("RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM", True),
    "bert": ("BertConfig", "BertForMaskedLM", True),
    "mamba": ("MambaConfig", "MambaForCausalLM", False),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", False),
    "vit": ("ViTConfig", "ViTForImageClassification", True),
}


def build_model(model: dict[str, Any], attn_implementation: str | None) -> tuple[torch.nn.Module, str | None]:
    """The model with fresh weights, and the attention implementation it actually uses (None: no attention)."""
    config_cls, model_cls, has_attention = _FAMILIES[model["family"]]
    config = getattr(tf, config_cls)(**model["arch"])
    kwargs = {"attn_implementation": attn_implementation} if has_attention and attn_implementation else {}
    net = getattr(tf, model_cls)._from_config(config, **kwargs)
    used = getattr(net.config, "_attn_implementation", None) if has_attention else None
    return net, used


def make_batch(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A synthetic micro-batch with the model's real shapes (CPU tensors; the caller moves them)."""
    arch, recipe, task = model["arch"], model["recipe"], model["task"]
    if task == "image_classification":
        size = recipe["image_size"]
        return {
            "pixel_values": torch.randn(micro_batch, 3, size, size, generator=generator),
            "labels": torch.randint(0, arch.get("num_labels", 2), (micro_batch,), generator=generator),
        }
    vocab, seq = arch["vocab_size"], recipe["sequence_length"]
    ids = torch.randint(0, vocab, (micro_batch, seq), generator=generator)
    if task == "causal_lm":
        return {"input_ids": ids, "labels": ids.clone()}
    # masked LM: mask `mlm_probability` of the positions, predict only those (-100 elsewhere)
    masked = torch.rand(micro_batch, seq, generator=generator) < recipe.get("mlm_probability", 0.15)
    masked[:, 0] |= ~masked.any(dim=1)  # at least one target per sequence
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = torch.where(masked, torch.full_like(ids, vocab - 1), ids)
    return {"input_ids": inputs, "labels": labels}

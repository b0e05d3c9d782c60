"""Training FLOPs per sample: the one declared formula behind MFU and the analytic estimate.

Transformers (Kaplan et al. / the PaLM appendix, as data/evidence/sources.md here-h200 uses it): a token costs
6 x (matmul parameters it passes through, LM head included, input embedding excluded) for forward +
backward, plus 12 x layers x hidden x context for attention scores and values. Causal attention is counted
in full, deliberately (issue 14): the PaLM appendix, Megatron and torch.utils.flop_counter count it so, and
MFU must compare with their figures; a causal flash kernel skips about half of it, so at long contexts MFU
overstates the arithmetic done by up to half the attention share. Norms, biases and activations are ignored
(< 2% for real sizes). With sparse prediction (24-hour BERT) the LM head counts for the masked share
of the tokens only.

ConvNeXt (issue 17) has its closed form too: per block a 7x7 depthwise convolution (49 x C multiply-adds per pixel)
and two pointwise layers (8 x C^2), the 2x2 downsamplings, the 4x4 stem (forward and weight gradient only: its input
is the image) and the classifier. torch's FlopCounterMode, which counted it before, ignores `groups` in the
convolution's backward: every depthwise weight gradient counted once per channel, ConvNeXt-XL at ~1.09e12 FLOPs per
sample against ~3.66e11 (2.98x), and the MFU inflated by as much. Every family now has a formula, so every count is
model FLOPs only: activation checkpointing's recomputed forward (which the counter also counted, +10.9% for
ConvNeXt) is never model FLOPs. A family with no formula would return None (the trainer's counter then).
Imports no torch.
"""

from __future__ import annotations

from typing import Any

from pretrain_planner.planning.families import FAMILIES


def _transformer_block(arch: dict[str, Any]) -> int:
    """Matmul parameters of one transformer block: q, k, v, o and the two MLP matrices."""
    h = arch["hidden_size"]
    return 4 * h * h + 2 * h * arch.get("intermediate_size", 4 * h)


def _mamba_block(arch: dict[str, Any]) -> int:
    """Matmul parameters of one Mamba block: in_proj (h -> 2*e*h), out_proj (e*h -> h), x_proj and dt_proj; the
    scan is linear in length and small next to them."""
    h, e = arch["hidden_size"], arch.get("expand", 2)
    d_inner, n = e * h, arch.get("state_size", 16)
    dt_rank = -(-h // 16)
    return h * 2 * d_inner + d_inner * h + d_inner * (dt_rank + 2 * n) + dt_rank * d_inner


def _convnext_macs(arch: dict[str, Any], image: int) -> tuple[float, float, float]:
    """(multiply-adds of one forward without the stem, those of the stem, parameters): ConvNeXt's stages at sides
    image/4, /8, /16, /32. Norms, layer scale and activations are left out (< 1%)."""
    widths, depths = arch.get("hidden_sizes", [96, 192, 384, 768]), arch.get("depths", [3, 3, 9, 3])
    patch = arch.get("patch_size", 4)
    side = image // patch
    stem_params = arch.get("num_channels", 3) * widths[0] * patch * patch
    macs, params = 0.0, float(stem_params + widths[-1] * arch.get("num_labels", 2))
    for i, (c, d) in enumerate(zip(widths, depths, strict=True)):
        if i:
            side //= 2
            params += widths[i - 1] * c * 4
            macs += widths[i - 1] * c * 4 * side * side
        block = 49 * c + 8 * c * c  # depthwise 7x7, then C -> 4C -> C
        params += d * block
        macs += d * block * side * side
    return macs + widths[-1] * arch.get("num_labels", 2), float(stem_params * (image // patch) ** 2), params


def _patches(arch: dict[str, Any]) -> int:
    return (arch["image_size"] // arch["patch_size"]) ** 2


def tokens_per_sample(model: dict[str, Any]) -> int | None:
    """Tokens one sample puts through the model: its sequence, or a ViT's patches and class token; None for a
    family without tokens (ConvNeXt)."""
    formula = FAMILIES[model["family"]].formula
    if formula == "vit":
        return _patches(model["arch"]) + 1
    return model["recipe"].get("sequence_length") if FAMILIES[model["family"]].is_text else None


def param_count(model: dict[str, Any]) -> float | None:
    """Parameters of a model (a ModelSpec.to_dict()) from its arch by its family's formula (families.py); None
    for a family without one. Biases and norms are left out (< 1% for real sizes)."""
    formula, a = FAMILIES[model["family"]].formula, model["arch"]
    if formula == "mamba":
        return float(a["num_hidden_layers"] * _mamba_block(a) + a["vocab_size"] * a["hidden_size"])
    if formula == "vit":
        embed = _patches(a) * a["hidden_size"] + a["hidden_size"] * a.get("num_labels", 2)
        return float(a["num_hidden_layers"] * _transformer_block(a) + embed)
    if formula == "transformer":
        tied = a.get("tie_word_embeddings", model["family"] != "gptneox")
        embed = a["vocab_size"] * a["hidden_size"] * (1 if tied else 2)
        return float(a["num_hidden_layers"] * _transformer_block(a) + embed)
    if formula == "convnext":
        return _convnext_macs(a, model["recipe"]["image_size"])[2]
    return None


def train_flops_per_sample(model: dict[str, Any]) -> float | None:
    """FLOPs of forward + backward for one sample of `model` (a ModelSpec.to_dict())."""
    formula, arch, recipe = FAMILIES[model["family"]].formula, model["arch"], model["recipe"]
    if formula in ("transformer", "vit"):
        layers, h = arch["num_hidden_layers"], arch["hidden_size"]
        if formula == "vit":
            tokens = _patches(arch) + 1
            head = h * arch.get("num_labels", 2) / tokens  # the classifier runs once per image
        else:
            tokens = recipe["sequence_length"]
            head = h * arch["vocab_size"]
            if arch.get("sparse_prediction"):  # the LM head runs on the masked positions only
                head *= recipe.get("mlm_probability", 0.15)
        per_token = 6 * (layers * _transformer_block(arch) + head) + 12 * layers * h * tokens
        return float(per_token * tokens)
    if formula == "mamba":
        per_token = 6 * (arch["num_hidden_layers"] * _mamba_block(arch) + arch["hidden_size"] * arch["vocab_size"])
        return float(per_token * recipe["sequence_length"])
    if formula == "convnext":  # forward 2 x MACs, backward 4 x; the stem has no input gradient (2 + 2)
        body, stem, _ = _convnext_macs(arch, recipe["image_size"])
        return 6 * body + 4 * stem
    return None


def mfu(flops_per_step: float | None, step_time_s: float | None, world_size: int, peak_tflops: float | None):
    """Model FLOPs utilisation against the dense peak of all GPUs of the cell; None when unknown."""
    if not flops_per_step or not step_time_s or not peak_tflops:
        return None
    return flops_per_step / (step_time_s * world_size * peak_tflops * 1e12)


def suspect(util: float | None, limit: float) -> tuple[bool, str | None]:
    """Whether an implied MFU is physically implausible (above `limit`, benchmark.suspect_mfu), and why: the check
    every cell's timing gets, and the study's published numbers too (tables/study.py)."""
    if util is None or util <= limit:
        return False, None
    return True, f"implied MFU {util:.1%} exceeds {limit:.0%} of the dense peak: the timing cannot be right"

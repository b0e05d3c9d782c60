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
ConvNeXt) is never model FLOPs. A family with no formula would return None (the trainer's counter then). The
closed forms themselves are each family's formula object (formulas.py); this module asks them. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from pretrain_planner.planning.families import FAMILIES


def tokens_per_sample(model: dict[str, Any]) -> int | None:
    """Tokens one sample puts through the model (a ModelSpec.to_dict()): its sequence, or a ViT's patches and class
    token, by its family's formula; None for a family without tokens (ConvNeXt)."""
    fam = FAMILIES[model["family"]]
    if fam.closed_form is not None:
        return fam.closed_form.tokens(model)
    return model["recipe"].get("sequence_length") if fam.is_text else None


def param_count(model: dict[str, Any]) -> float | None:
    """Parameters of a model (a ModelSpec.to_dict()) from its arch by its family's formula (families.py,
    formulas.py); None for a family without one. The study's families leave biases and norms out (< 1% for real
    sizes); the Llama-style decoders count them, exactly the built model's."""
    form = FAMILIES[model["family"]].closed_form
    return None if form is None else form.params(model)


def train_flops_per_sample(model: dict[str, Any]) -> float | None:
    """FLOPs of forward + backward for one sample of `model` (a ModelSpec.to_dict()) by its family's formula."""
    form = FAMILIES[model["family"]].closed_form
    return None if form is None else form.train_flops(model)


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

"""Training FLOPs per sample: the one declared formula behind MFU and the analytic estimate.

Transformers (Kaplan et al. / the PaLM appendix, as in reference/measurements.md): a token costs
6 x (matmul parameters it passes through, LM head included, input embedding excluded) for forward +
backward, plus 12 x layers x hidden x context for attention scores and values. Causal attention is counted
in full, deliberately (issue 14): the PaLM appendix, Megatron and torch.utils.flop_counter count it so, and
MFU must compare with their figures; a causal flash kernel skips about half of it, so at long contexts MFU
overstates the arithmetic done by up to half the attention share. Norms, biases and activations are ignored
(< 2% for real sizes). With sparse prediction (24-hour BERT) the LM head counts for the masked share
of the tokens only. Families with no formula here (ConvNeXt) return None; the trainer then counts
the FLOPs of one step with torch.utils.flop_counter. Imports no torch.
"""

from __future__ import annotations

from typing import Any

TRANSFORMER_FAMILIES = {"gptneox", "roberta", "roberta-prelayernorm", "bert", "vit"}


def _block_matmul_params(arch: dict[str, Any]) -> int:
    h = arch["hidden_size"]
    inter = arch.get("intermediate_size", 4 * h)
    return 4 * h * h + 2 * h * inter  # q, k, v, o + the two MLP matrices


def train_flops_per_sample(model: dict[str, Any]) -> float | None:
    """FLOPs of forward + backward for one sample of `model` (a ModelSpec.to_dict())."""
    family, arch, recipe = model["family"], model["arch"], model["recipe"]
    if family in TRANSFORMER_FAMILIES:
        layers, h = arch["num_hidden_layers"], arch["hidden_size"]
        if family == "vit":
            tokens = (arch["image_size"] // arch["patch_size"]) ** 2 + 1
            head = h * arch.get("num_labels", 2) / tokens  # the classifier runs once per image
        else:
            tokens = recipe["sequence_length"]
            head = h * arch["vocab_size"]
            if arch.get("sparse_prediction"):  # the LM head runs on the masked positions only
                head *= recipe.get("mlm_probability", 0.15)
        per_token = 6 * (layers * _block_matmul_params(arch) + head) + 12 * layers * h * tokens
        return float(per_token * tokens)
    if family == "mamba":
        # in_proj (h -> 2*e*h), out_proj (e*h -> h), x_proj and dt_proj are the matmuls; the scan is
        # linear in length and small next to them.
        h, layers, e = arch["hidden_size"], arch["num_hidden_layers"], arch.get("expand", 2)
        d_inner, n = e * h, arch.get("state_size", 16)
        dt_rank = -(-h // 16)
        per_layer = h * 2 * d_inner + d_inner * h + d_inner * (dt_rank + 2 * n) + dt_rank * d_inner
        per_token = 6 * (layers * per_layer + h * arch["vocab_size"])
        return float(per_token * recipe["sequence_length"])
    return None


def mfu(flops_per_step: float | None, step_time_s: float | None, world_size: int, peak_tflops: float | None):
    """Model FLOPs utilisation against the dense peak of all GPUs of the cell; None when unknown."""
    if not flops_per_step or not step_time_s or not peak_tflops:
        return None
    return flops_per_step / (step_time_s * world_size * peak_tflops * 1e12)

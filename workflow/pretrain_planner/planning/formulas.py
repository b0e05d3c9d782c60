"""The closed forms of a model family, one object per formula: what a sample costs (tokens, training FLOPs), what the
model holds (parameters), what one layer certainly saves for backward, and the memory-bound bytes a sample moves.
A family points to its formula (families.py, `Family.closed_form`); flops.py, memory.py and stepmodel.py ask that
object and never test its name, so a family with a new formula is a subclass here and its entry in the registry,
with no edit to them. Why each count is what it is: flops.py (FLOPs, parameters), memory.py (activations) and
stepmodel.py (memory-bound bytes) say it in their docstrings; the constants of the memory-bound bytes are here.

Every hook takes a model as ModelSpec.to_dict() gives it. Imports no torch, and nothing of the package (the
registry imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

# Memory-bound bytes of a transformer, per token (forward + backward; 16-bit activations, x2 for fp32 recipes):
# per layer about 27 hidden-size reads and writes forward (2 norms 4h, rotary / head reshapes 7h, GELU 8h, residual
# adds 4h, bias and dropout 4h) and twice that backward: 81 h elements = 162 h bytes;
LAYER_B_PER_HIDDEN = 162
# eager attention (`naive`) also writes, scales, masks, soft-maxes (in fp32) and differentiates a score per head and
# key: about 30 bytes per score (a fused SDPA / flash kernel keeps them on chip);
EAGER_SCORE_B = 30
# the loss over the vocabulary: 16-bit logits, their fp32 copy, the log-softmax, its gradient and the cast back:
# about 38 bytes per vocabulary entry and token.
LOGIT_B = 38
# Mamba: the block's elementwise work and the selective scan over expand x hidden channels (about the same count
# per channel as a transformer layer per hidden unit); ConvNeXt: per block and pixel the depthwise convolution,
# LayerNorm, GELU over 4C, layer scale and residual: about 30 channel-size reads and writes forward, twice that
# backward (90 C elements).
CONVNEXT_B_PER_CHANNEL = 90

Model = dict[str, Any]  # a ModelSpec.to_dict(): family, task, arch, recipe


@dataclass(frozen=True)
class Formula:
    """A family's closed forms. The base knows a sample's tokens (its sequence) and no layer-wise activation bound;
    a formula gives at least its parameters, its training FLOPs and its memory-bound bytes."""

    name: ClassVar[str]  # what evidence rows and the what-if's stand-ins call it (transformer, vit, mamba, convnext)

    def tokens(self, model: Model) -> int | None:
        """Tokens one sample puts through the model: the recipe's sequence; None for a model without tokens."""
        return model["recipe"].get("sequence_length")

    def params(self, model: Model) -> float:
        """Parameters from the arch; biases and norms are left out (< 1% for real sizes)."""
        raise NotImplementedError

    def train_flops(self, model: Model) -> float:
        """Model FLOPs of forward + backward for one sample."""
        raise NotImplementedError

    def layer_elements(self, model: Model, compiled: bool, eager_attention: bool) -> float | None:
        """Elements per token one layer certainly saves for backward (memory.py's bound); None: no bound known."""
        return None

    def memory_bytes(self, model: Model, eager_attention: bool) -> float:
        """Memory-bound bytes one sample moves through forward and backward at 16-bit activations (stepmodel.py
        doubles them for fp32 recipes)."""
        raise NotImplementedError


# A gated MLP's extra elementwise work (SiLU over the gate and the product with the up projection, forward ~5i
# elements read and written against GELU's 2i, twice that backward) in bytes per intermediate unit, on top of
# LAYER_B_PER_HIDDEN (which counts GELU at i = 4h): 3 x (5 - 2) elements x 2 bytes.
GATED_B_PER_INTERMEDIATE = 18


def _attention_widths(arch: dict[str, Any]) -> tuple[int, int]:
    """(query width: heads x head_dim, key/value width: kv heads x head_dim). head_dim is hidden / heads unless the
    arch says otherwise (Qwen3); kv heads are the heads unless grouped-query attention names fewer."""
    heads = arch["num_attention_heads"]
    head_dim = arch.get("head_dim") or arch["hidden_size"] // heads
    return heads * head_dim, (arch.get("num_key_value_heads") or heads) * head_dim


def _transformer_block(arch: dict[str, Any], gated: bool = False) -> int:
    """Matmul parameters of one transformer block: q, k, v (k and v at the key/value width: grouped-query
    attention), o, and the MLP's two matrices, three with a gated MLP (gate, up, down: SwiGLU)."""
    h = arch["hidden_size"]
    q, kv = _attention_widths(arch)
    return 2 * h * q + 2 * h * kv + (3 if gated else 2) * h * arch.get("intermediate_size", 4 * h)


def _transformer_flops(arch: dict[str, Any], tokens: int, head: float, gated: bool = False) -> float:
    """6 x the matmul parameters a token passes through (`head`: the head's, per token) + 12 x layers x query width
    (hidden, but heads x head_dim where they differ) x context for attention scores and values, causal attention
    counted in full (flops.py)."""
    layers = arch["num_hidden_layers"]
    q, _ = _attention_widths(arch)
    per_token = 6 * (layers * _transformer_block(arch, gated) + head) + 12 * layers * q * tokens
    return float(per_token * tokens)


def _transformer_bytes(
    arch: dict[str, Any], tokens: int, vocab: float, eager_attention: bool, gated: bool = False
) -> float:
    layers, h = arch["num_hidden_layers"], arch["hidden_size"]
    scores = EAGER_SCORE_B * arch["num_attention_heads"] * tokens if eager_attention else 0
    per_layer = LAYER_B_PER_HIDDEN * h + scores
    if gated:
        per_layer += GATED_B_PER_INTERMEDIATE * arch.get("intermediate_size", 4 * h)
    return tokens * (layers * per_layer + LOGIT_B * vocab)


@dataclass(frozen=True)
class Transformer(Formula):
    """A transformer language model (Kaplan et al. / the PaLM appendix): blocks of attention and MLP, a vocabulary
    head (on the masked share of the tokens only with sparse prediction), the input embedding tied to it or not.

    One closed form for the study's encoders and GPT-NeoX and for today's Llama-style decoders, as settings of it:
    a gated MLP (SwiGLU: three matrices), grouped-query attention (the arch's num_key_value_heads: k and v at the
    key/value width; head_dim where it is not hidden / heads), tied embeddings, and the norms. `norms` > 0 counts
    the parameters exactly (the decoders have no biases unless the arch asks for them): that many hidden-size
    RMSNorm weights per layer, the final norm, and the q/k norms (`qk_norm`: "head", one head_dim weight each for
    q and k, Qwen3; "proj", over the whole q and k projections, OLMo-2). `norms` 0 (the older families) leaves
    biases and norms out (< 1% for real sizes), so their figures are what they always were."""

    name: ClassVar[str] = "transformer"
    tied: bool = True  # the config class's default tie_word_embeddings (GPT-NeoX: False, a head of its own)
    parallel_residual: bool = False  # GPT-NeoX's parallel residual (both norms read one input) unless the arch
    # turns it off (use_parallel_residual, on by default)
    gated_mlp: bool = False  # gate, up and down projections with SiLU (Llama, Qwen3, OLMo-2, Mistral)
    norms: int = 0  # hidden-size norm weights per layer counted in the parameters; 0: norms and biases left out
    qk_norm: Literal["", "head", "proj"] = ""  # per-head q/k RMSNorm (Qwen3) | over the q and k projections (OLMo-2)

    def _norm_and_bias_params(self, a: dict[str, Any]) -> int:
        """The parameters besides the matrices, exactly, for a formula that counts them (`norms` > 0): the norm
        weights (per layer and the final one) and the biases the arch turns on (attention_bias, mlp_bias)."""
        if not self.norms:
            return 0
        h, i = a["hidden_size"], a.get("intermediate_size", 4 * a["hidden_size"])
        q, kv = _attention_widths(a)
        per_layer = self.norms * h
        if self.qk_norm == "head":
            per_layer += 2 * (q // a["num_attention_heads"])
        elif self.qk_norm == "proj":
            per_layer += q + kv
        if a.get("attention_bias"):
            per_layer += q + 2 * kv + h
        if a.get("mlp_bias"):
            per_layer += (2 if self.gated_mlp else 1) * i + h
        return a["num_hidden_layers"] * per_layer + h

    def params(self, model: Model) -> float:
        a = model["arch"]
        embed = a["vocab_size"] * a["hidden_size"] * (1 if a.get("tie_word_embeddings", self.tied) else 2)
        block = _transformer_block(a, self.gated_mlp)
        return float(a["num_hidden_layers"] * block + embed + self._norm_and_bias_params(a))

    def train_flops(self, model: Model) -> float:
        arch, recipe = model["arch"], model["recipe"]
        head = arch["hidden_size"] * arch["vocab_size"]
        if arch.get("sparse_prediction"):  # the LM head runs on the masked positions only
            head *= recipe.get("mlm_probability", 0.15)
        return _transformer_flops(arch, recipe["sequence_length"], head, self.gated_mlp)

    def layer_elements(self, model: Model, compiled: bool, eager_attention: bool) -> float | None:
        a = model["arch"]
        h = a.get("hidden_size")
        if not h:
            return None
        i = a.get("intermediate_size", 4 * h)
        # k and v at the key/value width (grouped-query attention; equal to h for the older families)
        kv_short = 2 * (h - _attention_widths(a)[1]) if "num_attention_heads" in a else 0
        if compiled:  # the matrix products' outputs: a gated MLP's gate and up
            out = 5.0 * h + (2 * i if self.gated_mlp else i) - kv_short
        else:  # a gated MLP saves gate, SiLU(gate), up and their product
            out = 8.0 * h + (4 * i if self.gated_mlp else 2 * i) - kv_short
            if self.parallel_residual and a.get("use_parallel_residual", True):
                out -= h
        if eager_attention and "num_attention_heads" in a:
            out += a["num_attention_heads"] * self.tokens(model)
        return out

    def memory_bytes(self, model: Model, eager_attention: bool) -> float:
        a, r = model["arch"], model["recipe"]
        vocab = a.get("vocab_size", 0)
        if a.get("sparse_prediction"):
            vocab *= r.get("mlm_probability", 0.15)
        return _transformer_bytes(a, self.tokens(model), vocab, eager_attention, self.gated_mlp)


def _patches(arch: dict[str, Any]) -> int:
    return (arch["image_size"] // arch["patch_size"]) ** 2


@dataclass(frozen=True)
class ViT(Transformer):
    """A vision transformer: the image's patches and a class token through transformer blocks, a classifier run
    once per image, no vocabulary."""

    name: ClassVar[str] = "vit"

    def tokens(self, model: Model) -> int:
        return _patches(model["arch"]) + 1

    def params(self, model: Model) -> float:
        a = model["arch"]
        embed = _patches(a) * a["hidden_size"] + a["hidden_size"] * a.get("num_labels", 2)
        return float(a["num_hidden_layers"] * _transformer_block(a) + embed)

    def train_flops(self, model: Model) -> float:
        arch = model["arch"]
        tokens = self.tokens(model)
        head = arch["hidden_size"] * arch.get("num_labels", 2) / tokens  # the classifier runs once per image
        return _transformer_flops(arch, tokens, head)

    def memory_bytes(self, model: Model, eager_attention: bool) -> float:
        return _transformer_bytes(model["arch"], self.tokens(model), 0, eager_attention)


def _mamba_block(arch: dict[str, Any]) -> int:
    """Matmul parameters of one Mamba block: in_proj (h -> 2*e*h), out_proj (e*h -> h), x_proj and dt_proj; the
    scan is linear in length and small next to them."""
    h, e = arch["hidden_size"], arch.get("expand", 2)
    d_inner, n = e * h, arch.get("state_size", 16)
    dt_rank = -(-h // 16)
    return h * 2 * d_inner + d_inner * h + d_inner * (dt_rank + 2 * n) + dt_rank * d_inner


@dataclass(frozen=True)
class Mamba(Formula):
    """A Mamba language model: selective-scan blocks and a vocabulary head tied to the embedding."""

    name: ClassVar[str] = "mamba"

    def params(self, model: Model) -> float:
        a = model["arch"]
        return float(a["num_hidden_layers"] * _mamba_block(a) + a["vocab_size"] * a["hidden_size"])

    def train_flops(self, model: Model) -> float:
        arch = model["arch"]
        per_token = 6 * (arch["num_hidden_layers"] * _mamba_block(arch) + arch["hidden_size"] * arch["vocab_size"])
        return float(per_token * model["recipe"]["sequence_length"])

    def layer_elements(self, model: Model, compiled: bool, eager_attention: bool) -> float | None:
        a = model["arch"]
        h = a.get("hidden_size")
        if not h:
            return None
        return 3.0 * a.get("expand", 2) * h + h  # in-projection output, the scan's output, the input

    def memory_bytes(self, model: Model, eager_attention: bool) -> float:
        a, r = model["arch"], model["recipe"]
        per_layer = LAYER_B_PER_HIDDEN * a["hidden_size"] * a.get("expand", 2)
        return r["sequence_length"] * (a["num_hidden_layers"] * per_layer + LOGIT_B * a["vocab_size"])


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


@dataclass(frozen=True)
class ConvNext(Formula):
    """ConvNeXt (issue 17): per block a 7x7 depthwise convolution and two pointwise layers, the downsamplings, the
    stem and the classifier. No tokens, and no layer-wise activation bound (memory.py has no estimate)."""

    name: ClassVar[str] = "convnext"

    def tokens(self, model: Model) -> None:
        return None

    def params(self, model: Model) -> float:
        return _convnext_macs(model["arch"], model["recipe"]["image_size"])[2]

    def train_flops(self, model: Model) -> float:
        """Forward 2 x MACs, backward 4 x; the stem has no input gradient (2 + 2)."""
        body, stem, _ = _convnext_macs(model["arch"], model["recipe"]["image_size"])
        return 6 * body + 4 * stem

    def memory_bytes(self, model: Model, eager_attention: bool) -> float:
        a = model["arch"]
        side = model["recipe"]["image_size"] // a.get("patch_size", 4)
        total = 0.0
        for i, (c, d) in enumerate(zip(a.get("hidden_sizes", [96, 192, 384, 768]), a.get("depths", [3, 3, 9, 3]),
                                       strict=True)):  # fmt: skip
            total += d * CONVNEXT_B_PER_CHANNEL * c * (side >> i) ** 2
        return total

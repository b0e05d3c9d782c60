"""Model families: what each is, in one place. Everything that depends on a model's family — the catalog's
checks, the grid's rules, the FLOPs, memory and step-model formulas (through the formula object each family points
to, formulas.py), the position ids of the masked-LM data and model, the study's order, the export, the trainer's
builder — reads this registry. Adding a family is one entry here (and a place in DISPLAY_ORDER), a formula
(formulas.py) when none of the existing ones counts it, plus its builder (trainer/models.py) when the plain
transformers classes named here are not enough. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_planner.planning.formulas import ConvNext, Formula, Mamba, Transformer, ViT
from pretrain_planner.planning.tasks import TASKS, Task
from pretrain_planner.schema import ConfigError

_TEXT_ARCH = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Llama-style decoders: the kv heads too (Mistral's and Qwen3's config classes default to 8 and 32, never the
# heads), and Qwen3's head_dim (its class defaults to 128 whatever hidden / heads is)
_DECODER_ARCH = (*_TEXT_ARCH, "num_key_value_heads")


@dataclass(frozen=True)
class Family:
    name: str
    task: str  # a key of tasks.TASKS: what it trains on (the batches, the loss, the recipe's sequence or image size)
    config_class: str  # the transformers config class its `arch` is passed to
    model_class: str  # the transformers model class built from that config
    attention: bool  # has attention layers that take `attn_implementation` (eager / sdpa / flash-attn 2)
    liger: bool  # Liger has kernels for it (the `liger` method part)
    closed_form: Formula | None  # its closed forms (formulas.py): parameters, FLOPs, activations, memory-bound
    # bytes; None: the trainer counts a step's FLOPs (torch.utils.flop_counter) and the memory model has no estimate
    required_arch: tuple[str, ...]  # arch keys the formulas and batch shapes read: never a transformers default
    positions_from_pad: int | None = None  # numbers positions from padding_idx + 1 (RoBERTa): the config class's
    # default pad_token_id; None: positions from 0

    @property
    def formula(self) -> str | None:
        """Its formula's name (transformer | vit | mamba | convnext), as evidence rows and stand-ins name it."""
        return self.closed_form.name if self.closed_form else None

    def position_offset(self, pad_token_id: int | None = None) -> int:
        """Position ids the model skips before a sequence's first token: pad_token_id + 1 for a family that numbers
        positions from the padding index (RoBERTa: max_position_embeddings must hold the sequence plus these), 0 for
        the others. `pad_token_id` None: the tokenizer's is not known yet (the data's room is set before its
        tokenizer is trained), the config class's default."""
        if self.positions_from_pad is None:
            return 0
        return (self.positions_from_pad if pad_token_id is None else pad_token_id) + 1

    @property
    def task_spec(self) -> Task:
        """The task's entry in the task registry (tasks.py)."""
        return TASKS[self.task]

    @property
    def masked_lm(self) -> bool:
        return self.task == "masked_lm"

    @property
    def vocab_head(self) -> bool:
        """A vocabulary head: a fused linear + cross-entropy head (`flce`) applies."""
        return self.task_spec.vocab_head

    @property
    def is_text(self) -> bool:
        return self.task_spec.tokens


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("gptneox", "causal_lm", "GPTNeoXConfig", "GPTNeoXForCausalLM", True, True,
               Transformer(tied=False, parallel_residual=True), _TEXT_ARCH),
        Family("roberta", "masked_lm", "RobertaConfig", "RobertaForMaskedLM", True, True, Transformer(), _TEXT_ARCH,
               positions_from_pad=1),
        Family("roberta-prelayernorm", "masked_lm", "RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM",
               True, True, Transformer(), _TEXT_ARCH, positions_from_pad=1),
        Family("bert", "masked_lm", "BertConfig", "BertForMaskedLM", True, True, Transformer(), _TEXT_ARCH),
        Family("vit", "image_classification", "ViTConfig", "ViTForImageClassification", True, True, ViT(),
               ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size", "num_labels")),
        Family("mamba", "causal_lm", "MambaConfig", "MambaForCausalLM", False, False, Mamba(),
               ("hidden_size", "num_hidden_layers", "vocab_size")),
        Family("convnext", "image_classification", "ConvNextConfig", "ConvNextForImageClassification", False, False,
               ConvNext(), ("depths", "hidden_sizes", "num_labels")),
        # Llama-style decoders (issue 55): pre-norm RMSNorm, RoPE, SwiGLU, grouped-query attention; one closed form
        # with GPT-NeoX's (formulas.Transformer), their differences its settings. Llama 3.x, SmolLM2, TinyLlama:
        Family("llama", "causal_lm", "LlamaConfig", "LlamaForCausalLM", True, True,
               Transformer(tied=False, gated_mlp=True, norms=2), _DECODER_ARCH),
        # Qwen3: Llama's block with a per-head RMSNorm on q and k
        Family("qwen3", "causal_lm", "Qwen3Config", "Qwen3ForCausalLM", True, True,
               Transformer(tied=False, gated_mlp=True, norms=2, qk_norm="head"), (*_DECODER_ARCH, "head_dim")),
        # OLMo-2: the norms after attention and MLP (on their outputs), an RMSNorm over the whole q and k
        Family("olmo2", "causal_lm", "Olmo2Config", "Olmo2ForCausalLM", True, True,
               Transformer(tied=False, gated_mlp=True, norms=2, qk_norm="proj"), _DECODER_ARCH),
        # Mistral: Llama's block; its sliding window masks scores, the counted FLOPs are full attention's as for all
        Family("mistral", "causal_lm", "MistralConfig", "MistralForCausalLM", True, True,
               Transformer(tied=False, gated_mlp=True, norms=2), _DECODER_ARCH),
    )
}  # fmt: skip

# The order the study's views list families in (tables/study.py model_rank), as its tables list its models
# (training_time_tables.py: Pythia by size, RoBERTa, Mamba, ConvNeXt, ViT); the families it does not have sit beside
# their nearest (BERT-like encoders after RoBERTa). A family missing here is listed after these.
DISPLAY_ORDER = (
    "gptneox",
    "llama",
    "qwen3",
    "olmo2",
    "mistral",
    "roberta",
    "roberta-prelayernorm",
    "bert",
    "mamba",
    "convnext",
    "vit",
)


def family(name: str, where: str = "family") -> Family:
    """The registry's entry, or a ConfigError naming `where` and the known families."""
    if name not in FAMILIES:
        raise ConfigError(f"{where}: unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def names(predicate=None) -> list[str]:
    """The families for which `predicate(family)` holds (all without one), in registry order."""
    return [n for n, f in FAMILIES.items() if predicate is None or predicate(f)]

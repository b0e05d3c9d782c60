"""Model families: what each is, in one place. Everything that depends on a model's family — the catalog's
checks, the grid's rules, the FLOPs and memory formulas, the export, the trainer's builder — reads this
registry. Adding a family is one entry here plus its builder (trainer/models.py) when the plain transformers
classes named here are not enough. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_planner.planning.tasks import TASKS, Task
from pretrain_planner.schema import ConfigError

_TEXT_ARCH = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class Family:
    name: str
    task: str  # a key of tasks.TASKS: what it trains on (the batches, the loss, the recipe's sequence or image size)
    config_class: str  # the transformers config class its `arch` is passed to
    model_class: str  # the transformers model class built from that config
    attention: bool  # has attention layers that take `attn_implementation` (eager / sdpa / flash-attn 2)
    liger: bool  # Liger has kernels for it (the `liger` method part)
    formula: str | None  # the closed form of its parameters and FLOPs (flops.py): transformer | vit | mamba | convnext;
    # None: the trainer counts a step's FLOPs (torch.utils.flop_counter) and the memory model has no estimate
    required_arch: tuple[str, ...]  # arch keys the formulas and batch shapes read: never a transformers default

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
        Family("gptneox", "causal_lm", "GPTNeoXConfig", "GPTNeoXForCausalLM", True, True, "transformer", _TEXT_ARCH),
        Family("roberta", "masked_lm", "RobertaConfig", "RobertaForMaskedLM", True, True, "transformer", _TEXT_ARCH),
        Family("roberta-prelayernorm", "masked_lm", "RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM",
               True, True, "transformer", _TEXT_ARCH),
        Family("bert", "masked_lm", "BertConfig", "BertForMaskedLM", True, True, "transformer", _TEXT_ARCH),
        Family("vit", "image_classification", "ViTConfig", "ViTForImageClassification", True, True, "vit",
               ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size", "num_labels")),
        Family("mamba", "causal_lm", "MambaConfig", "MambaForCausalLM", False, False, "mamba",
               ("hidden_size", "num_hidden_layers", "vocab_size")),
        Family("convnext", "image_classification", "ConvNextConfig", "ConvNextForImageClassification", False, False,
               "convnext", ("depths", "hidden_sizes", "num_labels")),
    )
}  # fmt: skip


def family(name: str, where: str = "family") -> Family:
    """The registry's entry, or a ConfigError naming `where` and the known families."""
    if name not in FAMILIES:
        raise ConfigError(f"{where}: unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def names(predicate=None) -> list[str]:
    """The families for which `predicate(family)` holds (all without one), in registry order."""
    return [n for n, f in FAMILIES.items() if predicate is None or predicate(f)]

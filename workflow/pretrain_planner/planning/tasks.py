"""Tasks: what a model trains on, in one place, beside the family registry (families.py: each family names its
task). A task says what a sample is (tokens of the recipe's sequence length, or an image of its image size),
the loss the model computes from a batch (`module(**batch).loss`, the one the trainer steps on), the throughput
a run reports (samples per second; tokens per second for token samples) and the learning-rate schedule of a
recipe that names none. Its data is the trainer's entry for it (trainer/tasks.py: the benchmark's synthetic
batches, the train and budget stages' real data). Adding a task is one entry here and one there. Imports no
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    name: str
    tokens: bool  # a sample is the recipe's `sequence_length` tokens (else an image of its `image_size`)
    vocab_head: bool  # the model ends in a vocabulary head: the fused linear + cross-entropy head (`flce`) applies
    loss: str  # what `module(**batch).loss` is
    default_schedule: dict[str, Any] = field(default_factory=lambda: {"name": "constant"})

    def tokens_per_sample(self, recipe: dict[str, Any]) -> int | None:
        """Tokens of one sample (a token task's sequence length; None for images): tokens per second's basis."""
        return recipe.get("sequence_length") if self.tokens else None


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("causal_lm", True, True, "next-token cross-entropy over every position (labels = inputs; the model "
             "shifts them)"),
        Task("masked_lm", True, True, "cross-entropy over the masked positions (labels -100 elsewhere)"),
        Task("image_classification", False, False, "cross-entropy over the class labels"),
    )
}  # fmt: skip

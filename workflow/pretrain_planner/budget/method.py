"""The benchmark's method, applied to the budget stage's pre-training through the trainer's own machinery
(trainer/methodbuild.py: the pieces a benchmark cell builds, plus what a real run needs: the learning rate set
every step, checkpoints that resume, full weights for model folders).

What is the budget's here: its policy for `fl` -- SDPA attention, TF32 and fused AdamW on CUDA, torch.compile on
CUDA only (on CPU the compile time would eat the budget of the small runs this stage is tested with) -- and the
recipe's AdamW without weight decay on biases and norms.
"""

from __future__ import annotations

from typing import Any

import torch

from pretrain_planner.trainer.methodbuild import CSTEP_MIN_LR, Built, MethodError, build, check
from pretrain_planner.trainer.parallel import MethodConfig, method_config

__all__ = ["CSTEP_MIN_LR", "Built", "MethodError", "build", "check", "config_of"]


def config_of(tr: dict[str, Any], slug: str, model: dict[str, Any], device: torch.device) -> MethodConfig:
    on_cuda = device.type == "cuda"
    # the recipe's AdamW without weight decay on biases and norms; TF32 and torch.compile (automatic dynamic
    # shapes: sparse prediction's masked rows vary) on CUDA only
    return method_config(
        slug, model, precision=tr["precision"], lr=tr["lr"], betas=tr["betas"], eps=tr["eps"],
        weight_decay=tr["weight_decay"], grad_clip=tr["grad_clip"] or None, no_decay_1d=True, tf32=on_cuda,
        supports_compile=on_cuda, compile_dynamic=None, where="train.method",
    )  # fmt: skip

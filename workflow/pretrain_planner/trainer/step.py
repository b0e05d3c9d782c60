"""One whole optimizer step: every micro-batch of the accumulation, then the optimizer."""

from __future__ import annotations

import contextlib

import torch

from .parallel import Applied


class TrainStep:
    def __init__(self, applied: Applied, optimizer: torch.optim.Optimizer, grad_clip: float | None, device_type: str):
        self.applied = applied
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.device_type = device_type
        self.scaler = torch.amp.GradScaler(device_type) if applied.autocast_dtype == torch.float16 else None

    def _autocast(self):
        dtype = self.applied.autocast_dtype
        return torch.autocast(self.device_type, dtype=dtype) if dtype else contextlib.nullcontext()

    def micro(self, batch: dict[str, torch.Tensor], scale: float, sync_grads: bool) -> torch.Tensor:
        """Forward + backward of one micro-batch; gradients are all-reduced only when `sync_grads`."""
        ctx = contextlib.nullcontext() if sync_grads else self.applied.no_sync()
        with ctx:
            with self._autocast():
                loss = self.applied.module(**batch).loss * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        if self.grad_clip:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.applied.raw.parameters(), self.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def reset_after_trial(self) -> None:
        """Drop gradients, and the loss scaler's per-step state (an OOM may strike after unscale_)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler = torch.amp.GradScaler(self.device_type, init_scale=self.scaler.get_scale())

    def __call__(self, batches: list[dict[str, torch.Tensor]], accum: int) -> torch.Tensor:
        """`accum` micro-batches (cycling through `batches`), all-reduce on the last one only, then step."""
        losses = [
            self.micro(batches[i % len(batches)], 1.0 / accum, sync_grads=i == accum - 1).float() for i in range(accum)
        ]
        self.optimizer_step()
        return torch.stack(losses).sum()

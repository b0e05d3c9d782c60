"""One whole optimizer step: every micro-batch of the accumulation, then the optimizer.

`TrainStep` drives a torch optimizer (one rank, DDP, FSDP2); `zero.DeepSpeedStep` overrides the
micro-batch and the optimizer step with the DeepSpeed engine's own backward and step. Both offer what
the measurement needs: `micro`, `optimizer_step`, `trial` (a step's memory peak, for the micro-batch
search), `reset_after_trial`, `__call__` (one timed step), `accepts` (can this instance run that
micro-batch size, or must a new one be built), `overflow_mark` / `was_skipped` (fp16: did the loss scaler
skip the optimizer step, which must never be timed) and `close`.

Gradient accumulation: DDP all-reduces on the last micro-batch only (`no_sync` before); FSDP2 likewise
reduce-scatters on the last micro-batch only (`set_requires_gradient_sync(False)` before, unsharded gradients
accumulate in fp32 between) when `grad_sync == "last"`, or on every micro-batch (`"every"`: gradients stay
sharded, less memory) -- the micro-batch search tries "last" first and falls back to "every" at the same size.
Under CUDA graphs (`cg`) gradients are preallocated and zeroed in place, never set to None: a gradient the
first backward would allocate inside the graph's memory pool is overwritten by the next replay (torch raises
"accessing gradient tensor output of CUDAGraphs that has been overwritten"); with a stable buffer,
AccumulateGrad adds the replay's output into it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from pretrain_planner.trainer.parallel import Applied

ACCUMULATING = 3  # trial_phase from which accumulated gradients are held (the second micro-batch on)


class TrainStep:
    def __init__(
        self,
        applied: Applied,
        optimizer: torch.optim.Optimizer,
        grad_clip: float | None,
        device_type: str,
        settings: dict[str, Any] | None = None,
    ):
        self.applied = applied
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.device_type = device_type
        self.settings = dict(applied.settings) if settings is None else settings
        self.probe = applied.probe
        self.probe_report: dict[str, Any] | None = None
        self.scaler = self._new_scaler()
        self.compiled_step: Any = None  # `cstep`: the optimizer step (with grad clipping) compiled
        self.trial_phase = 0  # how far `trial` got (an out-of-memory error's place: see ACCUMULATING)
        self.build_timings: dict[str, float] = {}  # methodbuild.build's: model_build_s, method_wrap_s
        self.trial_micro_s: tuple[float, float] | None = None  # the last trial's first and last micro-batch seconds
        self.device: torch.device | None = None  # the rank's device (methodbuild.build sets it)
        if applied.cuda_graphs:
            self._stable_grads()

    def compile_optimizer_step(self) -> None:
        """`cstep`: torch.compile the optimizer step, with gradient clipping unless a GradScaler must unscale
        first (its inf/nan check is data-dependent and stays eager; the optimizer's step is compiled then)."""
        from pretrain_planner.trainer.parallel import _allow_recompiles

        _allow_recompiles()
        eager_step = self.optimizer.step
        params = [p for p in self.applied.raw.parameters() if p.requires_grad]
        clip = self.grad_clip

        def step_fn() -> None:
            if clip:
                torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
            eager_step()

        if self.scaler is None:
            self.compiled_step = torch.compile(step_fn)
            covers = "clip_grad_norm_ + optimizer.step" if clip else "optimizer.step"
        else:  # GradScaler.step(optimizer) calls optimizer.step(): make that the compiled one
            compiled = torch.compile(lambda: eager_step())
            self.optimizer.step = lambda *a, **k: compiled()
            covers = "optimizer.step (GradScaler's unscale and inf check stay eager)"
        self.settings["compile_optimizer_step"] = covers

    def _new_scaler(self, init_scale: float | None = None):
        if not self.applied.loss_scaling:
            return None
        kwargs = {} if init_scale is None else {"init_scale": init_scale}
        if self.applied.sharded:  # each rank sees its shard of the gradients: agree on inf/nan
            import torch.distributed as torch_dist
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            # the live group: ShardedGradScaler's default (dist.group.WORLD) is bound when the module is first
            # imported, i.e. to a group an out-of-memory error may since have aborted and replaced
            group = torch_dist.group.WORLD if torch_dist.is_initialized() else None
            return ShardedGradScaler(self.device_type, process_group=group, **kwargs)
        return torch.amp.GradScaler(self.device_type, **kwargs)

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.applied.raw.parameters() if p.requires_grad]

    def _stable_grads(self) -> None:
        """`cg`: every gradient a zeroed buffer allocated outside any CUDA graph, before the first backward."""
        for p in self._params():
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _zero_grad(self) -> None:
        # cg: zero in place (the buffers must outlive every replay); otherwise free them
        self.optimizer.zero_grad(set_to_none=not self.applied.cuda_graphs)

    def overflow_mark(self) -> Any:
        """What `was_skipped` compares with: the loss scale now (None without loss scaling). A host read: call
        it outside timed regions."""
        return self.scaler.get_scale() if self.scaler is not None else None

    def was_skipped(self, mark: Any) -> bool:
        """Whether the optimizer step since `mark` was skipped: GradScaler backs the scale off exactly when it
        found inf/nan gradients and skipped `optimizer.step()`."""
        return mark is not None and self.scaler is not None and self.scaler.get_scale() < mark

    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def grad_sync_options(self) -> tuple[str, ...]:
        """The gradient synchronisations this step can run, preferred first (FSDP2: last, every; else none)."""
        return ("last", "every") if self.applied is not None and self.applied.fsdp is not None else ()

    def set_grad_sync(self, mode: str) -> None:
        """FSDP2: reduce-scatter on the "last" micro-batch of a step only, or on "every" one."""
        if mode not in self.grad_sync_options():
            raise ValueError(f"grad_sync {mode!r}: this step offers {self.grad_sync_options()}")
        self.applied.grad_sync = mode
        self.settings["fsdp"]["gradient_sync"] = (
            "reduce-scatter on the last micro-batch of a step (set_requires_gradient_sync(False) before it)"
            if mode == "last"
            else "reduce-scatter on every micro-batch (gradients stay sharded: a step with one reduce-scatter "
            "did not fit)"
        )
        self.settings["fsdp"]["grad_sync"] = mode
        if self.settings.get("fsdp_policy"):
            self.settings["fsdp_policy"] = {**self.settings["fsdp_policy"], "grad_sync": mode}

    def accepts(self, micro_batch: int) -> bool:
        """Whether this instance can run micro-batches of that size (a torch optimizer: any size)."""
        return True

    def _autocast(self):
        dtype = self.applied.autocast_dtype
        return torch.autocast(self.device_type, dtype=dtype) if dtype else contextlib.nullcontext()

    def _micro(self, batch: dict[str, torch.Tensor], scale: float, sync_grads: bool) -> torch.Tensor:
        ctx = contextlib.nullcontext() if sync_grads else self.applied.no_sync()
        with ctx:
            with self._autocast():
                loss = self.applied.module(**batch).loss * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        # under CUDA graphs the loss lives in the graph's memory pool, overwritten by the next replay
        return loss.detach().clone() if self.applied.cuda_graphs else loss.detach()

    def micro(self, batch: dict[str, torch.Tensor], scale: float, sync_grads: bool) -> torch.Tensor:
        """Forward + backward of one micro-batch; under DDP (and FSDP2 with grad_sync "last") gradients are
        reduced only when `sync_grads`. The first one is watched by the evidence probe."""
        if self.probe is None:
            return self._micro(batch, scale, sync_grads)
        probe, self.probe = self.probe, None
        try:
            return probe.watch(lambda: self._micro(batch, scale, sync_grads))
        finally:
            self.probe_report = probe.report()

    def optimizer_step(self) -> None:
        if self.compiled_step is not None and self.scaler is None:
            self.compiled_step()
            self._zero_grad()
            return
        if self.grad_clip:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.applied.raw.parameters(), self.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self._zero_grad()

    def trial(self, batch: dict[str, torch.Tensor], distributed: bool, accumulates: bool = True) -> None:
        """A step's memory peak: a micro-batch, the optimizer step (allocates the optimizer state), then two
        more micro-batches while that state and the accumulated gradients are held. Under DDP the
        backward skips the gradient all-reduce. Under FSDP2 the first micro-batch reduce-scatters (the
        optimizer needs its sharded gradients), the second accumulates as a step's earlier micro-batches do
        (unsharded with grad_sync "last", unless a step has one micro-batch: `accumulates` False) and the third
        reduce-scatters, as a step's last one does (oom.guarded makes a rank that fails inside a collective
        harmless to the others)."""
        fsdp = self.applied.fsdp is not None
        self.trial_phase = 1
        first = self.timed_micro(batch, sync_grads=not distributed or fsdp)
        self.trial_phase = 2
        self.optimizer_step()
        self.trial_phase = ACCUMULATING  # from here on FSDP2 with grad_sync "last" holds unsharded gradients
        self.micro(batch, 1.0, sync_grads=not distributed or (fsdp and not accumulates))
        self.trial_micro_s = (first, self.timed_micro(batch, sync_grads=not distributed or fsdp))
        self.trial_phase = 5

    def timed_micro(self, batch: dict[str, torch.Tensor], sync_grads: bool) -> float:
        """`micro` (scale 1), its seconds with the device synchronised around it (the trial's first and last
        micro-batch: the first one's extra time is torch.compile's at this shape)."""
        self._device_sync()
        t0 = time.perf_counter()
        self.micro(batch, 1.0, sync_grads=sync_grads)
        self._device_sync()
        return time.perf_counter() - t0

    def _device_sync(self) -> None:
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)  # None (not set by methodbuild.build): the current device

    def reset_after_trial(self) -> None:
        """Drop gradients, and the loss scaler's per-step state (an OOM may strike after unscale_)."""
        self._zero_grad()
        if self.scaler is not None:
            self.scaler = self._new_scaler(init_scale=self.scaler.get_scale())

    def accumulate(self, batch_of: Callable[[int], dict[str, torch.Tensor]], accum: int) -> list[torch.Tensor]:
        """One optimizer step: `accum` micro-batches (`batch_of(i)`), each loss scaled 1/accum, gradients
        synchronised on the last, then the optimizer. The micro-batches' losses, on the device (no host sync)."""
        losses = [self.micro(batch_of(i), 1.0 / accum, sync_grads=i == accum - 1).float() for i in range(accum)]
        self.optimizer_step()
        return losses

    def __call__(self, batches: list[dict[str, torch.Tensor]], accum: int) -> torch.Tensor:
        """`accumulate` cycling through `batches`; the step's loss."""
        return torch.stack(self.accumulate(lambda i: batches[i % len(batches)], accum)).sum()

    def observed(self) -> dict[str, Any] | None:
        """What the evidence probe saw during the first micro-batch (None: not probed, e.g. compiled)."""
        return self.probe_report

    def close(self) -> None:
        """Drop every reference to the model and optimizer so their memory can be freed."""
        if self.probe is not None:
            self.probe.detach()
        self.probe = None
        self.optimizer = None
        self.applied = None
        self.scaler = None
        self.compiled_step = None

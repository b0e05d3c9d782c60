"""One typed spec for a run: a model (with the run's recipe) and a method on a GPU type, for a number of ranks,
on CUDA devices or not. The grid judges it (`reason`, with the study's rules around it), the trainer checks it
where the job runs (the same `reason`, then what only the host can tell: packages, device capability), builds it
and records it, the export writes it: each from its one concrete translation (planning.settings.resolve, once
per build, with the real micro-batch and accumulation). Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pretrain_planner.planning import families
from pretrain_planner.planning.catalog import GpuSpec, ModelSpec
from pretrain_planner.planning.methods import HYBRID, Method, parse, shard_ranks
from pretrain_planner.results import with_current_keys


class OnNodes:
    """Coordinates of a run on `nodes` nodes of `gpus_per_node` GPUs each (a cell, a search setting, a job, a
    costed setting): their world size, defined once."""

    nodes: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def batch_split_reason(global_batch: int, world_size: int, micro_batch: int | None = None) -> str | None:
    """Why a step of `global_batch` samples cannot be split evenly over `world_size` ranks, each in whole
    micro-batches of `micro_batch` (None: any micro-batch), or None. The one batch rule: the grid (with the study's
    power of two around it), the what-if, the train and budget stages and the loss check ask it."""
    if global_batch % world_size:
        return f"global batch {global_batch} is not divisible by {world_size} GPUs"
    if micro_batch and (global_batch // world_size) % micro_batch:
        return f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} x {world_size} ranks"
    return None


def sharding_reason(method: Method, world_size: int) -> str | None:
    """The study's rule on sharding, beside the method's own validity (`RunSpec.reason`): a sharding method on one
    GPU without offload divides nothing, so the sweep does not measure it (the trainer still runs it: the GPU check
    exercises FSDP's and ZeRO's code on one GPU). Asked by the grid and by the what-if's fit check."""
    if method.sharding and world_size == 1 and not method.offload:
        return f"{method.sharding} shards across GPUs: needs more than 1 GPU (or offload)"
    return None


def accumulation(global_batch: int, micro_batch: int, world_size: int) -> int:
    """The micro-batches each rank accumulates per optimizer step; ValueError (`batch_split_reason`) where the
    global batch does not split into them."""
    why = batch_split_reason(global_batch, world_size, micro_batch)
    if why:
        raise ValueError(why)
    return global_batch // (micro_batch * world_size)


def grad_sync_of(method_settings: dict[str, Any] | None) -> str | None:
    """FSDP2's gradient synchronisation as a cell (or a plan) recorded it - the one setting only the measurement
    decides; None: not FSDP2, or not recorded."""
    ms = method_settings if isinstance(method_settings, dict) else {}
    return (ms.get("fsdp_policy") or {}).get("grad_sync") or (ms.get("fsdp") or {}).get("grad_sync")


@dataclass(frozen=True)
class TrainSetting(OnNodes):
    """How a stage trains: the method and the batch split (micro-batch x accumulation x ranks) on nodes x
    gpus_per_node GPUs of a type, as the benchmark measured it (`source` benchmark: its plan.json) or the config
    gives it. One typed value, made once where the stage is planned (budget/config.py, the train stage's plan) and
    turned into JSON once, at the job's boundary (`to_json` / `of_json`)."""

    gpu: str
    nodes: int
    gpus_per_node: int
    method: Method
    micro_batch: int
    grad_accum_steps: int
    source: str = "config"  # benchmark (a plan.json) | config
    plan: str | None = None  # the plan.json it came from
    grad_sync: str | None = None  # FSDP2's gradient synchronisation as the measurement found it to fit

    missing = False

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum_steps * self.world_size

    def with_global_batch(self, global_batch: int) -> TrainSetting:
        """The same micro-batch, ranks and method at another global batch: the accumulation remade (ValueError
        where it does not split: `accumulation`)."""
        return replace(self, grad_accum_steps=accumulation(global_batch, self.micro_batch, self.world_size))

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "world_size": self.world_size, "source": self.source, "plan": self.plan,
                "micro_batch": self.micro_batch, "grad_accum_steps": self.grad_accum_steps,
                "global_batch": self.global_batch, "method": self.method.slug, "grad_sync": self.grad_sync}  # fmt: skip

    @classmethod
    def of_json(cls, data: dict[str, Any], where: str = "setting") -> TrainSetting:
        """From `to_json`'s record (a job's arguments, a result's `setting`); legacy keys read."""
        d = with_current_keys(data)
        return cls(str(d["gpu"]), int(d["nodes"]), int(d["gpus_per_node"]), parse(str(d["method"]), f"{where}.method"),
                   int(d["micro_batch"]), int(d["grad_accum_steps"]), str(d.get("source") or "config"),
                   d.get("plan"), d.get("grad_sync"))  # fmt: skip

    @classmethod
    def of_plan(cls, plan: dict[str, Any], path: str | None = None) -> TrainSetting:
        """The benchmark's setting an exported plan.json holds (tables/export.py writes it; legacy keys read)."""
        measured = with_current_keys(plan["measured"])
        return cls(str(plan["gpu"]["name"]), int(plan["nodes"]), int(plan["gpus_per_node"]),
                   parse(str(plan["method"]), "plan.json method"), int(measured["micro_batch"]),
                   int(measured["grad_accum_steps"]), "benchmark", path,
                   grad_sync_of(plan.get("method_settings")))  # fmt: skip


@dataclass(frozen=True)
class MissingSetting(OnNodes):
    """A setting asked of the benchmark's plan that does not exist (yet): the workflow's parse goes on (a benchmark
    sweep may still write it), the job that needs it stops with `error`."""

    gpu: str
    nodes: int
    gpus_per_node: int
    plan: str
    error: str
    source = "missing"
    missing = True

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "world_size": self.world_size, "source": self.source, "plan": self.plan,
                "error": self.error}  # fmt: skip


def setting_of_json(data: dict[str, Any]) -> TrainSetting | MissingSetting:
    """Either setting from its `to_json` record (a job's arguments)."""
    if data.get("source") == MissingSetting.source:
        return MissingSetting(data["gpu"], int(data["nodes"]), int(data["gpus_per_node"]), data["plan"], data["error"])
    return TrainSetting.of_json(data)


@dataclass(frozen=True)
class RunSpec:
    model: ModelSpec  # its recipe is the run's: the catalog's, or a stage's own (`with_recipe`)
    gpu: GpuSpec
    method: Method
    world_size: int = 1
    cuda: bool | None = None  # the ranks run on CUDA devices (None: every GPU type but the `cpu` stand-in)
    compile_dynamic: bool | None = False  # torch.compile's `dynamic` (None: automatic, for data-dependent shapes)
    compile_model: bool = True  # free-lunch compiles the model (a stage may leave it eager: the budget on CPU)
    nodes: int = 1  # machines the ranks are spread over (hybrid sharding shards within one, replicates across them)

    @property
    def shard_ranks(self) -> int:
        """The ranks a sharded state is divided among: every rank, or a node's for hybrid sharding."""
        return shard_ranks(self.method.sharding, self.world_size, self.nodes)

    @classmethod
    def of(cls, model: dict[str, Any], gpu: dict[str, Any], method: str | Method, world_size: int = 1,
           where: str = "method", **more: Any) -> RunSpec:  # fmt: skip
        """From plain data (a cell's spec, plan.json: ModelSpec.to_dict(), GpuSpec.to_dict(), a method slug)."""
        m = method if isinstance(method, Method) else parse(method, where)
        return cls(ModelSpec.from_dict(model), GpuSpec.from_dict(gpu), m, world_size, **more)

    @property
    def on_cuda(self) -> bool:
        return self.gpu.name != "cpu" if self.cuda is None else self.cuda

    def with_recipe(self, **changes: Any) -> RunSpec:
        """The same run with recipe values replaced (a stage's own recipe over the catalog's)."""
        return replace(self, model=replace(self.model, recipe=replace(self.model.recipe, **changes)))

    def reason(self, models_path: str | None = None) -> str | None:
        """Why the method cannot run for this model on this GPU type (and device), or None: the one validity rule
        of a method, asked by the grid (planning/grid.py adds the study's and the launcher's rules around it) and
        by the trainer where the job runs (trainer/methodbuild.py adds what only the host can tell).
        `models_path`: the catalog file a reason about the model names."""
        method, model = self.method, self.model
        if method.sharding in HYBRID and (self.nodes < 2 or self.shard_ranks < 2):
            return (f"{method.sharding} shards among a node's GPUs and replicates across nodes: it needs 2 or more "
                    f"nodes of 2 or more GPUs each (here {self.nodes} x {self.world_size // max(1, self.nodes)}; "
                    "fsdp-full shards over every GPU)")  # fmt: skip
        if method.offload and not method.sharding:
            return "offload needs a sharding method (zero1/2/3, fsdp-grad, fsdp-full)"
        if method.checkpointing and not model.supports_checkpointing:
            return f"{model.name} does not support activation checkpointing" + (f" ({models_path})" if models_path
                                                                                 else "")  # fmt: skip
        return self._extras_reason()

    def sweep_reason(self, models_path: str | None = None) -> str | None:
        """Why the sweep does not measure this run's method: the study's sharding rule (`sharding_reason`), then the
        method's own validity (`reason`). Asked by the grid and by the what-if's fit check."""
        return sharding_reason(self.method, self.world_size) or self.reason(models_path)

    def _extras_reason(self) -> str | None:
        """Why the method's extra parts (fa2, liger, flce, cstep, cg) are meaningless for this run, or None."""
        method, model, gpu = self.method, self.model, self.gpu
        if not method.extras:
            return None
        if not method.free_lunch:
            return f"{'+'.join(method.extras)} refine the free-lunch base: use fl+{'+'.join(method.extras)}"
        on_cpu = not self.on_cuda
        if method.flash_attn:
            if not model.kind.attention:
                return f"fa2: {model.name} ({model.family}) has no attention layer"
            if on_cpu:
                return "fa2: flash-attn runs on CUDA GPUs only"
            if model.recipe.precision == "fp32":
                return f"fa2: flash-attn computes in fp16/bf16 only; {model.name}'s recipe precision is fp32"
            if not gpu.bf16:
                return f"fa2: flash-attn 2 needs an Ampere or newer GPU ({gpu.name} has no bf16: older)"
        if method.liger:
            if not model.kind.liger:
                covered = ", ".join(families.names(lambda f: f.liger))
                return f"liger: Liger has no kernels for the {model.family} family ({covered})"
            if on_cpu:
                return "liger: Liger's Triton kernels run on CUDA GPUs only"
        if method.fused_ce:
            if not model.kind.vocab_head:
                return f"flce: {model.name} ({model.task}) has no vocabulary head to fuse with its loss"
            if method.sharding == "zero3":
                return (
                    "flce: ZeRO-3 gathers a layer's weights only inside that layer's forward; "
                    "the fused head reads them directly"
                )
        if method.compile_mode:
            part = method.compile_mode
            if not model.supports_compile:
                return f"{part}: {model.name} does not support torch.compile"
            if part == "cstep" and method.sharding in ("zero1", "zero2", "zero3"):
                return "cstep: DeepSpeed's engine owns the optimizer step; it cannot be compiled with the model"
            if part == "cstep" and method.offload:
                return "cstep: with offload the optimizer step runs on the CPU, outside the compiled step"
            if part == "cg" and on_cpu:
                return "cg: CUDA graphs need a CUDA GPU"
            if part == "cg" and method.sharding:
                return f"cg: CUDA graphs cannot capture {method.sharding}'s collectives and hooks"
        return None


def device_gpu(name: str, cuda: bool) -> GpuSpec:
    """The GPU facts of a run whose GPU type is not looked up in the catalog (the budget stage's own run): its
    name, and TF32 wherever it runs on CUDA (free-lunch then turns it on)."""
    return GpuSpec(name=name, label=name, memory_gib=None, peak_tflops={}, bf16=cuda, fp16=cuda, tf32=cuda,
                   price_usd=None, cloud_usd_per_gpu_hour=None)  # fmt: skip

"""The step model: what one optimizer step of a method is made of, for the adaptive search's time model
(search/timemodel.py) and the cross-GPU what-if (tables/whatif.py) alike, so that pruning and prediction cannot
disagree about what a method costs.

A step (per GPU) = compute + communication + offload:

- compute = the rank's samples x seconds per sample, x (1 + RECOMPUTE_SHARE) with activation checkpointing (the
  forward runs again: 2 of a step's 6 FLOPs per parameter and token). Within one GPU type the search fits seconds
  per sample per method family to the measured cells; across GPU types the what-if transfers them in proportion to
  `ideal_seconds`: the sample's matmul FLOPs at the GPU's achievable matmul rate plus KAPPA x its memory-bound bytes
  (norms, activations, softmax, residuals, the loss over the vocabulary: `memory_bytes_per_sample`) at the GPU's
  memory bandwidth. The datasheet peak alone does not transfer: from A100 to H100 it grows 3.2x, the memory
  bandwidth 1.6x and the achievable matmul rate about 2.4x.
- communication = syncs x one all-reduce of the gradients, 2 x GRAD_COMM_B x parameters x (w - 1) / w bytes per GPU
  (a ring's reduce-scatter and all-gather) over the bus: one sync per step unsharded, one per micro-batch sharded
  (the gradients are reduced as they are made), FULL_SHARD_VOLUME x at full sharding (the parameters are gathered
  again for the backward). A volume measured or transferred for one model and method is rescaled by `sync_bytes`.
  On several nodes (`comm_seconds`) the ring leaves each node once per ring, so a node's network carries the same
  bytes a rank sends: the bus runs at the slower of the GPU-to-GPU link and the node's network (the job's GPUs in a
  node x the network bandwidth per GPU); hybrid sharding (`hsdp`) reduce-scatters and gathers inside a node and
  all-reduces only each rank's shard across nodes (2 (n - 1) / n of the gradients per node, once per sync).
- offload = the CPU optimizer over the rank's shard (CPU_ADAM_B per parameter over the CPU-Adam bandwidth) + the
  parameters fetched over PCIe (FETCH_B per parameter) every micro-batch at full sharding.

Imports no torch (and no numpy: the search's hypothesis grids pass arrays through the same arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from pretrain_planner.planning.families import FAMILIES

# the memory-bound bytes' constants (formulas.py), also under this module's name (evidence.py reads them here)
from pretrain_planner.planning.formulas import EAGER_SCORE_B, LAYER_B_PER_HIDDEN, LOGIT_B  # noqa: F401

RECOMPUTE_SHARE = 1 / 3  # checkpointing runs the forward again: its 2 of a step's 6 FLOPs per parameter and token
FULL_SHARD_VOLUME = 1.5  # ZeRO-3 / full FSDP gather the parameters again for the backward
GRAD_COMM_B = 4  # bytes per gradient element reduced (fp32 gradients of fp32 master parameters under autocast)
CPU_ADAM_B = 16  # model-state bytes per parameter a CPU optimizer step goes through (fp32 parameter, grad, 2 moments)
FETCH_B = 4  # bytes per parameter fetched from the CPU at full sharding with offload

# Model-state traffic, memory-bound, per parameter: a micro-batch's backward writes its gradient and adds it into the
# fp32 accumulator (read + write of 4 B and the low-precision gradient's 2 B write and read: GRAD_ACCUM_B, once per
# micro-batch), and an Adam-type step reads the fp32 parameter, gradient and two moments and writes the parameter and
# moments back (OPTIMIZER_B, once per optimizer step of a rank's samples). Per sample they shrink with the micro-batch
# and with the samples per step: what makes a small-memory GPU at a small micro-batch slower than its rates say.
GRAD_ACCUM_B = 12
OPTIMIZER_B = 28

KAPPA = 1.0  # the weight of the memory-bound seconds against the matmul seconds (the what-if fits it to evidence)


@dataclass(frozen=True)
class Features:
    """What a step of a method at a micro-batch is made of, in the model's units."""

    family: str
    ac: bool
    syncs: float  # all-reduce volumes per step
    cpu: float  # CPU optimizer steps over the full model states (1 / ranks when sharded)
    fetches: float  # parameter fetches over PCIe per step
    micro_batch: int
    slug: str = ""
    hybrid: bool = False  # shards inside a node, replicates across nodes (methods.HYBRID)


def features(  # fmt: skip
    family: str,
    ac: bool,
    level: int,
    sharded: bool,
    offload: bool,
    micro_batch: int,
    batch: int,
    world: int,
    slug: str = "",
    hybrid: bool = False,
) -> Features:
    """A method's step (sharding `level`: 0 none .. 3 full) at micro-batch `micro_batch` of a per-rank `batch`."""
    accum = max(1, batch // micro_batch)
    syncs = 0.0 if world == 1 else (accum if sharded else 1) * (FULL_SHARD_VOLUME if level >= 3 else 1.0)
    cpu = (1 / world if sharded else 1.0) if offload else 0.0
    return Features(family, ac, syncs, cpu, float(accum) if offload and level >= 3 else 0.0, micro_batch, slug, hybrid)


def of_method(slug: str, micro_batch: int, batch: int, world: int) -> Features:
    """`features` of a method slug (methods.py grammar)."""
    from pretrain_planner.planning.methods import HYBRID, parse

    m = parse(slug)
    return features(m.base, m.checkpointing, m.sharding_level, bool(m.sharding), m.offload, micro_batch, batch, world,
                    slug, m.sharding in HYBRID)  # fmt: skip


def allreduce_bytes(params: float, world: int) -> float:
    """Bytes one GPU sends for one ring all-reduce of the gradients (0 on one GPU)."""
    return 2 * GRAD_COMM_B * params * (world - 1) / world if world > 1 else 0.0


def sync_bytes(f: Features, params: float, world: int) -> float:
    """A step's communication volume per GPU."""
    return f.syncs * allreduce_bytes(params, world)


def comm_seconds(
    f: Features, params: float, nodes: int, gpus_per_node: int, link_b_s: float, network_b_s: float | None
) -> float:
    """A step's communication seconds per GPU on `nodes` x `gpus_per_node`: `link_b_s` the GPU-to-GPU bandwidth in a
    node per direction, `network_b_s` the network's per GPU to other nodes (None on one node, or unknown: the link's).
    A flat collective over every rank crosses the nodes at the job's GPUs of a node x `network_b_s` at most; `hsdp`
    shards inside a node (its volume over the link) and all-reduces across nodes (over the network)."""
    world = nodes * gpus_per_node
    if world == 1 or not f.syncs:
        return 0.0
    node_b_s = gpus_per_node * network_b_s if nodes > 1 and network_b_s else None
    if f.hybrid and nodes > 1:
        inside = f.syncs * allreduce_bytes(params, gpus_per_node) / link_b_s
        across = f.syncs / FULL_SHARD_VOLUME * allreduce_bytes(params, nodes) / (node_b_s or link_b_s)
        return inside + across
    return sync_bytes(f, params, world) / min(link_b_s, node_b_s or link_b_s)


def compute_units(f: Features, batch: int) -> float:
    """Samples' worth of compute in a step (checkpointing runs the forward again); the search adds its small-batch
    slowdown on top."""
    return batch * (1 + RECOMPUTE_SHARE if f.ac else 1.0)


def offload_bytes(f: Features, params: float) -> tuple[float, float]:
    """(CPU-optimizer bytes, PCIe fetch bytes) of a step."""
    return f.cpu * CPU_ADAM_B * params, f.fetches * FETCH_B * params


# ------------------------------------------------------------------------------------------------ across GPU types


@dataclass(frozen=True)
class Rates:
    """What a GPU type does per second for a recipe's precision."""

    matmul_tflops: float  # achievable dense matrix-multiply rate (measured, else an assumed share of the peak)
    memory_gb_s: float  # memory (HBM / GDDR) bandwidth, datasheet
    matmul_measured: bool  # False: `matmul_tflops` is the datasheet peak x the catalog's median measured share


def precision_key(gpu: Any, precision: str, tf32: bool = True) -> str:
    """The key of a GPU's rate tables for a recipe's precision (as GpuSpec.peak_for)."""
    if precision == "fp32":
        return "tf32" if tf32 and gpu.tf32 else "fp32"
    return precision


def matmul_share(gpus: Any) -> float | None:
    """The median measured share of the datasheet peak (16-bit) over the GPU types that give both: what a GPU type
    with no measured matmul rate is assumed to reach."""
    shares = [
        g.matmul_tflops[k] / g.peak_tflops[k]
        for g in gpus
        for k in ("bf16", "fp16")
        if g.matmul_tflops.get(k) and g.peak_tflops.get(k)
    ]
    return median(shares) if shares else None


def rates(gpu: Any, precision: str, share: float | None, tf32: bool = True) -> Rates | None:
    """The GPU's rates for `precision` (share: `matmul_share` of the catalog); None without a peak or a memory
    bandwidth (the `cpu` stand-in)."""
    key = precision_key(gpu, precision, tf32)
    twin = {"bf16": "fp16", "fp16": "bf16"}.get(key)  # the other 16-bit format runs at the same rate
    measured = gpu.matmul_tflops.get(key) or (gpu.matmul_tflops.get(twin) if twin and gpu.supports(key) else None)
    peak = gpu.peak_tflops.get(key)
    if not gpu.memory_gb_s or not (measured or (peak and share)):
        return None
    return Rates(measured or peak * share, gpu.memory_gb_s, bool(measured))


def memory_bytes_per_sample(model: dict[str, Any], eager_attention: bool = False) -> float | None:
    """Memory-bound bytes one sample moves through forward and backward (a ModelSpec.to_dict()), by its family's
    formula (formulas.py: the constants LAYER_B_PER_HIDDEN, EAGER_SCORE_B, LOGIT_B, CONVNEXT_B_PER_CHANNEL), x2 for
    an fp32 recipe's activations; None for a family without one."""
    form = FAMILIES[model["family"]].closed_form
    if form is None:
        return None
    width = 2.0 if model["recipe"].get("precision") == "fp32" else 1.0
    return width * form.memory_bytes(model, eager_attention)


def state_bytes_per_sample(params: float, micro_batch: float | None, samples_per_step: float | None) -> float:
    """Memory-bound model-state bytes per sample of a rank (GRAD_ACCUM_B per parameter per micro-batch, OPTIMIZER_B
    per parameter per optimizer step of `samples_per_step`); 0 where a batch size is unknown."""
    out = GRAD_ACCUM_B * params / micro_batch if micro_batch else 0.0
    return out + (OPTIMIZER_B * params / samples_per_step if samples_per_step else 0.0)


def ideal_seconds(flops: float, memory_bytes: float, r: Rates, kappa: float = KAPPA) -> float:
    """A sample's seconds at the GPU's rates: matmul FLOPs at the achievable matmul rate + kappa x memory-bound bytes
    at the memory bandwidth. A measured step's compute per sample divided by this is its efficiency, which is what
    transfers to another GPU type."""
    return flops / (r.matmul_tflops * 1e12) + kappa * memory_bytes / (r.memory_gb_s * 1e9)

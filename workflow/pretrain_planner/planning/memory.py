"""A memory model of one training method on one GPU: model-state bytes by engine, and activation bytes per sample.
Both are LOWER bounds of what a rank really holds, so a method whose bound exceeds the GPU's memory cannot fit,
and the micro-batch the bound lets fit is never smaller than the largest that really fits: the adaptive search
(search/calibration.py, rules.py) and the what-if (tables/whatif.py) prune with them.

Model states, per rank, as each engine holds them (the trainer's engines: trainer/parallel.py, fsdp.py, zero.py;
their settings: planning/settings.py). P parameters, w ranks, b the 16-bit width (2 bytes; 4 for an fp32 recipe):

- one GPU / DDP (no sharding; autocast over fp32 weights): resident 4P weights + 8P Adam, and under DDP 4P of
  gradient buckets (gradient_as_bucket_view: held from step to step); on one GPU the 4P gradients exist from a
  step's first backward to its update (while accumulating, and at the step);
- FSDP2 (fsdp-grad, fsdp-full; bf16/fp16 compute by a MixedPrecisionPolicy): resident 4P/w sharded fp32 weights
  + 8P/w Adam; + 4P/w sharded gradients at the step and while accumulating (grad_sync "every"; "last" holds 4P
  unsharded); fsdp-grad + bP at the end of a forward: every unit's gathered weights, kept until its backward;
- DeepSpeed ZeRO-1/2: resident bP flat 16-bit weights (whole on every rank) + 4P/w fp32 master + 8P/w Adam;
  while accumulating + bP whole 16-bit gradients (ZeRO-1) or bP/w their partition (ZeRO-2); + 4P/w fp32
  gradient partition at the step;
- DeepSpeed ZeRO-3: resident, all partitioned: bP/w weights + 4P/w master (none for fp32, where the partition is
  the master) + 8P/w Adam + bP/w gradients.

Offload (`off`) moves to the host: ZeRO-1/2 the master, Adam and the fp32 gradients (the flat 16-bit weights and,
for ZeRO-1, the whole 16-bit gradients stay on the GPU); ZeRO-3 the weight and gradient partitions too (nothing
above stays on the GPU); FSDP2 (CPUOffloadPolicy) the sharded weights, gradients and Adam (fsdp-grad's gathered
weights stay). What is left out makes the bound lower, never wrong: the CUDA context, the allocator's caching, the
communication buckets (DeepSpeed's reduce bucket, up to 5e8 elements under ZeRO-1), parameters or norms the
formula omits (flops.param_count leaves out the study's families' biases and norms), the parameters ZeRO-3 and
fsdp-full gather for the module being computed, the 16-bit weight copies autocast saves for backward, and the fp32
gradient partition ZeRO-3 builds for the sub-group it steps (measured: +4P/w at the step; DeepSpeed's own estimator,
`estimate_zero3_model_states_mem_needs`, does not count it: 18P/w + 4 x the largest layer, and this bound is held
to never exceed that estimate). Each column was measured on 2 gloo ranks on CPU by walking every tensor the engine
holds (tests/test_memory.py; the margins in docs/adaptive-search.md).

Activations (per sample, at the end of its forward, where they peak): the tensors a transformer layer certainly
saves for backward, at the recipe's activation width (2 bytes; 4 for fp32): its input, each norm's output, the
attention's q, k, v and output and the MLP's two intermediates (8h + 2i elements per token; 7h + 2i with GPT-NeoX's
parallel residual, where both norms read one input; a gated MLP's gate, SiLU(gate), up and product 4i, and k and v at
the key/value width under grouped-query attention), plus the attention probabilities with eager attention
(`naive`: heads x sequence per token); a compiled model saves only the matrix products' and attention's outputs
and the residual stream (5h + i: the partitioner recomputes norms and activation functions); with activation
checkpointing only each layer's input is kept. Mamba layers keep at least the in-projection output, the scan's
output and the input (3 x expand x h + h, mamba-ssm's fused kernel recomputing the rest). A plain vocabulary head
adds the log-probabilities cross-entropy saves (fp32 for causal LMs: transformers upcasts the logits); the fused
head (`flce`) none. This is Korthikanti et al.'s count (34 s h bytes per layer, 16-bit, with dropout masks) without
what a given method does not hold. Each family's formula object counts its layer's elements (formulas.py,
`layer_elements`). `activation_estimate` (Korthikanti's count as is) is the search's expectation of what a sample
holds, not a bound. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_planner.planning.catalog import ModelSpec
from pretrain_planner.planning.flops import param_count, tokens_per_sample
from pretrain_planner.planning.methods import SHARDING_ENGINE, SHARDING_LEVEL, Method, parse, shard_ranks
from pretrain_planner.planning.settings import attention_for, compiles

GIB = 2**30
GRAD_B = 4  # bytes of a gradient as DDP all-reduces and FSDP2 reduce-scatters it (fp32): the communication unit
MASTER_B, ADAM_B = 4, 8  # the fp32 weights an optimizer updates, Adam's two fp32 moments (per parameter)


def width(precision: str | None) -> int:
    """Bytes of a 16-bit-recipe tensor (weights a 16-bit engine holds, activations): 2, or 4 for fp32; None
    (precision unknown) gives the smaller, so that the bound stays a bound."""
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class StateBytes:
    """Model-state bytes one rank holds: on its GPU, by when in a step, and on its host (offload)."""

    resident: float  # on the GPU throughout a step (after the first)
    accumulating: float  # + from a step's second micro-batch on (gradients accumulated across micro-batches)
    forward: float  # + at the end of a micro-batch's forward (weights gathered and kept for backward)
    step: float  # + at the optimizer step (gradients, their fp32 partitions)
    host: float  # on the host throughout a step, with offload (master weights, optimizer states)

    def at_forward(self, accumulating: bool = False) -> float:
        """On the GPU at a micro-batch's activation peak (the end of its forward), the step's first micro-batch
        or (`accumulating`) a later one."""
        return self.resident + self.forward + (self.accumulating if accumulating else 0.0)

    @property
    def at_step(self) -> float:
        return self.resident + self.step

    def need(self, micro_batch: int, per_sample: float, accumulating: bool = False) -> float:
        """On the GPU at the most of a step's two instants with `micro_batch` samples of `per_sample` activation
        bytes: the end of a micro-batch's forward (a later micro-batch's with `accumulating`) and the optimizer step.
        The one quantity every answer compares with a GPU's memory, so that none can say a micro-batch fits that
        another refuses."""
        return max(self.at_forward(accumulating) + micro_batch * per_sample, self.at_step)

    @property
    def floor(self) -> float:
        """On the GPU at some instant of every step, whatever the micro-batch."""
        return max(self.at_forward(), self.at_step)

    @property
    def peak(self) -> float:
        """The most model-state bytes the bound says are on the GPU at one instant (DeepSpeed's estimators'
        quantity)."""
        return max(self.at_forward(True), self.at_step)


def model_states(
    sharding: str | None, offload: bool, params: float, world: int, precision: str | None = None, nodes: int = 1
) -> StateBytes:
    """The engine's model states per rank (module docstring: the table); `precision` the recipe's (None:
    unknown, the least of any). Hybrid sharding (hsdp) divides them among a node's ranks only (world / `nodes`):
    as fsdp-full there; with `nodes` unknown (1) among every rank, still a lower bound."""
    p, b = float(params), width(precision)
    w = shard_ranks(sharding, world, nodes)
    engine, level = SHARDING_ENGINE.get(sharding or ""), SHARDING_LEVEL.get(sharding or "", 0)
    adam = ADAM_B * p
    if engine is None:  # one GPU or DDP: fp32 weights (autocast casts per op), gradient_as_bucket_view buckets
        grads = GRAD_B * p
        if w > 1:
            return StateBytes(MASTER_B * p + adam + grads, 0.0, 0.0, 0.0, 0.0)
        return StateBytes(MASTER_B * p + adam, grads, 0.0, grads, 0.0)
    if engine == "fsdp":
        shards, grads = (MASTER_B * p + adam) / w, GRAD_B * p / w
        gathered = b * p if level == 2 else 0.0  # fsdp-grad keeps every unit's gathered weights until backward
        if offload:
            return StateBytes(0.0, 0.0, gathered, 0.0, shards)  # its gradients reach the host at the step
        return StateBytes(shards, grads, gathered, grads, 0.0)
    master = 0.0 if b == MASTER_B and level == 3 and not offload else MASTER_B * p / w
    if level == 3:
        partitions = (b * p + master + adam + b * p) / w  # weights, master, Adam, gradients: partitioned
        return StateBytes(0.0, 0.0, 0.0, 0.0, partitions) if offload else StateBytes(partitions, 0.0, 0.0, 0.0, 0.0)
    flat = b * p  # ZeRO-1/2: every rank keeps the whole flat 16-bit weights
    grads_16 = b * p if level == 1 else b * p / w  # ZeRO-1 accumulates whole 16-bit gradients, ZeRO-2 its partition
    fp32_grads = GRAD_B * p / w
    if offload:  # the master, Adam and the fp32 gradients live on the host; ZeRO-2 reduces into them there
        return StateBytes(flat, grads_16 if level == 1 else 0.0, 0.0, 0.0, master + adam / w + fp32_grads)
    return StateBytes(flat + master + adam / w, grads_16, 0.0, fp32_grads, 0.0)


def state_bytes_lb(
    sharding: str | None,
    offload: bool,
    params: float,
    world: int,
    precision: str | None = None,
    accumulating: bool = False,
) -> float:
    """Model-state bytes certainly on one GPU at a micro-batch's activation peak (a lower bound), in a step's
    first micro-batch or (`accumulating`) a later one: what a micro-batch's activations are added to."""
    return model_states(sharding, offload, params, world, precision).at_forward(accumulating)


def method_of(method: Method | str) -> Method:
    return parse(method) if isinstance(method, str) else method


def _head_bytes(model: ModelSpec, fused: bool) -> float:
    """Bytes per sample a plain vocabulary head's loss saves: the log-probabilities (fp32 for a causal LM, whose
    logits transformers upcasts; the activation width for a masked LM; nothing for sparse prediction, which
    keeps a random share of the rows)."""
    if fused or not model.kind.vocab_head or model.arch.get("sparse_prediction"):
        return 0.0
    tokens = tokens_per_sample(model.to_dict()) or 0
    per = 4 if model.task == "causal_lm" else width(model.recipe.precision)
    return float(tokens * model.arch["vocab_size"] * per)


def activation_bytes_per_sample(model: ModelSpec, method: Method | str | None = None) -> float | None:
    """A lower bound of the activation bytes one sample holds at the end of its forward under `method` (module
    docstring); None: the least of any method without activation checkpointing (compiled, fused head). None for
    a family without a formula."""
    if method is None:
        compiled, eager, ac, fused = model.supports_compile, False, False, model.kind.vocab_head
    else:
        m = method_of(method)
        compiled, ac, fused = compiles(m, model.to_dict()), m.checkpointing, m.fused_ce
        eager = model.kind.attention and attention_for(m) == "eager" and not compiled
    as_dict, form = model.to_dict(), model.kind.closed_form
    per_layer = None if form is None else form.layer_elements(as_dict, compiled, eager)  # formulas.py
    tokens = tokens_per_sample(as_dict)
    if per_layer is None or tokens is None:
        return None
    layers = model.arch["num_hidden_layers"]
    elements = layers * model.arch["hidden_size"] if ac else layers * per_layer
    return tokens * elements * width(model.recipe.precision) + _head_bytes(model, fused)


def activation_estimate(model: ModelSpec) -> float | None:
    """What a sample is expected to hold without checkpointing (the search's guess, not a bound): Korthikanti et
    al.'s 34 s h bytes per layer for 16-bit activations (x2 for fp32 recipes)."""
    a = model.arch
    if "hidden_size" not in a or "num_hidden_layers" not in a:
        return None
    tokens = tokens_per_sample(model.to_dict())
    if tokens is None:
        return None
    return 34.0 * tokens * a["hidden_size"] * a["num_hidden_layers"] * (2 if model.recipe.precision == "fp32" else 1)


def largest_micro_batch(
    states: StateBytes, per_sample: float, capacity: float, top: int, per_rank_batch: int | None = None
) -> int:
    """The largest micro-batch, halving from `top` as the trainer tries them, that the lower bounds let fit in
    `capacity` bytes (its model states at a forward's end plus `per_sample` bytes per sample, and at the step);
    0: none. An upper bound of the largest that really fits. A micro-batch below `per_rank_batch` (None: the
    same as `top`) accumulates gradients across micro-batches."""
    full = top if per_rank_batch is None else per_rank_batch
    micro_batch = top
    while micro_batch >= 1 and states.need(micro_batch, per_sample, micro_batch < full) > capacity:
        micro_batch //= 2
    return micro_batch


def bounds(model: ModelSpec, method: Method | str, world: int, nodes: int = 1) -> tuple[StateBytes, float] | None:
    """(the model states per rank, the activation bytes per sample) of `method` on `world` GPUs over `nodes`
    machines, at the recipe's precision: what `need_bytes` and `predicted_micro_batch` compare with a GPU's memory.
    Activations of a family without an activation formula count 0 bytes (the model states alone: still a lower
    bound, the loosest, so that a model no one can fit is still refused); None when the parameters are unknown."""
    m = method_of(method)
    params = param_count(model.to_dict())
    if params is None:
        return None
    act = activation_bytes_per_sample(model, m) or 0.0
    return model_states(m.sharding, m.offload, params, world, model.recipe.precision, nodes), act


def need_bytes(
    model: ModelSpec,
    method: Method | str,
    world: int,
    micro_batch: int = 1,
    nodes: int = 1,
    per_rank_batch: int | None = None,
) -> float | None:
    """The bytes per GPU `method` needs at `micro_batch` by the lower bounds (StateBytes.need: its activations with
    the method's head, compilation and checkpointing; a micro-batch below `per_rank_batch` accumulates gradients,
    None: the step's first micro-batch). A micro-batch fits iff this is within the GPU's memory, the test
    `predicted_micro_batch` halves by; None when the parameters are unknown."""
    got = bounds(model, method, world, nodes)
    if got is None:
        return None
    states, act = got
    return states.need(micro_batch, act, per_rank_batch is not None and micro_batch < per_rank_batch)


def predicted_micro_batch(
    model: ModelSpec,
    method: Method | str,
    world: int,
    memory_gib: float,
    top: int,
    per_rank_batch: int | None = None,
    nodes: int = 1,
) -> int | None:
    """The largest micro-batch `method` can fit on `world` GPUs of `memory_gib` GiB by the lower bounds (an upper
    bound of what fits; 0: none), halving from `top`; None when the parameters are unknown (no formula)."""
    got = bounds(model, method, world, nodes)
    if got is None:
        return None
    states, act = got
    return largest_micro_batch(states, act, memory_gib * GIB, top, per_rank_batch)


@dataclass(frozen=True)
class MemoryFacts:
    """What the search knows of one setting's memory: GPU capacity, parameters, activations per sample."""

    capacity: float | None  # bytes per GPU; None = unknown (the `cpu` stand-in)
    params: float | None
    activation_est: float | None  # bytes per sample without checkpointing (activation_estimate: a guess)
    precision: str | None = None  # the recipe's (None: unknown, the model states' least)
    activation_lbs: tuple[tuple[str, float], ...] = ()  # (method slug, activation_bytes_per_sample) of the setting

    @classmethod
    def of(cls, model: ModelSpec, memory_gib: float | None, methods: tuple[str, ...] = ()) -> MemoryFacts:
        params = param_count(model.to_dict())
        lbs = tuple((m, lb) for m in methods if (lb := activation_bytes_per_sample(model, m)) is not None)
        return cls(
            memory_gib * GIB if memory_gib else None, params, activation_estimate(model), model.recipe.precision, lbs
        )

    def states(self, sharding: str | None, offload: bool, world: int) -> StateBytes:
        return model_states(sharding, offload, self.params or 0.0, world, self.precision)

    def activation_lb(self, slug: str) -> float | None:
        """The activation lower bound per sample of a method of the setting (None: unknown)."""
        return dict(self.activation_lbs).get(slug)

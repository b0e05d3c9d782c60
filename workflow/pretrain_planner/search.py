"""Adaptive search: measure only the cells of a setting that can still be its fastest method.

The exhaustive study measures every valid method of every (model, GPU type, nodes, GPUs per node); most
cannot win. Here each setting first measures its probes (the bare member of each method family: `naive`,
`fl`, and `fl` with any throughput lever such as `fl+liger`), then each round reads what was measured,
prunes every open method it can, with the reason, and schedules the one candidate the time model expects
fastest; a round that schedules nothing ends the search. A method is pruned by three kinds of argument.

Sound: what cannot win under a worst-case model (a proof, given the model):
- Work order. Within a family, adding activation checkpointing (the forward runs again: a third of the
  step's FLOPs, at most at `benchmark.suspect_mfu` of the GPU's peak), adding offload, or sharding more
  (none < zero1 < zero2 < zero3; none < fsdp-grad < fsdp-full) never makes a step faster at the same
  micro-batch, and never needs more memory.
- Micro-batches. A larger micro-batch never makes a step slower, a k times larger one makes it at most k
  times faster, and once a micro-batch holds `search.saturated_tokens` tokens the GPU is busy: an
  unsharded step gains nothing more (a sharded one communicates every micro-batch, so it keeps gaining).
- Memory. Model states (memory.py, DeepSpeed's estimator) are a lower bound of a step's peak: a method
  whose model states alone exceed the GPU's memory cannot fit; with half the activation bytes per sample
  measured by a probe (CUDA peaks only) they bound the largest micro-batch; a method that saves no more
  memory than one that did not fit micro-batch b does not fit b either.
- Hence a method is pruned when it cannot fit, or when a measured method below it in the work order,
  scaled by the most its larger micro-batch could gain, is already no faster than the best step measured.

The study's findings (the "$100K" study; issue 8), adopted as this model's assumptions, each with its reason.
"Expected to reach" is, for the method compared with, the memory model's micro-batch (`_predicted_mbs`:
model states + the overhead a measured peak showed + activations per sample, inflated until it predicts no
measured cell to fit more than it did), and for the method judged the most it may plausibly reach
(`_optimistic_mb`, no less than the memory model's: the doubt goes to the method); "enough" is that
micro-batch, capped at saturation for an unsharded step (a sharded one communicates every micro-batch, so a
larger one pays beyond it). A method waits ("defer") while the
method it is compared with is open and expected to fit enough; a pruned one stands in by its expectation.
1. Offloading is slower than not offloading whenever both fit: X+off is a candidate only when X (the same
   method without `off`) does not fit, or fits less than enough ("offloading is slower ...").
2. Activation checkpointing only pays when it lets a larger micro-batch or the model fit at all: the same
   test for X+ac against X ("activation checkpointing only pays ...").
3. Full sharding only when memory forces it: a more-sharded method is a candidate only when each
   less-sharded one of its engine (zero1 < zero2 < zero3; fsdp-grad < fsdp-full; and for full sharding,
   zero3 / fsdp-full, those of either engine) does not fit the micro-batch it is expected to reach
   ("full sharding only when memory forces it ...").
4. The free lunch: `fl` is `naive` with faster kernels and no more memory, so the memory-saving variants of
   `naive` are searched only when the `naive` probe was faster than `fl` (e.g. on CPU) or `fl` did not run;
   likewise a lever family (`fl+liger`) against its base: the family whose probe was faster (when all OOM,
   the one expected to hold less) is searched ("fl was faster than naive (or both did not fit): ...").

The time model (timemodel.py; a prediction, not a proof) assumes no hardware speed: every interconnect,
CPU-Adam and PCIe bandwidth and small-batch slowdown on wide grids is a hypothesis, fitted to the setting's
measured cells; a method is pruned when even the most favourable kept hypothesis, at the largest micro-batch
it may plausibly reach (`_optimistic_mb`), puts it no more than `search.tolerance` faster than the best
measured step, the reason showing that price and the hardware behind it; among the candidates it orders what
to measure (`_next`).
Imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .flops import train_flops_per_sample
from .memory import GIB, SHARDING_ENGINE, SHARDING_LEVEL, MemoryFacts, state_bytes_lb
from .results import atomic_write_text
from .timemodel import RECOMPUTE_SHARE, Features, Hypotheses, features

STRATEGIES = ("exhaustive", "adaptive")
ROUND_PATTERN = "search/{model}/{gpu}/{nodes}x{gpus_per_node}/round{k}.json"
SEARCH_PATTERN = "search/{model}/{gpu}/{nodes}x{gpus_per_node}/search.json"
ACTIVATION_LB_SHARE = 0.5  # of the measured activation bytes per sample, for the upper bound of a micro-batch
AC_ESTIMATE_SHARE = 0.1  # activations kept with checkpointing, for the guess of the next method only
AC_EXTRA_WORK = 0.25  # checkpointing's extra time, for the guess of the next method only
DEFAULT_TOLERANCE = 0.02  # search.tolerance: the pick may be this much slower than the exhaustive optimum
DEFAULT_MODEL_ERROR = 0.03  # search.model_error: the time model's error on top of its worst fit to measured cells
MEMORY_SAVING_LEVERS = ("fa2", "liger", "flce")  # throughput levers that also hold less (rule 4's tie-break)


# ------------------------------------------------------------------------------------------ the lattice


@dataclass(frozen=True)
class Shape:
    """A method's place in the lattice: its family (base + throughput levers) and its memory savers."""

    slug: str
    family: str
    ac: bool
    sharding: str | None
    offload: bool

    @property
    def level(self) -> int:
        return SHARDING_LEVEL.get(self.sharding or "", 0)

    @property
    def is_probe(self) -> bool:
        return not (self.ac or self.sharding or self.offload)


def shape(slug: str) -> Shape:
    """Split a slug; parts that save no memory (any part but ac, a sharding, off) are throughput levers."""
    base, *parts = slug.split("+")
    levers = [p for p in parts if p != "ac" and p != "off" and p not in SHARDING_LEVEL]
    sharding = next((p for p in parts if p in SHARDING_LEVEL), None)
    return Shape(slug, "+".join([base, *sorted(levers)]), "ac" in parts, sharding, "off" in parts)


def covers(a: Shape, b: Shape) -> bool:
    """a does at least b's work per sample and saves at least b's memory (b <= a in the work order)."""
    if a.family != b.family or a.ac < b.ac or a.offload < b.offload:
        return False
    if b.sharding is None:
        return True
    return a.sharding is not None and SHARDING_ENGINE[a.sharding] == SHARDING_ENGINE[b.sharding] and a.level >= b.level


# ----------------------------------------------------------------------------------------- what we know


@dataclass(frozen=True)
class Observation:
    """What a measured cell says to the search."""

    status: str  # ok | oom | unsupported | corrupt
    micro_batch: int | None = None
    step_time_s: float | None = None
    peak_mem_gib: float | None = None
    peak_mem_kind: str | None = None
    gpu_hours: float = 0.0
    suspect: bool = False

    @classmethod
    def of(cls, row: Mapping[str, Any] | None, world: int) -> Observation:
        """From a result row (aggregate.parse_result); None = an unusable file."""
        if row is None:
            return cls("corrupt")
        wall = row.get("wall_time_s")
        noisy = row["status"] == "noisy"  # it ran at that micro-batch, but its timing is not to be trusted
        return cls(
            "ok" if noisy else row["status"],
            row.get("micro_batch_size"),
            row.get("step_time_s"),
            row.get("peak_mem_gib"),
            row.get("peak_mem_kind"),
            (wall or 0.0) * (row.get("world_size") or world) / 3600,
            bool(row.get("suspect")) or noisy,
        )


@dataclass(frozen=True)
class Setting:
    """One (model, GPU type, nodes, GPUs per node) and its valid methods."""

    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    methods: tuple[str, ...]
    per_rank_batch: int
    top: int  # the largest micro-batch the trainer tries
    memory: MemoryFacts = field(default_factory=lambda: MemoryFacts(None, None, None))
    saturated: int = 8  # a micro-batch this large already keeps the GPU busy (search.saturated_tokens)
    compute_floor_s: float = 0.0  # a step's training FLOPs at the plausible MFU ceiling (0 = unknown)
    tolerance: float = DEFAULT_TOLERANCE  # search.tolerance
    model_error: float = DEFAULT_MODEL_ERROR  # search.model_error

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def folder(self) -> str:
        return f"{self.model}/{self.gpu}/{self.nodes}x{self.gpus_per_node}"


def top_micro_batch(per_rank_batch: int, cap: int | None) -> int:
    """The trainer's first micro-batch: the largest power of two up to the per-rank batch and the cap."""
    top = per_rank_batch if cap is None else min(per_rank_batch, cap)
    return 1 << (max(1, top).bit_length() - 1)


@dataclass
class Decision:
    run: list[str]  # to measure now
    pruned: dict[str, str]  # method -> why it cannot win


def _fits(mb: int, ob: Observation) -> str:
    return f"reached micro-batch {mb}" if ob.status == "ok" else "does not fit micro-batch 1"


def _measured_activation(setting: Setting, observed: Mapping[str, Observation], ac: bool = False) -> float | None:
    """Activation bytes per sample from a measured CUDA peak of a method without (`ac`: with) checkpointing."""
    mem = setting.memory
    if mem.params is None:
        return None
    best = None
    for slug, ob in observed.items():
        s = shape(slug)
        if ob.status != "ok" or s.ac != ac or not ob.micro_batch or not ob.peak_mem_gib:
            continue
        if not (ob.peak_mem_kind or "").startswith("cuda"):
            continue
        states = state_bytes_lb(s.sharding, s.offload, mem.params, setting.world)
        per_sample = max(0.0, ob.peak_mem_gib * GIB - states) / ob.micro_batch
        best = per_sample if best is None else min(best, per_sample)
    return best


def _largest_fitting(cap: int, states: float, per_sample: float, capacity: float) -> int:
    mb = cap
    while mb >= 1 and states + mb * per_sample > capacity:
        mb //= 2
    return mb


def _anchor_note(setting: Setting, mb: int) -> str:
    if mb == setting.per_rank_batch:
        return f"micro-batch {mb} = per-GPU batch"
    if mb == setting.top:
        return f"micro-batch {mb} = the largest tried (benchmark.max_micro_batch)"
    return f"micro-batch {mb}"


def _bound(setting: Setting, s: Shape, observed: Mapping[str, Observation], measured_act: float | None):
    """(largest micro-batch the method can fit, why; or 0 with the reason it fits none)."""
    mem = setting.memory
    cap, why = setting.top, "the largest tried"
    if mem.capacity and mem.params:
        states = state_bytes_lb(s.sharding, s.offload, mem.params, setting.world)
        if states > mem.capacity:
            return 0, (
                f"model states alone need at least {states / GIB:.1f} GiB per GPU "
                f"({mem.params / 1e9:.2f}B parameters x 16 bytes, {s.sharding or 'no sharding'}"
                f"{' + offload' if s.offload else ''}, {setting.world} GPUs) > {mem.capacity / GIB:g} GiB"
            )
        if measured_act and not s.ac:
            fit = _largest_fitting(cap, states, ACTIVATION_LB_SHARE * measured_act, mem.capacity)
            if fit < cap:
                if fit == 0:
                    return 0, (
                        f"model states ({states / GIB:.1f} GiB) + half the measured activations of micro-batch 1 "
                        f"exceed {mem.capacity / GIB:g} GiB"
                    )
                cap, why = fit, "the memory model (model states + half the measured activations per sample)"
    for slug, ob in observed.items():
        other = shape(slug)
        if ob.status not in ("ok", "oom") or not covers(other, s):
            continue
        if ob.status == "oom":
            return 0, f"{slug} saves at least as much memory and does not fit micro-batch 1"
        if ob.micro_batch is not None and ob.micro_batch < cap:
            cap, why = ob.micro_batch, f"{slug} saves at least as much memory and reached only {ob.micro_batch}"
    return cap, why


def _cannot_win(setting: Setting, s: Shape, cap: int, why: str, observed: Mapping[str, Observation]) -> str | None:
    """Why s cannot beat the fastest measured step, or None. A measured A with A <= s bounds s's step from
    below: T(s) >= T(A) x work factor / gain, the gain of going from A's micro-batch to s's largest: at most
    k-fold for a k times larger micro-batch, and none beyond `saturated` samples unless A shards (sharded
    steps communicate every micro-batch, so fewer, larger ones keep paying)."""
    timed = [
        (ob.step_time_s, m) for m, ob in observed.items() if ob.status == "ok" and not ob.suspect and ob.step_time_s
    ]
    if not timed:
        return None
    best_t, best_m = min(timed)
    sat = setting.saturated
    for slug, ob in observed.items():
        a = shape(slug)
        if ob.status != "ok" or ob.suspect or not ob.step_time_s or not ob.micro_batch or not covers(s, a):
            continue
        if cap <= ob.micro_batch:
            extra = "" if cap >= ob.micro_batch else f" (at most {cap}: {why})"
            return (
                f"{slug} already fits {_anchor_note(setting, ob.micro_batch)}; {s.slug} does at least its work "
                f"per sample and cannot fit a larger micro-batch{extra}"
            )
        if a.sharding:  # communicates every micro-batch: fewer, larger ones gain up to linearly
            gain_bound = cap / ob.micro_batch
        else:
            gain_bound = min(cap, sat) / min(ob.micro_batch, sat)
        recompute = RECOMPUTE_SHARE * setting.compute_floor_s if s.ac and not a.ac else 0.0
        lb = ob.step_time_s / gain_bound + recompute
        if lb >= best_t:
            gain = "no faster" if gain_bound <= 1 else f"at most {gain_bound:g}x faster"
            return (
                f"a step takes at least {lb:.4g} s >= {best_t:.4g} s of {best_m}: it does at least the work of "
                f"{slug} ({ob.step_time_s:.4g} s at micro-batch {ob.micro_batch}; a micro-batch up to {cap} is "
                f"{gain}{'' if a.sharding else f' once {sat} samples keep the GPU busy'})"
                + (f", +{recompute:.3g} s to recompute the forward at the MFU ceiling" if recompute else "")
            )
    return None


def decide(setting: Setting, observed: Mapping[str, Observation]) -> Decision:
    """One round: prune what cannot win (with the reason), schedule what might; nothing scheduled = done.

    First the sound rules (`_bound`, `_cannot_win`), then the study's findings (`_domain_rules`), then the
    time model (timemodel.py): it prunes what even its most favourable prediction puts no more than
    `search.tolerance` faster than the best measured step, and picks the one candidate to measure next (probes
    first, all in round 0)."""
    measured_act = _measured_activation(setting, observed)
    pruned: dict[str, str] = {}
    open_: dict[str, int] = {}
    nofit: set[str] = set()  # pruned because it cannot fit (what the rules read as "does not fit")
    for slug in setting.methods:
        if slug in observed:
            continue
        s = shape(slug)
        cap, why = _bound(setting, s, observed, measured_act)
        if cap == 0:
            pruned[slug] = f"{slug}: cannot fit micro-batch 1: {why}"
            nofit.add(slug)
            continue
        why_not = _cannot_win(setting, s, cap, why, observed)
        if why_not:
            pruned[slug] = f"{slug}: {why_not}"
            continue
        open_[slug] = cap
    predicted = _predicted_mbs(setting, observed, open_, measured_act)
    hopeful = {m: _optimistic_mb(setting, shape(m), cap, predicted[m], observed) for m, cap in open_.items()}
    best = _best(observed)
    probes = [m for m in open_ if shape(m).is_probe]
    tm = None if probes else time_model(setting, observed)  # probes first: round 0 needs no time model
    deferred: set[str] = set()
    for _ in range(len(setting.methods) + 1):  # until nothing changes: a pruning can release a deferred method
        before = len(pruned)
        deferred = set()
        for slug in sorted(open_, key=_lattice_rank):
            if slug in pruned:
                continue
            verdict, why = _domain_rules(setting, slug, observed, open_, pruned, nofit, predicted, hopeful)
            if verdict == "prune":
                pruned[slug] = f"{slug}: {why}"
            elif verdict == "defer":
                deferred.add(slug)
        if best and tm is not None:
            for slug in open_:
                if slug in pruned:
                    continue
                mb = hopeful[slug]
                t, hardware = tm.lower(_features(setting, shape(slug), mb))
                if t >= best[0] * (1 - setting.tolerance):
                    pruned[slug] = (
                        f"{slug}: predicted at least {t:.4g} s a step at micro-batch {mb}"
                        f"{f' ({hardware})' if hardware else ''} >= {best[0]:.4g} s of {best[1]} less the "
                        f"{setting.tolerance:.0%} tolerance (the time model: {tm.describe()}; a prediction, "
                        f"not a proof)"
                    )
        if len(pruned) == before:
            break
    candidates = {m: cap for m, cap in open_.items() if m not in pruned and m not in deferred}
    if probes:
        return Decision([m for m in probes if m in candidates], pruned)
    return Decision(_next(setting, candidates, predicted, tm), pruned)


def _optimistic_mb(setting: Setting, s: Shape, cap: int, guess: int, observed: Mapping[str, Observation]) -> int:
    """The micro-batch the time model's most favourable prediction uses: the memory model's guess (which errs on
    the safe side), or the largest that fits by the measured CUDA peaks of the family with the same
    checkpointing: peak = model states + overhead + micro-batch x activations per sample, the two fitted when
    those cells ran two micro-batches or more, else from the one with the closest model states and half its
    activations per sample beyond its micro-batch (the sound bound's assumption). Never more than such a
    method with no more model states reached."""
    mem, guess = setting.memory, max(1, guess)
    if not (mem.params and mem.capacity):
        return guess

    def states(x: Shape) -> float:
        return state_bytes_lb(x.sharding, x.offload, mem.params, setting.world)

    anchors = [
        (states(shape(m)), ob.peak_mem_gib * GIB, ob.micro_batch) for m, ob in observed.items()
        if ob.status == "ok" and ob.micro_batch and ob.peak_mem_gib and (ob.peak_mem_kind or "").startswith("cuda")
        and shape(m).family == s.family and shape(m).ac == s.ac
    ]  # fmt: skip
    if not anchors:
        return guess
    mine = states(s)
    fitted = _overhead_and_activation(anchors)
    sa, peak, ma = min(anchors, key=lambda a: abs(a[0] - mine))
    mb = min([cap] + [m for st, _p, m in anchors if st <= mine])
    while mb > guess:
        if fitted:
            need = mine + fitted[0] + mb * fitted[1]
        else:
            need = peak + mine - sa + (mb - ma) * (peak - sa) / ma
        if need <= mem.capacity:
            break
        mb //= 2
    return max(guess, mb)


def _overhead_and_activation(cells: list[tuple[float, float, int]]) -> tuple[float, float] | None:
    """Least squares of peak - model states = overhead + micro-batch x activations per sample over (model states,
    peak, micro-batch) cells; None unless they ran two micro-batches or more and the fit is physical."""
    if len({m for _s, _p, m in cells}) < 2:
        return None
    xs, ys = [float(m) for _s, _p, m in cells], [p - st for st, p, _m in cells]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    act = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return (my - act * mx, act) if act > 0 else None


def _predict_mb(
    setting: Setting, s: Shape, cap: int, act: float, k: float, overheads: list[tuple[float, float]] | None = None
) -> int:
    """The memory model's guess of the largest micro-batch `s` fits. Without a measured peak: k x (model states +
    micro-batch x `act`), k inflating both to match what was seen; with measured peaks: model states + the
    overhead measured on the cell whose model states are closest to these + k x micro-batch x `act` (`act`:
    activation bytes per sample of `s`, with checkpointing for ac; `overheads`: (model states, overhead) pairs)."""
    mem = setting.memory
    states = state_bytes_lb(s.sharding, s.offload, mem.params or 0.0, setting.world)
    if not overheads:
        return _largest_fitting(cap, k * states, k * act, mem.capacity or 0.0)
    overhead = min(overheads, key=lambda so: (abs(so[0] - states), so[1]))[1]
    return _largest_fitting(cap, states + max(0.0, overhead), k * act, mem.capacity or 0.0)


def _calibrate(
    setting: Setting,
    observed: Mapping[str, Observation],
    act: float,
    ac: bool = False,
    k: float = 1.2,
    overheads: list[tuple[float, float]] | None = None,
    family: str | None = None,
) -> float:
    """The least inflation of the memory model (from `k`) under which it predicts no cell measured so far, of
    `family` (None: any), with (`ac`) or without checkpointing, to fit a larger micro-batch than it did."""
    seen = [
        (shape(m), ob) for m, ob in observed.items()
        if ob.status in ("ok", "oom") and shape(m).ac == ac and (family is None or shape(m).family == family)
    ]  # fmt: skip
    while k < 8 and any(
        _predict_mb(setting, s, setting.top, act, k, overheads) > (ob.micro_batch or 0 if ob.status == "ok" else 0)
        for s, ob in seen
        if ob.status == "oom" or (ob.micro_batch or 0) < setting.top
    ):
        k *= 1.1
    return k


def _predicted_mbs(
    setting: Setting, observed: Mapping[str, Observation], open_: Mapping[str, int], measured_act: float | None
) -> dict[str, int]:
    """The calibrated memory model's micro-batch for every method (a measured one: what it reached, 0 = OOM).

    Activations per sample: the analytic estimate (AC_ESTIMATE_SHARE of it with checkpointing), else the
    measured one. Once a cell's CUDA peak is measured, what it held beyond its model states and activations is
    the overhead (taken from the cell whose model states are closest), and only the activations are inflated
    (k, from 1) until no measured cell is predicted to fit more than it did; each family, with and without
    checkpointing, on its own."""
    mem = setting.memory
    plain = mem.activation_est or measured_act
    if not (mem.capacity and mem.params and plain):
        return {m: open_.get(m, setting.top) for m in setting.methods}
    acts = {False: plain, True: plain * AC_ESTIMATE_SHARE}
    overheads = []
    for m, ob in observed.items():
        if ob.status == "ok" and ob.micro_batch and ob.peak_mem_gib and (ob.peak_mem_kind or "").startswith("cuda"):
            s = shape(m)
            states = state_bytes_lb(s.sharding, s.offload, mem.params, setting.world)
            overheads.append((states, ob.peak_mem_gib * GIB - states - ob.micro_batch * acts[s.ac]))
    ks: dict[tuple[str, bool], float] = {}
    out = {}
    for slug in setting.methods:
        ob = observed.get(slug)
        if ob is not None and ob.status in ("ok", "oom"):
            out[slug] = ob.micro_batch or 0 if ob.status == "ok" else 0
            continue
        s, cap = shape(slug), open_.get(slug, setting.top)
        if (s.family, s.ac) not in ks:  # each family its own: eager attention holds more than SDPA
            ks[s.family, s.ac] = _calibrate(
                setting, observed, acts[s.ac], s.ac, 1.0 if overheads else 1.2, overheads, s.family
            )
        out[slug] = _predict_mb(setting, s, cap, acts[s.ac], ks[s.family, s.ac], overheads)
    return out


def _lattice_rank(slug: str) -> tuple[int, int, int, str]:
    """Less memory saving first: a method's rules read the methods below it."""
    s = shape(slug)
    return (s.level, int(s.ac), int(s.offload), slug)


def _best(observed: Mapping[str, Observation]) -> tuple[float, str] | None:
    timed = [(ob.step_time_s, m) for m, ob in observed.items() if ob.status == "ok" and not ob.suspect]
    return min((t, m) for t, m in timed if t) if any(t for t, _m in timed) else None


def _variant(slug: str, base: str | None = None, **change: Any) -> str:
    """The slug of `slug` with its family's probe (`base`), ac, sharding or off changed (canonical order:
    the family's parts, ac, sharding, off)."""
    s = shape(slug)
    family = base or "+".join(p for p in slug.split("+") if p not in ("ac", "off") and p not in SHARDING_LEVEL)
    ac, sharding, off = change.get("ac", s.ac), change.get("sharding", s.sharding), change.get("offload", s.offload)
    return "+".join([family, *(["ac"] if ac else []), *([sharding] if sharding else []), *(["off"] if off else [])])


def _family_winner(setting: Setting, observed: Mapping[str, Observation]) -> tuple[list[str], str] | None:
    """Rule 4: the families (by their probe's slug) whose memory-saving variants are searched, and why; None =
    not decided yet (a probe not measured, or unusable)."""
    probes = {m: observed.get(m) for m in setting.methods if shape(m).is_probe}
    if len(probes) < 2 or any(ob is None for ob in probes.values()):
        return None
    timed = {f: ob.step_time_s for f, ob in probes.items() if ob.status == "ok" and ob.step_time_s}
    if timed:
        fastest = min(timed.values())
        return [f for f, t in timed.items() if t == fastest], "faster"
    if any(ob.status not in ("oom", "unsupported") for ob in probes.values()):
        return None  # a corrupt probe: no verdict
    runnable = [f for f, ob in probes.items() if ob.status == "oom"] or list(probes)
    score = {f: _memory_thrift(f) for f in runnable}
    top = max(score.values())
    return [f for f in runnable if score[f] == top], "less memory"


def _memory_thrift(family: str) -> tuple[int, int]:
    """How little memory a family is expected to use: the free-lunch base (SDPA attention, no more memory than
    eager), then levers that save memory (fused kernels and head) minus those that add some (CUDA graphs)."""
    base, *levers = family.split("+")
    return (int(base == "fl"), sum(p in MEMORY_SAVING_LEVERS for p in levers) - sum(p == "cg" for p in levers))


def _domain_rules(
    setting: Setting,
    slug: str,
    observed: Mapping[str, Observation],
    open_: Mapping[str, int],
    pruned: Mapping[str, str],
    nofit: set[str],
    predicted: Mapping[str, int],
    hopeful: Mapping[str, int],
) -> tuple[str, str]:
    """The study's findings (rules 1-4 of the module docstring): ("prune", why), ("defer", why) or ("run", "")."""
    s = shape(slug)
    if s.is_probe:
        return "run", ""

    def state(m: str) -> tuple[str, int]:
        """fits (measured micro-batch) | nofit | pruned (predicted) | open (predicted) | absent."""
        if m not in setting.methods:
            return "absent", 0
        ob = observed.get(m)
        if ob is not None:
            if ob.suspect:
                return "absent", 0  # an implausible measurement proves nothing
            if ob.status == "ok" and ob.micro_batch:
                return "fits", ob.micro_batch
            return ("nofit", 0) if ob.status in ("oom", "unsupported") else ("absent", 0)
        if m in nofit:
            return "nofit", 0
        return ("pruned" if m in pruned else "open"), predicted.get(m, 0)

    # 4. the free lunch: the memory-saving variants of the family whose probe was slower are the same methods
    # as the faster family's, with slower kernels
    won = _family_winner(setting, observed)
    own = _variant(slug, ac=False, sharding=None, offload=False)
    if won and own in setting.methods and own not in won[0]:
        winner = won[0][0]
        twin = _variant(slug, base=winner)
        if twin in setting.methods:
            what = "the free-lunch kernels" if own == "naive" else f"{winner}'s kernels"
            return (
                "prune",
                f"{winner} was faster than {own} (or both did not fit): {twin} is the same method with {what}",
            )
    mb_self = hopeful.get(slug, predicted.get(slug, 0))  # the time model's micro-batch: a larger one may pay
    # 1. offloading is slower than not offloading whenever both fit (at the micro-batch that matters), and
    # 2. activation checkpointing only pays when it lets a larger micro-batch or the model fit at all
    for saver, finding in (
        ("offload", "offloading is slower than not offloading whenever both fit"),
        ("ac", "activation checkpointing only pays when it lets a larger micro-batch or the model fit at all"),
    ):
        if not getattr(s, saver):
            continue
        x = _variant(slug, **{saver: False})
        st, mb = state(x)
        # a sharded step communicates every micro-batch: there a larger one pays even beyond saturation
        sat = setting.top if s.sharding and setting.world > 1 else setting.saturated
        enough = min(mb_self, sat, setting.top)
        busy = f" and {sat} samples keep the GPU busy" if mb >= sat and sat < setting.top else ""
        if st == "fits" and mb >= enough:
            return "prune", f"{finding}: {x} fits micro-batch {mb}, {slug} is expected to reach {mb_self}{busy}"
        if st == "pruned" and mb >= 1 and mb >= enough:
            return "prune", (
                f"{finding}: {x} is expected to fit micro-batch {mb}, {slug} {mb_self}{busy}, and {x} was pruned "
                f"({pruned[x].split(': ', 1)[1]})"
            )
        if st == "open" and mb >= 1 and mb >= enough:
            return "defer", f"{x} first"
    # 3. full sharding only when memory forces it: a less-sharded method of the same engine (or, for full
    # sharding, of either engine) that fits the micro-batch this one is expected to reach makes it pointless
    if s.sharding:
        lower = [None] + [
            sh for sh in SHARDING_LEVEL
            if SHARDING_LEVEL[sh] < s.level and (SHARDING_ENGINE[sh] == SHARDING_ENGINE[s.sharding] or s.level == 3)
        ]  # fmt: skip
        waits = []
        for sh in lower:
            x = _variant(slug, sharding=sh)
            st, mb = state(x)
            if st == "fits" and mb >= mb_self:
                return "prune", (
                    f"full sharding only when memory forces it: {x} shards less and fits micro-batch {mb}, no less "
                    f"than the {mb_self} {slug} is expected to reach"
                )
            if st == "pruned" and mb >= 1 and mb >= mb_self:
                return "prune", (
                    f"full sharding only when memory forces it: {x} shards less, is expected to fit micro-batch {mb} "
                    f"(no less than {slug}'s {mb_self}) and was pruned"
                )
            if st == "open" and mb >= 1 and mb >= mb_self:
                waits.append(x)
        if waits:
            return "defer", f"{', '.join(waits)} first"
    return "run", ""


def time_model(setting: Setting, observed: Mapping[str, Observation]) -> Hypotheses:
    """The setting's hardware hypotheses fitted to its timed cells (timemodel.py)."""
    mem = setting.memory
    hyp = Hypotheses.grid(
        mem.params or 0.0, setting.world, setting.per_rank_batch, setting.saturated,
        setting.compute_floor_s / setting.per_rank_batch, setting.model_error,
        any(shape(m).offload for m in setting.methods),
    )  # fmt: skip
    timed = [
        (_features(setting, shape(m), ob.micro_batch), ob.step_time_s) for m, ob in observed.items()
        if ob.status == "ok" and not ob.suspect and ob.step_time_s and ob.micro_batch
    ]  # fmt: skip
    return hyp.fit(timed)


def _features(setting: Setting, s: Shape, mb: int) -> Features:
    st = setting
    return features(s.family, s.ac, s.level, bool(s.sharding), s.offload, mb, st.per_rank_batch, st.world, s.slug)


def _next(setting: Setting, open_: Mapping[str, int], predicted: Mapping[str, int], tm: Hypotheses) -> list[str]:
    """The one candidate with the fastest median prediction of the kept hypotheses (at the micro-batch the memory
    model expects): the likeliest winner, measured before long exploratory cells (the most favourable
    prediction, which decides pruning, would send a micro-batch of 1 on offload first). When the memory model
    expects none to fit, the most memory-saving ones (an OOM there prunes the rest)."""
    if not open_:
        return []
    shapes = {m: shape(m) for m in open_}
    fitting = {m: predicted.get(m, cap) for m, cap in open_.items() if predicted.get(m, cap) >= 1}
    if not fitting:
        pool = list(open_)
        return [m for m in pool if not any(o != m and covers(shapes[o], shapes[m]) for o in pool)]
    if tm.cells or tm.tau_floor:
        times = {m: tm.central(_features(setting, shapes[m], mb)) for m, mb in fitting.items()}
        return [min(fitting, key=lambda m: (times[m], _lattice_rank(m)))]
    # no time model (no FLOPs and nothing measured): the least work among those expected to reach the most
    capped = {m: min(mb, setting.saturated) for m, mb in fitting.items()}
    target = max(capped.values())
    pool = [m for m in fitting if capped[m] == target]
    return [m for m in pool if not any(o != m and covers(shapes[m], shapes[o]) for o in pool)]


# ------------------------------------------------------------------------------------------------ replay


@dataclass
class Replay:
    ran: list[str]
    pruned: dict[str, str]
    rounds: list[list[str]]
    gpu_hours: float
    gpu_hours_exhaustive: float


def replay(setting: Setting, table: Mapping[str, Observation]) -> Replay:
    """Run the search against a complete table of cell results (measured or synthetic), training nothing."""
    observed: dict[str, Observation] = {}
    rounds = []
    while True:
        decision = decide(setting, observed)
        if not decision.run:
            break
        rounds.append(decision.run)
        for m in decision.run:
            observed[m] = table[m]
    spent = sum(table[m].gpu_hours for m in observed)
    total = sum(table[m].gpu_hours for m in setting.methods)
    return Replay(list(observed), decision.pruned, rounds, spent, total)


# ------------------------------------------------------------------------------------- planning helpers


def compute_floor_s(model: Any, gpu: Any, per_rank_batch: int, mfu_ceiling: float) -> float:
    """Seconds a step's forward + backward takes at least: its FLOPs at `mfu_ceiling` of the GPU's highest dense
    peak for the recipe (benchmark.suspect_mfu: a faster step is physically implausible). 0 when unknown."""
    flops = train_flops_per_sample(model.to_dict())
    peak = gpu.peak_for(model.recipe.precision, tf32=True)
    if not flops or not peak:
        return 0.0
    return per_rank_batch * flops / (peak * 1e12 * mfu_ceiling)


def tokens_per_sample(model: Any) -> int:
    """Tokens one sample puts through the model: the sequence, a ViT's patches, else 16x16 image patches."""
    r, a = model.recipe, model.arch
    if r.sequence_length:
        return int(r.sequence_length)
    patch = a.get("patch_size", 16)
    return max(1, (r.image_size // patch) ** 2 + (1 if "patch_size" in a else 0))


def settings(
    planned: Iterable[Any],
    catalog: Any,
    max_micro_batch: int | None,
    saturated_tokens: int = 16384,
    mfu_ceiling: float = 0.85,
    tolerance: float = DEFAULT_TOLERANCE,
    model_error: float = DEFAULT_MODEL_ERROR,
) -> list[Setting]:
    """The settings of a plan (grid.PlannedCell list) with their valid methods, in plan order."""
    groups: dict[tuple[str, str, int, int], list[str]] = {}
    for p in planned:
        c = p.cell
        key = (c.model, c.gpu, c.nodes, c.gpus_per_node)
        methods = groups.setdefault(key, [])
        if p.valid:
            methods.append(c.method)
    out = []
    for (model, gpu, nodes, gpn), methods in groups.items():
        if not methods:
            continue
        spec = catalog.models[model]
        per_rank = spec.recipe.global_batch // (nodes * gpn)
        out.append(
            Setting(
                model, gpu, nodes, gpn, tuple(methods), per_rank, top_micro_batch(per_rank, max_micro_batch),
                MemoryFacts.of(spec, catalog.gpus[gpu].memory_gib),
                max(1, saturated_tokens // tokens_per_sample(spec)),
                compute_floor_s(spec, catalog.gpus[gpu], per_rank, mfu_ceiling), tolerance, model_error,
            )
        )  # fmt: skip
    return out


def predicted_table(setting: Setting, hours: Mapping[str, float]) -> dict[str, Observation]:
    """What the memory model expects every method to do (for the dry run's estimate of adaptive cells)."""
    mem, table = setting.memory, {}
    for slug in setting.methods:
        s = shape(slug)
        mb = setting.top
        if mem.capacity and mem.params and mem.activation_est:
            states = state_bytes_lb(s.sharding, s.offload, mem.params, setting.world) * 1.2
            share = AC_ESTIMATE_SHARE if s.ac else 1.0
            mb = _largest_fitting(mb, states, mem.activation_est * share, mem.capacity)
        ok = mb >= 1
        # relative step time: the work order's factors, and the saturation of small micro-batches
        step = (1 + AC_EXTRA_WORK * s.ac) * (1.5 if s.offload else 1.0) * 1.05**s.level
        step *= min(setting.top, setting.saturated) / min(max(mb, 1), setting.saturated)
        table[slug] = Observation(
            "ok" if ok else "oom", mb if ok else None, step if ok else None, gpu_hours=hours[slug]
        )
    return table


# ------------------------------------------------------------------------------------------ the rules


def round_path(results: str, setting_wc: Mapping[str, Any], k: int) -> str:
    return f"{results}/" + ROUND_PATTERN.format(**setting_wc, k=k)


def cell_result(results: str, setting: Setting, method: str) -> str:
    return f"{results}/cells/{setting.folder}/{method}/result.json"


def read_round(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def round_results(results: str, path: str | Path) -> list[str]:
    """result.json of every cell a round has scheduled so far (what the next round reads)."""
    data = read_round(path)
    return [f"{results}/cells/{data['folder']}/{m}/result.json" for m in data["ran"]]


def write_round(
    setting: Setting, k: int | str, inputs: Any, results: str, out_json: str, log_path: str | None = None
) -> dict[str, Any]:
    """The `search_round` checkpoint: read the results so far, prune and schedule, write the decision.
    `inputs` is the rule's input (a mapping; round 0 has none, later rounds name the `previous` round)."""
    from .aggregate import parse_result

    k = int(k)
    previous = inputs.get("previous") if hasattr(inputs, "get") else None
    ran: list[str] = read_round(previous)["ran"] if previous else []
    observed: dict[str, Observation] = {}
    for m in ran:
        row, _problem = parse_result(cell_result(results, setting, m))
        observed[m] = Observation.of(row, setting.world)
    decision = decide(setting, observed)
    data = {
        "setting": {"model": setting.model, "gpu": setting.gpu, "nodes": setting.nodes,
                    "gpus_per_node": setting.gpus_per_node},
        "folder": setting.folder,
        "round": k,
        "methods": list(setting.methods),
        "observed": {m: asdict(ob) for m, ob in observed.items()},
        "run": decision.run,
        "ran": ran + decision.run,
        "pruned": decision.pruned,
        "done": not decision.run,
        "gpu_hours_spent": sum(ob.gpu_hours for ob in observed.values()),
    }  # fmt: skip
    atomic_write_text(out_json, json.dumps(data, indent=1) + "\n")
    if log_path:
        lines = [f"{setting.folder} round {k}: measured {len(observed)}, run {decision.run or 'nothing (done)'}"]
        lines += [f"PRUNED {why}" for why in decision.pruned.values()]
        atomic_write_text(log_path, "\n".join(lines) + "\n")
    return data


def write_search(last_round: str, out_json: str, log_path: str | None = None) -> None:
    """The `search_done` rule: the final round of a setting, under a name the aggregation can depend on."""
    text = Path(last_round).read_text()
    atomic_write_text(out_json, text)
    if log_path:
        data = json.loads(text)
        ran, pruned, rounds = len(data["ran"]), len(data["pruned"]), data["round"] + 1
        atomic_write_text(log_path, f"{data['folder']}: {ran} cells run, {pruned} pruned, {rounds} rounds\n")


def read_searches(paths: Iterable[str | Path]) -> tuple[list[str], dict[tuple[str, str, int, int, str], str]]:
    """(result.json paths the searches ran, {(model, gpu, nodes, gpus_per_node, method): pruning reason})."""
    results, pruned = [], {}
    for path in paths:
        path = Path(path)
        data = read_round(path)
        root = path.parents[4]  # {results}/search/{model}/{gpu}/{N}x{G}/search.json
        s = data["setting"]
        key = (s["model"], s["gpu"], s["nodes"], s["gpus_per_node"])
        results += [str(root / "cells" / data["folder"] / m / "result.json") for m in data["ran"]]
        for m, why in data["pruned"].items():
            pruned[(*key, m)] = why
    return results, pruned


def latest_rounds(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The newest round file of each setting under results/search (for the status view), by folder."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in Path(results_dir, "search").glob("*/*/*/round*.json"):
        try:
            k = int(path.stem.removeprefix("round"))
            data = read_round(path)
        except (ValueError, OSError):
            continue
        if data.get("folder") and (data["folder"] not in out or out[data["folder"]][0] < k):
            out[data["folder"]] = (k, data)
    return {folder: data for folder, (_k, data) in out.items()}

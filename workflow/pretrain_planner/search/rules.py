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
- Memory. Model states as the method's engine holds them (planning/memory.py: per engine and precision,
  checked against DeepSpeed's estimators and the bytes the engines hold) are a lower bound of a step's peak: a
  method whose model states alone exceed the GPU's memory cannot fit; with the activations' lower bound per
  sample (memory.activation_bytes_per_sample), or half the activation bytes per sample measured by a probe
  (CUDA peaks only) where that is more, they bound the largest micro-batch; a method that saves no more memory
  than one that did not fit micro-batch b does not fit b either.
- Hence a method is pruned when it cannot fit, or when a measured method below it in the work order,
  scaled by the most its larger micro-batch could gain, is already no faster than the best step measured.

The study's findings (the "$100K" study; issue 8), adopted as this model's assumptions, each with its reason.
"Expected to reach" is, for the method compared with, the memory model's micro-batch (`predicted_mbs`:
model states + the overhead a measured peak showed + activations per sample, inflated until it predicts no
measured cell to fit more than it did), and for the method judged the most it may plausibly reach
(`optimistic_mb`, no less than the memory model's: the doubt goes to the method); "enough" is that
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
it may plausibly reach (`optimistic_mb`), puts it no more than `search.tolerance` faster than the best
measured step, the reason showing that price and the hardware behind it; among the candidates it orders what
to measure (`_next`), a family with no measured cell by the evidence (`prior`, timemodel.Prior) where given.
Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pretrain_planner.planning.methods import SHARDING_ENGINE, SHARDING_LEVEL
from pretrain_planner.planning.stepmodel import RECOMPUTE_SHARE, Features, features
from pretrain_planner.search.calibration import anchor_note, bound, measured_activation, optimistic_mb, predicted_mbs
from pretrain_planner.search.lattice import (
    MEMORY_SAVING_LEVERS,
    Observation,
    Setting,
    Shape,
    best_measured,
    covers,
    lattice_rank,
    shape,
    variant,
)
from pretrain_planner.search.timemodel import Hypotheses, Prior


@dataclass
class Decision:
    run: list[str]  # to measure now
    pruned: dict[str, str]  # method -> why it cannot win
    order: dict[str, str] = field(default_factory=dict)  # family with no measured cell -> what its order rests on


def _fits(micro_batch: int, ob: Observation) -> str:
    return f"reached micro-batch {micro_batch}" if ob.status == "ok" else "does not fit micro-batch 1"


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
                f"{slug} already fits {anchor_note(setting, ob.micro_batch)}; {s.slug} does at least its work "
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


def decide(setting: Setting, observed: Mapping[str, Observation], prior: Prior | None = None) -> Decision:
    """One round: prune what cannot win (with the reason), schedule what might; nothing scheduled = done.

    First the sound rules (`bound`, `_cannot_win`), then the study's findings (`_domain_rules`), then the
    time model (timemodel.py): it prunes what even its most favourable prediction puts no more than
    `search.tolerance` faster than the best measured step, and picks the one candidate to measure next (probes
    first, all in round 0; a family with no measured cell ordered by the evidence, `prior`)."""
    measured_act = measured_activation(setting, observed)
    pruned: dict[str, str] = {}
    open_: dict[str, int] = {}
    nofit: set[str] = set()  # pruned because it cannot fit (what the rules read as "does not fit")
    for slug in setting.methods:
        if slug in observed:
            continue
        s = shape(slug)
        cap, why = bound(setting, s, observed, measured_act)
        if cap == 0:
            pruned[slug] = f"{slug}: cannot fit micro-batch 1: {why}"
            nofit.add(slug)
            continue
        why_not = _cannot_win(setting, s, cap, why, observed)
        if why_not:
            pruned[slug] = f"{slug}: {why_not}"
            continue
        open_[slug] = cap
    predicted = predicted_mbs(setting, observed, open_, measured_act)
    hopeful = {m: optimistic_mb(setting, shape(m), cap, predicted[m], observed) for m, cap in open_.items()}
    best = best_measured(observed)
    probes = [m for m in open_ if shape(m).is_probe]
    tm = None if probes else time_model(setting, observed, prior)  # probes first: round 0 needs no time model
    deferred: set[str] = set()
    for _ in range(len(setting.methods) + 1):  # until nothing changes: a pruning can release a deferred method
        before = len(pruned)
        deferred = set()
        for slug in sorted(open_, key=lattice_rank):
            if slug in pruned:
                continue
            verdict, why = _domain_rules(Knowledge(setting, observed, pruned, nofit, predicted, hopeful), slug)
            if verdict == "prune":
                pruned[slug] = f"{slug}: {why}"
            elif verdict == "defer":
                deferred.add(slug)
        if best and tm is not None:
            for slug in open_:
                if slug in pruned:
                    continue
                micro_batch = hopeful[slug]
                t, hardware = tm.lower(_features(setting, shape(slug), micro_batch))
                if t >= best[0] * (1 - setting.tolerance):
                    pruned[slug] = (
                        f"{slug}: predicted at least {t:.4g} s a step at micro-batch {micro_batch}"
                        f"{f' ({hardware})' if hardware else ''} >= {best[0]:.4g} s of {best[1]} less the "
                        f"{setting.tolerance:.0%} tolerance (the time model: {tm.describe()}; a prediction, "
                        f"not a proof)"
                    )
        if len(pruned) == before:
            break
    candidates = {m: cap for m, cap in open_.items() if m not in pruned and m not in deferred}
    if probes:
        return Decision([m for m in probes if m in candidates], pruned)
    run = _next(setting, candidates, predicted, tm)
    return Decision(run, pruned, {fam: why for fam, (_t, why) in tm.guesses.items()})


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


@dataclass(frozen=True)
class Knowledge:
    """What one round knows of the setting's methods, for the study's findings (rules 1-4)."""

    setting: Setting
    observed: Mapping[str, Observation]
    pruned: Mapping[str, str]
    nofit: set[str]
    predicted: Mapping[str, int]
    hopeful: Mapping[str, int]

    def state(self, m: str) -> tuple[str, int]:
        """fits (measured micro-batch) | nofit | pruned (predicted) | open (predicted) | absent."""
        if m not in self.setting.methods:
            return "absent", 0
        ob = self.observed.get(m)
        if ob is not None:
            if ob.suspect:
                return "absent", 0  # an implausible measurement proves nothing
            if ob.status == "ok" and ob.micro_batch:
                return "fits", ob.micro_batch
            return ("nofit", 0) if ob.status in ("oom", "unsupported") else ("absent", 0)
        if m in self.nofit:
            return "nofit", 0
        return ("pruned" if m in self.pruned else "open"), self.predicted.get(m, 0)


def _free_lunch(k: Knowledge, slug: str) -> tuple[str, str] | None:
    """Rule 4: the memory-saving variants of the family whose probe was slower are the same methods as the
    faster family's, with slower kernels."""
    won = _family_winner(k.setting, k.observed)
    own = variant(slug, ac=False, sharding=None, offload=False)
    if won and own in k.setting.methods and own not in won[0]:
        winner = won[0][0]
        twin = variant(slug, base=winner)
        if twin in k.setting.methods:
            what = "the free-lunch kernels" if own == "naive" else f"{winner}'s kernels"
            return (
                "prune",
                f"{winner} was faster than {own} (or both did not fit): {twin} is the same method with {what}",
            )
    return None


def _saver_pays(k: Knowledge, slug: str, s: Shape, mb_self: int) -> tuple[str, str] | None:
    """Rules 1 and 2: offloading is slower than not offloading whenever both fit (at the micro-batch that
    matters), and activation checkpointing only pays when it lets a larger micro-batch or the model fit."""
    for saver, finding in (
        ("offload", "offloading is slower than not offloading whenever both fit"),
        ("ac", "activation checkpointing only pays when it lets a larger micro-batch or the model fit at all"),
    ):
        if not getattr(s, saver):
            continue
        x = variant(slug, **{saver: False})
        st, micro_batch = k.state(x)
        # a sharded step communicates every micro-batch: there a larger one pays even beyond saturation
        sat = k.setting.top if s.sharding and k.setting.world_size > 1 else k.setting.saturated
        enough = min(mb_self, sat, k.setting.top)
        busy = f" and {sat} samples keep the GPU busy" if micro_batch >= sat and sat < k.setting.top else ""
        if st == "fits" and micro_batch >= enough:
            return "prune", (f"{finding}: {x} fits micro-batch {micro_batch}, {slug} is expected to reach "
                             f"{mb_self}{busy}")  # fmt: skip
        if st == "pruned" and micro_batch >= 1 and micro_batch >= enough:
            return "prune", (
                f"{finding}: {x} is expected to fit micro-batch {micro_batch}, {slug} {mb_self}{busy}, and {x} was "
                f"pruned ({k.pruned[x].split(': ', 1)[1]})"
            )
        if st == "open" and micro_batch >= 1 and micro_batch >= enough:
            return "defer", f"{x} first"
    return None


def _memory_forces_sharding(k: Knowledge, slug: str, s: Shape, mb_self: int) -> tuple[str, str] | None:
    """Rule 3: a less-sharded method of the same engine (or, for full sharding, of either engine) that fits
    the micro-batch this one is expected to reach makes it pointless."""
    if not s.sharding:
        return None
    lower = [None] + [
        sh for sh in SHARDING_LEVEL
        if SHARDING_LEVEL[sh] < s.level and (SHARDING_ENGINE[sh] == SHARDING_ENGINE[s.sharding] or s.level == 3)
    ]  # fmt: skip
    waits = []
    for sh in lower:
        x = variant(slug, sharding=sh)
        st, micro_batch = k.state(x)
        if st == "fits" and micro_batch >= mb_self:
            return "prune", (
                f"full sharding only when memory forces it: {x} shards less and fits micro-batch {micro_batch}, no "
                f"less than the {mb_self} {slug} is expected to reach"
            )
        if st == "pruned" and micro_batch >= 1 and micro_batch >= mb_self:
            return "prune", (
                f"full sharding only when memory forces it: {x} shards less, is expected to fit micro-batch "
                f"{micro_batch} (no less than {slug}'s {mb_self}) and was pruned"
            )
        if st == "open" and micro_batch >= 1 and micro_batch >= mb_self:
            waits.append(x)
    return ("defer", f"{', '.join(waits)} first") if waits else None


def _domain_rules(k: Knowledge, slug: str) -> tuple[str, str]:
    """The study's findings (rules 1-4 of the module docstring): ("prune", why), ("defer", why) or ("run", "")."""
    s = shape(slug)
    if s.is_probe:
        return "run", ""
    mb_self = k.hopeful.get(slug, k.predicted.get(slug, 0))  # the time model's micro-batch: a larger one may pay
    return (
        _free_lunch(k, slug)
        or _saver_pays(k, slug, s, mb_self)
        or _memory_forces_sharding(k, slug, s, mb_self)
        or ("run", "")
    )


def time_model(setting: Setting, observed: Mapping[str, Observation], prior: Prior | None = None) -> Hypotheses:
    """The setting's hardware hypotheses fitted to its timed cells (timemodel.py), with the evidence (`prior`) for
    the order of a family none of them times."""
    mem = setting.memory
    hyp = Hypotheses.grid(
        mem.params or 0.0, setting.world_size, setting.per_rank_batch, setting.saturated,
        setting.compute_floor_s / setting.per_rank_batch, setting.model_error,
        any(shape(m).offload for m in setting.methods),
    )  # fmt: skip
    hyp.prior = prior
    timed = [
        (_features(setting, shape(m), ob.micro_batch), ob.step_time_s) for m, ob in observed.items()
        if ob.status == "ok" and not ob.suspect and ob.step_time_s and ob.micro_batch
    ]  # fmt: skip
    return hyp.fit(timed)


def _features(setting: Setting, s: Shape, micro_batch: int) -> Features:
    st = setting
    return features(
        s.family, s.ac, s.level, bool(s.sharding), s.offload, micro_batch, st.per_rank_batch, st.world_size, s.slug
    )


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
        times = {m: tm.central(_features(setting, shapes[m], micro_batch)) for m, micro_batch in fitting.items()}
        return [min(fitting, key=lambda m: (times[m], lattice_rank(m)))]
    # no time model (no FLOPs and nothing measured): the least work among those expected to reach the most
    capped = {m: min(micro_batch, setting.saturated) for m, micro_batch in fitting.items()}
    target = max(capped.values())
    pool = [m for m in fitting if capped[m] == target]
    return [m for m in pool if not any(o != m and covers(shapes[m], shapes[o]) for o in pool)]

"""The memory side of the search: how large a micro-batch a method can fit (an upper bound for the sound
rules: planning/memory.py's lower bounds of model states and activations), and how large it is expected to reach
(the memory model, calibrated on the measured cells so that it never predicts a measured cell to fit more than it
did). Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping

from pretrain_planner.planning.memory import GIB, largest_micro_batch
from pretrain_planner.search.lattice import Observation, Setting, Shape, covers, shape

ACTIVATION_LB_SHARE = 0.5  # of the measured activation bytes per sample, for the upper bound of a micro-batch
AC_ESTIMATE_SHARE = 0.1  # activations kept with checkpointing, for the guess of the next method only


def measured_activation(setting: Setting, observed: Mapping[str, Observation], ac: bool = False) -> float | None:
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
        accumulating = ob.micro_batch < setting.per_rank_batch  # a later micro-batch of an accumulated step
        states = mem.states(s.sharding, s.offload, setting.world_size).at_forward(accumulating)
        per_sample = max(0.0, ob.peak_mem_gib * GIB - states) / ob.micro_batch
        best = per_sample if best is None else min(best, per_sample)
    return best


def _engine(s: Shape) -> str:
    return f"{s.sharding or 'no sharding'}{' + offload' if s.offload else ''}"


def _states(setting: Setting, s: Shape) -> float:
    """The model states the guesses reason with: the most the lower bound says are held at once."""
    return setting.memory.states(s.sharding, s.offload, setting.world_size).peak


def largest_fitting(cap: int, states: float, per_sample: float, capacity: float) -> int:
    micro_batch = cap
    while micro_batch >= 1 and states + micro_batch * per_sample > capacity:
        micro_batch //= 2
    return micro_batch


def anchor_note(setting: Setting, micro_batch: int) -> str:
    if micro_batch == setting.per_rank_batch:
        return f"micro-batch {micro_batch} = per-GPU batch"
    if micro_batch == setting.top:
        return f"micro-batch {micro_batch} = the largest tried (benchmark.max_micro_batch)"
    return f"micro-batch {micro_batch}"


def bound(setting: Setting, s: Shape, observed: Mapping[str, Observation], measured_act: float | None):
    """(largest micro-batch the method can fit, why; or 0 with the reason it fits none). Per sample: the larger
    of the activations' lower bound (memory.activation_bytes_per_sample) and half the activations a probe's CUDA
    peak showed."""
    mem = setting.memory
    cap, why = setting.top, "the largest tried"
    if mem.capacity and mem.params:
        st = mem.states(s.sharding, s.offload, setting.world_size)
        if st.floor > mem.capacity:
            return 0, (
                f"model states alone need at least {st.floor / GIB:.1f} GiB per GPU "
                f"({mem.params / 1e9:.2f}B parameters, {_engine(s)}, {setting.world_size} GPUs) > "
                f"{mem.capacity / GIB:g} GiB"
            )
        analytic = mem.activation_lb(s.slug) or 0.0
        half = ACTIVATION_LB_SHARE * measured_act if measured_act and not s.ac else 0.0
        per_sample = max(analytic, half)
        if per_sample:
            what = "half the measured activations" if half >= analytic else "the activations' lower bound"
            fit = largest_micro_batch(st, per_sample, mem.capacity, cap, setting.per_rank_batch)
            if fit < cap:
                if fit == 0:
                    return 0, (
                        f"model states ({st.at_forward() / GIB:.1f} GiB) + {what} of micro-batch 1 "
                        f"({per_sample / GIB:.2g} GiB) exceed {mem.capacity / GIB:g} GiB"
                    )
                cap, why = fit, f"the memory model (model states + {what} per sample)"
    for slug, ob in observed.items():
        other = shape(slug)
        if ob.status not in ("ok", "oom") or not covers(other, s):
            continue
        if ob.status == "oom":
            return 0, f"{slug} saves at least as much memory and does not fit micro-batch 1"
        if ob.micro_batch is not None and ob.micro_batch < cap:
            cap, why = ob.micro_batch, f"{slug} saves at least as much memory and reached only {ob.micro_batch}"
    return cap, why


def optimistic_mb(setting: Setting, s: Shape, cap: int, guess: int, observed: Mapping[str, Observation]) -> int:
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
        return _states(setting, x)

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
    micro_batch = min([cap] + [m for st, _p, m in anchors if st <= mine])
    while micro_batch > guess:
        if fitted:
            need = mine + fitted[0] + micro_batch * fitted[1]
        else:
            need = peak + mine - sa + (micro_batch - ma) * ACTIVATION_LB_SHARE * (peak - sa) / ma
        if need <= mem.capacity:
            break
        micro_batch //= 2
    return max(guess, micro_batch)


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
    states = _states(setting, s)
    if not overheads:
        return largest_fitting(cap, k * states, k * act, mem.capacity or 0.0)
    overhead = min(overheads, key=lambda so: (abs(so[0] - states), so[1]))[1]
    return largest_fitting(cap, states + max(0.0, overhead), k * act, mem.capacity or 0.0)


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


def predicted_mbs(
    setting: Setting, observed: Mapping[str, Observation], open_: Mapping[str, int], measured_act: float | None
) -> dict[str, int]:
    """The calibrated memory model's micro-batch for every method (a measured one: what it reached, 0 = OOM).

    Activations per sample: the analytic estimate (AC_ESTIMATE_SHARE of it with checkpointing), else the
    measured one, never below the activations' lower bound of the family's methods; model states: the most the
    lower bound says an engine holds at once (memory.StateBytes.peak). Once a cell's CUDA peak is measured, what
    it held beyond its model states and activations is the overhead (taken from the cell whose model states are
    closest), and only the activations are inflated
    (k, from 1) until no measured cell is predicted to fit more than it did; each family, with and without
    checkpointing, on its own."""
    mem = setting.memory
    plain = mem.activation_est or measured_act
    if not (mem.capacity and mem.params and plain):
        return {m: open_.get(m, setting.top) for m in setting.methods}
    shares = {False: plain, True: plain * AC_ESTIMATE_SHARE}
    acts = {}  # per (family, ac): the estimate, never below the activations' lower bound of the family's methods
    for m in setting.methods:
        s = shape(m)
        acts[s.family, s.ac] = max(acts.get((s.family, s.ac), shares[s.ac]), mem.activation_lb(m) or 0.0)
    overheads = []
    for m, ob in observed.items():
        if ob.status == "ok" and ob.micro_batch and ob.peak_mem_gib and (ob.peak_mem_kind or "").startswith("cuda"):
            s = shape(m)
            states = _states(setting, s)
            overheads.append((states, ob.peak_mem_gib * GIB - states - ob.micro_batch * acts[s.family, s.ac]))
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
                setting, observed, acts[s.family, s.ac], s.ac, 1.0 if overheads else 1.2, overheads, s.family
            )
        out[slug] = _predict_mb(setting, s, cap, acts[s.family, s.ac], ks[s.family, s.ac], overheads)
    return out

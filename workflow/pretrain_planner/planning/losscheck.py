"""Whether a method trains the same model as naive: the loss-equivalence check's statistic and verdict.

A method is "free" only if, from the same initial weights and the same batches in the same order, its loss curve
(and its gradient norm, where both runs expose one) stays inside the spread naive itself shows when only what
may legitimately differ changes: the data-parallel reduction order (another world size, another micro-batch split)
and the dropout RNG's seed. That spread is measured per step (`band`), never assumed; the verdict (`verdict`) is:

- the band at step s: the largest |variant - reference| over naive's variants up to step s (a running envelope:
  two trajectories that differ by rounding drift apart with the steps and do not come back), at least
  `FLOOR_REL` of the reference (a band of exactly zero, where every variant is bitwise naive's, would call a
  last-digit difference a change);
- `same`: the mean |method - reference| over the last `tail` share of the steps is within the mean band there,
  and no step is more than `k` x its band away;
- else `differs`, with the step where the curve left (the first step beyond k x the band, else the first step of
  the last run of steps outside the band) and the signed relative difference of the tail's mean (`+3.1%`: the
  method's loss is 3.1% higher).

docs/methods.md "Loss equivalence" says what "same" means and the statistic's measured false-alarm rate
(benchmarks/loss_check_false_alarm.py). Plain data, no torch: the tables, `best` and the export read it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.planning.configtypes import LossCheckSection, require
from pretrain_planner.planning.runspec import batch_split_reason
from pretrain_planner.runlog import fingerprint
from pretrain_planner.schema import section
from pretrain_planner.versions import installed_versions

FLOOR_REL = 1e-4  # the band's floor, relative to the reference: float32 rounding of a loss is ~1e-7
NOT_CHECKED = "not checked"
SAME = "same"
DIFFERS = "differs"
QUANTITIES = ("loss", "grad_norm")  # compared where both runs recorded them, in this order
FAULT_ENV = "PRETRAIN_PLANNER_TEST_LOSS_FAULT"  # a test's faults in named runs (trainer/losscheck.py breaks them)
FAULTS = ("unscaled_accum", "lr_x2", "bf16_no_master")
# what a run's curve depends on besides its own definition and the check's data: the code that trains it
SOFTWARE = ("torch", "transformers", "deepspeed", "pretrain-planner")


def settings(given: Mapping[str, Any] | None = None) -> LossCheckSection:
    """benchmark.loss_check typed, the schema's defaults under what is given: for a caller holding part of a
    config or its JSON (the CLI, the aggregate rule's params, a test); the facade types the whole section."""
    return LossCheckSection.of(section("config", "benchmark.loss_check", dict(given or {})))


@dataclass(frozen=True)
class Verdict:
    """One curve against naive's band: `same` / `differs` (with where and by how much)."""

    verdict: str  # SAME | DIFFERS
    quantity: str  # what decided: loss or grad_norm
    tail_rel: float  # signed mean relative difference over the tail (0.031 = +3.1%)
    worst_ratio: float  # the largest |difference| / band over every step
    left_at: int | None  # the step where the curve left the band (None: same)

    @property
    def text(self) -> str:
        """What the tables show: `same`, `differs +3.1% at step 14`, `differs grad_norm +100% at step 0`."""
        if self.verdict == SAME:
            return SAME
        what = "" if self.quantity == "loss" else f"{self.quantity} "
        return f"{DIFFERS} {what}{self.tail_rel * 100:+.1f}% at step {self.left_at}"

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "text": self.text, "quantity": self.quantity, "tail_rel": self.tail_rel,
                "worst_ratio": self.worst_ratio, "left_at": self.left_at}  # fmt: skip


def band(reference: Sequence[float], variants: Sequence[Sequence[float]]) -> list[float]:
    """Naive's half-width per step: the running maximum of |variant - reference| over the variants, floored."""
    out, envelope = [], 0.0
    for s, ref in enumerate(reference):
        here = max((abs(v[s] - ref) for v in variants if s < len(v) and _finite(v[s])), default=0.0)
        envelope = max(envelope, here)
        out.append(max(envelope, FLOOR_REL * abs(ref)))
    return out


def compare(curve: Sequence[float], reference: Sequence[float], width: Sequence[float], k: float, tail: float,
            quantity: str = "loss") -> Verdict:  # fmt: skip
    """`curve` against `reference` inside `width` (band()): the statistic of the module's docstring."""
    n = min(len(curve), len(reference), len(width))
    if n == 0:
        raise ValueError("loss check: no steps to compare")
    diff = [curve[s] - reference[s] if _finite(curve[s]) else math.inf for s in range(n)]
    ratio = [abs(d) / width[s] for s, d in enumerate(diff)]
    start = max(0, n - max(1, math.ceil(tail * n)))
    mean_diff = sum(abs(d) for d in diff[start:]) / (n - start)
    mean_band = sum(width[start:n]) / (n - start)
    ref_tail = sum(abs(r) for r in reference[start:n]) / (n - start) or 1.0
    tail_rel = sum(diff[start:]) / (n - start) / ref_tail
    worst = max(ratio)
    if mean_diff <= mean_band and worst <= k:
        return Verdict(SAME, quantity, tail_rel, worst, None)
    beyond = next((s for s, r in enumerate(ratio) if r > k), None)
    if beyond is None:  # the first step of the last run of steps outside the band
        beyond = n - 1
        while beyond > 0 and ratio[beyond - 1] > 1.0:
            beyond -= 1
    return Verdict(DIFFERS, quantity, tail_rel if math.isfinite(tail_rel) else math.inf, worst, beyond)


def judge(run: dict[str, Any], reference: dict[str, Any], variants: Sequence[dict[str, Any]], k: float,
          tail: float) -> Verdict:  # fmt: skip
    """A run's curves (`loss`, `grad_norm`: lists per step) against the reference run's within the variants' band:
    the loss first, then the gradient norm where the run, the reference and a variant all recorded it; the first
    quantity that differs decides."""
    verdicts = []
    for q in QUANTITIES:
        mine, ref = run.get(q), reference.get(q)
        others = [v[q] for v in variants if _complete(v.get(q))]
        if not (_complete(mine) and _complete(ref)) or (q != "loss" and not others):
            continue
        verdicts.append(compare(mine, ref, band(ref, others), k, tail, q))
    if not verdicts:
        raise ValueError("loss check: the run recorded no loss")
    return next((v for v in verdicts if v.verdict == DIFFERS), verdicts[0])


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _complete(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(v is not None for v in values)


# --- reading a check's record -------------------------------------------------------------------------------
def read(path: str | Path) -> dict[str, Any] | None:
    """A setting's loss_check.json (None: absent or unreadable: `not checked`)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def allowed(text: str | None, allow_differs: bool = False) -> bool:
    """Whether `best` may pick a method with this verdict: `same` or `not checked`, or anything when allowed."""
    return allow_differs or text is None or not text.startswith(DIFFERS)


# --- why a method is `not checked` -----------------------------------------------------------------------------
NO_REFERENCE = "naive is not swept at the setting (sweep.methods): no reference to check against; add naive to check"


def has_reference(methods: Sequence[str]) -> bool:
    """Whether a setting whose valid methods are `methods` can be checked: every verdict compares with naive's own
    curve from the same setting, so a setting without a naive cell has nothing to compare with. Its check is not
    planned (the pipeline's loss_check_folders) rather than planned as a job that can only record this."""
    return "naive" in methods


def unplanned(conf: LossCheckSection, methods: Sequence[str]) -> str | None:
    """Why a setting with valid methods `methods` has no check planned (None: it has one), in the words `best`,
    loss_check.md and report.md use."""
    require(conf, LossCheckSection, "planning.losscheck.unplanned")
    if conf.mode == "off":
        return "benchmark.loss_check.mode is off"
    return None if has_reference(methods) else NO_REFERENCE


def why_unchecked(method: str, record: dict[str, Any] | None, conf: LossCheckSection, methods: Sequence[str]
                  ) -> str:  # fmt: skip
    """Why `method` has no verdict at its setting: the plan's reason, else the setting's check record's (its
    `note`: naive did not train there, the check batch does not split, the pick is naive), else the mode's."""
    reason = unplanned(conf, methods)
    if reason:
        return reason
    if record is None:
        return "the setting's check has not run yet"
    if record.get("note"):
        return str(record["note"])
    if conf.mode == "chosen":
        return (f"{method} was not the setting's pick when the check ran (benchmark.loss_check.mode chosen checks "
                "the pick only; `all` checks every method)")  # fmt: skip
    return "the check recorded no verdict for it (tables/loss_check.md)"


# --- which runs a setting's check job makes ------------------------------------------------------------------------


def picked(rows: dict[str, dict[str, Any]]) -> str | None:
    """The setting's pick, as the time_to_train table makes it (tables/aggregate._simplest_of_tied): of the ok, not
    suspect cells whose median step is at most the fastest's p90 step (a tie inside its noise), the one with the
    fewest method parts, then the fastest."""
    ok = [(r["step_time_s"], m) for m, r in rows.items() if r.get("status") == "ok" and not r.get("suspect")
          and r.get("step_time_s") is not None]  # fmt: skip
    if not ok:
        return None
    fast_s, fast = min(ok)
    p90 = rows[fast].get("step_time_p90_s") or fast_s
    return min((m.count("+"), s, m) for s, m in ok if s <= p90)[2]


def precision_key(settings: Any) -> tuple[Any, ...]:
    """What a method computes in (planning.settings.Settings): a change here is a precision change, named apart."""
    return (settings.autocast, settings.tf32)


def plan_runs(rows: dict[str, dict[str, Any]], conf: LossCheckSection, model: dict[str, Any], gpu: dict[str, Any],
              world: int, nodes: int, cuda: bool) -> tuple[list[dict[str, Any]], str | None, int]:  # fmt: skip
    """(the runs of a setting's check job, why there are none, the check's global batch), from the setting's cell
    results by method (`rows`) and `benchmark.loss_check` (`conf`): naive as the reference, naive's variants
    (half its micro-batch; other dropout seeds where the model has dropout), each method to check (`chosen`: the
    pick; `all`: every method that ran), and for a method that computes in another precision, naive at that
    precision with its own variant."""
    from pretrain_planner.planning.runspec import RunSpec
    from pretrain_planner.planning.settings import resolve
    from pretrain_planner.results import RAN

    require(conf, LossCheckSection, "planning.losscheck.plan_runs")
    size = int(conf.global_batch or model["recipe"]["global_batch"])
    if conf.mode == "off":
        return [], "benchmark.loss_check.mode is off", size
    why = batch_split_reason(size, world)
    if why:
        return [], f"the check's {why}", size
    naive = rows.get("naive")
    if naive is None or naive.get("status") not in RAN:
        why = "not measured" if naive is None else naive.get("status")
        return [], f"naive did not train at this setting ({why}): no reference", size
    if conf.mode == "chosen":
        pick = picked(rows)
        methods = [pick] if pick and pick != "naive" else []
    else:
        methods = sorted(m for m, r in rows.items() if m != "naive" and r.get("status") in RAN)
    if not methods:
        return [], "the pick is naive itself: nothing to check" if conf.mode == "chosen" else None, size

    def micro_batch_of(method: str) -> int:
        micro_batch = min(int(rows[method]["micro_batch"]), size // world)
        while (size // world) % micro_batch:
            micro_batch -= 1
        return micro_batch

    def settings_of(method: str, micro_batch: int) -> Any:
        spec = RunSpec.of(model, gpu, method, world, cuda=cuda, nodes=nodes)
        return resolve(spec, micro_batch, size // (world * micro_batch))

    def naive_runs(suffix: str, overrides: dict[str, Any], role: str) -> list[dict[str, Any]]:
        micro_batch = micro_batch_of("naive")
        out = [{"name": f"naive{suffix}", "method": "naive", "micro_batch": micro_batch, "dropout_seed": 0,
                "overrides": overrides, "role": role}]  # fmt: skip
        if micro_batch >= 2:
            out.append(
                {
                    "name": f"naive{suffix}~mb{micro_batch // 2}",
                    "method": "naive",
                    "micro_batch": micro_batch // 2,
                    "dropout_seed": 0,
                    "overrides": overrides,
                    "role": "variant",
                    "of": f"naive{suffix}",
                }
            )
        for seed in range(1, conf.seeds):
            out.append({"name": f"naive{suffix}~dropout{seed}", "method": "naive", "micro_batch": micro_batch,
                        "dropout_seed": seed, "overrides": overrides, "role": "variant", "of": f"naive{suffix}",
                        "only_if_dropout": True})  # fmt: skip
        return out

    runs = naive_runs("", {}, "reference")
    base = precision_key(settings_of("naive", micro_batch_of("naive")))
    precisions: dict[tuple[Any, ...], str] = {}
    for m in methods:
        key = precision_key(settings_of(m, micro_batch_of(m)))
        entry = {"name": m, "method": m, "micro_batch": micro_batch_of(m), "dropout_seed": 0, "role": "method",
                 "against": "naive"}  # fmt: skip
        if key != base:
            name = precisions.get(key)
            if name is None:
                name = precisions[key] = (
                    "~" + "+".join(p for p, on in (("tf32", key[1]), (f"autocast-{key[0]}", key[0] != base[0])) if on)
                    if key[1] or key[0] != base[0]
                    else "~fp32"
                )
                runs += naive_runs(name, {"tf32": key[1]}, "precision")
            entry["against"] = f"naive{name}"
        runs.append(entry)
    return runs, None, size


def faults() -> dict[str, str]:
    """Run name -> the fault a test asks to break it with (FAULT_ENV="run=fault[;run=fault]"; never set by the
    pipeline)."""
    raw = os.environ.get(FAULT_ENV, "").strip()
    out = {}
    for part in filter(None, (p.strip() for p in raw.split(";"))):
        name, _, fault = part.partition("=")
        if fault not in FAULTS:
            raise ValueError(f"{FAULT_ENV}={raw!r}: fault {fault!r} is not one of {', '.join(FAULTS)}")
        out[name] = fault
    return out


def identity(spec: dict[str, Any]) -> str:
    """What a setting's check runs on besides each run's definition: the model and GPU type as planned, the setting's
    layout and the software that trains it (a digest; a check record holds it, so a later check knows which of its
    runs still stand)."""
    c = spec["cell"]
    return fingerprint(spec["model"], spec["gpu"], [c["model"], c["gpu"], c["nodes"], c["gpus_per_node"]],
                       spec["benchmark"].get("device"), installed_versions(SOFTWARE))  # fmt: skip


def run_key(run: dict[str, Any], check: dict[str, Any]) -> str:
    """A run's key: its definition and what its curve depends on besides (the check's identity, steps, global batch,
    seed and initial weights). Equal keys, equal curves: a setting's check job runs again whenever a cell of the
    setting changes (a method added, a cell measured again), and the runs it made before need not run again."""
    return fingerprint(run, [check.get(k) for k in ("identity", "steps", "global_batch", "seed", "init")])


def keepable(run: dict[str, Any]) -> bool:
    """A run's record worth keeping for a later check: not broken by a test's fault, and finished (its loss at every
    step, or skipped, or refused with the reason)."""
    return not run.get("test_fault") and bool(run.get("skipped") or run.get("error") or _complete(run.get("loss")))


def kept_run(path: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """The kept record at `path` of the run `run` (None: none, unreadable, another run's, or asked to be broken now
    by a test's fault)."""
    if run["name"] in faults():
        return None
    got = read(path)
    if not got or any(got.get(k) != v for k, v in run.items()) or not keepable(got):
        return None
    return got


def cost_gpu_hours(runs: int, steps: int, step_time_s: float | None, world: int) -> float | None:
    """The check's GPU-hours: runs x steps x the measured step time x ranks (None: no step time)."""
    return runs * steps * step_time_s * world / 3600 if step_time_s else None


def _usable(run: dict[str, Any]) -> bool:
    return not run.get("skipped") and not run.get("error") and _complete(run.get("loss"))


def judge_records(records: list[dict[str, Any]], k: float, tail: float) -> list[dict[str, Any]]:
    """Every checked method's verdict (and every precision change's own line), from the settings' check records
    (trainer/losscheck.py's curves files). A reference's band: its own variants, and naive's reference runs at the
    other world sizes of the same model, GPU type, check batch, seed and steps (another data-parallel reduction
    order, a legitimate difference)."""
    refs: dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]] = {}
    for rec in records:
        for run in rec.get("runs") or []:
            if run.get("role") in ("reference", "precision") and _usable(run):
                refs.setdefault((*_ident(rec), run["name"]), []).append((folder_of(rec), run))
    rows = []
    for rec in records:
        runs = {r["name"]: r for r in rec.get("runs") or []}
        for name, run in runs.items():
            if run.get("role") == "method":
                rows.append(_line(rec, runs, refs, name, run.get("against", "naive"), "method", k, tail))
            elif run.get("role") == "precision":
                rows.append(_line(rec, runs, refs, name, "naive", "precision", k, tail))
    return rows


def _ident(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two settings' reference runs comparable: the same model, GPU type, batches and steps."""
    s, c = rec["setting"], rec["check"]
    return (s["model"], s["gpu"], c["global_batch"], c["seed"], c["steps"])


def _line(rec: dict[str, Any], runs: dict[str, dict[str, Any]], refs: dict[tuple[Any, ...], list[Any]], name: str,
          against: str, role: str, k: float, tail: float) -> dict[str, Any]:  # fmt: skip
    """One row of the loss_check table: run `name` against run `against` inside the band of the latter's
    variants (its own, and its twins at the model's other settings)."""
    run, ref = runs.get(name), runs.get(against)
    base = {**rec["setting"], "method": name, "role": role, "against": against, "steps": rec["check"]["steps"],
            "global_batch": rec["check"]["global_batch"]}  # fmt: skip
    if run is None or ref is None or not _usable(ref):
        return {**base, "loss": NOT_CHECKED, "note": "the reference did not run"}
    if not _usable(run):
        return {**base, "loss": NOT_CHECKED, "note": run.get("error") or run.get("skipped") or "no loss"}
    here = folder_of(rec)
    band_runs = [r for r in runs.values() if r.get("of") == against and _usable(r)]
    band_runs += [r for f, r in refs.get((*_ident(rec), against), []) if f != here]
    v = judge(run, ref, band_runs, k, tail)
    return {**base, **v.as_dict(), "loss": v.text, "band_runs": len(band_runs), "test_fault": run.get("test_fault")}


def folder_of(rec: dict[str, Any]) -> str:
    """A record's setting folder ({model}/{gpu}/{N}x{G})."""
    s = rec["setting"]
    return f"{s['model']}/{s['gpu']}/{s['nodes']}x{s['gpus_per_node']}"

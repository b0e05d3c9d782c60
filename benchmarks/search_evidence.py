"""What the evidence is worth to the adaptive search, and which of its uses are safe (issue 40).

The search measures every method family's probe first, then prunes on what the setting itself measured; the evidence
(the shipped, imported and own rows the what-if uses) could enter it in three places. Each is replayed here on
tests/test_search.py's simulator (the five lattices of the tests and every setting of config/paper.yaml it can model,
on the tests' machine and others), in GPU-hours spent / exhaustive and the worst pick's days against the exhaustive
optimum (**wrong**: more than 2% slower):

1. The order (adopted, for a family with no timed cell): the evidence's seconds per sample replace the fixed guess of
   half the MFU ceiling (planning/evidence_prior.py). Replayed with no evidence, with the simulator's exact compute
   (perfect evidence), with it 0.7x and 1.5x off (the evidence's band), and with the shipped evidence itself (its
   numbers are another machine's than the simulator's: the code path, not its accuracy). The ceiling of any order is
   replayed too: the true fastest candidate measured next.
2. The order of every candidate by method ratios measured elsewhere (not adopted): each candidate priced at the
   setting's measured cells times its ratio to them on another machine (another GPU type or site: the same lattice
   simulated on other hardware).
3. Hardware shared across the site's settings (not adopted): the hypotheses (bus, CPU Adam, PCIe, small-batch
   exponent) kept only where they also explain the cells the site measured for other models on the same GPU type and
   layout (every dimension, or the bus only), with one bus per machine and with a bus an all-reduce reaches more of
   as its message grows (x (parameters / 7e9) ** 0.3, at most 1).

2 and 3 wrap the search's own functions (rules._next, rules.time_model) for the replay only. Writes a markdown table
(default benchmarks/results/search_evidence.md). No training, no torch; about a minute on 2 cores.

    .venv/bin/python benchmarks/search_evidence.py [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow")]

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from pretrain_planner import search  # noqa: E402
from pretrain_planner.facade.pipeline import load  # noqa: E402
from pretrain_planner.planning.evidence_prior import EvidencePrior  # noqa: E402
from pretrain_planner.planning.flops import train_flops_per_sample  # noqa: E402
from pretrain_planner.search import rules  # noqa: E402
from pretrain_planner.search.timemodel import Hypotheses  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402
from snakemake.utils import update_config  # noqa: E402

import tests.test_search as lattices  # noqa: E402  (the simulator and the five lattices of the tests)

ALL_MACHINES = [lattices.Hardware(), *lattices.OTHER_HARDWARE]
MACHINES = [ALL_MACHINES[i] for i in (0, 1, 2, 6, 7)]  # 1 and 2: the tests', slower and faster; the slowest, fastest
SIZE_BUS_EXPONENT = 0.3  # 3's second case: the bus an all-reduce reaches x (parameters / 7e9) ** this, at most 1


@dataclasses.dataclass(frozen=True)
class SimulatedCompute:
    """The simulator's own seconds per sample of a family (timemodel.Prior), `scale` times off."""

    spec: object
    peak_tflops: float
    scale: float = 1.0

    def seconds_per_sample(self, family: str) -> tuple[float | None, str]:
        work = 1.6 if family == "naive" else 1.0  # the simulator's (tests/test_search.simulate)
        tau = train_flops_per_sample(self.spec.to_dict()) * work / (self.peak_tflops * 1e12 * 0.5)
        return tau * self.scale, f"the simulator's compute x {self.scale:g}"


Score = tuple[float, float, float, int, int]  # spent, exhaustive, worst, wrong picks, settings that guessed


def _score(st: search.Setting, table: dict, rep: search.Replay) -> Score:
    want, want_days = lattices.fastest(st, table)
    got, got_days = lattices.fastest(st, {m: table[m] for m in rep.ran})
    worst = got_days / want_days - 1 if want_days and got_days else (0.0 if (want is None) == (got is None) else 1.0)
    return rep.gpu_hours, rep.gpu_hours_exhaustive, worst, int(worst > 0.02), int(bool(rep.order))


def _total(scores: list[Score]) -> str:
    spent, total = sum(s[0] for s in scores), sum(s[1] for s in scores)
    worst, wrong = max(s[2] for s in scores), sum(s[3] for s in scores)
    return f"{spent / total:.3f} (worst {100 * worst:+.1f}%{f', **{wrong} wrong**' if wrong else ''})"


class Bench:
    def __init__(self) -> None:
        config = yaml.safe_load((REPO / "config/config.yaml").read_text())
        update_config(config, yaml.safe_load((REPO / "config/paper.yaml").read_text()))
        config["search"] = {"strategy": "adaptive", "saturated_tokens": lattices.SAT * 2048}
        self.paper = load(config, REPO, "config/paper.yaml")
        self.grid = [st for st in self.paper.settings.values() if st.memory.activation_est]
        self.lattices = {name: [st for st, _t in lattices.lattice(self.paper, *case[:4])]
                         for name, case in lattices.CASES.items()}  # fmt: skip

    def simulate(self, st: search.Setting, hw: lattices.Hardware, size_bus: bool = False) -> dict:
        if size_bus:
            p = st.memory.params or 1e9
            hw = dataclasses.replace(hw, bus=hw.bus * min(1.0, (p / 7e9) ** SIZE_BUS_EXPONENT))
        return lattices.simulate(st, *lattices.model_and_peak(self.paper, st), hw)

    def replay_all(self, settings: list[search.Setting], hw: lattices.Hardware,
                   prior: Callable[[search.Setting], object] | None = None) -> list[Score]:  # fmt: skip
        out = []
        for st in settings:
            table = self.simulate(st, hw)
            out.append(_score(st, table, search.replay(st, table, prior(st) if prior else None)))
        return out

    def columns(self) -> list[tuple[str, list[search.Setting]]]:
        return [*self.lattices.items(), (f"study grid ({len(self.grid)} settings)", self.grid)]


# ------------------------------------------------------------------------------- 1: the order of an untimed family


def _untimed_rows(b: Bench) -> list[list[str | int]]:
    shipped = {}

    def evidence(st: search.Setting) -> EvidencePrior:
        key = (st.model, st.gpu)
        if key not in shipped:
            shipped[key] = EvidencePrior(b.paper.catalog, st.model, st.gpu)
        return shipped[key]

    def simulated(scale: float) -> Callable[[search.Setting], SimulatedCompute]:
        return lambda st: SimulatedCompute(*lattices.model_and_peak(b.paper, st), scale)

    priors: list[tuple[str, Callable | None]] = [
        ("none: half the MFU ceiling (the guess before)", None),
        ("perfect: the simulator's compute", simulated(1.0)),
        ("0.7x the simulator's", simulated(0.7)),
        ("1.5x the simulator's", simulated(1.5)),
        ("the shipped evidence (another machine's numbers)", evidence),
    ]
    rows = []
    for hw in MACHINES[:3]:
        for name, prior in priors:
            cells, guessed = [], 0
            for _col, settings in b.columns():
                scores = b.replay_all(settings, hw, prior)
                guessed = sum(s[4] for s in scores)  # the last column's: the study grid
                cells.append(_total(scores))
            rows.append([f"{hw.bus / 1e9:g} / {hw.cpu_adam / 1e9:g} / {hw.pcie / 1e9:g}", name, *cells, guessed])
            print(" | ".join(map(str, rows[-1])), flush=True)
        with _oracle_order(b) as oracle:
            cells = []
            for _col, settings in b.columns():
                scores = []
                for st in settings:
                    table = b.simulate(st, hw)
                    oracle.update(table)
                    scores.append(_score(st, table, search.replay(st, table)))
                cells.append(_total(scores))
        rows.append([f"{hw.bus / 1e9:g} / {hw.cpu_adam / 1e9:g} / {hw.pcie / 1e9:g}",
                     "the ceiling: the true fastest candidate next", *cells, "-"])  # fmt: skip
        print(" | ".join(rows[-1]), flush=True)
    return rows


@contextmanager
def _oracle_order(b: Bench) -> Iterator[dict]:
    """rules._next replaced by the true fastest candidate (from the simulated table) for the replay."""
    table: dict = {}
    saved = rules._next

    def oracle(setting, open_, predicted, tm):
        if not open_:
            return []
        return [min(open_, key=lambda m: (0, table[m].step_time_s) if table[m].status == "ok" else (1, 0.0))]

    rules._next = oracle
    try:
        yield table
    finally:
        rules._next = saved


# ------------------------------------------------------------------------- 2: method ratios measured elsewhere


@contextmanager
def _ratio_order(elsewhere: dict) -> Iterator[None]:
    """rules._next ordering every candidate the other machine measured by its ratio to the setting's timed cells
    there (the time model's measured cells); the rest by the time model's median."""
    saved = rules._next

    def by_ratio(setting, open_, predicted, tm):
        got = saved(setting, open_, predicted, tm)
        here = {f.slug: t for f, t in tm.measured}
        there = {m: ob.step_time_s for m, ob in elsewhere.items() if ob.status == "ok" and ob.step_time_s}
        fitting = {m: predicted.get(m, cap) for m, cap in open_.items() if predicted.get(m, cap) >= 1}
        if len(got) != 1 or not fitting or not here:
            return got
        times = {}
        for m, micro_batch in fitting.items():
            logs = [math.log(here[a] * there[m] / there[a]) for a in here if a in there and m in there]
            f = rules._features(setting, search.shape(m), micro_batch)
            times[m] = math.exp(sum(logs) / len(logs)) if logs else tm.central(f)
        return [min(times, key=lambda m: (times[m], m))]

    rules._next = by_ratio
    try:
        yield
    finally:
        rules._next = saved


def _ratio_rows(b: Bench) -> list[list[str]]:
    rows = []
    for target, source in ((0, 1), (0, 4), (4, 0), (1, 3)):
        hw, other = MACHINES[target], MACHINES[source]
        cells = []
        for _col, settings in b.columns():
            scores = []
            for st in settings:
                table = b.simulate(st, hw)
                with _ratio_order(b.simulate(st, other)):
                    scores.append(_score(st, table, search.replay(st, table)))
            cells.append(_total(scores))
        rows.append([_hw(hw), _hw(other), *cells])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def _hw(hw: lattices.Hardware) -> str:
    return f"{hw.bus / 1e9:g} / {hw.cpu_adam / 1e9:g} / {hw.pcie / 1e9:g} / {hw.small_batch_exponent:g}"


# ------------------------------------------------------------------------ 3: hardware shared across settings


@contextmanager
def _shared_hardware(bus_only: bool) -> Iterator[list]:
    """rules.time_model keeping only the hypotheses the site's other settings of the same layout also allow."""
    others: list = []
    saved = rules.time_model

    def joint(setting, observed, prior=None):
        hyp = saved(setting, observed, prior)
        if not hyp.measured:
            return hyp
        offload = any(search.shape(m).offload for m in setting.methods)
        for st, obs in others:
            h = Hypotheses.grid(st.memory.params or 0.0, st.world_size, st.per_rank_batch, st.saturated,
                                st.compute_floor_s / st.per_rank_batch, st.model_error, offload)  # fmt: skip
            timed = [(rules._features(st, search.shape(m), ob.micro_batch), ob.step_time_s) for m, ob in obs.items()
                     if ob.status == "ok" and not ob.suspect and ob.step_time_s and ob.micro_batch]  # fmt: skip
            if not timed:
                continue
            h.fit(timed)
            keep = np.isin(hyp.bw[:, 0], h.bw[h.kept, 0]) if bus_only else h.kept
            if (hyp.kept & keep).any():
                hyp.kept = hyp.kept & keep
        return hyp

    rules.time_model = joint
    try:
        yield others
    finally:
        rules.time_model = saved


def _shared_rows(b: Bench) -> list[list[str]]:
    rows = []
    order = sorted(b.grid, key=lambda s: (s.gpu, s.nodes, s.gpus_per_node, s.memory.params or 0))
    for size_bus in (False, True):
        for hw in ALL_MACHINES:
            cells = []
            for mode in ("none", "every dimension", "the bus only"):
                done: dict = {}
                scores = []
                for st in order:
                    table = b.simulate(st, hw, size_bus)
                    key = (st.gpu, st.nodes, st.gpus_per_node)
                    if mode == "none":
                        rep = search.replay(st, table)
                    else:
                        with _shared_hardware(mode == "the bus only") as others:
                            others.extend(done.get(key, []))
                            rep = search.replay(st, table)
                    done.setdefault(key, []).append((st, {m: table[m] for m in rep.ran}))
                    scores.append(_score(st, table, rep))
                cells.append(_total(scores))
            bus = f"x (params / 7e9) ** {SIZE_BUS_EXPONENT}" if size_bus else "one per machine"
            rows.append([_hw(hw), bus, *cells])
            print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/search_evidence.md"))
    args = ap.parse_args()
    b = Bench()
    names = [name for name, _s in b.columns()]
    text = [
        "# What the evidence is worth to the adaptive search\n",
        f"{dt.date.today()}; `{' '.join(sys.argv)}` (benchmarks/search_evidence.py's docstring says how). GPU-hours "
        "spent / exhaustive per lattice of tests/test_search.py's simulator and over the study grid; worst: the pick's "
        "days against the exhaustive optimum; **wrong**: more than 2% slower. Machine: bus / CPU Adam / PCIe GB/s "
        "(/ small-batch exponent).\n",
        "## 1. The order of a family with no timed cell (adopted)\n",
        "The evidence prices only a family none of whose cells in the setting has a time (its probe ran out of memory "
        "or was unsupported), for the order; pruning keeps the MFU ceiling. Last column: study-grid settings where "
        "such a family was ordered.\n",
        *markdown.plain(
            ["machine", "the family's seconds per sample", *names, "settings ordered so"], _untimed_rows(b)
        ),
        "",
        "## 2. Every candidate ordered by its ratios measured on another machine (not adopted)\n",
        *markdown.plain(["machine searched", "machine the ratios come from", *names], _ratio_rows(b)),
        "",
        "## 3. Hardware hypotheses shared with the site's other models at the same layout (not adopted)\n",
        "Study grid only, the settings of a GPU type and layout searched smallest model first, each seeing the cells "
        "the earlier ones measured.\n",
        *markdown.plain(
            ["machine", "bus an all-reduce reaches", "alone (today)", "every dimension shared", "the bus only shared"],
            _shared_rows(b),
        ),
        "",
    ]
    Path(args.out).write_text("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""What-if: days and cost of a model on GPUs you do not own, PREDICTED from the cells measured on those you do.

A measured cell's step splits into compute and communication. Its communication is what the multi-GPU cell takes
beyond 1/w of the same method's one-GPU step (the search's time model, search/timemodel.py, splits a step the same
way); its compute MFU is what is left against the GPU's dense peak. Both transfer to a target (model, GPU type,
count):

- compute = the step's model FLOPs / (GPUs x the target's dense peak x the compute MFU measured for that method on
  each measured GPU type (the same model, else the nearest-sized measured model of its family, else of any));
- communication = the measured seconds scaled by the ring all-reduce volume per GPU ((w - 1) / w) and by the ratio
  of the datasheet interconnects (config/gpus.yaml `interconnect_gb_s`); with no multi-GPU cell measured, the
  gradient all-reduce (2 x 4 bytes x parameters) at the datasheet bandwidth per direction (optimistic) or at
  BUS_EFFICIENCY of it (pessimistic).

The band: optimistic = the highest compute MFU among the measured GPU types (x (1 + MIN_SPREAD), capped at the
`suspect` limit) with the least communication; pessimistic = the lowest (x (1 - MIN_SPREAD)) with the most. GPU types
that disagree widen it; one GPU type still gives a band, never a point. The method assumed is the fastest measured
one that the memory model (planning/memory.py: model-state lower bound plus one sample's activations) lets fit the
target; a method measured out of memory on a GPU with at least the target's memory at that count does not fit. The
target GPU type's own cells are never used (its row shows them beside the prediction as a check). With nothing
measured on a GPU type with a dense peak (the `cpu` stand-in), only the physics bound is given: the days at the
`suspect` limit of the target's peak. Imports no torch.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import methods
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.flops import param_count, train_flops_per_sample
from pretrain_planner.planning.memory import GIB, GRAD_B, activation_bytes_per_sample, state_bytes_lb
from pretrain_planner.results import atomic_write_text
from pretrain_planner.search.timemodel import BUS_B_S, FULL_SHARD_VOLUME
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables.aggregate import to_markdown
from pretrain_planner.tables.study import ran

MIN_SPREAD = 0.15  # the compute MFU's band around the measured GPU types' range (kernels, clocks, memory bandwidth)
BUS_EFFICIENCY = 0.25  # no multi-GPU cell measured: the pessimistic all-reduce runs at this share of the datasheet

COLUMNS = {
    "model": pl.String, "gpu": pl.String, "nodes": pl.Int64, "gpus_per_node": pl.Int64, "world_size": pl.Int64,
    "status": pl.String, "method": pl.String, "why": pl.String, "basis": pl.String, "mfu_low": pl.Float64,
    "mfu_central": pl.Float64, "mfu_high": pl.Float64, "comm_share": pl.Float64, "days_optimistic": pl.Float64,
    "days_central": pl.Float64, "days_pessimistic": pl.Float64, "measured_days": pl.Float64,
    "hardware_usd": pl.Float64, "amortised_usd_optimistic": pl.Float64, "amortised_usd_pessimistic": pl.Float64,
    "note": pl.String,
}  # fmt: skip
MD_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "status", "method", "days_optimistic", "days_central",
    "days_pessimistic", "measured_days", "amortised_usd_optimistic", "amortised_usd_pessimistic", "why",
]  # fmt: skip
INTRO = (
    "PREDICTIONS, not measurements: days and cost of each model of the sweep on every catalog GPU type and count, "
    "transferred from the cells measured on other GPU types (compute MFU per method, communication scaled by the "
    "datasheet interconnect); a band from optimistic to pessimistic, the method assumed and why. `measured_days` "
    "shows the setting's own measurement where there is one (never used for its prediction)."
)


@dataclass
class Prediction:
    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    world_size: int
    status: str  # predicted | bound only | does not fit | invalid | no peak
    method: str | None = None
    why: str = ""
    basis: str = ""
    mfu_low: float | None = None
    mfu_central: float | None = None
    mfu_high: float | None = None
    comm_share: float | None = None
    days_optimistic: float | None = None
    days_central: float | None = None
    days_pessimistic: float | None = None
    measured_days: float | None = None
    hardware_usd: float | None = None
    amortised_usd_optimistic: float | None = None
    amortised_usd_pessimistic: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Evidence:
    """One measured cell, split: its compute MFU and its communication seconds (None: no one-GPU cell to split by)."""

    model: str
    gpu: str
    method: str
    world: int
    mfu_compute: float
    comm_s: float | None
    step_s: float


def _ring(w: int) -> float:
    return (w - 1) / w if w > 1 else 0.0


class Predictor:
    """Predictions from a `cells` table (aggregate.cells_table) and the catalog."""

    def __init__(self, cells: pl.DataFrame, catalog: Catalog, suspect_mfu: float = 0.85,
                 costs_config: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.catalog, self.limit = catalog, suspect_mfu
        self.costs = pp_costs.settings(costs_config)
        ok = ran(cells).filter(pl.col("mfu").is_not_null() & (pl.col("mfu") > 0))
        one = {(r["model"], r["gpu"], r["method"]): r["step_time_s"]
               for r in ok.filter(pl.col("world_size") == 1).iter_rows(named=True)}  # fmt: skip
        self.evidence: dict[str, list[Evidence]] = defaultdict(list)  # model -> its cells
        self.by_method: dict[tuple[str, str], list[Evidence]] = defaultdict(list)  # (model, method) -> its cells
        for r in ok.iter_rows(named=True):
            t, w = r["step_time_s"], r["world_size"]
            t1 = one.get((r["model"], r["gpu"], r["method"]))
            comm = 0.0 if w == 1 else (max(0.0, min(0.9 * t, t - t1 / w)) if t1 else None)
            e = Evidence(r["model"], r["gpu"], r["method"], w, r["mfu"] * t / (t - (comm or 0.0)), comm, t)
            self.evidence[r["model"]].append(e)
            self.by_method[(e.model, e.method)].append(e)
        self.oom: dict[tuple[str, str, int], list[str]] = defaultdict(list)  # (model, method, world) -> GPU types
        for m, g, s, w in cells.filter(pl.col("status") == "oom").select("model", "gpu", "method", "world_size").rows():
            self.oom[(m, s, w)].append(g)
        self.measured = {(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"]): r["training_days"]
                         for r in ok.group_by("model", "gpu", "nodes", "gpus_per_node")
                         .agg(pl.col("training_days").min()).iter_rows(named=True)}  # fmt: skip

    # ---------------------------------------------------------------------------------------- pieces

    def _basis(self, model: str, exclude_gpu: str) -> tuple[str | None, str]:
        """The model whose cells transfer: itself, else the nearest-sized measured one of its family, else of any."""

        def usable(m: str) -> bool:
            return any(e.gpu != exclude_gpu for e in self.evidence.get(m, []))

        if usable(model):
            return model, f"{model}'s own cells"
        spec = self.catalog.model(model)
        size = param_count(spec.to_dict()) or 1.0
        for same_family in (True, False):
            near = [m for m in self.evidence if usable(m) and m in self.catalog.models
                    and (self.catalog.models[m].family == spec.family) == same_family]  # fmt: skip
            if near:
                best = min(
                    near, key=lambda m: abs(_log(param_count(self.catalog.models[m].to_dict()) or 1.0) - _log(size))
                )
                what = f"family {spec.family}" if same_family else "another family"
                return best, f"the nearest measured model of {what}: {best}'s cells"
        return None, ""

    def _fits(self, model: str, slug: str, gpu: str, world: int) -> tuple[bool, str]:
        spec, g = self.catalog.model(model), self.catalog.gpu(gpu)
        m = methods.parse(slug)
        if m.sharding and world == 1 and not m.offload:
            return False, "sharding on one GPU"
        for gg in self.oom.get((model, slug, world), []):
            if gg != gpu:
                mem = self.catalog.gpus[gg].memory_gib if gg in self.catalog.gpus else None
                if mem and g.memory_gib and mem >= g.memory_gib:
                    return False, f"out of memory measured on {world} x {gg} ({mem:g} GiB)"
        if not g.memory_gib:
            return True, ""
        params = param_count(spec.to_dict())
        act = activation_bytes_per_sample(spec) or 0.0
        if m.checkpointing and spec.arch.get("num_hidden_layers"):
            act /= spec.arch["num_hidden_layers"]
        need = (state_bytes_lb(m.sharding, m.offload, params, world) if params else 0.0) + act
        if need > g.memory_gib * GIB:
            return False, f"memory model: at least {need / GIB:.3g} GiB per GPU > {g.memory_gib:g} GiB"
        return True, ""

    def _comm(self, slug: str, model: str, gpu: str, world: int) -> tuple[float, float, float]:
        """(optimistic, central, pessimistic) communication seconds per step on the target."""
        if world == 1:
            return 0.0, 0.0, 0.0
        bw_t = self.catalog.gpu(gpu).interconnect_gb_s
        got = []
        for e in self.by_method.get((model, slug), []):
            if e.world == 1 or e.comm_s is None or e.gpu == gpu:
                continue
            bw_s = self.catalog.gpus[e.gpu].interconnect_gb_s if e.gpu in self.catalog.gpus else None
            ratio = bw_s / bw_t if bw_s and bw_t else 1.0
            got.append(e.comm_s * ratio * _ring(world) / _ring(e.world))
        if got:
            return min(got), statistics.median(got), max(got)
        params = param_count(self.catalog.model(model).to_dict()) or 0.0
        volume = (
            2 * GRAD_B * params * _ring(world) * (FULL_SHARD_VOLUME if methods.parse(slug).sharding_level >= 3 else 1)
        )
        fast = (bw_t / 2 * 1e9) if bw_t else float(BUS_B_S[-1])  # per direction
        slow = fast * BUS_EFFICIENCY if bw_t else float(BUS_B_S[0])
        return volume / fast, (volume / fast * volume / slow) ** 0.5, volume / slow

    # ---------------------------------------------------------------------------------------- predict

    def predict(self, model: str, gpu: str, nodes: int, gpus_per_node: int) -> Prediction:
        spec, g = self.catalog.model(model), self.catalog.gpu(gpu)
        world = nodes * gpus_per_node
        p = Prediction(model, gpu, nodes, gpus_per_node, world, "predicted",
                       measured_days=self.measured.get((model, gpu, nodes, gpus_per_node)))  # fmt: skip
        r = spec.recipe
        if r.global_batch % world:
            p.status, p.why = "invalid", f"global batch {r.global_batch} is not divisible by {world} GPUs"
            return p
        if not g.supports(r.precision):
            p.status, p.why = "invalid", f"{gpu} has no {r.precision}"
            return p
        peak = g.peak_for(r.precision, tf32=True)
        per_sample = train_flops_per_sample(spec.to_dict())
        if not peak or not per_sample or not r.steps:
            p.status, p.why = "no peak", f"{gpu} declares no dense peak for {r.precision}" if not peak else "no FLOPs"
            return p
        flops = per_sample * r.global_batch
        basis, p.basis = self._basis(model, gpu)
        if basis is None:
            p.status = "bound only"
            p.why = ("nothing measured on a GPU type with a dense peak: the physics bound only (the days at "
                     f"{self.limit:.0%} of {gpu}'s dense peak, the `suspect` limit); no pessimistic end")  # fmt: skip
            p.days_optimistic = r.steps * flops / (world * peak * 1e12 * self.limit) / 86400
            self._price(p)
            return p
        ev = [e for e in self.evidence[basis] if e.gpu != gpu]
        by_method: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for e in ev:
            by_method[e.method][e.gpu].append(e.mfu_compute)
        options, refused = [], []
        for slug, per_gpu in sorted(by_method.items()):
            fits, why = self._fits(model, slug, gpu, world)
            if not fits:
                refused.append(f"{slug}: {why}")
                continue
            mfus = [statistics.median(v) for v in per_gpu.values()]
            lo, mid = min(mfus) * (1 - MIN_SPREAD), statistics.median(mfus)
            hi = min(max(mfus) * (1 + MIN_SPREAD), self.limit)  # never above the `suspect` limit
            mid = min(mid, hi)
            lo = min(lo, mid)
            c_opt, c_mid, c_pess = self._comm(slug, basis, gpu, world)
            step = [flops / (world * peak * 1e12 * u) + c for u, c in ((hi, c_opt), (mid, c_mid), (lo, c_pess))]
            options.append((step[1], slug, lo, mid, hi, step, c_mid, sorted(per_gpu)))
        if not options:
            p.status, p.why = "does not fit", "; ".join(refused) or "no measured method"
            return p
        central, slug, lo, mid, hi, step, comm, sources = min(options)
        p.method, p.mfu_low, p.mfu_central, p.mfu_high = slug, lo, mid, hi
        p.comm_share = comm / central if central else None
        p.days_optimistic, p.days_central, p.days_pessimistic = (r.steps * s / 86400 for s in step)
        p.why = (f"fastest of {len(options)} measured method(s) that fit {world} x {gpu}"
                 f"{' (' + str(g.memory_gib) + ' GiB)' if g.memory_gib else ''}; compute MFU from "
                 f"{', '.join(sources)}")  # fmt: skip
        if refused:
            p.note = "does not fit: " + "; ".join(refused)
        self._price(p)
        return p

    def _price(self, p: Prediction) -> None:
        base, years = self.catalog.base_machine_usd, self.costs["amortisation_years"]
        g = self.catalog.gpu(p.gpu)
        for days, attr in (
            (p.days_optimistic, "amortised_usd_optimistic"),
            (p.days_pessimistic, "amortised_usd_pessimistic"),
        ):
            if days is None:
                continue
            price = pp_costs.price(g, p.gpu, p.nodes, p.gpus_per_node, days, base, years, self.catalog.gpus_path)
            setattr(p, attr, price.amortised_usd)
            p.hardware_usd = price.hardware_usd
            notes = [n for n in price.notes if "cloud" not in n]
            if notes and "cost:" not in p.note:
                p.note = "; ".join([x for x in (p.note, "cost: " + "; ".join(notes)) if x])


def _log(x: float) -> float:
    import math

    return math.log(max(x, 1.0))


def whatif_table(predictor: Predictor, models: list[str], counts: list[tuple[int, int]]) -> pl.DataFrame:
    """Every (model, catalog GPU type with a dense peak, count) as a Prediction row."""
    rows = [predictor.predict(m, g, n, k).to_dict()
            for m in models if m in predictor.catalog.models
            for g, spec in predictor.catalog.gpus.items() if spec.peak_tflops
            for n, k in counts]  # fmt: skip
    return pl.DataFrame(rows, schema=COLUMNS)


def table_files(folder: str) -> dict[str, str]:
    return {"whatif_csv": f"{folder}/whatif.csv", "whatif_md": f"{folder}/whatif.md"}


def build_whatif(
    cells_parquet: str,
    out: dict[str, str],
    log_path: str,
    catalog: Catalog,
    models: list[str],
    counts: list[tuple[int, int]],
    suspect_mfu: float,
    costs_config: dict[str, Any] | None = None,
) -> pl.DataFrame:
    """The `whatif` rule: tables/whatif.{csv,md}."""
    t0 = time.perf_counter()
    table = whatif_table(Predictor(pl.read_parquet(cells_parquet), catalog, suspect_mfu, costs_config), models, counts)
    Path(out["whatif_csv"]).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out["whatif_csv"], table.write_csv())
    atomic_write_text(out["whatif_md"], f"# What-if (predictions)\n\n{INTRO}\n\n"
                      f"{to_markdown(table.select(MD_COLUMNS), max_rows=2000)}")  # fmt: skip
    by = dict(table.group_by("status").len().sort("status").rows())
    atomic_write_text(log_path, f"whatif: {table.height} rows {by} ({time.perf_counter() - t0:.2f} s)\n")
    return table

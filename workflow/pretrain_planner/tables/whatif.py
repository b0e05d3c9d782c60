"""What-if: days and cost of a model on GPUs you do not own, PREDICTED from measurements on other GPU types.

What a prediction rests on, in order of precedence: the cells measured here (your own) of the model, else the public
evidence of the model shipped with the package (planning/evidence.py: published throughput with a source per row),
else the cells of the nearest-sized measured model of its family, else the public runs of the nearest-sized model of
its kind (a stand-in at most STAND_IN_RATIO times larger or smaller). The target GPU type's own cells are never used
(its row shows them beside the prediction as a check); public runs on the target GPU type are, and weigh most.

A step is the step model's (planning/stepmodel.py, shared with the adaptive search's time model):
- compute: a measured run's seconds per token (per sample for images), moved to the target by the cross-GPU model
  (planning/crossgpu.py: the matmul FLOPs at the GPU's measured matmul rate + kappa x the memory-bound bytes at its
  memory bandwidth, corrected by the per-GPU effects the public evidence shows between GPU types it measured; kappa,
  the weighting of near GPU types and the effects fitted on the public evidence), times the rank's tokens
  per step (x 4/3 with activation checkpointing); a cell measured here has its communication split off first (what
  the multi-GPU cell takes beyond 1/w of the same method's one-GPU step);
- communication: a measured split scaled by the step's all-reduce volume (`stepmodel.sync_bytes`: the parameter
  count, the ring's (w - 1) / w, one sync per step unsharded or per micro-batch sharded, 1.5x at full sharding) and
  by the bandwidths of the two layouts (`stepmodel.comm_seconds`: the datasheet GPU link `interconnect_gb_s` and, on
  several nodes, the network per GPU `inter_node_gbit_s`, config/gpus.yaml's reference system or the site file's);
  with none measured, the step model at those bandwidths (optimistic) .. BUS_EFFICIENCY of them (pessimistic), an
  unknown network spanning 5 GB/s .. the link (the row's note says which).

The band: the cross-GPU model's 5%-95% out-of-sample errors of the prediction's KIND of transfer around the central
compute (crossgpu.Kind: the same model or a stand-in, of the same software or another, to a GPU type the evidence
measured or not; near or far; `transfer` names it, `model_error` its measured error), with the least communication at
the optimistic end and the most at the pessimistic one. The method assumed is the fastest that the memory model
(planning/memory.py: model-state lower bound plus the micro-batch's activations) lets fit the target: of the methods
measured (your cells), or, from public evidence, the least-communicating data-parallel method (fl, ZeRO / FSDP sharding,
checkpointing; no offload) at the largest micro-batch that fits. A method measured out of memory on a GPU with at least
the target's memory at that count does not fit. With no evidence of the model's family or kind within STAND_IN_RATIO of
its size, or a target without the step model's rates, only the physics bound is given: the days at the `suspect` limit
of the target's peak, and why (the nearest model measured, how many times larger or smaller). Cells measured on a GPU
type without those rates (the `cpu` stand-in) cannot be moved to a GPU and are not used; each prediction of their
model says so in its `note`.

whatif.csv has every prediction with every column, its rows in the order a reader asks (`reading_order`: the swept
models and those the config's `whatif.models` names, each ranked by days, then the other models); whatif.md answers
that question first (`whatif_markdown`): the measured error of this run's fit, each lead model's settings in one table
that fits 120 columns with its reasons said once, then each other model's fastest setting. Imports no torch.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import evidence as pp_evidence
from pretrain_planner.planning import evidence_exchange as pp_exchange
from pretrain_planner.planning import grid, methods, stepmodel
from pretrain_planner.planning.catalog import Catalog, ModelSpec
from pretrain_planner.planning.crossgpu import NEAR, STAND_IN_RATIO, CrossGpu, Estimate, Kind, fit, stand_in
from pretrain_planner.planning.evidence import HERE, Evidence, Run, Work, origins_text
from pretrain_planner.planning.flops import param_count, tokens_per_sample, train_flops_per_sample
from pretrain_planner.planning.memory import GIB
from pretrain_planner.results import atomic_write_text
from pretrain_planner.schema import ConfigError, section
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables import memfix
from pretrain_planner.tables.markdown import WIDTH
from pretrain_planner.tables.markdown import table as to_table
from pretrain_planner.tables.study import ran, study_settings
from pretrain_planner.tables.units import days as days_text
from pretrain_planner.tables.units import gib as gib_text
from pretrain_planner.tables.units import number as number_text
from pretrain_planner.tables.units import usd as usd_text

BUS_EFFICIENCY = 0.25  # no multi-GPU cell measured: the pessimistic all-reduce runs at this share of the datasheet
OWN, PUBLIC = "your cells", "public evidence"
# what public evidence is transferred to: data-parallel methods, least communication first (no offload: its CPU
# optimizer and PCIe speeds are not in the evidence)
PUBLIC_METHODS = (
    "fl", "fl+zero1", "fl+zero2", "fl+fsdp-grad", "fl+zero3", "fl+fsdp-full",
    "fl+ac", "fl+ac+zero1", "fl+ac+zero2", "fl+ac+fsdp-grad", "fl+ac+zero3", "fl+ac+fsdp-full",
    "fl+hsdp", "fl+ac+hsdp",  # several nodes only (grid.invalid_reason)
)  # fmt: skip

COLUMNS = {
    "model": pl.String, "gpu": pl.String, "nodes": pl.Int64, "gpus_per_node": pl.Int64, "world_size": pl.Int64,
    "status": pl.String, "evidence": pl.String, "method": pl.String, "micro_batch": pl.Int64, "why": pl.String,
    "basis": pl.String, "rests_on": pl.String, "sources": pl.String, "transfer": pl.String, "model_error": pl.String,
    "mfu_low": pl.Float64, "mfu_central": pl.Float64, "mfu_high": pl.Float64, "comm_share": pl.Float64,
    "days_optimistic": pl.Float64, "days_central": pl.Float64, "days_pessimistic": pl.Float64,
    "measured_days": pl.Float64, "hardware_usd": pl.Float64, "amortised_usd_optimistic": pl.Float64,
    "amortised_usd_pessimistic": pl.Float64, "note": pl.String,
}  # fmt: skip
INTRO = (
    "PREDICTIONS, not measurements: the days to train and the cost of a model on the catalog's GPU types at the "
    "sweep's counts, moved from measurements on other GPU types (your cells, else the public throughput evidence "
    "shipped with the planner) by each type's measured matmul rate and memory bandwidth and the per-GPU effects the "
    "evidence shows. A setting's own measurement is never used for its prediction (`measured` shows it beside)."
)
ERROR_LEAD = "Measured error of this run's cross-GPU model"  # opens the sentence report.md reads back (error_sentence)
BOUND = ": the physics bound only"  # a bound-only `why`: its reason, then this
# a model's rows in whatif.md and whatif.csv, in this order (each ranked by days)
STATUS_RANK = {"predicted": 0, "bound only": 1, "does not fit": 2, "invalid": 3, "no peak": 4}


@dataclass
class Prediction:
    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    world_size: int
    status: str  # predicted | bound only | does not fit | invalid | no peak
    evidence: str = ""  # your cells | public evidence
    method: str | None = None
    micro_batch: int | None = None
    why: str = ""
    basis: str = ""
    rests_on: str = ""  # the runs it rests on (public row ids with their source, or your cells)
    sources: str = ""
    transfer: str = ""  # the kind of transfer (crossgpu.Kind), whose measured error `model_error` states
    model_error: str = ""
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
class Step:
    """One method's predicted step on the target, seconds: (optimistic, central, pessimistic)."""

    slug: str
    mb: int
    compute: tuple[float, float, float]
    comm: tuple[float, float, float]
    estimate: Estimate

    @property
    def seconds(self) -> tuple[float, float, float]:
        return tuple(c + m for c, m in zip(self.compute, self.comm, strict=True))  # type: ignore[return-value]


def _units(spec: ModelSpec) -> int:
    """Units of the cross-GPU model per sample: tokens for text, one for an image."""
    return (tokens_per_sample(spec.to_dict()) or 1) if spec.is_text else 1


def _work(spec: ModelSpec, slug: str) -> Work | None:
    m = methods.parse(slug)
    return pp_evidence.catalog_work(spec, eager=m.base == "naive", tf32=m.base != "naive")


class Predictor:
    """Predictions from a `cells` table (aggregate.cells_table), the catalog and the public evidence (`public`: the
    shipped evidence and the rows imported into `evidence_folder` by default; an Evidence to use another, None for
    none)."""

    def __init__(
        self,
        cells: pl.DataFrame,
        catalog: Catalog,
        suspect_mfu: float = 0.85,
        costs_config: dict[str, Any] | None = None,
        public: Evidence | None | bool = True,
        evidence_folder: str | Path | None = None,
    ) -> None:
        self.catalog, self.limit = catalog, suspect_mfu
        self.costs = pp_costs.settings(costs_config)
        if public is True:  # the shipped rows and those imported into the evidence folder (planning/evidence_exchange)
            public = pp_exchange.loaded_evidence(catalog, suspect_mfu, evidence_folder)
        self.public: Evidence = public or Evidence()
        self.public_by_model: dict[str, list[Run]] = defaultdict(list)
        for r in self.public.runs:
            self.public_by_model[r.model].append(r)
        ok = ran(cells).filter(pl.col("mfu").is_not_null() & (pl.col("mfu") > 0))
        one = {(r["model"], r["gpu"], r["method"]): r["step_time_s"]
               for r in ok.filter(pl.col("world_size") == 1).iter_rows(named=True)}  # fmt: skip
        self.own: dict[str, list[tuple[Run, float | None, int | None]]] = defaultdict(list)  # model -> (run, comm, mb)
        self.own_nodes: dict[str, int] = {}  # a measured cell's run id -> its nodes (its layout's bandwidths)
        for r in ok.iter_rows(named=True):
            got = self._own_run(r, one.get((r["model"], r["gpu"], r["method"])))
            if got:
                self.own[r["model"]].append(got)
                self.own_nodes[got[0].id] = int(r["nodes"])
        # the sweep's own cells join the fit (issue 40): a setting measured on two of your GPU types gives each its
        # own offset, which every other prediction for them then uses; the out-of-sample errors count them (`own`)
        self.model: CrossGpu = fit([*self.public.runs, *(run for rs in self.own.values() for run, _c, _m in rs)],
                                   catalog.gpus)  # fmt: skip
        self.oom: dict[tuple[str, str, int], list[str]] = defaultdict(list)  # (model, method, world) -> GPU types
        for m, g, s, w in cells.filter(pl.col("status") == "oom").select("model", "gpu", "method", "world_size").rows():
            self.oom[(m, s, w)].append(g)
        self.measured = {(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"]): r["training_days"]
                         for r in ok.group_by("model", "gpu", "nodes", "gpus_per_node")
                         .agg(pl.col("training_days").min()).iter_rows(named=True)}  # fmt: skip

    # ---------------------------------------------------------------------------------------- evidence

    def _own_run(self, r: dict[str, Any], t1: float | None) -> tuple[Run, float | None, int | None] | None:
        """A measured cell as a Run: its compute per unit (its communication split off where a one-GPU cell of the
        same method tells it), with its communication seconds and micro-batch."""
        spec = self.catalog.models.get(r["model"])
        work = _work(spec, r["method"]) if spec else None
        if work is None or r["gpu"] not in self.catalog.gpus:
            return None
        t, w = r["step_time_s"], r["world_size"]
        comm = 0.0 if w == 1 else (max(0.0, min(0.9 * t, t - t1 / w)) if t1 else None)
        m = methods.parse(r["method"])
        units = spec.recipe.global_batch // w * _units(spec) * (1 + stepmodel.RECOMPUTE_SHARE if m.checkpointing else 1)
        folder = f"{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        run = Run(folder, "measured here", f"cells/{folder}", r["model"], work.kind, work.params, r["gpu"], w,
                  f"own:{r['model']}:{w}:{r['method']}", r["method"], work.precision, (t - (comm or 0.0)) / units,
                  work.flops, work.memory_bytes, public=False, tf32=work.tf32, formula=work.formula,
                  origin="own")  # fmt: skip
        mb = r.get("micro_batch_size")
        return run, comm, int(mb) if mb else None

    def _nearest(self, spec: ModelSpec, candidates: list[str], same) -> str | None:
        size = math.log(max(param_count(spec.to_dict()) or 1.0, 1.0))
        pool = [m for m in candidates if same(m)
                and abs(math.log(max(self._params(m), 1.0)) - size) <= math.log(STAND_IN_RATIO)]  # fmt: skip
        if not pool:
            return None
        return min(pool, key=lambda m: (abs(math.log(max(self._params(m), 1.0)) - size), m))

    def _params(self, model: str) -> float:
        if model in self.catalog.models:
            return param_count(self.catalog.models[model].to_dict()) or 1.0
        runs = self.public_by_model.get(model)
        return runs[0].params if runs else 1.0

    def basis(self, spec: ModelSpec, gpu: str) -> tuple[str, str, str] | None:
        """(evidence kind, model whose runs transfer, why that one): your cells of the model (on other GPU types),
        else public runs of it (on any GPU type: those on the target itself weigh most), else your cells of the
        nearest-sized model of its family, else public runs of the nearest-sized catalog model of its family (the
        same architecture and software), else of the nearest-sized public workload of its kind."""
        own = {m for m, rs in self.own.items() if any(r.gpu != gpu and self._rated(r) for r, _c, _m in rs)}
        pub = set(self.public_by_model)
        if spec.name in own:
            return OWN, spec.name, f"{spec.name}'s own cells"
        if spec.name in pub:
            return PUBLIC, spec.name, f"public measurements of {spec.name}"

        def family(m: str) -> bool:
            return m in self.catalog.models and m != spec.name and self.catalog.models[m].family == spec.family

        near = self._nearest(spec, sorted(own), family)
        if near:
            return OWN, near, f"the nearest measured model of family {spec.family}: {near}'s cells"
        near = self._nearest(spec, sorted(pub), family)
        if near:
            return PUBLIC, near, f"public measurements of the nearest-sized model of family {spec.family}: {near}"
        run0 = {m: self.public_by_model[m][0] for m in pub}
        near = stand_in(spec.name, param_count(spec.to_dict()) or 1.0, spec.task, spec.kind.formula or "", HERE,
                        {m: (m, r.params, r.kind, r.formula, r.software) for m, r in run0.items()})  # fmt: skip
        if near:
            return PUBLIC, near, (f"public measurements of the nearest-sized {spec.task} {spec.kind.formula} (this "
                                  f"trainer's first): {near}")  # fmt: skip
        return None

    def _rated(self, run: Run) -> bool:
        return self.model.rates(run.gpu, run.precision, run.tf32) is not None

    def _lacks(self, gpu: str, precision: str, tf32: bool = True) -> str:
        """What the catalog does not give GPU type `gpu` of the two rates the cross-GPU model moves a step by:
        "no matmul rate and no memory bandwidth" (the `cpu` stand-in)."""
        g = self.catalog.gpus[gpu]
        key = stepmodel.precision_key(g, precision, tf32)
        missing = [what for what, known in (("matmul rate", g.matmul_tflops.get(key) or g.peak_tflops.get(key)),
                                            ("memory bandwidth", g.memory_gb_s)) if not known]  # fmt: skip
        return "no " + " and no ".join(missing) if missing else f"no {key} rate"

    def unused_cells(self, model: str) -> str:
        """Why the cells measured here of `model` on a GPU type without the step model's rates (the `cpu` stand-in)
        are not used (a step cannot be moved from it); "" when there are none. README's "your cells" promise is
        only kept where the cross-GPU model can move them, so each prediction that skips some says so."""
        gpus = sorted({run.gpu for run, _c, _m in self.own.get(model, []) if not self._rated(run)})
        if not gpus:
            return ""
        run0 = {run.gpu: run for run, _c, _m in self.own[model]}
        lacks = "; ".join(f"{g} has {self._lacks(g, run0[g].precision, run0[g].tf32)}" for g in gpus)
        return (f"your cells of {model} on {', '.join(gpus)} are not used: {lacks} in {self.catalog.gpus_path}, "
                "which the cross-GPU model moves a step by")  # fmt: skip

    def nearest_of_kind(self, spec: ModelSpec, gpu: str) -> tuple[str, float] | None:
        """The measured model nearest in size to `spec` of its family (your cells on other GPU types, public runs)
        or of its kind (public workloads of its task and formula, any software), at any size ratio: (its name, its
        parameters / the model's). What `basis` would have used, were it within STAND_IN_RATIO."""
        size = max(param_count(spec.to_dict()) or 1.0, 1.0)
        own = {m for m, rs in self.own.items() if any(r.gpu != gpu and self._rated(r) for r, _c, _m in rs)}
        pool: list[tuple[float, bool, str]] = []
        for m in sorted(own | set(self.public_by_model)):
            if m == spec.name:
                continue
            runs = self.public_by_model.get(m)
            family = m in self.catalog.models and self.catalog.models[m].family == spec.family
            kind = bool(runs) and runs[0].kind == spec.task and runs[0].formula == (spec.kind.formula or "")
            if family or kind:
                d = abs(math.log(max(self._params(m), 1.0) / size))
                pool.append((round(d, 2), not family, m))  # as near (within 1%): its family's first, as `basis`
        if not pool:
            return None
        _d, _other, near = min(pool)
        return near, max(self._params(near), 1.0) / size

    def bound_reason(self, spec: ModelSpec, gpu: str) -> str:
        """Why a prediction of `spec` on `gpu` is the physics bound only, true to the case: the target has no rates,
        or nothing of the model's family or kind was measured, or the nearest is beyond STAND_IN_RATIO in size
        (named, with how many times larger or smaller)."""
        precision = spec.recipe.precision
        if not self.model.rates(gpu, precision):
            return (f"{gpu} has {self._lacks(gpu, precision)} in {self.catalog.gpus_path}, which the cross-GPU model "
                    "moves a step by")  # fmt: skip
        near = self.nearest_of_kind(spec, gpu)
        if near is None:
            return (f"no measurement of {spec.name}, its family ({spec.family}) or its kind ({spec.task} "
                    f"{spec.kind.formula}) on another GPU type with the step model's rates")  # fmt: skip
        name, ratio = near
        times = f"{number_text(ratio)}x larger" if ratio >= 1 else f"{number_text(1 / ratio)}x smaller"
        return (f"no measurement of {spec.name}, its family or its kind within {STAND_IN_RATIO:g}x of its size "
                f"(nearest: {name}, {times})")  # fmt: skip

    # ---------------------------------------------------------------------------------------- pieces

    def _fits(self, model: str, slug: str, gpu: str, world: int, nodes: int = 1) -> tuple[bool, str]:
        spec, g = self.catalog.model(model), self.catalog.gpu(gpu)
        m = methods.parse(slug)
        if m.sharding and world == 1 and not m.offload:
            return False, "sharding on one GPU"
        for gg in self.oom.get((model, slug, world), []):
            if gg != gpu:
                mem = self.catalog.gpus[gg].memory_gib if gg in self.catalog.gpus else None
                if mem and g.memory_gib and mem >= g.memory_gib:
                    return False, f"out of memory measured on {world} x {gg} ({mem:g} GiB)"
        need = self._need(spec, m, world, 1, nodes)
        if g.memory_gib and need > g.memory_gib * GIB:
            return False, f"memory model: at least {gib_text(need / GIB)} per GPU > {g.memory_gib:g} GiB"
        return True, ""

    def _need(self, spec: ModelSpec, m: methods.Method, world: int, mb: int, nodes: int = 1) -> float:
        """The memory model's bytes per GPU at micro-batch `mb` (tables/memfix.py: its one use of the memory model)."""
        return memfix.need_bytes(spec, m, world, mb, nodes)

    def _largest_mb(self, spec: ModelSpec, slug: str, gpu: str, world: int, nodes: int = 1) -> int:
        """The largest power-of-two micro-batch (up to the per-GPU batch) the memory model lets fit; 0 = none."""
        per_rank = spec.recipe.global_batch // world
        cap = self.catalog.gpu(gpu).memory_gib
        if not cap:
            return per_rank
        m, mb = methods.parse(slug), per_rank
        while mb >= 1 and self._need(spec, m, world, mb, nodes) > cap * GIB:
            mb //= 2
        return mb

    def _link(self, gpu: str, nodes: int) -> tuple[float | None, float | None]:
        """(GPU-to-GPU link per direction, network per GPU to other nodes), bytes/s, as the catalog (and the site
        file) give them: None where unknown; the network only on several nodes."""
        g = self.catalog.gpus.get(gpu)
        link = g.interconnect_gb_s / 2 * 1e9 if g and g.interconnect_gb_s else None
        net = g.inter_node_gbit_s / 8 * 1e9 if g and g.inter_node_gbit_s and nodes > 1 else None
        return link, net

    def _comm_model(self, f: stepmodel.Features, params: float, gpu: str, nodes: int, world: int) -> float | None:
        """The step model's communication seconds of step `f` at the catalog's bandwidths; None where the link is
        unknown, or the network of a multi-node layout."""
        link, net = self._link(gpu, nodes)
        if link is None or (nodes > 1 and net is None):
            return None
        return stepmodel.comm_seconds(f, params, nodes, world // nodes, link, net)

    def _comm(self, spec: ModelSpec, slug: str, mb: int, gpu: str, world: int,
              measured: list[tuple[Run, float | None, int | None]],
              nodes: int = 1) -> tuple[float, float, float]:  # fmt: skip
        """(optimistic, central, pessimistic) communication seconds per step on the target's layout: measured splits
        scaled by the step model (volume: parameters, sharding, syncs; bandwidths: the GPU link and, on several
        nodes, the network), else the step model at the catalog's bandwidths .. BUS_EFFICIENCY of them. An unknown
        link or network spans the search's bus range instead (Ethernet class .. NVLink 5)."""
        if world == 1:
            return 0.0, 0.0, 0.0
        from pretrain_planner.search.timemodel import BUS_B_S

        per_rank = spec.recipe.global_batch // world
        params = param_count(spec.to_dict()) or 0.0
        f = stepmodel.of_method(slug, mb, per_rank, world)
        target = self._comm_model(f, params, gpu, nodes, world)
        got = []
        for run, comm, mb_src in measured:
            if run.world == 1 or comm is None or run.gpu == gpu or run.method != slug:
                continue
            src = self.catalog.models[run.model]
            src_rank = src.recipe.global_batch // run.world
            src_f = stepmodel.of_method(slug, mb_src or src_rank, src_rank, run.world)
            src_params = param_count(src.to_dict()) or 0.0
            source = self._comm_model(src_f, src_params, run.gpu, self.own_nodes.get(run.id, 1), run.world)
            if source and target:
                got.append(comm * target / source)
                continue
            # a bandwidth unknown: the volume ratio alone (the same bus)
            src_volume = stepmodel.sync_bytes(src_f, src_params, run.world)
            if src_volume > 0:
                got.append(comm * stepmodel.sync_bytes(f, params, world) / src_volume)
        if got:
            return min(got), sorted(got)[len(got) // 2], max(got)
        link, net = self._link(gpu, nodes)
        fast_link, slow_link = (link, link * BUS_EFFICIENCY) if link else (float(BUS_B_S[-1]), float(BUS_B_S[0]))
        if nodes > 1:  # the network: the catalog's (or the site's) .. BUS_EFFICIENCY of it; unknown: the link .. 5 GB/s
            fast_net, slow_net = (net, net * BUS_EFFICIENCY) if net else (fast_link, float(BUS_B_S[0]))
        else:
            fast_net = slow_net = None
        gpn = world // nodes
        fast = stepmodel.comm_seconds(f, params, nodes, gpn, fast_link, fast_net)
        slow = stepmodel.comm_seconds(f, params, nodes, gpn, slow_link, slow_net)
        return fast, math.sqrt(fast * slow), slow

    def _step(self, spec: ModelSpec, slug: str, gpu: str, world: int, mb: int, basis: list[Run],
              measured: list[tuple[Run, float | None, int | None]], nodes: int = 1) -> Step | None:  # fmt: skip
        work = _work(spec, slug)
        est = self.model.estimate(basis, work, gpu) if work else None
        if est is None:
            return None
        m = methods.parse(slug)
        units = spec.recipe.global_batch // world * _units(spec) * (1 + stepmodel.RECOMPUTE_SHARE if m.checkpointing
                                                                      else 1)  # fmt: skip
        compute = (est.low * units, est.central * units, est.high * units)
        return Step(slug, mb, compute, self._comm(spec, slug, mb, gpu, world, measured, nodes), est)

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
        basis = self.basis(spec, gpu) if self.model.rates(gpu, r.precision) else None
        p.note = self.unused_cells(model)
        if basis is None:
            p.status = "bound only"
            p.why = (f"{self.bound_reason(spec, gpu)}: the physics bound only (the days at {self.limit:.0%} of {gpu}'s "
                     "dense peak, the `suspect` limit); no pessimistic end")  # fmt: skip
            p.days_optimistic = r.steps * flops / (world * peak * 1e12 * self.limit) / 86400
            self._price(p)
            return p
        kind, source_model, p.basis = basis
        p.evidence = kind
        options, refused = [], []
        if kind == OWN:
            measured = self.own[source_model]
            by_method: dict[str, list[Run]] = defaultdict(list)
            for run, _c, _m in measured:
                if run.gpu != gpu and self._rated(run):
                    by_method[run.method].append(run)
            for slug, runs in sorted(by_method.items()):
                fits, why = self._fits(model, slug, gpu, world, nodes)
                if not fits:
                    refused.append(f"{slug}: {why}")
                    continue
                mbs = [mb for run, _c, mb in measured if run.method == slug and mb]
                mb = min(max(mbs) if mbs else r.global_batch // world, r.global_batch // world)
                step = self._step(spec, slug, gpu, world, mb, runs, measured, nodes)
                if step:
                    options.append(step)
        else:
            runs = self.public_by_model[source_model]  # the target's own public runs weigh most (distance 0)
            for slug in PUBLIC_METHODS:
                cell = grid.Cell(model, gpu, nodes, gpus_per_node, slug)
                if grid.invalid_reason(cell, spec, g, "slurm", self.catalog):
                    continue
                fits, why = self._fits(model, slug, gpu, world, nodes)
                mb = self._largest_mb(spec, slug, gpu, world, nodes) if fits else 0
                if not fits or mb < 1:
                    refused.append(f"{slug}: {why or 'the memory model fits no micro-batch'}")
                    continue
                step = self._step(spec, slug, gpu, world, mb, runs, [], nodes)
                if step:
                    options.append(step)
        if not options:
            p.status, p.why = "does not fit", "; ".join(refused) or "no measured method"
            return p
        best = min(options, key=lambda s: (s.seconds[1], PUBLIC_METHODS.index(s.slug) if s.slug in PUBLIC_METHODS
                                           else 0, s.slug))  # fmt: skip
        opt, central, pess = best.seconds
        p.method, p.micro_batch = best.slug, best.mb
        p.mfu_high, p.mfu_central, p.mfu_low = (flops / (world * peak * 1e12 * s) for s in (opt, central, pess))
        p.comm_share = best.comm[1] / central if central else None
        p.days_optimistic, p.days_central, p.days_pessimistic = (r.steps * s / 86400 for s in (opt, central, pess))
        p.rests_on = best.estimate.rows()
        p.sources = ", ".join(best.estimate.sources)
        p.transfer = best.estimate.kind.short + (" (near)" if best.estimate.nearest < NEAR else " (far)")
        p.model_error = best.estimate.band_note
        what = "measured method(s)" if kind == OWN else "data-parallel method(s) (public evidence)"
        p.why = (f"fastest of {len(options)} {what} that fit {world} x {gpu}"
                 f"{' (' + str(g.memory_gib) + ' GiB)' if g.memory_gib else ''} at micro-batch {best.mb}; compute "
                 f"from {p.basis} on {', '.join(sorted({b.gpu for b, _t, _w in best.estimate.basis}))}")  # fmt: skip
        if refused:
            p.note = "; ".join(x for x in (p.note, "does not fit: " + "; ".join(refused)) if x)
        if nodes > 1:
            p.note = "; ".join(x for x in (p.note, self.network_note(gpu)) if x)
        self._price(p)
        return p

    def network_note(self, gpu: str) -> str:
        """Where a multi-node prediction's network bandwidth comes from (the site file, else config/gpus.yaml's
        reference system), or that it is unknown and what the prediction spans instead."""
        g = self.catalog.gpus[gpu]
        if not g.inter_node_gbit_s:
            return (f"network to other nodes unknown (no inter_node_gbit_s for {gpu} in {self.catalog.gpus_path} or "
                    "the site file): its communication spans 5 GB/s (Ethernet class) .. the GPU link")  # fmt: skip
        where = g.network_note or (f"{self.catalog.gpus_path}'s reference system; your site's: the site file's "
                                   "inter_node_gbit_s")  # fmt: skip
        return f"network {g.inter_node_gbit_s:g} Gb/s per GPU to other nodes ({where})"

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


CELL_COLUMNS = {
    "model": pl.String, "gpu": pl.String, "nodes": pl.Int64, "gpus_per_node": pl.Int64, "world_size": pl.Int64,
    "method": pl.String, "status": pl.String, "suspect": pl.Boolean, "valid": pl.Boolean, "step_time_s": pl.Float64,
    "mfu": pl.Float64, "training_days": pl.Float64, "micro_batch_size": pl.Int64,
}  # fmt: skip


def empty_cells() -> pl.DataFrame:
    """A cells table with nothing measured (a fresh install: predictions from public evidence only)."""
    return pl.DataFrame(schema=CELL_COLUMNS)


FIT_COLUMNS = {
    "model": pl.String, "fits": pl.String, "basis": pl.String, "method": pl.String, "days": pl.Float64,
    "days_optimistic": pl.Float64, "days_pessimistic": pl.Float64, "tokens_in_time": pl.Float64, "unit": pl.String,
    "share_of_run": pl.Float64, "why": pl.String, "rests_on": pl.String,
}  # fmt: skip


def _verdict(days: float, opt: float | None, central: float | None, pess: float | None) -> str:
    if pess is not None and pess <= days:
        return "yes"
    if central is not None and central <= days:
        return "likely"
    if opt is not None and opt <= days:
        return "maybe"
    return "no"


def fit_table(predictor: Predictor, gpu: str, nodes: int, gpus_per_node: int, days: float,
              models: list[str] | None = None, measured: pl.DataFrame | None = None) -> pl.DataFrame:  # fmt: skip
    """The inverse question (what none of the anchors answer from measurements): per catalog model, the fastest
    setting on `nodes` x `gpus_per_node` x `gpu` measured here (`measured`: tables/time_to_train) or else
    predicted (Predictor.predict), the tokens (samples for images) it reaches in `days`, and whether the recipe's
    run fits: yes (measured so, or even the pessimistic end within the days), likely (the central value), maybe (the
    optimistic end only), no."""
    cat = predictor.catalog
    names = models or [n for n, s in cat.models.items() if s.recipe.steps and not n.startswith("tiny-")]
    got = {}
    if measured is not None and not measured.is_empty():
        here = (pl.col("gpu") == gpu) & (pl.col("nodes") == nodes) & (pl.col("gpus_per_node") == gpus_per_node)
        sel = measured.filter(here & pl.col("step_time_s").is_not_null())
        got = {r["model"]: r for r in sel.iter_rows(named=True)}
    rows = []
    for name in names:
        spec = cat.model(name)
        units = spec.recipe.global_batch * _units(spec)
        unit = "tokens" if spec.is_text else "samples"
        row: dict[str, Any] = {"model": name, "unit": unit}
        m = got.get(name)
        if m is not None and m.get("training_days"):
            step = m["step_time_s"]
            row.update(fits="yes" if m["training_days"] <= days else "no", basis="measured",
                       method=m.get("best_method"), days=m["training_days"], why="measured here")  # fmt: skip
        elif (p := predictor.predict(name, gpu, nodes, gpus_per_node)).status == "bound only":
            step = None
            row.update(fits="no" if p.days_optimistic > days else "maybe", basis=p.status,
                       days_optimistic=p.days_optimistic, why=predictor.bound_reason(spec, gpu))  # fmt: skip
        else:
            central = p.days_central
            step = central * 86400 / spec.recipe.steps if central and spec.recipe.steps else None
            row.update(fits=_verdict(days, p.days_optimistic, p.days_central, p.days_pessimistic) if central else
                       "no", basis=p.evidence or p.status, method=p.method, days=central,
                       days_optimistic=p.days_optimistic, days_pessimistic=p.days_pessimistic, why=p.why,
                       rests_on=p.rests_on)  # fmt: skip
        if step:
            row["tokens_in_time"] = days * 86400 / step * units
            row["share_of_run"] = days / row["days"] if row.get("days") else None
        rows.append(row)
    order = {"yes": 0, "likely": 1, "maybe": 2, "no": 3}
    rows.sort(key=lambda r: (order.get(r["fits"], 4), r.get("days") or math.inf))
    return pl.DataFrame(rows, schema=FIT_COLUMNS)


def evidence_models(predictor: Predictor) -> list[str]:
    """The catalog models the public evidence reaches (its own runs, or a model of its kind): the real models the
    default sweep's what-if shows beside the sweep's."""
    gpus = [name for name, g in predictor.catalog.gpus.items() if g.peak_tflops]
    real = [(n, s) for n, s in predictor.catalog.models.items() if not n.startswith("tiny-") and s.recipe.steps]
    return [name for name, spec in real if any(predictor.basis(spec, g) for g in gpus)]


def whatif_table(predictor: Predictor, models: list[str], counts: list[tuple[int, int]]) -> pl.DataFrame:
    """Every (model, catalog GPU type with a dense peak, count) as a Prediction row."""
    rows = [predictor.predict(m, g, n, k).to_dict()
            for m in dict.fromkeys(models) if m in predictor.catalog.models
            for g, spec in predictor.catalog.gpus.items() if spec.peak_tflops
            for n, k in counts]  # fmt: skip
    return pl.DataFrame(rows, schema=COLUMNS)


def table_files(folder: str) -> dict[str, str]:
    return {"whatif_csv": f"{folder}/whatif.csv", "whatif_md": f"{folder}/whatif.md"}


def counts_of(config: dict[str, Any]) -> list[tuple[int, int]]:
    """The (nodes, GPUs per node) the what-if predicts: the sweep's, and the study's GPU-days setting (the GPU-days
    plot shows the prediction where that setting was not measured)."""
    sweep = config["sweep"]
    study = study_settings(config.get("study"))
    counts = {(n, g) for n in sweep["nodes"] for g in sweep["gpus_per_node"]}
    counts.add((study["gpu_days_nodes"], study["gpu_days_gpus_per_node"]))
    return sorted(counts, key=lambda c: (c[0] * c[1], c[0]))


def whatif_settings(given: dict[str, Any] | None, catalog: Catalog | None = None) -> dict[str, Any]:
    """The config's `whatif` section over the schema's defaults, checked: the models it names must be in the catalog
    (a typo would silently lead with nothing)."""
    out = section("config", "whatif", given)
    unknown = [m for m in out["models"] if catalog is not None and m not in catalog.models]
    if unknown:
        raise ConfigError(f"config whatif.models: {unknown} not in {catalog.models_path} ({', '.join(catalog.models)})")
    return out


# ---------------------------------------------------------------------------------------- the reading order


def _days_of(r: dict[str, Any]) -> float:
    """A row's days for ranking: the central, else the optimistic end (a bound), else none (last)."""
    d = r["days_central"] if r.get("days_central") is not None else r.get("days_optimistic")
    return math.inf if d is None else d


def _rank(r: dict[str, Any]) -> tuple[int, float, int, str]:
    return STATUS_RANK.get(r["status"], len(STATUS_RANK)), _days_of(r), r["world_size"], r["gpu"]


def _by_model(table: pl.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """model -> its rows ranked: predicted by days, then bound only, then does not fit, invalid, no peak."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in table.iter_rows(named=True):
        out.setdefault(r["model"], []).append(r)
    return {m: sorted(rows, key=_rank) for m, rows in out.items()}


def reading_order(table: pl.DataFrame, lead: list[str]) -> pl.DataFrame:
    """The rows in the order a reader asks: every setting of each `lead` model (the swept ones, then those the config
    names), each model's ranked (`_by_model`); then the fastest setting of each other model, those models ranked by
    it; then the rest of theirs, model by model. whatif.csv is written so, and the what-if plot draws its first
    rows: the plot is handed the CSV only, so the order is how it knows what leads."""
    rows = _by_model(table)
    first = [m for m in dict.fromkeys(lead) if m in rows]
    others = sorted((m for m in rows if m not in first), key=lambda m: (_rank(rows[m][0]), m))
    ordered = [r for m in first for r in rows[m]] + [rows[m][0] for m in others]
    ordered += [r for m in others for r in rows[m][1:]]
    return pl.DataFrame(ordered, schema=table.schema)


# ---------------------------------------------------------------------------------------- whatif.md


def error_sentence(predictor: Predictor) -> str:
    """The fitted model's out-of-sample error of the same model's transfer, to a GPU type the evidence did not and
    did measure: the figures of this run (report.md states them from here, never typed into a caption)."""
    cal = predictor.model.calibration

    def said(kind: Kind, where: str) -> str:
        e = cal.of(kind)
        if not e.n or e.mean_abs is None or e.max_abs is None:
            return f"to {where} not measured (too few cases in the evidence)"
        return f"to {where} {e.mean_abs:.1%} mean ({e.max_abs:.0%} worst, {e.n} runs)"

    unseen = said(Kind("same", False), "a GPU type absent from the evidence")
    seen = said(Kind("same", True), "one it measured")
    return (f"{ERROR_LEAD}, out of sample on the public evidence, for the same model moved {unseen} and {seen}; a "
            "stand-in model's transfer has its own.")  # fmt: skip


def read_error_sentence(whatif_md: str | Path) -> str | None:
    """The error sentence of a written whatif.md (its paragraph opening with ERROR_LEAD), on one line; None when the
    file or the paragraph is missing (a what-if of an older version)."""
    path = Path(whatif_md)
    if not path.is_file():
        return None
    for paragraph in path.read_text(encoding="utf-8").split("\n\n"):
        if paragraph.startswith(ERROR_LEAD):
            return " ".join(paragraph.split())
    return None


def _fill(text: str, width: int = WIDTH, **kw: Any) -> str:
    """textwrap.fill that keeps a name whole (tiny-gptneox, fl+ac+zero2, a100-40gb-pcie are not broken)."""
    return textwrap.fill(text, width, break_on_hyphens=False, break_long_words=False, **kw)


def _days_band(r: dict[str, Any]) -> str:
    """'14 d (12 - 17 d)': the central days and the band, the unit written once where both ends share it;
    '>= 1.2 ms' for a bound; the status for a row without days."""
    if r["status"] == "bound only" and r.get("days_optimistic") is not None:
        return f">= {days_text(r['days_optimistic'])}"
    if r.get("days_central") is None:
        return r["status"]
    lo, hi = days_text(r["days_optimistic"]), days_text(r["days_pessimistic"])
    lo_n, _, lo_u = lo.rpartition(" ")
    band = f"{lo_n} - {hi}" if hi.endswith(" " + lo_u) else f"{lo} - {hi}"
    return f"{days_text(r['days_central'])} ({band})"


def _rests_on(r: dict[str, Any]) -> str:
    """'public: same, seen, near': the evidence (your cells or public) and the kind of transfer in three words."""
    if r["status"] == "bound only":
        return "physics bound only"
    if r["status"] != "predicted":
        return ""
    t = r.get("transfer") or ""
    what = "other-sw" if "other software" in t else "stand-in" if t.startswith("stand-in") else "same"
    seen = "unseen" if "unmeasured GPU type" in t else "seen"
    near = "near" if "(near)" in t else "far" if "(far)" in t else ""
    who = {OWN: "yours", PUBLIC: "public"}.get(r.get("evidence") or "", r.get("evidence") or "")
    return f"{who}: " + ", ".join(x for x in (what, seen, near) if x)


def _cost(r: dict[str, Any]) -> str:
    lo, hi = r.get("amortised_usd_optimistic"), r.get("amortised_usd_pessimistic")
    if lo is None:
        return ""
    return f"{usd_text(lo)} - {usd_text(hi)}" if hi is not None else f">= {usd_text(lo)}"


def _measured(r: dict[str, Any]) -> str:
    return "" if r.get("measured_days") is None else days_text(r["measured_days"])


def _setting(r: dict[str, Any]) -> str:
    return f"{r['nodes']}x{r['gpus_per_node']}"


def _width(columns: list[str], rows: list[list[str]]) -> int:
    """The characters of a Markdown table's line (markdown.table's padding)."""
    return 1 + sum(max([len(c), 3, *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns))


def _compact(columns: list[tuple[str, Any]], rows: list[dict[str, Any]], optional: tuple[str, ...]) -> str:
    """A Markdown table of `rows` by `columns` (header, row -> text) that fits WIDTH, so that it is never cut into
    blocks: a column empty in every row is left out, then `optional` ones (last first) while a line is too wide."""
    texts = {h: [fn(r) for r in rows] for h, fn in columns}
    keep = [h for h, _ in columns if any(texts[h])]
    for h in reversed(optional):
        if _width(keep, [[texts[c][i] for c in keep] for i in range(len(rows))]) <= WIDTH:
            break
        if h in keep:
            keep.remove(h)
    return to_table(keep, [[texts[c][i] for c in keep] for i in range(len(rows))], keys=1).rstrip("\n")


def _dnf_kinds(whys: list[str]) -> str:
    kinds = {"memory model": "the memory model's lower bound at micro-batch 1 passes the GPU's memory",
             "out of memory measured": "measured out of memory on a GPU type with as much memory",
             "sharding on one GPU": "sharding on one GPU"}  # fmt: skip
    found = [text for key, text in kinds.items() if any(key in w for w in whys)]
    return "; ".join(found) or "no measured method fits"


def _grouped(rows: list[dict[str, Any]]) -> str:
    """'rtx3090 (1x1, 1x2), a6000 (1x1)': the settings of some rows, by GPU type."""
    by: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["world_size"], r["nodes"])):
        by.setdefault(r["gpu"], []).append(_setting(r))
    return ", ".join(f"{g} ({', '.join(s)})" for g, s in by.items())


def _model_section(predictor: Predictor, model: str, rows: list[dict[str, Any]], why: str) -> list[str]:
    """One lead model: what its rows rest on and why some do not predict, said once; its rows ranked by days."""
    n = {s: sum(r["status"] == s for r in rows) for s in STATUS_RANK}
    said_as = {"bound only": "the physics bound only", "does not fit": "do not fit", "no peak": "without a peak"}
    counts = ", ".join(f"{k} {said_as.get(s, s)}" for s, k in n.items() if k)
    said = [f"{len(rows)} settings ({counts})."]
    bases = list(dict.fromkeys(r["basis"] for r in rows if r["status"] == "predicted" and r["basis"]))
    if bases:
        said.append(f"Predicted from {'; '.join(bases)}.")
    bound = list(dict.fromkeys(r["why"].split(BOUND)[0] for r in rows if r["status"] == "bound only"))
    if bound:
        said.append(f"The physics bound only (the days at the `suspect` share of the dense peak): {'; '.join(bound)}.")
    unused = predictor.unused_cells(model)
    if unused:
        said.append(unused[0].upper() + unused[1:] + ".")
    dnf = [r for r in rows if r["status"] == "does not fit"]
    if dnf:
        said.append(f"Does not fit ({_dnf_kinds([r['why'] for r in dnf])}; each method's need in whatif.csv `why`): "
                    f"{_grouped(dnf)}.")  # fmt: skip
    for status in ("invalid", "no peak"):
        for reason in dict.fromkeys(r["why"] for r in rows if r["status"] == status):
            said.append(f"{status.capitalize()}: {reason} ({_grouped([r for r in rows if r['why'] == reason])}).")
    shown = [r for r in rows if r["status"] in ("predicted", "bound only")]
    columns = [("GPU", lambda r: r["gpu"]), ("GPUs", _setting), ("method", lambda r: r["method"] or ""),
               ("days (band)", _days_band), ("rests on", _rests_on), ("amortised cost", _cost),
               ("measured", _measured)]  # fmt: skip
    md = [f"### {model} ({why})", "", _fill(" ".join(said), WIDTH), ""]
    if shown:
        md.append(_compact(columns, shown, ("amortised cost",)))
    return md


def _others_section(predictor: Predictor, rows: dict[str, list[dict[str, Any]]], lead: list[str]) -> list[str]:
    """The other catalog models the evidence reaches: each one's fastest predicted setting, ranked by it; and the
    real catalog models it does not reach, each with why."""
    others = sorted((m for m in rows if m not in lead), key=lambda m: (_rank(rows[m][0]), m))
    fastest = [rows[m][0] for m in others if rows[m][0]["status"] == "predicted"]
    md: list[str] = []
    if fastest:
        total = sum(len(rows[m]) for m in others)
        predicted = sum(r["status"] == "predicted" for m in others for r in rows[m])
        md += ["## Other catalog models the evidence reaches", "",
               _fill(f"Each model's fastest predicted setting, the models ranked by it ({predicted} of their "
                             f"{total} settings are predicted; all of them in whatif.csv). Name a model in the "
                             "config's `whatif.models` to see each of its settings above.", WIDTH), "",
               _compact([("model", lambda r: r["model"]),
                         ("fastest setting", lambda r: f"{_setting(r)} {r['gpu']}, {r['method']}"),
                         ("days (band)", _days_band), ("rests on", _rests_on), ("amortised cost", _cost)], fastest,
                        ("amortised cost",))]  # fmt: skip
    rated = [g for g, spec in predictor.catalog.gpus.items() if spec.peak_tflops]
    unreached = [(n, spec) for n, spec in predictor.catalog.models.items()
                 if n not in rows and not n.startswith("tiny-") and spec.recipe.steps]  # fmt: skip
    if unreached and rated:
        md += ["", "Catalog models the evidence does not reach (the physics bound only; `pretrain-planner predict` "
               "gives it):", ""]  # fmt: skip
        for name, spec in unreached:
            gpu = next((g for g in rated if predictor.model.rates(g, spec.recipe.precision)), rated[0])
            md.append(_fill(f"- {name}: {predictor.bound_reason(spec, gpu)}", WIDTH, subsequent_indent="  "))
    return md


def _cost_notes(table: pl.DataFrame) -> str:
    """The cost notes of every row, said once: the GPU types without a price, then any other note."""
    notes: dict[str, None] = {}
    for note in table["note"].drop_nulls():
        if "cost: " in note:
            for part in note.split("cost: ", 1)[1].split("; "):
                notes[part] = None
    unpriced: dict[str, list[str]] = defaultdict(list)
    rest = []
    for n in notes:
        if n.startswith("no price_usd for ") and " in " in n:
            gpu, path = n[len("no price_usd for ") :].split(" in ", 1)
            unpriced[path].append(gpu)
        else:
            rest.append(n)
    said = [f"no price_usd in {path} for {', '.join(gpus)}: no cost shown" for path, gpus in unpriced.items()]
    return _fill("Costs: " + "; ".join([*said, *rest]) + ".", WIDTH) if said or rest else ""


def whatif_markdown(predictor: Predictor, table: pl.DataFrame, swept: list[str], named: list[str]) -> str:
    """whatif.md: the question a user asks first. The intro and the model's measured error by kind of transfer;
    each swept and named model's settings ranked by days, in one table of at most WIDTH characters; each other model
    the evidence reaches by its fastest setting; the reasons said once per model, not as numbered notes; every column
    and row in whatif.csv."""
    rows = _by_model(table)
    lead = [m for m in dict.fromkeys([*swept, *named]) if m in rows]
    years = predictor.costs["amortisation_years"]
    intro = _fill(f"{INTRO} The cross-GPU model: {predictor.model.params.describe()}.", WIDTH)
    kinds = [_fill(line, WIDTH, initial_indent="- ", subsequent_indent="  ")
             for line in predictor.model.calibration.lines()]  # fmt: skip
    legend = (
        "One row per setting (a catalog GPU type with a dense peak, a count): the predicted ones ranked by their "
        "central days (the band: optimistic - pessimistic), then the physics bound only (`>=`), then what does not "
        "fit (said under the model). `rests on`: your cells (yours) or the public evidence (public), and the kind of "
        "transfer: the same model or a stand-in of its kind (other-sw: from another software's runs), to a GPU type "
        f"the evidence measured (seen) or not (unseen), from a near or a far one. `amortised cost`: the hardware over "
        f"{years:g} years for the band's days."
    )  # fmt: skip
    md = ["# What-if (predictions)", "", intro, "", _fill(error_sentence(predictor), WIDTH), "",
          "By kind of transfer (each kind's band is its 5%-95% errors):", "", *kinds, ""]  # fmt: skip
    if lead:
        md += ["## " + ("The swept and named models" if any(m not in swept for m in lead) else "The swept models"),
               "", _fill(legend, WIDTH), ""]  # fmt: skip
        for m in lead:
            md += [*_model_section(predictor, m, rows[m], "swept" if m in swept else "named in whatif.models"), ""]
    md += _others_section(predictor, rows, lead)
    costs = _cost_notes(table)
    full = (f"The full table, every column and every row ({table.height}: the sources, the evidence rows, the "
            "method's reasons, the measured error of each row's kind, the notes), is whatif.csv.")  # fmt: skip
    md += ["", *([costs, ""] if costs else []), _fill(full, WIDTH)]
    return "\n".join(md).rstrip("\n") + "\n"


def rule_settings(config: dict[str, Any], catalog: Catalog) -> dict[str, Any]:
    """What the `whatif` rule passes to build_whatif from the sweep's config (a change of any re-predicts)."""
    return {
        "models": list(config["sweep"]["models"]),
        "counts": counts_of(config),
        "suspect_mfu": config["benchmark"]["suspect_mfu"],
        "costs_config": config.get("costs", {}),
        "named": whatif_settings(config.get("whatif"), catalog)["models"],
        # the site file's network over the catalog's (a change of it re-predicts the multi-node rows)
        "network": {g: spec.inter_node_gbit_s for g, spec in catalog.gpus.items() if spec.network_note},
        # the rows imported from other sites (an import re-predicts: its digest is the parameter that changes)
        "evidence_folder": str(pp_exchange.evidence_folder(config)),
        "evidence_digest": pp_exchange.folder_digest(pp_exchange.evidence_folder(config)),
    }


def build_whatif(
    cells_parquet: str,
    out: dict[str, str],
    log_path: str,
    catalog: Catalog,
    models: list[str],
    counts: list[tuple[int, int]],
    suspect_mfu: float,
    costs_config: dict[str, Any] | None = None,
    with_evidence_models: bool = True,
    named: list[str] | None = None,
    network: dict[str, float] | None = None,
    evidence_folder: str | None = None,
    evidence_digest: str = "",
) -> pl.DataFrame:
    """The `whatif` rule: tables/whatif.{csv,md} of the sweep's models (`models`), those the config names
    (`named`: whatif.models) and, `with_evidence_models`, every catalog model the public evidence reaches. The CSV
    has every row and column, in the reading order (`reading_order`); the .md leads with the swept and named.
    `network`: the site file's inter_node_gbit_s the catalog already carries (a rule parameter, so that a change
    of it reruns the rule; logged). `evidence_folder`: where other sites' rows were imported (`evidence_digest`,
    their digest, is the parameter an import changes)."""
    t0 = time.perf_counter()
    predictor = Predictor(pl.read_parquet(cells_parquet), catalog, suspect_mfu, costs_config,
                          evidence_folder=evidence_folder)  # fmt: skip
    named = [m for m in named or [] if m in catalog.models]
    lead = [*models, *named]
    every = [*lead, *evidence_models(predictor)] if with_evidence_models else lead
    table = reading_order(whatif_table(predictor, every, counts), lead)
    Path(out["whatif_csv"]).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out["whatif_csv"], table.write_csv())
    atomic_write_text(out["whatif_md"], whatif_markdown(predictor, table, models, named))
    error = predictor.model.calibration.describe()
    by = dict(table.group_by("status").len().sort("status").rows())
    atomic_write_text(log_path, f"whatif: {table.height} rows {by}; {len(predictor.public.runs)} evidence runs "
                                f"({origins_text(predictor.public.origins())} from {evidence_folder or 'no folder'}; "
                                f"{len(predictor.public.skipped)} rows not usable); {error}; the site's network "
                                f"{network or 'not given (config/gpus.yaml defaults)'} "
                                f"({time.perf_counter() - t0:.2f} s)\n")  # fmt: skip
    return table

"""The what-if's predictor: days and cost of a model on GPUs you do not own, PREDICTED from measurements on other GPU
types (`Predictor.predict`, one setting at a time). Asked by the what-if's tables (tables/whatif.py: whatif.csv,
whatif.md, the `fit` table) and by `pretrain-planner predict`, `fit` and `when`.

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
(planning/memory.py: model-state lower bound plus the micro-batch's activations, asked for that very method, its head
and checkpointing included) lets fit the target: of the methods measured (your cells, at the largest micro-batch
measured, cut to the memory model's largest on the target), or, from public evidence, the least-communicating
data-parallel method (fl, ZeRO / FSDP sharding, checkpointing; no offload) at the largest micro-batch that fits. A
method measured out of memory on a GPU with at least the target's memory at that count does not fit. With no evidence
of the model's family or kind within STAND_IN_RATIO of its size, or a target without the step model's rates, only the
physics bound is given: the days at the `suspect` limit of the target's peak, and why (the nearest model measured,
how many times larger or smaller). Cells measured on a GPU type without those rates (the `cpu` stand-in) cannot be
moved to a GPU and are not used; each prediction of their model says so in its `note`. Imports no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import evidence as pp_evidence
from pretrain_planner.planning import evidence_exchange as pp_exchange
from pretrain_planner.planning import grid, memory, methods, stepmodel
from pretrain_planner.planning.catalog import Catalog, ModelSpec
from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.planning.crossgpu import NEAR, STAND_IN_RATIO, CrossGpu, Estimate, fit, stand_in
from pretrain_planner.planning.evidence import HERE, Evidence, Run, Work
from pretrain_planner.planning.flops import param_count, tokens_per_sample, train_flops_per_sample
from pretrain_planner.planning.memory import GIB
from pretrain_planner.planning.runspec import RunSpec, batch_split_reason
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables.study import ran
from pretrain_planner.tables.units import gib as gib_text
from pretrain_planner.tables.units import number as number_text

BUS_EFFICIENCY = 0.25  # no multi-GPU cell measured: the pessimistic all-reduce runs at this share of the datasheet
OWN, PUBLIC = "your cells", "public evidence"
# what public evidence is transferred to: data-parallel methods, least communication first (no offload: its CPU
# optimizer and PCIe speeds are not in the evidence)
PUBLIC_METHODS = (
    "fl", "fl+zero1", "fl+zero2", "fl+fsdp-grad", "fl+zero3", "fl+fsdp-full",
    "fl+ac", "fl+ac+zero1", "fl+ac+zero2", "fl+ac+fsdp-grad", "fl+ac+zero3", "fl+ac+fsdp-full",
    "fl+hsdp", "fl+ac+hsdp",  # several nodes only (grid.invalid_reason)
)  # fmt: skip

BOUND = ": the physics bound only"  # a bound-only `why`: its reason, then this (whatif.md says the reason once)


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
    micro_batch: int
    compute: tuple[float, float, float]
    comm: tuple[float, float, float]
    estimate: Estimate

    @property
    def seconds(self) -> tuple[float, float, float]:
        return tuple(c + m for c, m in zip(self.compute, self.comm, strict=True))  # type: ignore[return-value]


def units_per_sample(spec: ModelSpec) -> int:
    """Units of the cross-GPU model per sample: tokens for text, one for an image."""
    return (tokens_per_sample(spec.to_dict()) or 1) if spec.is_text else 1


def _rank_units(spec: ModelSpec, m: methods.Method, world: int) -> float:
    """A rank's units per optimizer step: its share of the global batch in units, x (1 + RECOMPUTE_SHARE) with
    activation checkpointing (the recomputed forward counts as work)."""
    share = spec.recipe.global_batch // world * units_per_sample(spec)
    return share * (1 + stepmodel.RECOMPUTE_SHARE if m.checkpointing else 1)


def _work(spec: ModelSpec, slug: str, micro_batch: int | None = None, world: int | None = None) -> Work | None:
    """A catalog model's work per unit under a method; at a micro-batch on `world` ranks its model-state traffic is
    in (stepmodel.state_bytes_per_sample) where the method replicates the model states, as for the evidence's rows."""
    m = methods.parse(slug)
    replicated = m.sharding is None and micro_batch and world
    micro, per_step = (micro_batch, spec.recipe.global_batch / world) if replicated else (None, None)
    return pp_evidence.catalog_work(spec, eager=m.base == "naive", tf32=m.base != "naive", micro_batch=micro,
                                    samples_per_step=per_step)  # fmt: skip


Measured = tuple[Run, float | None, int | None]  # a measured cell as a run, its communication seconds, its micro-batch


def _by_method(rows: list[Measured]) -> dict[str, list[Measured]]:
    """A model's measured runs by method, in their order."""
    out: dict[str, list[Measured]] = defaultdict(list)
    for row in rows:
        out[row[0].method].append(row)
    return out


class Predictor:
    """Predictions from a `cells` table (aggregate.cells_table), the catalog and the public evidence (`public`: the
    shipped evidence and the rows imported into `evidence_folder` by default; an Evidence to use another, None for
    none). `costs`: the config's costs section, typed (None: the schema's defaults)."""

    def __init__(
        self,
        cells: pl.DataFrame,
        catalog: Catalog,
        suspect_mfu: float = 0.85,
        costs: CostsSection | None = None,
        public: Evidence | None | bool = True,
        evidence_folder: str | Path | None = None,
    ) -> None:
        self.catalog, self.limit = catalog, suspect_mfu
        self.costs = pp_costs.typed(costs, "tables.predictor.Predictor")
        if public is True:  # the shipped rows and those imported into the evidence folder (planning/evidence_exchange)
            public = pp_exchange.loaded_evidence(catalog, suspect_mfu, evidence_folder)
        self.public: Evidence = public or Evidence()
        self.public_by_model: dict[str, list[Run]] = defaultdict(list)
        for r in self.public.runs:
            self.public_by_model[r.model].append(r)
        ok = ran(cells).filter(pl.col("mfu").is_not_null() & (pl.col("mfu") > 0))
        one = {(r["model"], r["gpu"], r["method"]): r["step_time_s"]
               for r in ok.filter(pl.col("world_size") == 1).iter_rows(named=True)}  # fmt: skip
        self.own: dict[str, list[tuple[Run, float | None, int | None]]] = defaultdict(
            list
        )  # model -> (run, comm, micro-batch)
        self.own_nodes: dict[str, int] = {}  # a measured cell's run id -> its nodes (its layout's bandwidths)
        # what every prediction asks again of the same model, method and layout, made once (a what-if table asks
        # thousands): a catalog model's parameter count, its work per unit, a measured run's communication model
        self._param_counts: dict[str, float | None] = {}
        self._works: dict[tuple[str, str, int | None, int | None], Work | None] = {}
        self._sources: dict[tuple[str, str, int | None], tuple[float | None, float]] = {}
        for r in ok.iter_rows(named=True):
            got = self._own_run(r, one.get((r["model"], r["gpu"], r["method"])))
            if got:
                self.own[r["model"]].append(got)
                self.own_nodes[got[0].id] = int(r["nodes"])
        self.own_by_method: dict[str, dict[str, list[Measured]]] = {
            model: _by_method(rows) for model, rows in self.own.items()
        }
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
        micro_batch = r.get("micro_batch")
        mb = int(micro_batch) if micro_batch else None
        work = self._work(spec, r["method"], mb, r["world_size"]) if spec else None
        if work is None or r["gpu"] not in self.catalog.gpus:
            return None
        t, w = r["step_time_s"], r["world_size"]
        comm = 0.0 if w == 1 else (max(0.0, min(0.9 * t, t - t1 / w)) if t1 else None)
        m = methods.parse(r["method"])
        units = _rank_units(spec, m, w)
        folder = f"{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        run = Run(folder, "measured here", f"cells/{folder}", r["model"], work.kind, work.params, r["gpu"], w,
                  f"own:{r['model']}:{w}:{r['method']}", r["method"], work.precision, (t - (comm or 0.0)) / units,
                  work.flops, work.memory_bytes, public=False, tf32=work.tf32, formula=work.formula,
                  origin="own")  # fmt: skip
        return run, comm, int(micro_batch) if micro_batch else None

    def _param_count(self, spec: ModelSpec) -> float | None:
        """The catalog model's parameter count (planning/flops.param_count), once per model."""
        if spec.name not in self._param_counts:
            self._param_counts[spec.name] = param_count(spec.to_dict())
        return self._param_counts[spec.name]

    def _work(self, spec: ModelSpec, slug: str, micro_batch: int | None, world: int | None) -> Work | None:
        """`_work` of the module, once per model, method, micro-batch and ranks (a Work is frozen)."""
        key = (spec.name, slug, micro_batch, world)
        if key not in self._works:
            self._works[key] = _work(spec, slug, micro_batch, world)
        return self._works[key]

    def _nearest(self, spec: ModelSpec, candidates: list[str], same) -> str | None:
        size = math.log(max(self._param_count(spec) or 1.0, 1.0))
        pool = [m for m in candidates if same(m)
                and abs(math.log(max(self._params(m), 1.0)) - size) <= math.log(STAND_IN_RATIO)]  # fmt: skip
        if not pool:
            return None
        return min(pool, key=lambda m: (abs(math.log(max(self._params(m), 1.0)) - size), m))

    def _params(self, model: str) -> float:
        if model in self.catalog.models:
            return self._param_count(self.catalog.models[model]) or 1.0
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
        near = stand_in(spec.name, self._param_count(spec) or 1.0, spec.task, spec.kind.formula or "", HERE,
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
        size = max(self._param_count(spec) or 1.0, 1.0)
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
        why = RunSpec(spec, g, m, world, nodes=nodes).sweep_reason()
        if why:
            return False, why
        for gg in self.oom.get((model, slug, world), []):
            if gg != gpu:
                mem = self.catalog.gpus[gg].memory_gib if gg in self.catalog.gpus else None
                if mem and g.memory_gib and mem >= g.memory_gib:
                    return False, f"out of memory measured on {world} x {gg} ({mem:g} GiB)"
        if self._largest_mb(spec, slug, gpu, world, nodes) < 1:
            per_rank = spec.recipe.global_batch // world
            need = memory.need_bytes(spec, m, world, 1, nodes, per_rank) or 0.0
            return False, f"memory model: at least {gib_text(need / GIB)} per GPU > {g.memory_gib:g} GiB"
        return True, ""

    def _largest_mb(self, spec: ModelSpec, slug: str, gpu: str, world: int, nodes: int = 1) -> int:
        """The largest micro-batch, halving from the per-GPU batch, that the memory model lets `slug` fit (0: none):
        planning/memory.py's `predicted_micro_batch` for this very method, the answer the search and the
        explanations (tables/memfix.py) give, so that a prediction never names a micro-batch its memory model
        refuses. The per-GPU batch where the GPU's memory or the model's parameters are unknown (nothing to refuse
        by)."""
        per_rank = spec.recipe.global_batch // world
        cap = self.catalog.gpu(gpu).memory_gib
        got = memory.predicted_micro_batch(spec, slug, world, cap, per_rank, nodes=nodes) if cap else None
        return per_rank if got is None else got

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

    def _comm(self, spec: ModelSpec, slug: str, micro_batch: int, gpu: str, world: int,
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
        params = self._param_count(spec) or 0.0
        f = stepmodel.of_method(slug, micro_batch, per_rank, world)
        target = self._comm_model(f, params, gpu, nodes, world)
        got = []
        for run, comm, mb_src in measured:
            if run.world == 1 or comm is None or run.gpu == gpu or run.method != slug:
                continue
            source, src_volume = self._source(run, slug, mb_src)
            if source and target:
                got.append(comm * target / source)
                continue
            # a bandwidth unknown: the volume ratio alone (the same bus)
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

    def _source(self, run: Run, slug: str, micro_batch: int | None) -> tuple[float | None, float]:
        """A measured run's communication under method `slug` at its micro-batch: (the step model's seconds at its
        layout's bandwidths, None where one is unknown; the bytes it synchronises per step), once per run."""
        key = (run.id, slug, micro_batch)
        if key not in self._sources:
            src = self.catalog.models[run.model]
            src_rank = src.recipe.global_batch // run.world
            src_f = stepmodel.of_method(slug, micro_batch or src_rank, src_rank, run.world)
            src_params = self._param_count(src) or 0.0
            source = self._comm_model(src_f, src_params, run.gpu, self.own_nodes.get(run.id, 1), run.world)
            self._sources[key] = (source, stepmodel.sync_bytes(src_f, src_params, run.world))
        return self._sources[key]

    def _step(self, spec: ModelSpec, slug: str, gpu: str, world: int, micro_batch: int, basis: list[Run],
              measured: list[tuple[Run, float | None, int | None]], nodes: int = 1) -> Step | None:  # fmt: skip
        work = self._work(spec, slug, micro_batch, world)
        est = self.model.estimate(basis, work, gpu) if work else None
        if est is None:
            return None
        m = methods.parse(slug)
        units = _rank_units(spec, m, world)
        compute = (est.low * units, est.central * units, est.high * units)
        return Step(slug, micro_batch, compute, self._comm(spec, slug, micro_batch, gpu, world, measured, nodes), est)

    # ---------------------------------------------------------------------------------------- predict

    def predict(self, model: str, gpu: str, nodes: int, gpus_per_node: int) -> Prediction:
        spec, g = self.catalog.model(model), self.catalog.gpu(gpu)
        world = nodes * gpus_per_node
        p = Prediction(model, gpu, nodes, gpus_per_node, world, "predicted",
                       measured_days=self.measured.get((model, gpu, nodes, gpus_per_node)))  # fmt: skip
        r = spec.recipe
        why = batch_split_reason(r.global_batch, world)
        if why:
            p.status, p.why = "invalid", why
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
            p.why = (f"{self.bound_reason(spec, gpu)}{BOUND} (the days at {self.limit:.0%} of {gpu}'s "
                     "dense peak, the `suspect` limit); no pessimistic end")  # fmt: skip
            p.days_optimistic = r.steps * flops / (world * peak * 1e12 * self.limit) / 86400
            self._price(p)
            return p
        kind, source_model, p.basis = basis
        p.evidence = kind
        options, refused = [], []
        if kind == OWN:
            measured = self.own_by_method[source_model]  # the model's cells by method
            by_method: dict[str, list[Run]] = defaultdict(list)
            for run, _c, _m in self.own[source_model]:
                if run.gpu != gpu and self._rated(run):
                    by_method[run.method].append(run)
            for slug, runs in sorted(by_method.items()):
                fits, why = self._fits(model, slug, gpu, world, nodes)
                if not fits:
                    refused.append(f"{slug}: {why}")
                    continue
                # the micro-batch measured (on another GPU type, maybe of a stand-in model) only as far as the
                # memory model lets it fit the target: a larger GPU's micro-batch may not
                mbs = [micro_batch for _run, _c, micro_batch in measured[slug] if micro_batch]
                largest = self._largest_mb(spec, slug, gpu, world, nodes)
                micro_batch = min(max(mbs), largest) if mbs else largest
                step = self._step(spec, slug, gpu, world, micro_batch, runs, measured[slug], nodes)
                if step:
                    options.append(step)
        else:
            runs = self.public_by_model[source_model]  # the target's own public runs weigh most (distance 0)
            for slug in PUBLIC_METHODS:
                cell = grid.Cell(model, gpu, nodes, gpus_per_node, slug)
                if grid.invalid_reason(cell, spec, g, "slurm", self.catalog):
                    continue
                fits, why = self._fits(model, slug, gpu, world, nodes)
                micro_batch = self._largest_mb(spec, slug, gpu, world, nodes) if fits else 0
                if not fits or micro_batch < 1:
                    refused.append(f"{slug}: {why or 'the memory model fits no micro-batch'}")
                    continue
                step = self._step(spec, slug, gpu, world, micro_batch, runs, [], nodes)
                if step:
                    options.append(step)
        if not options:
            p.status, p.why = "does not fit", "; ".join(refused) or "no measured method"
            return p
        best = min(options, key=lambda s: (s.seconds[1], PUBLIC_METHODS.index(s.slug) if s.slug in PUBLIC_METHODS
                                           else 0, s.slug))  # fmt: skip
        opt, central, pess = best.seconds
        p.method, p.micro_batch = best.slug, best.micro_batch
        p.mfu_high, p.mfu_central, p.mfu_low = (flops / (world * peak * 1e12 * s) for s in (opt, central, pess))
        p.comm_share = best.comm[1] / central if central else None
        p.days_optimistic, p.days_central, p.days_pessimistic = (r.steps * s / 86400 for s in (opt, central, pess))
        p.rests_on = best.estimate.rows()
        p.sources = ", ".join(best.estimate.sources)
        p.transfer = best.estimate.kind.short + (" (near)" if best.estimate.nearest < NEAR else " (far)")
        p.model_error = best.estimate.band_note
        what = "measured method(s)" if kind == OWN else "data-parallel method(s) (public evidence)"
        basis_gpus = ", ".join(sorted({b.gpu for b, _t, _w in best.estimate.basis}))
        p.why = (f"fastest of {len(options)} {what} that fit {world} x {gpu}"
                 f"{' (' + str(g.memory_gib) + ' GiB)' if g.memory_gib else ''} at micro-batch {best.micro_batch}; "
                 f"compute from {p.basis} on {basis_gpus}")  # fmt: skip
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
        base, years = self.catalog.base_machine_usd, self.costs.amortisation_years
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
    "mfu": pl.Float64, "training_days": pl.Float64, "micro_batch": pl.Int64,
}  # fmt: skip


def empty_cells() -> pl.DataFrame:
    """A cells table with nothing measured (a fresh install: predictions from public evidence only)."""
    return pl.DataFrame(schema=CELL_COLUMNS)

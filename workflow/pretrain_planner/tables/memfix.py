"""Why a setting does not fit in memory, and the cheapest change that makes it fit.

For a (model, GPU type, count) where no method ran, and for every `oom` cell: the memory needed at micro-batch 1
against the GPU's, and the first change, cheapest first, that the planner can show fits:
1. another method on the same GPUs: one measured to fit in this setting, else the memory-saving methods in the
   order of what they cost in speed (checkpointing recomputes a third of the compute; sharding adds communication;
   offload moves the optimizer to the CPU and its PCIe link), skipping those measured out of memory here;
2. more GPUs of the same type (sharding divides the model states by the GPU count);
3. a GPU type with more memory, the cheapest first (config/gpus.yaml prices; unpriced ones after);
4. a shorter sequence (text models; activations shrink with it), the recipe's changed.

"Needed" is measured where a cell of the same model, method and GPU count ran at micro-batch 1 (its peak, on any GPU
type), else the memory model's lower bound (model states + one sample's activations): such a fix is necessary, not
proven sufficient, and says so. The memory model is used here only through `need_bytes`, which is
planning/memory.py's: the same bytes, for the same method, that the what-if's predictions (tables/predictor.py) and
the adaptive search compare with a GPU's memory, so that an explanation and a prediction cannot disagree on what
fits. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from pretrain_planner.planning import grid, memory, methods
from pretrain_planner.planning.catalog import Catalog, GpuSpec, ModelSpec
from pretrain_planner.planning.memory import GIB
from pretrain_planner.tables import units

# memory-saving methods, least slowdown first (the order in which a fix is proposed)
FIX_METHODS = (
    "fl+ac", "fl+zero1", "fl+zero2", "fl+fsdp-grad", "fl+zero3", "fl+fsdp-full", "fl+ac+zero2", "fl+ac+fsdp-grad",
    "fl+ac+zero3", "fl+ac+fsdp-full", "fl+zero2+off", "fl+zero3+off", "fl+ac+zero3+off",
)  # fmt: skip
MAX_GPUS = 64  # more GPUs: counts tried up to this many
GPUS_PER_NODE = 8  # a larger count is spread over nodes of this many
MIN_SEQUENCE = 64


def need_bytes(
    spec: ModelSpec, method: str | methods.Method, world: int, micro_batch: int = 1, nodes: int = 1
) -> float | None:
    """The memory model's bytes per GPU at `micro_batch` (a lower bound on the step's peak; planning/memory.py's
    `need_bytes`): the most of two instants, the first micro-batch's activation peak (model states then, by the
    method's sharding and offload, plus the micro-batch's activations as the method holds them: its head's logits,
    one block's with checkpointing) and the optimizer step. None when the parameters are unknown. Asked with the
    method itself, never a method-less estimate: a plain head's fp32 logits are most of a text model's activations."""
    return memory.need_bytes(spec, method, world, micro_batch, nodes)


@dataclass(frozen=True)
class Need:
    """Memory needed per GPU at micro-batch 1 (`gib`: at least that much unless measured)."""

    gib: float | None
    source: str  # measured peak ... | memory model (lower bound) | out of memory on ... | unknown

    def text(self) -> str:
        return need_text(self.gib, self.source)


def need_text(gib: float | None, source: str | None) -> str:
    """12 GiB (a measured peak), > 24 GiB (out of memory on a GPU that large), >= 15 GiB (the memory model's lower
    bound); blank when unknown."""
    if gib is None:
        return ""
    source = source or ""
    mark = "" if source.startswith("measured") else "> " if source.startswith("out of memory") else ">= "
    return mark + units.gib(gib)


def _layout(world: int) -> tuple[int, int]:
    return (1, world) if world <= GPUS_PER_NODE else (world // GPUS_PER_NODE, GPUS_PER_NODE)


class Explainer:
    """The fixes of one sweep's results (a `cells` table: aggregate.cells_table) against the catalog."""

    def __init__(self, cells: pl.DataFrame, catalog: Catalog) -> None:
        self.catalog = catalog
        cols = set(cells.columns)
        has = {c: c in cols for c in ("peak_mem_gib", "micro_batch")}
        ran = cells.filter(pl.col("status").is_in(["ok", "noisy"])) if has["peak_mem_gib"] else cells.head(0)
        self.measured_mb1 = {
            (r["model"], r["method"], r["world_size"]): (r["peak_mem_gib"], r["gpu"])
            for r in ran.filter((pl.col("micro_batch") == 1) & pl.col("peak_mem_gib").is_not_null())
            .sort("peak_mem_gib", descending=True)  # the least measured stays
            .iter_rows(named=True)
        } if has["micro_batch"] else {}  # fmt: skip
        self.oom = {(m, g, w, s) for m, g, w, s in cells.filter(pl.col("status") == "oom")
                    .select("model", "gpu", "world_size", "method").rows()}  # fmt: skip
        self.oom_on: dict[tuple[str, str, int], tuple[float, str]] = {}  # the most memory it did not fit in
        for m, g, w, s in sorted(self.oom):
            mem = catalog.gpus[g].memory_gib if g in catalog.gpus else None
            if mem and mem > self.oom_on.get((m, s, w), (0.0, ""))[0]:
                self.oom_on[(m, s, w)] = (mem, g)
        fastest = cells.filter(pl.col("status") == "ok").sort("step_time_s") if "step_time_s" in cols else cells.head(0)
        self.fits_here: dict[tuple[str, str, int, int], str] = {}
        for r in fastest.iter_rows(named=True):
            self.fits_here.setdefault((r["model"], r["gpu"], r["nodes"], r["gpus_per_node"]), r["method"])

    # ------------------------------------------------------------------------------------------------ pieces

    def need(self, model: str, slug: str, world: int) -> Need:
        """Measured (a peak at micro-batch 1, on any GPU type), else the larger of the memory model's lower bound and
        the memory of the largest GPU it was measured not to fit in."""
        got = self.measured_mb1.get((model, slug, world))
        if got:
            return Need(got[0], f"measured peak on {world} x {got[1]}")
        spec = self.catalog.models.get(model)
        need = need_bytes(spec, slug, world) if spec else None
        model_gib = need / GIB if need is not None else None
        over = self.oom_on.get((model, slug, world))
        if over and (model_gib is None or over[0] >= model_gib):
            return Need(over[0], f"out of memory measured on {world} x {over[1]} ({units.gib(over[0])})")
        if model_gib is None:
            return Need(None, "unknown")
        return Need(model_gib, "memory model (lower bound)")

    def _fits(self, spec: ModelSpec, slug: str, gpu: str, world: int) -> bool:
        """The slug can run there (the grid's rules), was not measured out of memory there, and the memory model
        leaves room for micro-batch 1."""
        g = self.catalog.gpus[gpu]
        nodes, gpn = _layout(world)
        if grid.invalid_reason(grid.Cell(spec.name, gpu, nodes, gpn, slug), spec, g, "slurm", self.catalog):
            return False
        if self._measured_oom(spec.name, slug, g, world):
            return False
        need = need_bytes(spec, slug, world, nodes=nodes)
        return bool(g.memory_gib) and need is not None and need <= g.memory_gib * GIB

    def _measured_oom(self, model: str, slug: str, g: GpuSpec, world: int) -> bool:
        """Measured out of memory on a GPU with at least g's memory: at any count for an unsharded method (its
        per-GPU memory does not shrink with more GPUs), at this count or more for a sharded one."""
        sharded = methods.parse(slug).sharding is not None
        for m, other, w, s in self.oom:
            mem = self.catalog.gpus[other].memory_gib if other in self.catalog.gpus else None
            as_large = other == g.name or (mem and g.memory_gib and mem >= g.memory_gib)
            if m == model and s == slug and as_large and (not sharded or w >= world):
                return True
        return False

    def fixes(self, model: str, gpu: str, nodes: int, gpus_per_node: int, tried: list[str]) -> list[str]:
        """The changes that make the setting fit, cheapest first (at most one of each kind)."""
        spec, g = self.catalog.models.get(model), self.catalog.gpus.get(gpu)
        if spec is None or g is None:
            return []
        world = nodes * gpus_per_node
        if not g.memory_gib:
            untried = [s for s in FIX_METHODS if s not in tried and not self._invalid(spec, s, gpu, world)]
            return [f"{untried[0]} (memory of {gpu} unknown: a memory-saving method to try)"] if untried else []
        out = []
        method = next((s for s in FIX_METHODS if self._fits(spec, s, gpu, world)), None)
        if method:
            lb = units.gib((need_bytes(spec, method, world) or 0.0) / GIB)
            out.append(f"{method} on the same GPUs (memory model: >= {lb} of {g.memory_gib:g} GiB; not measured)")
        more = None if method else next(((w, s) for w in _counts(world) for s in ("fl", *FIX_METHODS)
                                         if self._fits(spec, s, gpu, w)), None)  # fmt: skip
        if more:
            n, k = _layout(more[0])
            out.append(f"{more[1]} on {units.layout(n, k)} {gpu}")
        bigger = self._bigger_gpu(spec, g, world)
        if bigger:
            out.append(bigger)
        shorter = self._shorter(spec, gpu, world, [t for t in tried if t in ("fl", "naive")] or ["fl"])
        if shorter:
            out.append(shorter)
        return out

    def _invalid(self, spec: ModelSpec, slug: str, gpu: str, world: int) -> bool:
        nodes, gpn = _layout(world)
        cell = grid.Cell(spec.name, gpu, nodes, gpn, slug)
        return grid.invalid_reason(cell, spec, self.catalog.gpus[gpu], "slurm", self.catalog) is not None

    def _bigger_gpu(self, spec: ModelSpec, g: GpuSpec, world: int) -> str | None:
        def key(o: GpuSpec) -> tuple:
            return (o.price_usd is None, o.price_usd or 0.0, o.memory_gib, o.name)

        for o in sorted((o for o in self.catalog.gpus.values() if (o.memory_gib or 0) > (g.memory_gib or 0)), key=key):
            slug = next((s for s in ("fl", *FIX_METHODS) if self._fits(spec, s, o.name, world)), None)
            if slug:
                n, k = _layout(world)
                return f"{slug} on {units.layout(n, k)} {o.name} ({o.memory_gib:g} GiB)"
        return None

    def _shorter(self, spec: ModelSpec, gpu: str, world: int, slugs: list[str]) -> str | None:
        """The longest halved sequence at which one of `slugs` (the sweep's methods without memory saving) fits."""
        seq = spec.recipe.sequence_length
        if not spec.is_text or not seq:
            return None
        s = seq // 2
        while s >= MIN_SEQUENCE:
            short = replace(spec, recipe=replace(spec.recipe, sequence_length=s))
            slug = next((m for m in slugs if self._fits(short, m, gpu, world)), None)
            if slug:
                return f"sequence length {s} (the recipe's {seq}) with {slug}"
            s //= 2
        return None

    # ------------------------------------------------------------------------------------------------ rows

    def setting(self, model: str, gpu: str, nodes: int, gpus_per_node: int, tried: list[str]) -> dict:
        """A setting where nothing ran: the least memory any tried method needs at micro-batch 1, and the fixes."""
        world = nodes * gpus_per_node
        needs = [(self.need(model, s, world), s) for s in tried]
        known = [(n, s) for n, s in needs if n.gib is not None]
        need, slug = min(known, key=lambda x: x[0].gib) if known else (Need(None, "unknown"), None)
        fixes = self.fixes(model, gpu, nodes, gpus_per_node, tried)
        return self._row(gpu, need, slug, fixes)

    def cell(self, model: str, gpu: str, nodes: int, gpus_per_node: int, slug: str, tried: list[str]) -> dict:
        """An oom cell: its method's need at micro-batch 1, and the fix (a method measured to fit here first)."""
        need = self.need(model, slug, nodes * gpus_per_node)
        here = self.fits_here.get((model, gpu, nodes, gpus_per_node))
        fixes = ([f"{here} on the same GPUs (measured: it fits)"] if here else
                 self.fixes(model, gpu, nodes, gpus_per_node, tried))  # fmt: skip
        return self._row(gpu, need, slug, fixes)

    def _row(self, gpu: str, need: Need, slug: str | None, fixes: list[str]) -> dict:
        g = self.catalog.gpus.get(gpu)
        return {
            "gpu_memory_gib": g.memory_gib if g else None,
            "need_gib": need.gib,
            "need_method": slug,
            "need_source": need.source,
            "cheapest_fix": fixes[0] if fixes else "none found within the catalog (more GPUs, GPU types, sequence)",
            "other_fixes": "; ".join(fixes[1:]) or None,
        }


def _counts(world: int) -> list[int]:
    out, w = [], world * 2
    while w <= MAX_GPUS:
        out.append(w)
        w *= 2
    return out


FIX_COLUMNS = {"gpu_memory_gib": pl.Float64, "need_gib": pl.Float64, "need_method": pl.String,
               "need_source": pl.String, "cheapest_fix": pl.String, "other_fixes": pl.String}  # fmt: skip
KEY = ["model", "gpu", "nodes", "gpus_per_node"]


def explain_settings(feas: pl.DataFrame, cells: pl.DataFrame, catalog: Catalog | None) -> pl.DataFrame:
    """The feasibility table with, where nothing fits for lack of memory, the need and the cheapest fix."""
    rows = []
    if catalog is not None:
        ex = Explainer(cells, catalog)
        tried = _tried(cells)
        for r in feas.filter(pl.col("verdict") == "out of memory").select(KEY).iter_rows(named=True):
            key = tuple(r.values())
            rows.append({**r, **ex.setting(*key, tried.get(key, []))})
    extra = pl.DataFrame(rows, schema={**{k: feas.schema[k] for k in KEY}, **FIX_COLUMNS})
    return feas.join(extra, on=KEY, how="left")


def explain_cells(cells: pl.DataFrame, catalog: Catalog | None) -> pl.DataFrame:
    """The cells table with, on each `oom` cell, its need at micro-batch 1 and the cheapest fix."""
    rows = []
    if catalog is not None:
        ex = Explainer(cells, catalog)
        tried = _tried(cells)
        for r in cells.filter(pl.col("status") == "oom").select(*KEY, "method").iter_rows(named=True):
            key = (r["model"], r["gpu"], r["nodes"], r["gpus_per_node"])
            rows.append({**r, **ex.cell(*key, r["method"], tried.get(key, []))})
    schema = {**{k: cells.schema[k] for k in [*KEY, "method"]}, **FIX_COLUMNS}
    return cells.join(pl.DataFrame(rows, schema=schema), on=[*KEY, "method"], how="left")


def _tried(cells: pl.DataFrame) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for m, g, n, k, s in cells.filter(pl.col("status").is_in(["oom", "ok", "noisy"])).select(*KEY, "method").rows():
        out.setdefault((m, g, n, k), []).append(s)
    return out

"""What the Snakefile and the CLI need at parse time: the validated config, the catalog, the plan, per-cell specs,
the adaptive search's settings and the loss check's jobs.

The facade sits above the stages it describes (planning, launch, search): it may ask them all, none of them asks it.
No torch, no scheduler contact, so `snakemake -n` is instant anywhere.
"""

from __future__ import annotations

import csv
import functools
import io
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pretrain_planner import __version__, layout, sweeprecord
from pretrain_planner import search as pp_search
from pretrain_planner.launch.request import driver_cores
from pretrain_planner.planning import grid, losscheck
from pretrain_planner.planning.catalog import Catalog, load_catalog
from pretrain_planner.planning.configtypes import (
    BenchmarkSection,
    CostsSection,
    EvidenceSection,
    LauncherSection,
    LossCheckSection,
    SiteFile,
    StudySection,
    SweepSection,
    TrainSection,
    WhatifSection,
)
from pretrain_planner.planning.corpus import check_train_data
from pretrain_planner.planning.devices import wants_cuda
from pretrain_planner.planning.evidence_prior import EvidencePrior
from pretrain_planner.planning.preflight import Expect
from pretrain_planner.planning.preflight import digest as preflight_digest
from pretrain_planner.planning.site import for_gpus, gpu_settings, read_site, resolve_limits, within_limits
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.results import atomic_write_text
from pretrain_planner.schema import ConfigError, load_yaml, non_defaults, resolve_path, validate


@dataclass
class Pipeline:
    config: dict[str, Any]
    catalog: Catalog
    planned: list[grid.PlannedCell]
    site: SiteFile | None = None  # the site file (slurm): the sweep's GPU types, their limits resolved
    sources: list[tuple[str, Any]] | None = None  # the config files merged, in order (for the dry run)
    cores: int | None = None  # the cores Snakemake has (None: unknown), what a rule's `threads:` stays within
    # the config's sections, typed once (planning/configtypes.py): what the rules and the stages below take; the
    # sweep, the launcher and the costs by `load`, which expands the grid and prices the catalog with them
    sweep: SweepSection = field(kw_only=True)
    launcher: LauncherSection = field(kw_only=True)
    costs: CostsSection = field(kw_only=True)  # the cost tables', plots', report's and what-if's
    train: TrainSection = field(init=False)
    benchmark: BenchmarkSection = field(init=False)
    evidence: EvidenceSection = field(init=False)  # the what-if's, the search's
    study: StudySection = field(init=False)  # the study's views', the what-if's GPU-days count
    whatif: WhatifSection = field(init=False)  # the models the what-if leads with

    def __post_init__(self) -> None:
        self.train = TrainSection.of(self.config["train"])
        self.benchmark = BenchmarkSection.of(self.config["benchmark"])
        self.evidence = EvidenceSection.of(self.config["evidence"])
        # checked against the catalog here, at parse time (the dry run): a typo would leave a view blank
        self.study = StudySection.of(self.config["study"]).in_catalog(self.catalog)
        self.whatif = WhatifSection.of(self.config["whatif"])
        self.whatif.named_in(self.catalog)

    @property
    def results(self) -> str:
        return self.config["results"]

    @property
    def adaptive(self) -> bool:
        return self.config["search"]["strategy"] == "adaptive"

    @functools.cached_property
    def settings(self) -> dict[str, pp_search.Setting]:
        """The adaptive search's settings by folder ({model}/{gpu}/{N}x{G}), each with its valid methods."""
        s, b = self.config["search"], self.benchmark
        found = pp_search.settings(
            self.planned, self.catalog, b.max_micro_batch, s["saturated_tokens"], b.suspect_mfu,
            s["tolerance"], s["model_error"],
        )  # fmt: skip
        return {x.folder: x for x in found}

    def setting(self, wildcards: Any) -> pp_search.Setting:
        return self.settings[layout.setting_folder(*_setting_key(wildcards))]

    def search_prior(self, wildcards: Any) -> EvidencePrior:
        """The evidence a setting's search orders a family with no measured cell by: the shipped rows, those
        imported into the evidence folder and the model's cells in the results folder (read when first needed)."""
        st = self.setting(wildcards)
        return EvidencePrior(self.catalog, st.model, st.gpu, self.results, self.evidence.folder_in(self.results),
                             self.benchmark.suspect_mfu)  # fmt: skip

    def search_files(self) -> list[str]:
        """Each setting's final search decision (adaptive), what the aggregation waits for."""
        return [f"{layout.search_dir(self.results, folder)}/{layout.SEARCH_FILE}" for folder in self.settings]

    def expected_adaptive(self) -> tuple[int, float, int]:
        """(cells, GPU-hour bound, probe cells) the adaptive search is expected to run, replaying it on what
        the memory model predicts (every method fits at the largest micro-batch where it has no capacity)."""
        hours = {(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"], r["method"]): r["gpu_hours_max"]
                 for r in self.rows()}  # fmt: skip
        cells, bound, probes = 0, 0.0, 0
        for st in self.settings.values():
            key = (st.model, st.gpu, st.nodes, st.gpus_per_node)
            h = {m: hours[(*key, m)] for m in st.methods}
            rep = pp_search.replay(st, pp_search.predicted_table(st, h))
            cells += len(rep.ran)
            bound += rep.gpu_hours
            probes += len(rep.rounds[0]) if rep.rounds else 0
        return cells, bound, probes

    @functools.cached_property
    def cells(self) -> list[grid.Cell]:
        """The valid cells (asked for every rule's inputs: made once)."""
        return [p.cell for p in self.planned if p.valid]

    @functools.cached_property
    def _cells_by_setting(self) -> dict[tuple[str, str, int, int], list[grid.Cell]]:
        out: dict[tuple[str, str, int, int], list[grid.Cell]] = {}
        for c in self.cells:
            out.setdefault((c.model, c.gpu, c.nodes, c.gpus_per_node), []).append(c)
        return out

    def cell_files(self, name: str) -> list[str]:
        return [f"{self.results}/{c.path}/{name}" for c in self.cells]

    def _cores(self, ranks: int) -> int:
        """Cores a job of `ranks` ranks holds on the driver's host: one per rank when they run here, else 1."""
        return driver_cores(self.launcher.kind, ranks, 1, self.cores)

    def threads(self, wildcards: Any) -> int:
        """A cell's rule `threads:` (`_cores` of its ranks)."""
        return self._cores(grid.Cell.from_wildcards(wildcards).world_size)

    def spec(self, wildcards: Any, output: Any) -> dict[str, Any]:
        """A cell's job spec (its rule's params, JSON: planning/spec.cell_spec from the typed sections)."""
        cell = grid.Cell.from_wildcards(wildcards)
        return cell_spec(cell, self.catalog, self.benchmark, self.launcher, output.result, output.steps, self.site)

    @property
    def preflight_on(self) -> bool:
        """Whether each GPU type's cells wait for its preflight (launch/preflight.py): on SLURM, unless turned off."""
        return self.launcher.kind == "slurm" and self.launcher.preflight

    @functools.cached_property
    def preflight_gpus(self) -> list[str]:
        """The GPU types with a cell to measure: each gets one preflight."""
        return sorted({c.gpu for c in self.cells})

    def preflight_files(self) -> list[str]:
        return [layout.preflight_file(self.results, g) for g in self.preflight_gpus] if self.preflight_on else []

    def preflight_input(self, wildcards: Any) -> list[str]:
        """A cell's preflight (none where preflights are off): its GPU type's."""
        return [layout.preflight_file(self.results, wildcards.gpu)] if self.preflight_on else []

    @functools.cached_property
    def _preflights(self) -> dict[str, tuple[Expect, str]]:
        """Each GPU type's preflight: what its cells need there and its digest (made once: it stats the
        environment)."""
        return {gpu: self._preflight(gpu) for gpu in self.preflight_gpus}

    def _preflight(self, gpu: str) -> tuple[Expect, str]:
        settings = self.site.gpus[gpu]
        needs_cuda = wants_cuda(gpu, self.benchmark.device)
        expect = Expect(
            gpu_type=gpu, gpu=self.catalog.gpu(gpu).to_dict(), needs_cuda=needs_cuda,
            gpus_asked=0 if settings["gpu_request"] == "none" else 1, cpus_per_gpu=settings["cpus_per_gpu"],
            site=self.site.path or "the site file", python=settings.get("python"),
            container=settings.get("container"), catalog=tuple(g.to_dict() for g in self.catalog.gpus.values()),
        )  # fmt: skip
        return expect, preflight_digest(expect, settings, sys.executable, __version__)

    def preflight_params(self, wildcards: Any) -> str:
        """The preflight rule's params: its digest (a change runs it again)."""
        return self._preflights[wildcards.gpu][1]

    def preflight_spec(self, wildcards: Any) -> dict[str, Any]:
        """What a GPU type's preflight job needs: what its cells need there, the launcher and the site's settings."""
        expect, digest = self._preflights[wildcards.gpu]
        return {"gpu_type": wildcards.gpu, "expect": asdict(expect), "digest": digest, "results": self.results,
                "launcher": self.launcher.job_options(),
                "slurm": gpu_settings(self.site, wildcards.gpu)}  # fmt: skip

    @property
    def loss_check(self) -> LossCheckSection:
        """benchmark.loss_check, typed (its mode normalised)."""
        return self.benchmark.loss_check

    def setting_methods(self) -> dict[str, list[str]]:
        """Each setting ({model}/{gpu}/{N}x{G}) -> its valid methods."""
        if self.adaptive:
            return {f: list(st.methods) for f, st in self.settings.items()}
        return {layout.setting_folder(*key): [c.method for c in cells] for key, cells in self._cells_by_setting.items()}

    def loss_check_folders(self) -> list[str]:
        """The settings a loss check runs for: every setting with a valid naive cell, the reference (a setting
        without one would run a job that can only record that it has nothing to compare with)."""
        return sorted(f for f, m in self.setting_methods().items() if losscheck.unplanned(self.loss_check, m) is None)

    def loss_check_files(self) -> list[str]:
        return [f"{layout.loss_check_dir(self.results, f)}/{layout.LOSS_CURVES}" for f in self.loss_check_folders()]

    def loss_check_cells(self, wildcards: Any) -> list[str]:
        """The result files of a setting's cells (exhaustive search: every valid method's)."""
        return [
            f"{self.results}/{c.path}/{layout.RESULT}" for c in self._cells_by_setting.get(_setting_key(wildcards), [])
        ]

    def loss_check_spec(self, wildcards: Any) -> dict[str, Any]:
        """The check job's spec: the setting's naive cell spec (model, GPU, launcher, site) and the check's config."""
        cell = grid.Cell(*_setting_key(wildcards), "naive")
        spec = cell_spec(cell, self.catalog, self.benchmark, self.launcher, "", "", self.site)
        spec["benchmark"] = self.benchmark.to_json()
        return {**spec, "results": self.results, "name": f"{cell.model}-{cell.gpu}-{cell.nodes}x{cell.gpus_per_node}"}

    def loss_check_threads(self, wildcards: Any) -> int:
        _, _, nodes, gpus_per_node = _setting_key(wildcards)
        return self._cores(nodes * gpus_per_node)

    def time_limit_min(self, gpu: str) -> int:
        if self.site:
            return self.site.gpus[gpu]["time_limit_min"]
        return self.launcher.timeout_min

    def partition(self, gpu: str) -> str:
        if self.site:
            return self.site.gpus[gpu]["partition"] or "(default)"
        return f"({self.launcher.kind})"

    def rows(self) -> list[dict[str, Any]]:
        """plan.csv rows: each cell, where it runs, and the most GPU-hours it can spend."""
        out = []
        for p in self.planned:
            limit = self.time_limit_min(p.cell.gpu)
            out.append(
                {
                    **p.row(),
                    "partition": self.partition(p.cell.gpu),
                    "time_limit_min": limit,
                    "gpu_hours_max": round(p.cell.world_size * limit / 60, 3) if p.valid else 0.0,
                }
            )
        return out

    def summary(self, targets: Iterable[str] = ()) -> str:
        """Cells per partition, GPUs per cell, time limit and the GPU-hour upper bound of the sweep; where every
        target is the budget stage's (`targets`: Snakemake's), only that the sweep does not run."""
        targets = list(targets)
        if targets and all(_budget_target(t, self.results) for t in targets):
            return (f"pretrain-planner plan: {', '.join(targets)} runs the budget stage alone: none of the sweep's "
                    f"{len(self.cells)} cells runs")  # fmt: skip
        rows = [r for r in self.rows() if r["valid"]]
        by_part: dict[str, dict[str, Any]] = {}
        for r in rows:
            agg = by_part.setdefault(r["partition"], {"cells": 0, "gpus": set(), "limit": set(), "hours": 0.0})
            agg["cells"] += 1
            agg["gpus"].add(r["world_size"])
            agg["limit"].add(r["time_limit_min"])
            agg["hours"] += r["gpu_hours_max"]
        lines = [*self.settings_lines()]
        measured = sum((Path(self.results) / c.path / layout.RESULT).is_file() for c in self.cells)
        cells = f"{len(rows)} cells to run" if not measured else (
            f"{len(rows)} cells, {len(rows) - measured} to run and {measured} measured already in "
            f"{self.results}/cells (kept unless a setting they ran with changed)")  # fmt: skip
        lines += [
            f"pretrain-planner plan: {cells}, {len(self.planned) - len(rows)} invalid "
            f"(reasons in {self.results}/plan.csv); launcher {self.launcher.kind}"
        ]
        for part, agg in sorted(by_part.items()):
            lines.append(
                f"  partition {part}: {agg['cells']} cells, {_span(agg['gpus'])} GPUs per cell, "
                f"time limit {'/'.join(map(str, sorted(agg['limit'])))} min, at most {agg['hours']:.1f} GPU-hours"
            )
        total = sum(a["hours"] for a in by_part.values())
        lines.append(f"  total: at most {total:.1f} GPU-hours")
        lines += self.loss_check_lines()
        if self.adaptive:
            cells, bound, probes = self.expected_adaptive()
            lines.append(
                f"  adaptive search: {len(self.settings)} settings, {probes} probe cells first; expected about "
                f"{cells} of the {len(rows)} cells, at most {bound:.1f} of the {total:.1f} GPU-hours of the "
                f"exhaustive upper bound (decisions in {self.results}/search/)"
            )
        return "\n".join(lines)

    def loss_check_lines(self) -> list[str]:
        """What the loss check adds to the plan: one job per setting, its runs x steps, each step the recipe's."""
        conf, folders = self.loss_check, self.loss_check_folders()
        unplanned = [r for m in self.setting_methods().values() if (r := losscheck.unplanned(conf, m))]
        if not folders:
            why = unplanned[0] if unplanned else "no setting"
            return [f"  loss check: none, no method is checked to train naive's model: {why}"]
        skipped = f"; {len(unplanned)} settings not checked ({unplanned[0]})" if unplanned else ""
        which = "each setting's pick" if conf.mode == "chosen" else "every method that trains"
        naive = 2 + conf.seeds - 1  # the reference, its half micro-batch, its other dropout seeds (if any dropout)
        runs = naive + (1 if conf.mode == "chosen" else max(1, len(self.cells) // len(folders) - 1))
        return [f"  loss check ({conf.mode}): {which} against naive, {len(folders)} settings, one job each of at "
                f"most {runs} runs x {conf.steps} steps (about {runs * conf.steps} step times per setting, "
                f"against the {self.benchmark.warmup_steps + self.benchmark.timed_steps}+ "
                f"of each cell; tables/benchmark_cost.csv: loss_check_gpu_hours){skipped}"]  # fmt: skip

    def settings_lines(self) -> list[str]:
        """The effective settings that differ from the schema's defaults, each with the file it came from:
        nothing a user did not write (or see written in the demo config) applies silently."""
        if self.sources is None:
            return []
        diff = non_defaults(self.config, "config", self.sources, CLI_CONFIG)
        lines = ["pretrain-planner settings (those differing from workflow/schemas/config.schema.yaml's defaults):"]
        lines += _aligned([(_clipped(f"{k} = {v}"), origin) for k, v, origin in diff])
        if any(origin == DEMO_LABEL for *_, origin in diff):
            lines.append(f"  ({DEMO_CONFIG} is the demo sweep, tiny models on CPUs: it applies only when no "
                         "--configfile is given)")  # fmt: skip
        return lines

    # -- the train stage's rule (workflow/rules/train.smk) ------------------------------------------------------
    def train_plan_input(self, wildcards: Any) -> str:
        """The train rule's input: the export's optimal/ folder for a setting of the sweep (the export writes its
        plan), else the setting's plan.json when it is there (a plan given by hand), else the folder. The same
        input on every run: a plan.json that appeared since the last run must not count as a changed input
        (Snakemake would train again on a finished workflow). The config's train data is checked here for the
        setting's model: when the DAG is built, a dry run included, before any job."""
        self.check_train_data(wildcards.model)
        key = _setting_key(wildcards)
        plan = layout.optimal_plan_pattern(self.results).format(**dict(zip(SETTING_KEYS, key, strict=True)))
        if layout.setting_folder(*key) in self.settings or not Path(plan).is_file():
            return f"{self.results}/{layout.OPTIMAL}"
        return plan

    def check_train_data(self, model: str) -> None:
        """The config's `train:` data for `model`'s task (planning/corpus.py: headers only, once per model): a
        problem ends the run with its one line, no traceback."""
        checked = self.__dict__.setdefault("_train_data_checked", set())
        if model in checked:
            return
        t = self.train
        try:
            check_train_data(self.catalog.model(model).to_dict(), t.data, t.data_dtype, t.data_field, t.tokenizer)
        except ValueError as exc:
            raise SystemExit(f"pretrain-planner: train data: {exc}") from None
        checked.add(model)

    @property
    def train_device(self) -> str:
        """The device the train rule's jobs run on (TrainSection.run_device: cpu where train or benchmark says so)."""
        return self.train.run_device(self.benchmark.device)

    def train_threads(self, wildcards: Any) -> int:
        """Cores a train run holds on the driver's host: one per rank (local, debug), one for a SLURM job."""
        _, _, nodes, gpus_per_node = _setting_key(wildcards)
        return self._cores(nodes * gpus_per_node)

    def plan_params(self) -> dict[str, Any]:
        """What plan.csv depends on besides the catalog files (a change re-plans)."""
        return {"sweep": self.sweep.to_json(), "launcher": self.launcher.kind}

    def search_params(self, wildcards: Any) -> dict[str, Any]:
        """What a setting's search rounds depend on (a change of methods or micro-batch cap re-decides)."""
        st = self.setting(wildcards)
        return {"methods": list(st.methods), "top": st.top, "saturated": st.saturated,
                "tolerance": st.tolerance, "model_error": st.model_error}  # fmt: skip


SETTING_KEYS = ("model", "gpu", "nodes", "gpus_per_node")  # a setting's wildcards: {model}/{gpu}/{N}x{G}


def _setting_key(wildcards: Any) -> tuple[str, str, int, int]:
    """(model, gpu, nodes, gpus_per_node) of a rule's wildcards (or a dict of them)."""
    get = wildcards.get if isinstance(wildcards, dict) else (lambda k: getattr(wildcards, k))
    return get("model"), get("gpu"), int(get("nodes")), int(get("gpus_per_node"))


def _span(values: set[int]) -> str:
    return f"{min(values)}-{max(values)}" if len(values) > 1 else str(min(values))


CLI_CONFIG = "--config (the command line, or the profile's `config:`)"
DEMO_CONFIG = "config/config.yaml"  # the demo sweep: loaded by the Snakefile only when no --configfile is given
DEMO_LABEL = f"{DEMO_CONFIG} (demo)"


def config_sources(configfiles: list[Any], basedir: str | Path) -> list[tuple[str, Any]]:
    """(label, contents) of each config file Snakemake merged, in order."""
    out = []
    for path in configfiles:
        label = str(path)
        if Path(path).resolve() == (Path(basedir) / DEMO_CONFIG).resolve():
            label = DEMO_LABEL
        try:
            out.append((label, load_yaml(path)))
        except ConfigError:
            continue
    return out


SETTING_TEXT_MAX = 100  # characters of one setting's `key = value` in the dry run; the whole value is in its file
ALIGN_MAX = 60  # settings up to this long align their `<- file`; a longer one does not push every other line out


def _clipped(text: str) -> str:
    """A setting's `key = value`, its value cut to SETTING_TEXT_MAX characters (the file beside it has it whole)."""
    if len(text) <= SETTING_TEXT_MAX:
        return text
    return f"{text[: SETTING_TEXT_MAX - 25]}... ({len(text)} characters)"


def _aligned(pairs: list[tuple[str, str]]) -> list[str]:
    """`  text  <- origin` lines, the short texts padded to one column."""
    width = max((len(t) for t, _ in pairs if len(t) <= ALIGN_MAX), default=0)
    return [f"  {t:<{width}}  <- {origin}" for t, origin in pairs]


BUDGET_RULES = ("budget", "budget_sweep", "prepare_data", "pretrain", "finetune_mnli", "finetune", "glue_table")


def _budget_target(target: str, results: str) -> bool:
    """Whether a Snakemake target is the budget stage's (workflow/rules/pretrain.smk): a rule of it, or a file under
    the results' budget/ folder. Such a target runs no cell of the sweep."""
    if target in BUDGET_RULES:
        return True
    try:
        Path(target).resolve().relative_to((Path(results) / "budget").resolve())
    except ValueError:
        return False
    return True


def load(
    config: dict[str, Any],
    basedir: str | Path,
    source: str = "config",
    sources: list[tuple[str, Any]] | None = None,
    cores: int | None = None,
) -> Pipeline:
    """Validate config (defaults filled in place), load the catalog, expand and check the plan."""
    if isinstance(config, dict) and "sweep" not in config:
        sets = ", ".join(f"`{k}:`" for k in config) or "nothing"
        raise ConfigError(
            f"{source}: no `sweep:` section (it sets {sets}): a sweep config names what to measure (sweep.models, "
            'sweep.gpus; README, "Your own sweep"); a file of extra settings such as config/adaptive.yaml goes '
            f"after a sweep's: --configfile my-sweep.yaml {source}"
        )
    validate(config, "config", source)
    cat = config["catalog"]
    models, gpus = resolve_path(cat["models"], basedir), resolve_path(cat["gpus"], basedir)
    costs = CostsSection.of(config["costs"])
    catalog = load_catalog(models, gpus).with_prices(costs.prices, source)
    sweep, launcher = SweepSection.of(config["sweep"]), LauncherSection.of(config["launcher"])
    planned = grid.expand(sweep, launcher, catalog, source)
    site = None
    if launcher.kind == "slurm" and launcher.site is not None:
        mapped = read_site(resolve_path(launcher.site, basedir))
        site = resolve_limits(for_gpus(mapped, list(sweep.gpus), source))
        planned = within_limits(planned, site)
        catalog = catalog.with_network(mapped)  # every type the site maps: the what-if predicts them all
    grid.check_plan(planned, source)
    return Pipeline(config, catalog, planned, site, sources, cores, sweep=sweep, launcher=launcher, costs=costs)


def load_or_exit(*args: Any, **kwargs: Any) -> Pipeline:
    """`load` (its arguments) for the Snakefile: a config mistake ends the run with the message alone, no
    traceback."""
    try:
        return load(*args, **kwargs)
    except ConfigError as exc:
        raise SystemExit(f"pretrain-planner: configuration error\n{exc}") from None


PLAN_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "method", "valid", "reason", "per_rank_batch",
    "partition", "time_limit_min", "gpu_hours_max", "path",
]  # fmt: skip


def write_plan(pipeline: Pipeline, out_csv: str) -> None:
    """results/plan.csv: every cell of the sweep, valid or not, with the reason and its GPU-hour bound."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=PLAN_COLUMNS)
    writer.writeheader()
    for row in pipeline.rows():
        writer.writerow(row)
    atomic_write_text(out_csv, buf.getvalue())


def record_sweep(
    pipeline: Pipeline, configfiles: list[Any], basedir: str | Path, workdir: str | Path | None = None
) -> None:
    """Before a sweep runs: its config recorded in the results folder (sweeprecord.py), so that `pretrain-planner`
    answers about these results with the config they were made from."""
    sweeprecord.write(pipeline.results, pipeline.config, configfiles, basedir, workdir)

"""The validated config's sections as typed, frozen values: built once where the config is loaded (the facade, the
CLI) and passed down instead of a dict read by key far from where it was checked; turned into JSON only at a job's
boundary (its arguments, a rule's params). A class here states each key's type, never its value: every default is
the schema's (workflow/schemas/), filled by `schema.validate` before a section is typed. Imports no torch.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Self

from pretrain_planner import schema
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.families import FAMILIES
from pretrain_planner.planning.runspec import MissingSetting, TrainSetting, setting_of_json


def require(value: Any, cls: type, where: str) -> None:
    """TypeError naming `where` unless `value` is a `cls`: a function below the entrance takes the typed section,
    never a dict (a dict would be read by key again, its keys unchecked)."""
    if not isinstance(value, cls):
        made = getattr(cls, "MADE_BY", f"{cls.__name__}.of(validated section)")
        raise TypeError(f"{where}: takes a {cls.__name__} (planning/configtypes.py, typed once where the config is "
                        f"loaded: {made}), not a {type(value).__name__}")  # fmt: skip


def _keys_of(cls: type, section: Any, where: str) -> dict[str, Any]:
    """The section's value of every field of `cls`; the section must be a validated one (its defaults filled, no
    other key): a missing or extra key is a section that did not come through `schema.validate`."""
    if not isinstance(section, Mapping):
        raise TypeError(f"{where}: expected the validated section (a mapping), not a {type(section).__name__}")
    names = [f.name for f in fields(cls)]
    missing, extra = [n for n in names if n not in section], sorted(k for k in section if k not in names)
    if missing or extra:
        raise ValueError(f"{where}: not a validated section (schema.validate fills every default): "
                         f"missing {missing}, unknown {extra}")  # fmt: skip
    return {n: section[n] for n in names}


class _Flat:
    """A section whose every key is a plain value: `of` takes its validated mapping as it is."""

    WHERE: ClassVar[str]  # the section's name in its file, for the messages

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> Self:
        """From the validated section."""
        return cls(**_keys_of(cls, section, where or cls.WHERE))


@dataclass(frozen=True)
class TrainSection(_Flat):
    """The config's `train:` section (workflow/schemas/config.schema.yaml): the train stage's budget, data,
    checkpoints, validation and device, as the train rule and `pretrain-planner train` read them (a CLI flag
    replaces a field: `dataclasses.replace`). A run's job gets `job_options()`, JSON."""

    WHERE: ClassVar[str] = "train"

    steps: int | None
    time_budget_hours: float | None
    data: str | None
    data_dtype: str | None
    data_field: str | None
    tokenizer: str | None
    checkpoint_every_min: float
    eval_every: int
    eval_batches: int
    device: str

    @classmethod
    def defaults(cls) -> TrainSection:
        """The schema's defaults alone: what a run launched without a config (torchrun, launch.sh) starts from."""
        return cls.of(schema.section("config", "train", None), "the schema's train section")

    def run_device(self, benchmark_device: str) -> str:
        """The device a train job runs on: cpu where this section or the benchmark (`benchmark.device`) says cpu
        (a GPU type's plan on CPU processes), else auto (the plan's GPU type)."""
        return "cpu" if self.device == "cpu" or benchmark_device == "cpu" else "auto"

    def job_options(self) -> dict[str, Any]:
        """The run's options as its job takes them (train.run.train_plan's keywords; JSON): the budget, the data,
        checkpoints and validation. The device is the job's own (`run_device`)."""
        return {"steps": self.steps, "time_budget_h": self.time_budget_hours, "data": self.data,
                "tokenizer": self.tokenizer, "data_dtype": self.data_dtype, "data_field": self.data_field,
                "checkpoint_every_min": self.checkpoint_every_min, "eval_every": self.eval_every,
                "eval_batches": self.eval_batches}  # fmt: skip


# -- the config's sweep, benchmark and launcher sections (and a job's launcher with its site settings) -------------


def _given(name: str, given: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The config's section `name` from part of it: validated, the schema's defaults filled under what is given
    (nested sections too), for a caller that is not handed a whole config (a test, a script, a job request)."""
    config = {"sweep": {"models": ["-"], "gpus": ["-"]}, name: copy.deepcopy(dict(given or {}))}
    return schema.validate(config, "config", where)[name]


class _StatedOrder:
    """A section whose JSON at a job's boundary keeps the order the validated mapping stated its keys in (the
    file's keys as written, then the schema's defaults): a rule's params are compared by their repr, and a job
    whose params' repr changed runs again, so typing the section must not re-measure a sweep's cells. Not a field:
    equality, `dataclasses.replace` and the schema's keys ignore it (a replaced value writes the schema's order)."""

    def _stated(self, section: Mapping[str, Any]) -> Self:
        object.__setattr__(self, "_order", tuple(section))
        return self

    def _in_stated_order(self, values: dict[str, Any]) -> dict[str, Any]:
        order = [k for k in getattr(self, "_order", ()) if k in values]
        return {k: values[k] for k in (*order, *(k for k in values if k not in order))}


@dataclass(frozen=True)
class SweepSection(_StatedOrder):
    """The config's `sweep:` section: the grid's axes (every combination is one cell), each a tuple. Typed where the
    config is loaded (facade/pipeline.load) and expanded by planning/grid.expand; plan.csv's params get `to_json`."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    nodes: tuple[int, ...]
    gpus_per_node: tuple[int, ...]
    methods: tuple[str, ...]

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str = "sweep") -> SweepSection:
        return cls(**{k: tuple(v) for k, v in _keys_of(cls, section, where).items()})._stated(section)

    def to_json(self) -> dict[str, Any]:
        """The section as the config states it (lists): a rule's params, whose change re-plans."""
        return self._in_stated_order({f.name: list(getattr(self, f.name)) for f in fields(self)})


@dataclass(frozen=True)
class LossCheckSection(_Flat):
    """The config's `benchmark.loss_check`: which methods are checked to train naive's model, and how strictly.
    `mode` is `off`, `chosen` or `all` (YAML reads an unquoted `off` as false: typed as "off" here, once)."""

    WHERE: ClassVar[str] = "benchmark.loss_check"

    mode: str
    steps: int
    seeds: int
    global_batch: int | None
    k: float
    tail: float

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> LossCheckSection:
        values = _keys_of(cls, section, where or cls.WHERE)
        return cls(**{**values, "mode": values["mode"] or "off"})

    def to_json(self) -> dict[str, Any]:
        """The check's settings as its job gets them (the loss-check rule's spec, the aggregate rule's params), in
        the schema's order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BenchmarkSection(_StatedOrder):
    """The config's `benchmark:` section: how a cell is timed (warm-up and timed steps, the micro-batch cap, the
    seed, the device, the suspect and spread limits) and the loss check. Typed where the config is loaded (the
    facade, the CLI); a cell's job gets `cell_options()` as JSON (its rule's params: the loss check is the check
    job's, whose change measures no cell again) and types it back at its entrance (`of_job`)."""

    warmup_steps: int
    timed_steps: int
    max_micro_batch: int | None
    seed: int
    device: str
    suspect_mfu: float
    max_spread: float
    loss_check: LossCheckSection

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str = "benchmark") -> BenchmarkSection:
        values = _keys_of(cls, section, where)
        loss_check = LossCheckSection.of(values["loss_check"], f"{where}.loss_check")
        return cls(**{**values, "loss_check": loss_check})._stated(section)

    def cell_options(self) -> dict[str, Any]:
        """What a cell's job is given (JSON, in the stated order): every key but the loss check. A copy of one
        made once (a plan asks it for every cell)."""
        return dict(self._cell_json)

    def to_json(self) -> dict[str, Any]:
        """The whole section as JSON, the loss check's included (the loss-check job's spec)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return self._in_stated_order({**values, "loss_check": self.loss_check.to_json()})

    @functools.cached_property
    def _cell_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_json().items() if k != "loss_check"}

    @classmethod
    def given(cls, given: Mapping[str, Any] | None = None) -> BenchmarkSection:
        """From part of the section (the schema's defaults under it): a test's or a script's cell."""
        return cls.of(_given("benchmark", given, "a given benchmark section"))

    @classmethod
    def of_job(cls, options: Mapping[str, Any], where: str = "the cell's spec: benchmark") -> BenchmarkSection:
        """From a job's JSON copy (`cell_options`, or `to_json`): a cell's has no loss check (the schema's then,
        which no cell reads)."""
        loss_check = options.get("loss_check") or schema.section("config", "benchmark.loss_check", None)
        return cls.of({**options, "loss_check": loss_check}, where)


@dataclass(frozen=True)
class LauncherSection(_Flat, _StatedOrder):
    """The config's `launcher:` section: local, debug or slurm, the local time-out and GPUs, warm ranks, the site
    file (slurm) and the scheduler's waits. Typed where the config is loaded (the facade, the CLI, a flag replacing
    a field); a job's spec carries `job_options()` (JSON, no site file: the job has its GPU type's settings) and
    its entrance types it back (`of_job`, `site` None)."""

    WHERE: ClassVar[str] = "launcher"

    kind: str
    timeout_min: int
    site: str | None  # None: a job's copy (`of_job`), whose site settings are its `Launch.slurm`
    local_gpus: int | None
    warm_ranks: bool
    submit_wait_min: float
    preflight: bool
    state_wait_min: float

    @classmethod
    def given(cls, given: Mapping[str, Any] | None = None) -> LauncherSection:
        """From part of the section (the schema's defaults under it; none given: the defaults alone, what a job
        request made without a config has)."""
        return cls.of(_given("launcher", given, "a given launcher section"))

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> LauncherSection:
        return cls(**_keys_of(cls, section, where or cls.WHERE))._stated(section)

    def job_options(self) -> dict[str, Any]:
        """What a job's spec carries (JSON, in the stated order): every key but the site file. A copy of one made
        once (a plan asks it for every cell)."""
        return dict(self._job_json)

    @functools.cached_property
    def _job_json(self) -> dict[str, Any]:
        return self._in_stated_order({f.name: getattr(self, f.name) for f in fields(self) if f.name != "site"})

    @classmethod
    def of_job(cls, options: Mapping[str, Any], where: str = "the job's spec: launcher") -> LauncherSection:
        """From a job's JSON copy (`job_options`)."""
        return cls.of({**options, "site": None}, where)


@dataclass(frozen=True)
class Launch:
    """How one job runs (launch/stage.py): the launcher, and under SLURM its GPU type's settings from the site file
    (planning/site.gpu_settings: JSON, as a job's spec carries them and submitit's request reads them) or why
    there are none (`slurm_error`: a site that does not map a stage's GPU type stops only that stage's jobs).
    Made by stage.launch_settings for a stage, and at a cell's or check's entrance from its spec (`of_job`)."""

    MADE_BY: ClassVar[str] = "launch/stage.launch_settings; at a job's entrance Launch.of_job(spec)"

    launcher: LauncherSection
    slurm: Mapping[str, Any] | None
    slurm_error: str | None

    @classmethod
    def of_job(cls, spec: Mapping[str, Any]) -> Launch:
        """A job's launch from its spec's JSON: `launcher` (LauncherSection.job_options) and `slurm`."""
        return cls(LauncherSection.of_job(spec["launcher"]), spec.get("slurm"), None)

    @property
    def kind(self) -> str:
        return self.launcher.kind


@dataclass(frozen=True)
class SiteFile:
    """The SLURM site file that `launcher.site` names (workflow/schemas/site.schema.yaml), validated by
    planning/site.read_site: where it is, its `defaults`, each GPU type it maps with its full settings (`defaults`
    under the type's entry: the JSON a job's `slurm` carries, planning/site.gpu_settings, read by key by the jobs,
    sbatch and the preflight at that boundary), whether the plan asks the scheduler for a partition's limits, and
    the driver's keys. Read where the config is loaded (facade/pipeline.load, the CLI, a stage's launcher);
    narrowed to the sweep's GPU types and their limits resolved there, each step a new value."""

    path: str
    defaults: Mapping[str, Any]
    gpus: Mapping[str, Mapping[str, Any]]
    ask_scheduler: bool
    poll_max_s: int
    max_queued_jobs: int | None


@dataclass(frozen=True)
class BudgetValidation(_Flat):
    """The budget file's `train.validation`: when the pre-training validates (fractions of the budget) and on what."""

    WHERE: ClassVar[str] = "train.validation"

    every: float
    dense_every: float
    dense_first: float
    dense_last: float
    max_samples: int
    rotate: bool


@dataclass(frozen=True)
class LossScaleFloor(_Flat):
    """The budget file's `train.loss_scale_floor`: fp16's stop on a loss scale at or below `scale` for `steps`."""

    WHERE: ClassVar[str] = "train.loss_scale_floor"

    scale: float
    steps: int


@dataclass(frozen=True)
class BudgetTrain:
    """The budget file's `train:` section (workflow/schemas/budget.schema.yaml): the time budget and its clock, the
    GPU type and ranks, where the setting comes from, the optimizer and schedule, validation, the stops, checkpoints
    and the job's device and threads, as one recipe has them (a catalog recipe's values and budget.sweep's applied
    by budget/config.py and budget/sweep.py before it is typed). Typed where the stage is loaded (the facade) and
    again, once, where a job reads its JSON arguments (budget/pretrain.py, budget/glue.py)."""

    budget_hours: float
    clock: str
    gpu: str
    nodes: int
    gpus_per_node: int
    setting: str
    method: str
    global_batch: int
    micro_batch: int
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_fraction: float
    curve: str
    decay_rate: float
    decay_step_hours: float
    grad_clip: float | None
    precision: str
    device: str
    threads: int | None
    attn_implementation: str
    validation: BudgetValidation
    early_stop: tuple[Mapping[str, float], ...]  # each {at_fraction | after_minutes, max_loss}: the schema's oneOf
    loss_scale_floor: LossScaleFloor
    stop_on_nonfinite_loss: bool
    finetune_checkpoints: tuple[float, ...]
    checkpoint_every_s: float | None
    max_steps: int | None
    fake_step_s: float | None
    log_every: int
    plot: bool

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str = "train") -> BudgetTrain:
        """From a validated budget config's `train` section (or a job's JSON copy of it)."""
        values = _keys_of(cls, section, where)
        values.update(
            betas=tuple(values["betas"]), early_stop=tuple(dict(m) for m in values["early_stop"]),
            finetune_checkpoints=tuple(values["finetune_checkpoints"]),
            validation=BudgetValidation.of(values["validation"], f"{where}.validation"),
            loss_scale_floor=LossScaleFloor.of(values["loss_scale_floor"], f"{where}.loss_scale_floor"),
        )  # fmt: skip
        return cls(**values)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def wants_gpu(self) -> bool:
        """Whether the stage's torch jobs run on CUDA (when it is there): device cuda, or auto with a GPU type as
        gpu."""
        return self.device == "cuda" or (self.device == "auto" and self.gpu != "cpu")

    def torch_threads(self, job_threads: int | None) -> int | None:
        """torch's intra-op threads of a job: `threads` when set, else the job's share of the cores."""
        return self.threads or job_threads


def _axis(value: Any) -> tuple[Any, ...]:
    """A grid axis of the budget file's glue section: a list, or a single value (a one-value axis)."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


@dataclass(frozen=True)
class BudgetGlue:
    """The budget file's `glue:` section: the GLUE tasks, the fine-tuning grid (lr x batch x epochs, each an axis;
    every setting once per seed) and each run's schedule, evaluation and selection. Typed where the stage is
    loaded (the facade: which tasks, which start from MNLI) and once in a fine-tuning job from its JSON."""

    data_dir: str
    tasks: tuple[str, ...]
    from_mnli: tuple[str, ...]
    lr: tuple[float, ...]
    batch: tuple[int, ...]
    epochs: tuple[float, ...]
    seeds: tuple[int, ...]
    max_len: int
    weight_decay: float
    warmup_steps: int
    max_grad_norm: float | None
    eval_steps: int
    select: str
    patience: int | None
    max_train_samples: int | None

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str = "glue") -> BudgetGlue:
        values = _keys_of(cls, section, where)
        values.update({k: _axis(values[k]) for k in ("tasks", "from_mnli", "lr", "batch", "epochs", "seeds")})
        return cls(**values)


@dataclass(frozen=True)
class BudgetRecipe:
    """One recipe of the budget stage as its rules launch it (the budget file's own, or one of budget.sweep's):
    its sections typed (`train`, `glue`, the data's `prep`: seed, corpus, tokenizer, data; the resolved `model`),
    the setting resolved (from the benchmark's plan or the config; MissingSetting where the plan was asked for and
    not there yet), budget.sweep's name and values of the recipe, and the job's config (`to_job`: JSON, what its
    pre-training or fine-tuning job reads and types again with `of`). Made once per recipe where the stage is
    loaded (facade/budget.py)."""

    train: BudgetTrain
    glue: BudgetGlue
    prep: BudgetPrep
    setting: TrainSetting | MissingSetting
    model: BudgetModel
    recipe: str | None  # budget.sweep's recipe name; None: the file's one recipe
    values: Mapping[str, Any] | None  # budget.sweep's values of the recipe; None: the file's one recipe
    source: str  # the budget file
    config: Mapping[str, Any]  # the validated recipe's config, read only by `to_job`

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> BudgetRecipe:
        """From budget/config.load's (or budget/sweep.recipes') config of one recipe, or a job's JSON copy of it
        (`to_job`)."""
        recipe, source = cfg.get("recipe"), str(cfg.get("source", "budget config"))
        setting = cfg["setting"]
        return cls(BudgetTrain.of(cfg["train"], f"{source}: train"), BudgetGlue.of(cfg["glue"], f"{source}: glue"),
                   BudgetPrep.of(cfg, source),
                   setting_of_json(setting) if isinstance(setting, Mapping) else setting,
                   BudgetModel.of(cfg["model"], f"{source}: model"), recipe["name"] if recipe else None,
                   dict(recipe["values"]) if recipe else None, source, cfg)  # fmt: skip

    @property
    def named(self) -> dict[str, Any] | None:
        """budget.sweep's {name, values} of the recipe (a result's `recipe`); None: the file's one recipe."""
        return {"name": self.recipe, "values": dict(self.values or {})} if self.recipe else None

    def prep_params(self) -> dict[str, Any]:
        """The sections that prepare the recipe's data as the validated file has them, in its key order: the
        prepare_data rule's params (Snakemake compares params by their repr: another order would prepare again)."""
        return {k: self.config[k] for k in ("seed", "corpus", "tokenizer", "data")}

    def to_job(self) -> dict[str, Any]:
        """The config as a job's argument: plain JSON data, the setting turned into JSON here, at the job's boundary
        (the job types it back with `of`)."""
        return {**self.config, "setting": self.setting.to_json()}


@dataclass(frozen=True)
class BudgetCorpus(_Flat):
    """The budget file's `corpus:` section: the documents' files (globs resolved by budget/config.load), their
    format and text field, and the share held out for validation."""

    WHERE: ClassVar[str] = "corpus"

    files: tuple[str, ...]
    format: str
    text_field: str
    validation_fraction: float

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> BudgetCorpus:
        values = _keys_of(cls, section, where or cls.WHERE)
        return cls(**{**values, "files": tuple(values["files"])})


@dataclass(frozen=True)
class BudgetTokenizer(_Flat):
    """The budget file's `tokenizer:` section: a local tokenizer (its path resolved) or the WordPiece to train, and
    the multiple the model's vocabulary is padded to."""

    WHERE: ClassVar[str] = "tokenizer"

    path: str | None
    pad_vocab_to_multiple_of: int
    vocab_size: int
    lowercase: bool


@dataclass(frozen=True)
class BudgetData(_Flat):
    """The budget file's `data:` section: how documents become masked samples (a catalog recipe's sequence length
    and masking probability applied by budget/config.py, budget.sweep's seq_len by budget/sweep.py)."""

    WHERE: ClassVar[str] = "data"

    seq_len: int
    mlm_probability: float
    max_predictions: int
    duplication_factor: int
    samples_per_shard: int
    min_tokens: int
    short_seq_prob: float
    docs_per_batch: int


@dataclass(frozen=True)
class BudgetPrep:
    """What prepares a masked-LM data set (trainer/data/mlm.prepare_data): the budget file's `seed`, `corpus`,
    `tokenizer` and `data`. Typed once per {data} wildcard where the stage is loaded (facade/budget.py); the train
    stage's masked-LM task makes one from its recipe (trainer/data/mlm.mlm_config). `to_json` is the prepare_data
    rule's params are the file's sections (`BudgetRecipe.prep_params`)."""

    seed: int
    corpus: BudgetCorpus
    tokenizer: BudgetTokenizer
    data: BudgetData

    @classmethod
    def of(cls, cfg: Mapping[str, Any], where: str = "budget config") -> BudgetPrep:
        """From a validated budget config (or any mapping with its four validated keys)."""
        for key in ("seed", "corpus", "tokenizer", "data"):
            if key not in cfg:
                raise ValueError(f"{where}: no {key!r}: not a validated budget config (schema.validate fills it)")
        return cls(int(cfg["seed"]), BudgetCorpus.of(cfg["corpus"], f"{where}: corpus"),
                   BudgetTokenizer.of(cfg["tokenizer"], f"{where}: tokenizer"),
                   BudgetData.of(cfg["data"], f"{where}: data"))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """As plain JSON (the files a list), in the schema's key order: the data's fingerprint (sorted keys)."""
        return {"seed": self.seed, "corpus": {**asdict(self.corpus), "files": list(self.corpus.files)},
                "tokenizer": asdict(self.tokenizer), "data": asdict(self.data)}  # fmt: skip


@dataclass(frozen=True)
class BudgetModel:
    """The budget file's `model:`, resolved by budget/config.load (a catalog name, a {base, arch} or a
    {family, arch} mapping): its name, family and architecture keys (the tokenizer's vocabulary and special ids
    are added in the pre-training job: budget/pretrain.model_dict)."""

    name: str
    family: str
    arch: Mapping[str, Any]

    @classmethod
    def of(cls, model: Mapping[str, Any], where: str = "model") -> BudgetModel:
        """From budget/config.load's resolved model {name, family, arch}."""
        return cls(**_keys_of(cls, model, where))


@dataclass(frozen=True)
class EvidenceSection(_Flat):
    """The config's `evidence:` section: where other sites' rows are imported and the what-if reads them, and this
    site's name in an export. Typed where the config is loaded (facade/pipeline.Pipeline.evidence; the CLI from
    the answered config: cli/config.evidence_of); the whatif rule's params hold the folder as a string."""

    WHERE: ClassVar[str] = "evidence"

    folder: str | None
    site: str | None

    def folder_in(self, results: str | Path) -> Path:
        """The evidence folder: `folder`, else {results}/evidence."""
        return Path(self.folder or Path(results) / "evidence")


# -- the config's costs, study and whatif sections (the tables' settings) -----------------------------------------


@dataclass(frozen=True)
class CostsSection(_Flat, _StatedOrder):
    """The config's `costs:` section: the hardware's amortisation, the Pareto front's cost axis and the sweep's own
    prices over the catalog's (each GPU type's {price_usd, cloud_usd_per_gpu_hour, note}: JSON, what
    Catalog.with_prices reads). Typed where the config is loaded (facade/pipeline.load, `Pipeline.costs`; the CLI
    from the answered config: cli/config.costs_of); the aggregate, plots and report rules' params and the whatif
    rule's settings hold `to_json()` (a change prices again) and their entrance types it back (`of`)."""

    WHERE: ClassVar[str] = "costs"

    amortisation_years: float
    pareto_cost: str  # hardware | amortised | cloud (the schema's enum)
    prices: Mapping[str, Mapping[str, Any]]

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> CostsSection:
        values = _keys_of(cls, section, where or cls.WHERE)
        prices = {gpu: dict(given) for gpu, given in (values["prices"] or {}).items()}  # a copy: the value is frozen
        return cls(**{**values, "prices": prices})._stated(section)

    @classmethod
    def given(cls, given: Mapping[str, Any] | None = None) -> CostsSection:
        """From part of the section, validated (the schema's defaults under it; none given: the defaults alone, what
        a table built without a config prices with)."""
        return cls.of(_given("costs", given, "a given costs section"))

    def to_json(self) -> dict[str, Any]:
        """The section as the config states it (a rule's params, in the stated order: a changed repr prices
        again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return self._in_stated_order({**values, "prices": {g: dict(p) for g, p in self.prices.items()}})


@dataclass(frozen=True)
class StudySection(_Flat):
    """The config's `study:` section: the GPU-days view's setting (GPU type, nodes, GPUs per node) and the model
    families the study's averages take (each a known family: checked here, once). Typed where the config is loaded
    (`Pipeline.study`, its GPU type checked against the catalog: `in_catalog`); the study_tables rule's params hold
    `to_json()` and the what-if predicts the GPU-days setting's count (tables/whatif.counts_of)."""

    WHERE: ClassVar[str] = "study"

    gpu_days_gpu: str
    gpu_days_nodes: int
    gpu_days_gpus_per_node: int
    average_families: tuple[str, ...]

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> StudySection:
        where = where or cls.WHERE
        values = _keys_of(cls, section, where)
        unknown = [f for f in values["average_families"] if f not in FAMILIES]
        if unknown:
            raise schema.ConfigError(f"config {where}.average_families: unknown {unknown}; known families: "
                                     f"{', '.join(FAMILIES)}")  # fmt: skip
        return cls(**{**values, "average_families": tuple(values["average_families"])})

    @classmethod
    def given(cls, given: Mapping[str, Any] | None = None) -> StudySection:
        """From part of the section, validated (none given: the study's own definitions, the schema's defaults)."""
        return cls.of(_given("study", given, "a given study section"))

    def in_catalog(self, catalog: Catalog | None) -> StudySection:
        """The section, its GPU-days GPU type checked against the catalog (a typo would leave the view blank)."""
        if catalog is not None and self.gpu_days_gpu not in catalog.gpus:
            raise schema.ConfigError(f"config study.gpu_days_gpu: {self.gpu_days_gpu!r} is not a GPU type of "
                                     f"{catalog.gpus_path} ({', '.join(catalog.gpus)})")  # fmt: skip
        return self

    def to_json(self) -> dict[str, Any]:
        """The section as JSON in the schema's order (the study_tables rule's params, as they always were)."""
        return {**asdict(self), "average_families": list(self.average_families)}


@dataclass(frozen=True)
class WhatifSection(_Flat):
    """The config's `whatif:` section: the catalog models the what-if leads with besides the swept ones. Typed where
    the config is loaded (`Pipeline.whatif`, its names checked against the catalog: `named_in`); the whatif rule's
    settings hold the names (`named`)."""

    WHERE: ClassVar[str] = "whatif"

    models: tuple[str, ...]

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str | None = None) -> WhatifSection:
        return cls(tuple(_keys_of(cls, section, where or cls.WHERE)["models"]))

    def named_in(self, catalog: Catalog | None) -> list[str]:
        """The models it names, each checked to be in the catalog (a typo would silently lead with nothing)."""
        unknown = [m for m in self.models if catalog is not None and m not in catalog.models]
        if unknown:
            raise schema.ConfigError(f"config whatif.models: {unknown} not in {catalog.models_path} "
                                     f"({', '.join(catalog.models)})")  # fmt: skip
        return list(self.models)

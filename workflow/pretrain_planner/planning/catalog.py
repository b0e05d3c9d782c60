"""Models, GPU types and their facts, loaded from config/models.yaml and config/gpus.yaml.

Typed, frozen records so the grid, the trainer and the tables agree on one meaning of each field.
Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pretrain_planner.planning.families import FAMILIES, Family, family
from pretrain_planner.planning.hostcpu import host_bf16
from pretrain_planner.schema import ConfigError, load_yaml, validate


@dataclass(frozen=True)
class Optimizer:
    name: str
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    no_decay_1d: bool = False  # biases and norm weights without weight decay (a stage's BERT recipe)

    def to_dict(self) -> dict[str, Any]:
        out = {**vars(self), "betas": list(self.betas)}
        if not self.no_decay_1d:  # the catalog's recipes: their dicts (a cell's spec, plan.json) as they were
            del out["no_decay_1d"]
        return out


@dataclass(frozen=True)
class Recipe:
    """The published recipe: a step is one optimizer step over `global_batch` samples."""

    global_batch: int
    steps: int | None
    time_budget_hours: float | None
    sequence_length: int | None
    image_size: int | None
    precision: str
    optimizer: Optimizer
    schedule: dict[str, Any]
    grad_clip: float | None
    mlm_probability: float

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "optimizer": self.optimizer.to_dict(), "schedule": dict(self.schedule)}

    @classmethod
    def from_dict(cls, r: dict[str, Any]) -> Recipe:
        """The inverse of `to_dict` (a cell's spec, plan.json)."""
        opt = r["optimizer"]
        optimizer = Optimizer(opt["name"], opt["lr"], tuple(opt["betas"]), opt["eps"], opt["weight_decay"],
                              bool(opt.get("no_decay_1d")))  # fmt: skip
        return cls(**{**{k: r.get(k) for k in RECIPE_FIELDS}, "optimizer": optimizer, "schedule": dict(r["schedule"])})


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    arch: dict[str, Any]
    recipe: Recipe
    supports_compile: bool = True
    supports_checkpointing: bool = True
    # provenance, not the model (a job's spec carries neither: two specs of one model are equal)
    source: str = field(default="", compare=False)
    original_training: dict[str, Any] | None = field(default=None, compare=False)  # {gpus, days, source}

    @property
    def kind(self) -> Family:
        """The family's entry in the registry (families.py)."""
        return FAMILIES[self.family]

    @property
    def task(self) -> str:
        return self.kind.task

    @property
    def is_text(self) -> bool:
        return self.kind.is_text

    @property
    def tokens_per_sample(self) -> int | None:
        return self.recipe.sequence_length if self.is_text else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a job's spec (JSON-safe)."""
        return {
            "name": self.name,
            "family": self.family,
            "task": self.task,
            "arch": dict(self.arch),
            "supports_compile": self.supports_compile,
            "supports_checkpointing": self.supports_checkpointing,
            "recipe": self.recipe.to_dict(),
        }

    @classmethod
    def from_dict(cls, m: dict[str, Any]) -> ModelSpec:
        """The inverse of `to_dict` (a cell's spec, plan.json): the task is the family's."""
        return cls(m["name"], m["family"], dict(m["arch"]), Recipe.from_dict(m["recipe"]),
                   m.get("supports_compile", True), m.get("supports_checkpointing", True))  # fmt: skip


@dataclass(frozen=True)
class GpuSpec:
    name: str
    label: str
    memory_gib: float | None
    peak_tflops: dict[str, float]
    bf16: bool
    fp16: bool
    tf32: bool
    price_usd: float | None
    cloud_usd_per_gpu_hour: float | None
    interconnect_gb_s: float | None = None  # datasheet GPU-to-GPU bandwidth (the what-if predictor's ratio)
    inter_node_gbit_s: float | None = None  # network to other nodes per GPU and direction (reference system / site)
    network_note: str | None = None  # where inter_node_gbit_s comes from when a site file gave it
    bf16_host: str | None = None  # `bf16: host` (the `cpu` stand-in): how this host's support was decided
    memory_gb_s: float | None = None  # datasheet memory bandwidth (the step model's memory-bound work)
    matmul_tflops: dict[str, float] = field(default_factory=dict)  # measured achievable dense matmul, by precision
    price_note: str | None = None  # where a price given by the sweep's config (costs.prices) comes from

    def supports(self, precision: str) -> bool:
        return precision == "fp32" or bool(getattr(self, precision))

    def peak_for(self, precision: str, tf32: bool = False) -> float | None:
        """Dense peak (TFLOP/s) that MFU is quoted against for a cell trained in `precision` (`tf32`: fp32 matmuls
        run as TF32). The measurement, the analytic estimate and the search's compute floor all ask here."""
        if precision == "fp32":
            key = "tf32" if tf32 and self.tf32 else "fp32"
        else:
            key = precision
        return self.peak_tflops.get(key)

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "peak_tflops": dict(self.peak_tflops), "matmul_tflops": dict(self.matmul_tflops)}

    @classmethod
    def from_dict(cls, g: dict[str, Any]) -> GpuSpec:
        """The inverse of `to_dict` (a cell's spec, plan.json)."""
        return cls(**{k: g[k] for k in GPU_FIELDS if k in g})


RECIPE_FIELDS = tuple(f.name for f in fields(Recipe))
GPU_FIELDS = tuple(f.name for f in fields(GpuSpec))


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelSpec]
    gpus: dict[str, GpuSpec]
    base_machine_usd: dict[int, float] = field(default_factory=dict)
    models_path: str = "config/models.yaml"
    gpus_path: str = "config/gpus.yaml"

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ConfigError(f"{self.models_path}: no model {name!r}; known: {', '.join(self.models)}")
        return self.models[name]

    def gpu(self, name: str) -> GpuSpec:
        if name not in self.gpus:
            raise ConfigError(f"{self.gpus_path}: no GPU type {name!r}; known: {', '.join(self.gpus)}")
        return self.gpus[name]

    def with_prices(self, prices: Mapping[str, Mapping[str, Any]] | None, source: str = "config") -> Catalog:
        """The catalog with a sweep's own prices (the config's `costs.prices`: your site's quotes, or the demo's
        nominal price for the `cpu` stand-in) over config/gpus.yaml's; each priced GPU type carries the note."""
        if not prices:
            return self
        gpus = dict(self.gpus)
        for name, given in prices.items():
            if name not in gpus:
                raise ConfigError(f"{source}: costs.prices.{name}: no GPU type {name!r} in {self.gpus_path}; "
                                  f"known: {', '.join(self.gpus)}")  # fmt: skip
            keys = {k: given[k] for k in ("price_usd", "cloud_usd_per_gpu_hour") if k in given}
            note = given.get("note") or f"price from {source} (costs.prices.{name})"
            gpus[name] = replace(gpus[name], **keys, price_note=note)
        return replace(self, gpus=gpus)

    def with_network(self, site: Any) -> Catalog:
        """The catalog with the site file's network (`inter_node_gbit_s` of each GPU type it maps) over
        config/gpus.yaml's reference-system default: what a multi-node prediction's bus crosses the nodes at.
        `site`: a planning/configtypes.SiteFile (not imported here: configtypes imports the catalog), or None."""
        if not site:
            return self
        gpus = dict(self.gpus)
        for name, settings in site.gpus.items():
            given = settings.get("inter_node_gbit_s")
            if given and name in gpus:
                note = f"inter_node_gbit_s from {site.path} (gpus.{name})"
                gpus[name] = replace(gpus[name], inter_node_gbit_s=float(given), network_note=note)
        return replace(self, gpus=gpus)


def _model(name: str, raw: dict, source: str) -> ModelSpec:
    r = raw["recipe"]
    opt = r["optimizer"]
    fam = family(raw["family"], f"{source}: models.{name}.family")
    if (r.get("sequence_length") is None) == fam.is_text:
        want = "sequence_length" if fam.is_text else "image_size"
        raise ConfigError(f"{source}: models.{name}.recipe: family {raw['family']!r} needs {want}")
    missing = [k for k in fam.required_arch if k not in raw["arch"]]
    if missing:
        raise ConfigError(
            f"{source}: models.{name}.arch: missing {', '.join(missing)} (required for family {raw['family']!r})"
        )
    recipe = Recipe(
        global_batch=r["global_batch"],
        steps=r.get("steps"),
        time_budget_hours=r.get("time_budget_hours"),
        sequence_length=r.get("sequence_length"),
        image_size=r.get("image_size"),
        precision=r["precision"],
        optimizer=Optimizer(opt["name"], opt["lr"], tuple(opt["betas"]), opt["eps"], opt["weight_decay"]),
        schedule=dict(r["schedule"]),
        grad_clip=r.get("grad_clip"),
        mlm_probability=r["mlm_probability"],
    )
    supports = raw.get("supports", {})
    return ModelSpec(
        name=name,
        family=raw["family"],
        arch=dict(raw["arch"]),
        recipe=recipe,
        supports_compile=supports.get("compile", True),
        supports_checkpointing=supports.get("activation_checkpointing", True),
        source=raw.get("source", ""),
        original_training=raw.get("original_training"),
    )


def load_models(path: str | Path) -> dict[str, ModelSpec]:
    data = validate(load_yaml(path), "models", path)
    return {name: _model(name, raw, str(path)) for name, raw in data["models"].items()}


def _gpu(name: str, g: dict[str, Any]) -> GpuSpec:
    bf16, bf16_host = g["bf16"], None
    if bf16 == "host":  # the `cpu` stand-in: native bf16 on this host's CPU, or emulated (planning/hostcpu.py)
        support = host_bf16()
        bf16, bf16_host = support.native, f"{'native' if support.native else 'emulated'} here: {support.why}"
    return GpuSpec(
        name=name,
        label=g["name"],
        memory_gib=g.get("memory_gib"),
        peak_tflops=dict(g.get("peak_tflops", {})),
        bf16=bf16,
        fp16=g["fp16"],
        tf32=g["tf32"],
        price_usd=g.get("price_usd"),
        cloud_usd_per_gpu_hour=g.get("cloud_usd_per_gpu_hour"),
        interconnect_gb_s=g.get("interconnect_gb_s"),
        inter_node_gbit_s=g.get("inter_node_gbit_s"),
        bf16_host=bf16_host,
        memory_gb_s=g.get("memory_gb_s"),
        matmul_tflops=dict(g.get("matmul_tflops", {})),
    )


def load_gpus(path: str | Path) -> tuple[dict[str, GpuSpec], dict[int, float]]:
    data = validate(load_yaml(path), "gpus", path)
    gpus = {name: _gpu(name, g) for name, g in data["gpus"].items()}
    base = {}
    for k, v in data.get("base_machine_usd", {}).items():
        if isinstance(k, bool) or not float(k).is_integer() or int(float(k)) < 1:
            raise ConfigError(f"{path}: base_machine_usd.{k}: {k!r} is not a GPU count (a whole number >= 1)")
        base[int(float(k))] = float(v)
    return gpus, base


def load_catalog(models_path: str | Path, gpus_path: str | Path) -> Catalog:
    gpus, base = load_gpus(gpus_path)
    return Catalog(load_models(models_path), gpus, base, str(models_path), str(gpus_path))

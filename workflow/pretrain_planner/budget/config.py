"""Load and check config/budget.yaml; resolve its paths and the model. Imports no torch."""

from __future__ import annotations

import copy
import glob
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pretrain_planner import layout
from pretrain_planner.launch import stage
from pretrain_planner.planning.catalog import load_models
from pretrain_planner.planning.configtypes import BudgetTrain, Launch, LauncherSection, require
from pretrain_planner.planning.methods import parse
from pretrain_planner.planning.runspec import MissingSetting, TrainSetting, accumulation
from pretrain_planner.schema import ConfigError, load_yaml, resolve_path, validate


def load(path: str | Path, basedir: str | Path = ".", results: str | Path | None = None) -> dict[str, Any]:
    """The validated budget config (defaults filled), with corpus files, GLUE dir, model and the training
    setting (`cfg["setting"]`, from the benchmark plan under `results` or from the config) resolved."""
    path = resolve_path(str(path), basedir)
    if not Path(path).is_file():
        raise ConfigError(f"{path}: budget config not found")
    raw = load_yaml(path) or {}
    given = copy.deepcopy(raw)  # what the file sets (validation fills the defaults in)
    cfg = validate(raw, "budget", path)
    cfg["source"] = str(path)  # (errors below name the file)
    files: list[str] = []
    for pattern in cfg["corpus"]["files"]:
        p = str(resolve_path(pattern, basedir))
        hits = sorted(glob.glob(p)) if any(c in p for c in "*?[") else ([p] if Path(p).is_file() else [])
        if not hits:
            raise ConfigError(f"{path}: corpus.files: {pattern!r} matches no file")
        files.extend(hits)
    cfg["corpus"]["files"] = files
    if cfg["tokenizer"]["path"]:
        cfg["tokenizer"]["path"] = str(resolve_path(cfg["tokenizer"]["path"], basedir))
    cfg["glue"]["data_dir"] = str(resolve_path(cfg["glue"]["data_dir"], basedir))
    if cfg["glue"]["patience"] and cfg["glue"]["select"] != "best_dev":
        raise ConfigError(f"{path}: glue.patience {cfg['glue']['patience']} needs glue.select: best_dev (early "
                          "stopping keeps the best dev checkpoint, as run_glue.py's EarlyStoppingCallback needs "
                          f"load_best_model_at_end); glue.select is {cfg['glue']['select']!r}")  # fmt: skip
    cfg["model"], recipe = _model(cfg, path, basedir)
    cfg["recipe_keys"] = apply_recipe(cfg, given, recipe) if recipe is not None else {}
    cfg["setting"] = resolve_setting(cfg, results, str(path), missing_ok=results is not None)
    return cfg


_T = TypeVar("_T")


def or_exit(fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)`, a configuration error ending the workflow's parse with its message (not a traceback)."""
    try:
        return fn(*args)
    except ConfigError as exc:
        raise SystemExit(f"pretrain-planner: budget configuration error\n{exc}") from None


def load_or_exit(path: str | Path, basedir: str | Path = ".", results: str | Path | None = None) -> dict[str, Any]:
    return or_exit(load, path, basedir, results)


def plan_path(cfg: dict[str, Any], results: str | Path) -> Path:
    """Where the export_plan rule puts the benchmark's best setting for this model, GPU type and count."""
    tr = cfg["train"]
    folder = layout.optimal_dir(results, cfg["model"]["name"], tr["gpu"], tr["nodes"], tr["gpus_per_node"])
    return folder / layout.PLAN_FILE


def resolve_setting(
    cfg: dict[str, Any], results: str | Path | None, source: str = "budget config", missing_ok: bool = False
) -> TrainSetting | MissingSetting:
    """Micro-batch, accumulation and method of the run: the benchmark's plan (train.setting benchmark, or auto
    when the plan exists) or the config's train.micro_batch / global_batch / method. Read at parse time, so a
    changed plan changes the pretrain rule's params (it reruns). A plan asked for but missing raises, or with
    `missing_ok` gives source "missing" (the workflow's parse: a benchmark sweep may still write it)."""
    tr = cfg["train"]
    world = tr["nodes"] * tr["gpus_per_node"]
    plan = plan_path(cfg, results) if results is not None else None
    if tr["setting"] != "config" and plan is not None and plan.is_file():
        try:
            return TrainSetting.of_plan(json.loads(plan.read_text()), str(plan))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{plan}: not a plan of the export_plan rule ({type(exc).__name__}: {exc})") from None
    if tr["setting"] == "benchmark":
        where = str(plan) if plan is not None else "results/optimal/{model}/{gpu}/{nodes}x{gpus_per_node}/plan.json"
        msg = (
            f"{source}: train.setting: benchmark, but there is no benchmark plan {where} for model "
            f"{cfg['model']['name']!r} on {tr['nodes']}x{tr['gpus_per_node']} {tr['gpu']!r} (train.gpu, train.nodes, "
            "train.gpus_per_node). Run the benchmark sweep with that model, GPU type and count up to the export_plan "
            "rule first, or set train.setting: config (train.micro_batch, train.global_batch, train.method)"
        )
        if not missing_ok or plan is None:
            raise ConfigError(msg)
        # parsing goes on (a benchmark sweep need not stop); the pretrain job stops with msg (`checked`)
        return MissingSetting(tr["gpu"], tr["nodes"], tr["gpus_per_node"], str(plan), msg)
    micro_batch, gb = tr["micro_batch"], tr["global_batch"]
    try:
        accum = accumulation(gb, micro_batch, world)
    except ValueError as exc:
        raise ConfigError(f"{source}: train.global_batch and train.micro_batch: {exc} (train.nodes x "
                          "train.gpus_per_node)") from None  # fmt: skip
    return TrainSetting(tr["gpu"], tr["nodes"], tr["gpus_per_node"], parse(tr["method"], f"{source}: train.method"),
                        micro_batch, accum)  # fmt: skip


def checked(setting: TrainSetting | MissingSetting) -> TrainSetting:
    """`setting`, or the ConfigError of a benchmark plan that was missing when the workflow was parsed: raised in
    the pretrain job (budget/jobs.pretrain, budget/pretrain._Run), since a plan read mid-run would not be in the
    rule's params and the next run would redo the pre-training."""
    if setting.missing:
        later = Path(setting.plan).is_file()
        raise ConfigError(
            setting.error + (". It exists now (written after this run started): run the workflow again, "
            "which reads it when it starts" if later else "")
        )  # fmt: skip
    return setting


def launch_settings(launcher: LauncherSection, tr: BudgetTrain, source: str, basedir: str | Path) -> Launch:
    """How the stage's jobs run (launch/stage.py): the main config's launcher, and on SLURM the site's settings
    for train.gpu (its partition and GPU request). A launcher that cannot run the setting stops the dry run; a site
    without train.gpu stops only the budget's jobs (`slurm_error`), not a benchmark sweep's parse. `source`: the
    budget file (errors name it)."""
    require(tr, BudgetTrain, "budget.config.launch_settings")
    require(launcher, LauncherSection, "budget.config.launch_settings")
    return stage.launch_settings(launcher, tr.gpu, tr.nodes, tr.world_size, basedir, source,
                                 "train.nodes x train.gpus_per_node", "train.gpu", soft_site=True)  # fmt: skip


def launch_or_exit(launcher: LauncherSection, tr: BudgetTrain, source: str, basedir: str | Path) -> Launch:
    return or_exit(launch_settings, launcher, tr, source, basedir)


def set_torch_threads(tr: BudgetTrain, threads: int | None) -> None:
    """torch's intra-op threads for a job: train.threads when set, else the job's share of the cores (`threads`)."""
    require(tr, BudgetTrain, "budget.config.set_torch_threads")
    threads = tr.torch_threads(threads)
    if threads:
        import torch  # a torch job's, at run time: this module imports no torch

        torch.set_num_threads(threads)


def _model(cfg: dict[str, Any], source: Path, basedir: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model {name, family, arch} and, for a catalog model (a name, or a mapping with `base`), its recipe."""
    m = cfg["model"]
    if isinstance(m, dict) and "base" not in m:
        return {"name": m.get("name", "custom"), "family": m["family"], "arch": dict(m["arch"])}, None
    name = m if isinstance(m, str) else m["base"]
    key = "model" if isinstance(m, str) else "model.base"
    catalog = load_models(resolve_path(cfg["catalog_models"], basedir))
    if name not in catalog:
        raise ConfigError(f"{source}: {key}: no model {name!r} in {cfg['catalog_models']}")
    spec = catalog[name]
    if spec.task != "masked_lm":
        raise ConfigError(f"{source}: {key}: {name!r} is not a masked LM (family {spec.family})")
    recipe = spec.to_dict()["recipe"]
    if isinstance(m, str):
        return {"name": spec.name, "family": spec.family, "arch": dict(spec.arch)}, recipe
    arch = {**spec.arch, **(m.get("arch") or {})}
    return {"name": m.get("name") or f"{spec.name}-custom", "family": spec.family, "arch": arch}, recipe


# (section, key of the budget file) <- a getter of the catalog recipe's value (config/models.yaml `recipe`)
RECIPE_KEYS: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
    ("train", "budget_hours"): lambda r: r["time_budget_hours"],
    ("train", "global_batch"): lambda r: r["global_batch"],
    ("train", "precision"): lambda r: r["precision"],
    ("train", "lr"): lambda r: r["optimizer"]["lr"],
    ("train", "betas"): lambda r: list(r["optimizer"]["betas"]),
    ("train", "eps"): lambda r: r["optimizer"]["eps"],
    ("train", "weight_decay"): lambda r: r["optimizer"]["weight_decay"],
    ("train", "warmup_fraction"): lambda r: r["schedule"].get("warmup_fraction"),
    ("train", "grad_clip"): lambda r: r["grad_clip"],
    ("data", "seq_len"): lambda r: r["sequence_length"],
    ("data", "mlm_probability"): lambda r: r["mlm_probability"],
}


def apply_recipe(cfg: dict[str, Any], raw: dict[str, Any], recipe: dict[str, Any]) -> dict[str, str]:
    """A catalog model's recipe fills every train / data key that the budget file leaves out (the file only
    overrides); returns where each of those keys came from ("catalog" or "file")."""
    if recipe.get("optimizer", {}).get("name") not in (None, "adamw"):
        raise ConfigError(f"{cfg.get('source', 'budget config')}: the catalog recipe's optimizer "
                          f"{recipe['optimizer']['name']!r}: the budget stage trains with AdamW")  # fmt: skip
    origin: dict[str, str] = {}
    for (section, key), get in RECIPE_KEYS.items():
        if key in (raw.get(section) or {}):
            origin[f"{section}.{key}"] = "file"
            continue
        value = get(recipe)
        if value is not None:
            cfg[section][key] = value
            origin[f"{section}.{key}"] = "catalog"
    return origin

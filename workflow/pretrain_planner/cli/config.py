"""The config a command answers with (the one the results folder was made from: sweeprecord.py), the catalog it
names, and the checks of the setting asked about; `CliError`, a refusal said in one line. Shared by every command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pretrain_planner import layout

if TYPE_CHECKING:
    from pretrain_planner.planning.configtypes import CostsSection, EvidenceSection

REPO = Path(__file__).resolve().parents[3]  # the checkout (config/ lives there); unused when installed elsewhere
DEFAULT_CONFIG = "config/config.yaml"


class CliError(Exception):
    pass


def resolve(path: str) -> Path:
    """Relative to the working directory, else to the checkout (like the Snakefile's paths)."""
    from pretrain_planner.schema import resolve_path

    return resolve_path(path, REPO)


def _load_file_config(path: Path, source: str) -> dict[str, Any]:
    """A config file as --config gives it: validated, the schema's defaults in (a file without `sweep:` is given a
    placeholder: the CLI needs only the other sections of it)."""
    from pretrain_planner.configfiles import problem
    from pretrain_planner.schema import load_yaml, validate

    why = problem(path) if path.is_file() else None  # a YAML mistake, an empty file: one line naming file and line
    if why:
        raise CliError(why)
    config = (load_yaml(path) if path.is_file() or source != DEFAULT_CONFIG else {}) or {}
    if "sweep" not in config:  # no sweep at hand: only the keys the CLI needs
        config["sweep"] = {"models": ["-"], "gpus": ["-"]}
    return validate(config, "config", source)


def evidence_of(config: dict[str, Any]) -> EvidenceSection:
    """The answered config's `evidence:` section, typed (a config recorded before the section had it: the
    schema's defaults)."""
    from pretrain_planner.planning.configtypes import EvidenceSection
    from pretrain_planner.schema import section

    return EvidenceSection.of(section("config", "evidence", config.get("evidence")))


def costs_of(config: dict[str, Any]) -> CostsSection:
    """The answered config's `costs:` section, typed (a config without it, or recorded before a key was added:
    the schema's defaults under what it has)."""
    from pretrain_planner.planning.configtypes import CostsSection

    return CostsSection.given(config.get("costs"))


def evidence_folder(config: dict[str, Any]) -> Path:
    """Where the answered config's sweep imports other sites' rows: `evidence.folder`, else {results}/evidence."""
    return evidence_of(config).folder_in(config.get("results") or "results")


# config keys that hold paths, resolved as the sweep resolved them (relative to its working directory)
PATH_KEYS = (("catalog", "models"), ("catalog", "gpus"), ("launcher", "site"), ("budget",), ("train", "tokenizer"))


def _anchored(config: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """The recorded config with its relative paths made absolute where they exist under the sweep's working
    directory (else under its Snakefile's folder), as the pipeline resolved them (schema.resolve_path)."""
    import copy

    config = copy.deepcopy(config)
    for keys in PATH_KEYS:
        holder = config
        for k in keys[:-1]:
            holder = holder.get(k) or {}
        value = holder.get(keys[-1]) if isinstance(holder, dict) else None
        if not isinstance(value, str) or Path(value).is_absolute():
            continue
        for base in (rec.get("workdir"), rec.get("basedir")):
            if base and (Path(base) / value).exists():
                holder[keys[-1]] = str(Path(base) / value)
                break
    return config


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config to answer with, and (in args.answer_source) where it came from: the config the results folder was
    made from (sweeprecord.py), so an answer follows the sweep the user ran.

    The results folder: --results, else --config's `results`, else the last sweep run in this working directory
    (.pretrain-planner/last-sweep.json), else config/config.yaml's. Its recorded config is used; a --config that
    disagrees with it is an error naming both. A folder with no record (made before records, or not run yet) is
    answered with --config, else the demo config/config.yaml, and the answer says so."""
    from pretrain_planner import sweeprecord

    given = _load_file_config(resolve(args.config), args.config) if args.config else None
    flag = getattr(args, "results", None)
    pointer = None if flag or given else sweeprecord.last_sweep()
    demo = None
    if flag:
        results = Path(flag)
    elif given is not None:
        results = Path(given["results"])
    elif pointer is not None:
        results = pointer
    else:
        demo = _load_file_config(resolve(DEFAULT_CONFIG), DEFAULT_CONFIG)
        results = Path(demo["results"])
    try:
        rec = sweeprecord.read(results)
    except sweeprecord.RecordError as exc:
        raise CliError(str(exc)) from None
    if rec is not None:
        if given is not None:
            diff = sweeprecord.differences(given, rec["config"])
            if diff:
                shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
                raise CliError(
                    f"--config {args.config} is not the config {results} was made from: {results} was made from "
                    f"{sweeprecord.describe(rec)}; they differ in {shown}. Leave out --config to answer with the "
                    f"recorded one, pass --results for another results folder, or rerun the sweep with {args.config}"
                )
        config = _anchored(_load_recorded(rec), rec)
        how = "; the last sweep run here" if pointer is not None else ""
        args.answer_source = f"config of {results}/: {sweeprecord.describe(rec)}{how}"
    else:
        config = given if given is not None else demo or _load_file_config(resolve(DEFAULT_CONFIG), DEFAULT_CONFIG)
        used = args.config or DEFAULT_CONFIG
        args.answer_source = (f"config: {used} ({results}/ has no record of its own: {results}/"
                              f"{layout.SWEEP_CONFIG} is written when a sweep runs)")  # fmt: skip
    config["results"] = str(results)
    for flag_name, value, example, single in (("--models", args.models, "config/models.yaml", "--model"),
                                              ("--gpus", args.gpus, "config/gpus.yaml", "--gpu")):  # fmt: skip
        if value and not resolve(value).is_file():
            raise CliError(f"{flag_name} takes a catalog file (e.g. {example}); {value!r} is not a file"
                           f"{f': for one name use {single} {value}' if '/' not in value else ''}")  # fmt: skip
    if args.models:
        config["catalog"]["models"] = args.models
    if args.gpus:
        config["catalog"]["gpus"] = args.gpus
    return config


def _load_recorded(rec: dict[str, Any]) -> dict[str, Any]:
    """The recorded config validated again (a key the schema added since takes its default)."""
    from pretrain_planner.schema import validate

    return validate(rec["config"], "config", rec["path"])


def config_catalog(config: dict[str, Any], models: bool = True):
    """The catalog the config names, with the sweep's own prices (and, on SLURM, the site file's network); `models`
    False: the GPU types alone (`cost` needs no models file)."""
    from pretrain_planner.planning.catalog import Catalog, load_catalog, load_gpus

    gpus_path = resolve(config["catalog"]["gpus"])
    prices = costs_of(config).prices  # the sweep's own prices over the catalog's (the demo's cpu)
    if models:
        catalog = load_catalog(resolve(config["catalog"]["models"]), gpus_path).with_prices(prices)
    else:
        gpus, base = load_gpus(gpus_path)
        catalog = Catalog({}, gpus, base, config["catalog"]["models"], str(gpus_path)).with_prices(prices)
    launcher = config.get("launcher") or {}
    if launcher.get("kind") == "slurm" and launcher.get("site"):  # the site's network, as the sweep's plan had it
        from pretrain_planner.planning.site import read_site

        catalog = catalog.with_network(read_site(resolve(launcher["site"])))
    return catalog


def results_dir(config: dict[str, Any]) -> Path:
    return Path(config["results"])


def per_node(count: int, nodes: int) -> int:
    """--count GPUs over --nodes machines: the GPUs per node, or a refusal when they do not divide."""
    if count < 1 or nodes < 1 or count % nodes:
        raise CliError(f"--count {count} GPUs cannot be spread evenly over --nodes {nodes}")
    return count // nodes


def context(args: argparse.Namespace) -> tuple[dict[str, Any], Path, Any]:
    """(config, results folder, catalog) a command answers with; the names it asks about (`--model`, `--gpu`) are
    looked up in the catalog, so that an unknown one ends with the catalog's known names."""
    config = load_config(args)
    catalog = config_catalog(config)
    if getattr(args, "model", None) and isinstance(args.model, str):
        catalog.model(args.model)
    if getattr(args, "gpu", None):
        catalog.gpu(args.gpu)
    return config, results_dir(config), catalog

"""JSON-Schema validation of the config files, with defaults filled in and errors a person can act on.

Snakemake's own `validate` reports the schema path; users need the file, the key, the bad value and
what is allowed, so every config file goes through `validate` here instead.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


class ConfigError(ValueError):
    """A config file is wrong; the message names the file, the key, the value and what is allowed."""


def resolve_path(path: str | Path, basedir: str | Path) -> Path:
    """A path a config file names: absolute, else relative to the working directory, else to the Snakefile's
    folder (`basedir`), the order Snakemake itself resolves a --configfile in."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return Path(basedir) / p


def _with_defaults(base):
    """A validator class that also writes each property's `default` into the instance."""
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(base, {"properties": set_defaults})


_DefaultingValidator = _with_defaults(Draft202012Validator)


# PyYAML's libyaml loader where the wheel has it (the same values, and marked errors with their line, as the pure-Python
# one): ten times faster, and every answer of the CLI reads the catalog, the schemas and the evidence files (0.41 ->
# 0.04 s for the repo's twelve config and schema files here).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """yaml.safe_load, through libyaml where PyYAML has it."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)


@cache
def load_schema(name: str) -> dict:
    return safe_load((SCHEMA_DIR / f"{name}.schema.yaml").read_text())


def key_path(parts) -> str:
    """['sweep', 'gpus', 1] -> 'sweep.gpus[1]'."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _describe(error) -> str:
    msg = error.message
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and "properties" in schema:
        msg += f"; allowed keys: {', '.join(schema['properties'])}"
        renamed = schema.get("x-renamed", {})  # keys of earlier versions: what replaced them
        for key in (k for k in error.instance if k in renamed and k not in schema["properties"]):
            msg += f"; {key!r} was replaced by {renamed[key]}"
    elif error.validator == "pattern" and schema.get("x-message"):
        msg = f"{error.instance!r} {schema['x-message']}"
    elif error.validator in ("oneOf", "anyOf"):
        explained = [c for c in error.context if c.validator == "pattern" and isinstance(c.schema, dict)
                     and c.schema.get("x-message")]  # fmt: skip
        if explained:
            msg = f"{error.instance!r} {explained[0].schema['x-message']}"
        else:
            msg = f"{error.instance!r} does not match the schema: " + "; ".join(
                sorted({c.message for c in error.context})[:4]
            )
    if schema.get("description") and error.validator != "additionalProperties":
        msg += f" ({schema['description']})"
    return msg


def validate(data: Any, schema_name: str, source: str | Path) -> dict:
    """Validate `data` against workflow/schemas/<schema_name>.schema.yaml; return it with defaults filled."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    validator = _DefaultingValidator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        lines = [f"  {key_path(e.absolute_path)}: {_describe(e)}" for e in errors[:10]]
        more = f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else ""
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines) + more)
    return data


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:  # one line naming the file and line, as a --configfile's mistake is said
        from pretrain_planner.configfiles import yaml_error

        raise ConfigError(yaml_error(path, exc)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc


def schema_defaults(schema_name: str) -> dict[str, Any]:
    """{'a.b': default} for every key the schema gives a default, nested ones included (also under a
    section that is itself required and has no default, e.g. sweep.nodes). A copy: the caller may change it."""
    return copy.deepcopy(_defaults(schema_name))


@cache
def _defaults(schema_name: str) -> dict[str, Any]:
    """`schema_defaults`, walked once per schema (a plan asks a section's defaults for every cell)."""

    def walk(schema: dict, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, sub in (schema.get("properties") or {}).items():
            path = f"{prefix}.{key}" if prefix else key
            if "properties" in sub:
                out.update(walk(sub, path))
            elif "default" in sub:
                out.update(leaves(sub["default"], path))
        return out

    return walk(load_schema(schema_name), "")


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b': value} for every non-mapping value of nested mappings (lists are values)."""
    if not isinstance(data, dict) or (not data and prefix):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def non_defaults(
    effective: dict, schema_name: str, sources: list[tuple[str, Any]], fallback: str = "--config"
) -> list[tuple[str, Any, str]]:
    """(key, value, where it came from) for every effective setting that differs from the schema's default.
    `sources` are (label, mapping) in the order they were merged; the last one that sets a key to its
    effective value is named; `fallback` when none does (e.g. Snakemake's --config)."""
    defaults = schema_defaults(schema_name)
    source_leaves = [(label, leaves(data or {})) for label, data in sources]
    out = []
    for key, value in leaves(effective).items():
        if key in defaults and defaults[key] == value:
            continue
        origin = next((label for label, flat in reversed(source_leaves) if flat.get(key, object()) == value), fallback)
        out.append((key, value, origin))
    return out


def default(schema_name: str, key: str) -> Any:
    """The schema's default of a dotted key (e.g. default("config", "search.tolerance")): code that needs a
    default reads it here rather than writing the number again."""
    return schema_defaults(schema_name)[key]


def section(schema_name: str, name: str, given: dict | None) -> dict:
    """A section of a config (e.g. `benchmark`) with the schema's defaults under what is given: for code that
    receives part of a config from a caller other than Snakemake (a test, a benchmark script, the CLI)."""
    prefix = f"{name}."
    found = {k[len(prefix) :]: v for k, v in _defaults(schema_name).items() if k.startswith(prefix)}
    mutable = (dict, list)  # a default the caller could change is its own copy
    return {**{k: copy.deepcopy(v) if isinstance(v, mutable) else v for k, v in found.items() if "." not in k},
            **(given or {})}  # fmt: skip

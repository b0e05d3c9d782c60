"""Clear errors for the config files Snakemake reads itself, before the Snakefile (and this package) runs.

`snakemake --configfile FILE` loads FILE in its own command-line code: a YAML mistake gives "Config file is not
valid JSON or YAML" with neither the file nor the line, an empty or comment-only file "must be given as JSON or YAML
with keys at top level" without the file, and a mistyped path a 27-line traceback. No line of the Snakefile runs by
then, but Snakemake imports every installed `snakemake_logger_plugin_*` package before it reads the config files
(its plugin registries are built with its command line). This distribution ships one,
`snakemake_logger_plugin_pretrain_planner` (beside this package, installed with it by any installer), whose import
calls `install()`: Snakemake's config-file loader is wrapped so that each file is first checked by `problem()`, and
a mistake ends the run with one line naming the file (and line), what is wrong and what to do. A file that passes is
loaded by Snakemake's own code, unchanged. Nothing runs in a Python process that is not Snakemake's.

`problem()` is also what the CLI's `--config` and `schema.load_yaml` say a YAML mistake with. Imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOADER = "snakemake.common.configfile"  # Snakemake 9's module of load_configfile
USERS = ("snakemake.settings.types",)  # ConfigSettings, which loads each --configfile, imported it by name


def problem(path: str | Path) -> str | None:
    """What is wrong with config file `path`, in one line naming it, or None when Snakemake can load it."""
    import os

    p = Path(path)
    if not p.exists():
        target = p.suffix not in (".yaml", ".yml") or p.parts[:1] == ("results",)
        hint = ("; --configfile takes every word after it up to the next option: give a target before it, e.g. "
                f"snakemake {path} --configfile my-sweep.yaml") if target else ""  # fmt: skip
        return f"--configfile {path}: no such file (looked in {os.getcwd()}){_near(p)}{hint}"
    if p.is_dir():
        return f"--configfile {path}: is a folder, not a config file (a YAML file such as my-sweep.yaml)"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"--configfile {path}: cannot be read ({exc})"
    import json

    try:
        data: Any = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loaders
        except yaml.MarkedYAMLError as exc:
            return yaml_error(path, exc)
        except yaml.YAMLError as exc:
            return f"{path}: not valid YAML: {' '.join(str(exc).split())}"
    if data is None:
        return (f"{path}: the file is empty (no keys, only comments or blank lines): a sweep config needs at least "
                "`sweep:` with `models:` and `gpus:` (README, \"Your own sweep\")")  # fmt: skip
    if not isinstance(data, dict):
        return (f"{path}: the top level is a {type(data).__name__}, not keys and values: a sweep config starts with "
                "`sweep:` (README, \"Your own sweep\")")  # fmt: skip
    return None


def yaml_error(path: str | Path, exc: Any) -> str:
    """'my.yaml:3:11: not valid YAML: expected ',' or ']', but got '<scalar>' (in the flow sequence that starts at
    line 2, column 11); fix it there (tabs are not allowed for indentation)'"""
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    what = exc.problem or "a syntax error"
    context = ""
    if exc.context and exc.context_mark and exc.context_mark is not mark:
        c = exc.context_mark
        context = f" ({exc.context} at line {c.line + 1}, column {c.column + 1})"
    tabs = " (YAML does not allow tabs for indentation)" if "\t" in Path(path).read_text(errors="replace") else ""
    return f"{where}: not valid YAML: {what}{context}{tabs}; fix it at that line"


def _near(p: Path) -> str:
    """'; did you mean config/paper.yaml?' for a close name among the YAML files beside it and in config/."""
    import difflib

    folder = p.parent if str(p.parent) not in ("", ".") else Path(".")
    pool = {str(f) for d in {folder, Path("config")} if d.is_dir() for f in d.glob("*.y*ml")}
    close = difflib.get_close_matches(str(p), sorted(pool), n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def wrap(module: Any) -> None:
    """Check each file before Snakemake's `load_configfile` of `module` loads it; a problem is its WorkflowError."""
    original = getattr(module, "load_configfile", None)
    error = getattr(module, "WorkflowError", None)
    if original is None or error is None or getattr(original, "checked_by_pretrain_planner", False):
        return

    raise_it = _raiser(module)

    def load_configfile(configpath: Any) -> Any:
        why = problem(configpath) if isinstance(configpath, (str, Path)) else None
        if why:
            raise_it(error, why)
        return original(configpath)

    load_configfile.checked_by_pretrain_planner = True  # type: ignore[attr-defined]
    load_configfile.__doc__ = original.__doc__
    module.load_configfile = load_configfile


def _raiser(module: Any) -> Any:
    """A function that raises `error(why)` from a frame Snakemake counts as its own: Snakemake prints an error's
    traceback up to its own frames, and this one's would add a `File ...configfiles.py` line under the one-line
    message. The frame's file is named `<pretrain_planner.configfiles>` inside Snakemake's folder, so a --verbose
    traceback still says where it came from."""
    import os

    folder = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))  # snakemake/
    namespace: dict[str, Any] = {}
    code = compile("def raise_it(error, why):\n    raise error(why)\n",
                   os.path.join(folder, "<pretrain_planner.configfiles>"), "exec")  # fmt: skip
    exec(code, namespace)
    return namespace["raise_it"]


def install() -> None:
    """Called when Snakemake imports its logger plugins (snakemake_logger_plugin_pretrain_planner): wrap its loader
    where its command line looks it up. Never raises: a failure here must not stop Snakemake, which then reports as
    it always did."""
    import importlib

    try:
        loader = importlib.import_module(LOADER)
        original = getattr(loader, "load_configfile", None)
        wrap(loader)
        for name in USERS:  # modules that bound the name at their import: `from ... import load_configfile`
            user = importlib.import_module(name)
            if getattr(user, "load_configfile", None) is original:
                user.load_configfile = loader.load_configfile
    except Exception:  # noqa: BLE001 - see the docstring
        pass

"""Clear errors for the config files Snakemake reads itself, before the Snakefile (and this package) runs.

`snakemake --configfile FILE` loads FILE in its own command-line code: a YAML mistake gives "Config file is not
valid JSON or YAML" with neither the file nor the line, an empty or comment-only file "must be given as JSON or YAML
with keys at top level" without the file, and a mistyped path a 27-line traceback. Nothing of ours runs by then, so
`envs/setup.sh` puts one line in the environment's site-packages (`pretrain_planner_snakemake.pth`) that, in a
`snakemake` process only, calls `install()`: when Snakemake imports its config-file loader, the loader is wrapped so
that each file is first checked by `problem()`, and a mistake ends the run with one line naming the file (and line),
what is wrong and what to do. A file that passes is loaded by Snakemake's own code, unchanged.

Everything here must cost nothing when Python starts (the .pth line runs in every process of the environment): only
`sys` is imported until a `snakemake` process imports the loader. Imports no torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

LOADER = "snakemake.common.configfile"  # Snakemake 9's module of load_configfile (cli.py and settings import it)
# one line (site runs a .pth line starting with `import`); silent where the package is gone (uninstalled)
PTH_LINE = (
    "import sys; (sys.argv[:1] and sys.argv[0].rsplit('/', 1)[-1] == 'snakemake' or sys.orig_argv[1:3] == "
    "['-m', 'snakemake']) and exec('try:\\n from pretrain_planner.configfiles import install\\n install()\\n"
    "except ImportError:\\n pass')"
)


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
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            return _yaml_error(path, exc)
        except yaml.YAMLError as exc:
            return f"{path}: not valid YAML: {' '.join(str(exc).split())}"
    if data is None:
        return (f"{path}: the file is empty (no keys, only comments or blank lines): a sweep config needs at least "
                "`sweep:` with `models:` and `gpus:` (README, \"Your own sweep\")")  # fmt: skip
    if not isinstance(data, dict):
        return (f"{path}: the top level is a {type(data).__name__}, not keys and values: a sweep config starts with "
                "`sweep:` (README, \"Your own sweep\")")  # fmt: skip
    return None


def _yaml_error(path: str | Path, exc: Any) -> str:
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


class _Finder:
    """Wraps Snakemake's config-file loader when it is imported (once; then it leaves sys.meta_path)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != LOADER:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            wrap(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
    """Called by the .pth line in a `snakemake` process: wrap the loader when Snakemake imports it (or now, if it
    already has). Never raises: a failure here must not stop Snakemake, which then reports as it always did."""
    try:
        if LOADER in sys.modules:
            wrap(sys.modules[LOADER])
        elif not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def pth_file(site_packages: str | Path) -> Path:
    """Write the .pth line into `site_packages` (envs/setup.sh); returns its path."""
    path = Path(site_packages) / "pretrain_planner_snakemake.pth"
    path.write_text(PTH_LINE + "\n")
    return path


if __name__ == "__main__":  # python -m pretrain_planner.configfiles SITE_PACKAGES (envs/setup.sh)
    print(pth_file(sys.argv[1]))

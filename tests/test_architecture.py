"""The package's shape, read from its source (ast): no import circles between modules; the layers in one order
(the budget stage -> the train stage -> the trainer -> the planning side -> the shared vocabulary, never back);
and the parts a login node runs (planning, launching, tables, report, search, the shared vocabulary) import
neither torch nor the trainer when they are imported."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from .conftest import REPO

PKG = REPO / "workflow" / "pretrain_planner"
HEAVY = ("torch", "transformers", "deepspeed", "flash_attn", "liger_kernel", "numpy.testing")
# Parts that run where there may be no torch (a login node, the Snakemake driver) and must import fast.
LIGHT = (
    "planning",
    "launch",
    "tables",
    "report",
    "search",
    "schema",
    "layout",
    "results",
    "runlog",
    "sweeprecord",
    "configfiles",
    "integrity",
    "cli",
    "facade",
    "versions",
)
# torch-free entries of compute parts
LIGHT_ENTRIES = (
    "trainer.schedule", "trainer.steplog", "trainer.signals", "trainer.data.mlm", "trainer.data.shards",
    "trainer.data.text", "trainer.data.tokens", "trainer.data.sampler", "budget.config", "budget.jobs",
    "budget.summary", "train.jobs", "train.record", "trainer.runidentity",
)  # fmt: skip
# The layers, top first: a module may import its own layer's modules and those of the layers below it, never one
# above (deferred imports inside functions count too). The facade (what the Snakefile and the CLI ask at parse time)
# describes every stage, so it sits above them all; the stages are recipes of the general train stage, which runs on
# the trainer, which is built on the torch-free side: the report over the tables, the tables over the launcher and
# the adaptive search, both over planning (settings, the grid's rules, the step model).
LAYERS = (
    ("cli", "__main__"),  # the user's entry points
    ("facade",),  # the parse-time facades: the pipeline, the budget stage's and train stage's rule helpers
    ("budget",),  # the time-budgeted BERT stage: the masked-LM task + a time budget + GLUE
    ("train",),  # the general train stage
    ("trainer",),  # building a model with its method, the loop, measuring
    ("report",),  # report.md and the plots, from the tables
    ("tables",),  # the tables from the results, the what-if, the calendar, the export
    ("launch", "search"),  # running a job; the adaptive search's rounds
    ("planning", "integrity"),  # the grid, the settings, the catalog, the step and memory models; damaged results
    ("schema", "layout", "results", "runlog", "sweeprecord", "configfiles", "versions", "__init__"),  # shared
)


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


@functools.cache
def _imports(mod: str, top_level_only: bool) -> frozenset[str]:
    """Modules `mod` imports (package modules by full name, others by their top-level name)."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # module level, including under `if`/`try` at the top
        nodes = [n for top in tree.body for n in ast.walk(top) if not isinstance(top, (ast.FunctionDef, ast.ClassDef))]
        nodes += [n for top in tree.body if isinstance(top, ast.ClassDef) for n in top.body
                  if isinstance(n, (ast.Import, ast.ImportFrom))]  # fmt: skip
    out: set[str] = set()
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in MODULES else base)
    return frozenset(m for m in out if m != mod)


@functools.cache
def _graph(top_level_only: bool) -> dict[str, set[str]]:
    return {m: {i for i in _imports(m, top_level_only) if i in MODULES} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_between_modules():
    """Every import counts, deferred ones inside functions included: a circle is a circle of design."""
    assert _cycles(_graph(top_level_only=False)) == []


def _layer(mod: str) -> int:
    part = mod.split(".")[1] if "." in mod else "__init__"
    found = [i for i, names in enumerate(LAYERS) if part in names]
    assert found, f"{mod}: in no layer of LAYERS (add its part there)"
    return found[0]


def _backward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return sorted(f"{m} ({LAYERS[_layer(m)][0]}) imports {i} ({LAYERS[_layer(i)][0]})"
                  for m, deps in graph.items() for i in deps if _layer(i) < _layer(m))  # fmt: skip


def test_layers_point_one_way():
    """facade -> budget -> train -> trainer -> report -> tables -> launch, search -> planning -> the shared
    vocabulary: never back, not even deferred (a stage of its own that the general one borrows from, a trainer that
    knows a stage, or planning that asks the search it feeds, is a layer upside down)."""
    graph = {m: deps for m, deps in _graph(top_level_only=False).items() if m != "pretrain_planner"}
    assert _backward(graph) == []


def test_the_layer_check_sees_an_import_upwards():
    """The checker itself: a made-up trainer module that imports the train stage, and a train module the budget's."""
    graph = {"pretrain_planner.trainer.x": {"pretrain_planner.train.run"},
             "pretrain_planner.train.run": {"pretrain_planner.budget.config", "pretrain_planner.trainer.loop"},
             "pretrain_planner.budget.config": {"pretrain_planner.planning.site"}}  # fmt: skip
    assert _backward(graph) == [
        "pretrain_planner.train.run (train) imports pretrain_planner.budget.config (budget)",
        "pretrain_planner.trainer.x (trainer) imports pretrain_planner.train.run (train)",
    ]


def test_the_layer_check_sees_planning_ask_the_search_or_the_launcher():
    """The finer layers of the torch-free side: a planning module that asks the search or the launcher (planning
    must answer without either: the dry run and the CLI read it on a login node) and a table that asks the report
    (the report reads the tables, never the reverse) are found."""
    graph = {
        "pretrain_planner.planning.pipeline": {"pretrain_planner.search", "pretrain_planner.launch.request"},
        "pretrain_planner.tables.x": {"pretrain_planner.report.plots"},
        "pretrain_planner.facade.pipeline": {"pretrain_planner.search", "pretrain_planner.budget.config"},
    }
    assert _backward(graph) == [
        "pretrain_planner.planning.pipeline (planning) imports pretrain_planner.launch.request (launch)",
        "pretrain_planner.planning.pipeline (planning) imports pretrain_planner.search (launch)",
        "pretrain_planner.tables.x (tables) imports pretrain_planner.report.plots (report)",
    ]


def _light(mod: str) -> bool:
    rel = mod.removeprefix("pretrain_planner.")
    return rel.split(".")[0] in LIGHT or rel in LIGHT_ENTRIES


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if _light(m)))
def test_light_modules_import_neither_torch_nor_the_trainer(mod):
    """At import time (module level), directly or through the package modules they import."""
    graph = _graph(top_level_only=True)
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        heavy = {i for i in _imports(m, True) if i.split(".")[0] in HEAVY}
        assert not heavy, f"{mod} imports {sorted(heavy)} at import time (through {m})"
        trainer = {i for i in graph[m] if i.startswith("pretrain_planner.trainer") and i != "pretrain_planner.trainer"}
        trainer -= {f"pretrain_planner.{e}" for e in LIGHT_ENTRIES if e.startswith("trainer.")}  # torch-free ones
        assert not trainer, f"{mod} imports the trainer ({sorted(trainer)}) at import time (through {m})"
        todo.extend(graph[m])


def test_the_checks_see_a_circle_and_a_heavy_import(tmp_path, monkeypatch):
    """The walker itself: a made-up pair of modules that import each other, one of them torch."""
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    src = tmp_path / "pretrain_planner" / "planning"
    src.mkdir(parents=True)
    (src / "bad.py").write_text("import torch\n")
    monkeypatch.setitem(MODULES, "pretrain_planner.planning.bad", src / "bad.py")
    _imports.cache_clear()
    assert "torch" in _imports("pretrain_planner.planning.bad", True)
    _imports.cache_clear()

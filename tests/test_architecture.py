"""The package's shape, read from its source (ast): no import circles between modules, and the parts a login
node runs (planning, launching, tables, report, search, the shared vocabulary) import neither torch nor the
trainer when they are imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

PKG = REPO / "workflow" / "pretrain_planner"
HEAVY = ("torch", "transformers", "deepspeed", "flash_attn", "liger_kernel", "numpy.testing")
# Parts that run where there may be no torch (a login node, the Snakemake driver) and must import fast.
LIGHT = ("planning", "launch", "tables", "report", "search", "schema", "layout", "results", "integrity", "cli")
# torch-free entries of compute parts
LIGHT_ENTRIES = (
    "trainer.cell", "budget.config", "budget.jobs", "budget.job", "train.jobs", "train.job", "train.record",
)  # fmt: skip


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(mod: str, top_level_only: bool) -> set[str]:
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
    return {m for m in out if m != mod}


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
        trainer -= {"pretrain_planner.trainer.cell"}
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
    assert "torch" in _imports("pretrain_planner.planning.bad", True)

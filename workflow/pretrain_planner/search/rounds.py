"""The search's rounds on disk: each round of a setting is a Snakemake checkpoint that reads the cells measured
so far, decides, and writes its decision (results/search/{model}/{gpu}/{N}x{G}/round{k}.json); the last one is
copied to search.json for the aggregation. Imports no torch."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import atomic_write_text, parse_result
from pretrain_planner.search.lattice import Observation, Setting
from pretrain_planner.search.rules import decide
from pretrain_planner.search.timemodel import Prior


def cell_result(results: str, setting: Setting, method: str) -> str:
    return layout.cell_file(results, setting.folder, method)


def read_round(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def round_results(results: str, path: str | Path) -> list[str]:
    """result.json of every cell a round has scheduled so far (what the next round reads)."""
    data = read_round(path)
    return [layout.cell_file(results, data["folder"], m) for m in data["ran"]]


def write_round(
    setting: Setting,
    k: int | str,
    inputs: Any,
    results: str,
    out_json: str,
    log_path: str | None = None,
    prior: Prior | None = None,
) -> dict[str, Any]:
    """The `search_round` checkpoint: read the results so far, prune and schedule, write the decision.
    `inputs` is the rule's input (a mapping; round 0 has none, later rounds name the `previous` round); `prior`: the
    evidence (planning/evidence_prior.py) the order of a family with no measured cell rests on."""

    k = int(k)
    previous = inputs.get("previous") if hasattr(inputs, "get") else None
    ran: list[str] = read_round(previous)["ran"] if previous else []
    observed: dict[str, Observation] = {}
    for m in ran:
        row, _problem = parse_result(cell_result(results, setting, m))
        observed[m] = Observation.of(row, setting.world_size)
    decision = decide(setting, observed, prior)
    data = {
        "setting": {"model": setting.model, "gpu": setting.gpu, "nodes": setting.nodes,
                    "gpus_per_node": setting.gpus_per_node},
        "folder": setting.folder,
        "round": k,
        "methods": list(setting.methods),
        "observed": {m: asdict(ob) for m, ob in observed.items()},
        "run": decision.run,
        "ran": ran + decision.run,
        "pruned": decision.pruned,
        "order": decision.order,  # a family with no measured cell -> what its order rested on
        "done": not decision.run,
        "gpu_hours_spent": sum(ob.gpu_hours for ob in observed.values()),
    }  # fmt: skip
    atomic_write_text(out_json, json.dumps(data, indent=1) + "\n")
    if log_path:
        lines = [f"{setting.folder} round {k}: measured {len(observed)}, run {decision.run or 'nothing (done)'}"]
        lines += [f"PRUNED {why}" for why in decision.pruned.values()]
        lines += [f"ORDER {fam} (no measured cell): {why}" for fam, why in decision.order.items()]
        atomic_write_text(log_path, "\n".join(lines) + "\n")
    return data


def write_search(last_round: str, out_json: str, log_path: str | None = None) -> None:
    """The `search_done` rule: the final round of a setting, under a name the aggregation can depend on."""
    text = Path(last_round).read_text()
    atomic_write_text(out_json, text)
    if log_path:
        data = json.loads(text)
        ran, pruned, rounds = len(data["ran"]), len(data["pruned"]), data["round"] + 1
        atomic_write_text(log_path, f"{data['folder']}: {ran} cells run, {pruned} pruned, {rounds} rounds\n")


def read_searches(paths: Iterable[str | Path]) -> tuple[list[str], dict[tuple[str, str, int, int, str], str]]:
    """(result.json paths the searches ran, {(model, gpu, nodes, gpus_per_node, method): pruning reason})."""
    results, pruned = [], {}
    for path in paths:
        path = Path(path)
        data = read_round(path)
        root = path.parents[4]  # {results}/search/{model}/{gpu}/{N}x{G}/search.json (layout.py)
        s = data["setting"]
        key = (s["model"], s["gpu"], s["nodes"], s["gpus_per_node"])
        results += [layout.cell_file(root, data["folder"], m) for m in data["ran"]]
        for m, why in data["pruned"].items():
            pruned[(*key, m)] = why
    return results, pruned


def latest_rounds(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The newest round file of each setting under results/search (for the status view), by folder."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in Path(results_dir, layout.SEARCH).glob(layout.round_file("*/*/*", "*")):
        k = layout.round_number(path)
        try:
            data = read_round(path) if k is not None else {}
        except (ValueError, OSError):
            continue
        if data.get("folder") and (data["folder"] not in out or out[data["folder"]][0] < k):
            out[data["folder"]] = (k, data)
    return {folder: data for folder, (_k, data) in out.items()}

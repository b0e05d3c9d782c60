"""The paper's ablations as a sweep: budget.sweep's values expand into one recipe per combination (the budget
file with those keys replaced), each pre-trained within the budget and fine-tuned on GLUE by the workflow's
`{recipe}` rules; `sweep_table` compares them. Imports no torch (the workflow's parse calls `recipes`).

The reference (IntelLabs/academic-budget-bert) only generates the command lines of such a grid
(generate_training_commands.py: the product of every hyper-parameter's values); here each is a job.
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math
from pathlib import Path
from typing import Any

from pretrain_planner.budget.config import or_exit
from pretrain_planner.budget.glue_report import AVERAGE_BASIS, BASIS_TEXT, average_score
from pretrain_planner.planning.configtypes import BudgetRecipe, require
from pretrain_planner.planning.runspec import MissingSetting, TrainSetting
from pretrain_planner.results import atomic_savefig, atomic_write_text
from pretrain_planner.runlog import FileLog
from pretrain_planner.schema import ConfigError
from pretrain_planner.tables.markdown import csv_text, table

# budget.sweep key -> (section, key of the budget file, short label in a recipe's name)
SWEEP_KEYS: dict[str, tuple[str, str, str]] = {
    "global_batch": ("train", "global_batch", "gb"),
    "lr": ("train", "lr", "lr"),
    "warmup_fraction": ("train", "warmup_fraction", "wu"),
    "seq_len": ("data", "seq_len", "seq"),
    "curve": ("train", "curve", ""),
}
BASE = ""  # the {recipe} wildcard of the budget file's own recipe: results/budget/pretrain/...
DATA = "data"  # the {data} wildcard of the budget file's own data: results/budget/data/index.json


def recipe_dir(name: str) -> str:
    """The {recipe} wildcard (a path prefix under results/budget/) of a swept recipe."""
    return f"recipes/{name}/"


def recipe_name(values: dict[str, Any]) -> str:
    """A recipe's folder name from its swept values, e.g. gb4096-lr0.001-wu0.06."""
    return "-".join(f"{SWEEP_KEYS[k][2]}{v:g}" if not isinstance(v, str) else v for k, v in values.items())


def _with_global_batch(setting: TrainSetting | MissingSetting, gb: int, where: str) -> TrainSetting | MissingSetting:
    """The setting with its accumulation remade for global batch `gb` (micro-batch, ranks and method kept)."""
    if setting.missing:  # the pretrain job stops with the setting's own message
        return setting
    try:
        return setting.with_global_batch(gb)
    except ValueError as exc:
        raise ConfigError(
            f"{where}: sweep.global_batch: {exc} (the setting from {setting.source}"
            f"{': ' + setting.plan if setting.plan else ''})"
        ) from None


def recipes(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{recipe} wildcard -> the recipe's budget config: the file's own (BASE) and, for budget.sweep, every
    combination of its values (in the order the file lists the keys) under recipes/<name>/. Each swept config
    records `recipe` {name, values} and `recipe_keys` origin "sweep" for the keys it replaces."""
    out = {BASE: cfg}
    sweep = {k: v for k, v in (cfg.get("sweep") or {}).items() if v}
    if not sweep:  # (the product of no axes is one empty recipe)
        return out
    for combo in itertools.product(*sweep.values()):
        values = dict(zip(sweep, combo, strict=True))
        name = recipe_name(values)
        if recipe_dir(name) in out:  # values equal to 6 significant digits would share a folder
            other = out[recipe_dir(name)]["recipe"]["values"]
            raise ConfigError(f"{cfg['source']}: sweep: recipes {other} and {values} get the same name {name!r}: "
                              "make the values differ in the first 6 digits")  # fmt: skip
        rc = copy.deepcopy(cfg)
        for key, value in values.items():
            section, field, _ = SWEEP_KEYS[key]
            rc[section][field] = value
            rc["recipe_keys"][f"{section}.{field}"] = "sweep"
        if "global_batch" in values:
            rc["setting"] = _with_global_batch(rc["setting"], values["global_batch"], f"{cfg['source']}: recipe {name}")
        rc["recipe"] = {"name": name, "values": values}
        out[recipe_dir(name)] = rc
    return out


def recipes_or_exit(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`recipes`, a configuration error ending the workflow's parse with its message."""
    return or_exit(recipes, cfg)


def swept(all_recipes: dict[str, dict[str, Any]]) -> list[str]:
    """The {recipe} wildcards of budget.sweep's recipes (empty without a sweep)."""
    return [r for r in all_recipes if r != BASE]


def data_key(recipe: BudgetRecipe, base: BudgetRecipe) -> str:
    """The {data} wildcard of a recipe's prepared data: the base's, or data-seq<N> for another sequence length."""
    require(recipe, BudgetRecipe, "budget.sweep.data_key")
    seq = recipe.prep.data.seq_len
    return DATA if seq == base.prep.data.seq_len else f"{DATA}-seq{seq}"


def data_sets(typed: dict[str, BudgetRecipe]) -> dict[str, BudgetRecipe]:
    """{data} wildcard -> the recipe whose seed, corpus, tokenizer and data settings (`prep`) prepare that data, of
    the recipes typed where the stage is loaded ({recipe} wildcard -> BudgetRecipe: facade/budget.py)."""
    base = typed[BASE]
    return {data_key(r, base): r for r in reversed(typed.values())} | {DATA: base}


# -- the comparison ------------------------------------------------------------------------------------------
COLUMNS = ["recipe", "stop_reason", "steps", "global_batch", "sequences", "tokens", "loss_last", "val_loss",
           "glue_tasks", "glue_avg"]  # fmt: skip


def _glue_average(csv_path: Path) -> tuple[int, float | None]:
    """The entries scored and their mean (x100) in a recipe's glue.csv: glue_report's average, on its one basis
    (glue_report.AVERAGE_BASIS: MNLI matched and mismatched as two entries, WNLI left out)."""
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if rows and "score" not in rows[0]:
        raise ValueError(f"{csv_path}: no score column (not a glue_table output)")
    metrics = {m for _, m in AVERAGE_BASIS}
    entries, avg = average_score([{k: (float(v) if v else None) if k in metrics else v for k, v in r.items()}
                                  for r in rows])  # fmt: skip
    return len(entries), avg


def _names(rows: list[dict[str, Any]], key: str, value: float) -> str:
    """The recipes whose `key` is `value` (a tie names them all)."""
    return ", ".join(r["recipe"] for r in rows if r[key] == value)


def sweep_table(
    recipes_values: dict[str, dict[str, Any]],
    results: list[str],
    glue_csvs: list[str],
    out_csv: str | Path,
    out_md: str | Path,
    out_png: str | Path,
    log: str | Path | None = None,
) -> list[dict[str, Any]]:
    """One row per recipe (in `recipes_values`' order, matching `results` and `glue_csvs`): its swept values,
    why it stopped, steps and sequences seen within the budget, training and validation loss at the end, the GLUE
    average (dev, headline score per task); and the validation loss of every recipe against time as a PNG."""
    logger = FileLog(log)
    keys = list(dict.fromkeys(k for v in recipes_values.values() for k in v))
    rows, curves = [], {}
    for (name, values), res_path, glue_path in zip(recipes_values.items(), results, glue_csvs, strict=True):
        res = json.loads(Path(res_path).read_text())
        n_tasks, avg = _glue_average(Path(glue_path))
        rows.append({"recipe": name, **{k: values.get(k) for k in keys},
                     **{c: res.get(c) for c in ("stop_reason", "steps", "global_batch", "sequences", "tokens",
                                                "loss_last", "val_loss")},
                     "glue_tasks": n_tasks, "glue_avg": avg})  # fmt: skip
        curves[name] = (res.get("clock", "wall"), res.get("validation") or [])
    head = COLUMNS[:1] + keys + [c for c in COLUMNS[1:] if c not in keys]
    atomic_write_text(out_csv, csv_text(head, ([r[c] for c in head] for r in rows)))
    finite = [r for r in rows if isinstance(r["val_loss"], float) and not math.isnan(r["val_loss"])]
    scored = [r for r in rows if r["glue_avg"] is not None]
    clock = {c for c, _ in curves.values()}
    md = ["# The budget's recipes compared", "",
          f"Every recipe of budget.sweep ({', '.join(keys)}) pre-trained within the same time budget "
          f"({'/'.join(sorted(clock))} clock) and fine-tuned on the same GLUE tasks. `loss_last`: training MLM "
          "loss over the last tenth of the steps; `val_loss`: validation loss at the end; `glue_avg`: the mean "
          "headline score (dev, x100) of each task's median over seeds of its best setting, over `glue_tasks` "
          f"entries of glue.md's one basis ({BASIS_TEXT}); sequences = steps x global batch. Validation loss "
          "against time: sweep_loss.png.", "",
          table(head, [[r[c] for c in head] for r in rows]).rstrip("\n")]  # fmt: skip
    if finite:
        low = min(r["val_loss"] for r in finite)
        md += ["", f"Lowest validation loss at the budget's end: {_names(finite, 'val_loss', low)} ({low:.4g})."]
    if scored:
        high = max(r["glue_avg"] for r in scored)
        md += [f"Highest GLUE average: {_names(scored, 'glue_avg', high)} ({high:.1f}, dev)."]
    stopped = [r for r in rows if r["stop_reason"] and r["stop_reason"] != "budget"]
    if stopped:
        md += ["", "Stopped before the budget's end: " + "; ".join(f"{r['recipe']} ({r['stop_reason']})"
                                                                 for r in stopped) + "."]  # fmt: skip
    atomic_write_text(out_md, "\n".join(md) + "\n")
    plot_validation(curves, Path(out_png))
    logger.info("sweep table: %d recipes -> %s, %s, %s", len(rows), out_csv, out_md, out_png)
    return rows


def plot_validation(curves: dict[str, tuple[str, list[dict[str, Any]]]], out: Path) -> Path:
    """Validation loss against hours on the runs' clock, one line per recipe."""
    from pretrain_planner.report.plots import _canvas  # a Figure of its own: no pyplot state across threads

    fig = _canvas(7.2, 4.4)
    ax = fig.add_axes((0.1, 0.12, 0.58, 0.8))  # fixed margins, the legend to the right (docs/architecture.md)
    for name, (_, points) in curves.items():
        pts = [(p["elapsed_s"] / 3600, p["val_loss"]) for p in points if p.get("val_loss") is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=name)
    clocks = {c for c, _ in curves.values()}
    ax.set_xlabel("hours (" + ("wall time" if clocks == {"wall"} else "training time" if clocks == {"train"}
                               else "each run's clock") + ")")  # fmt: skip
    ax.set_ylabel("validation MLM loss")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    atomic_savefig(fig, out)
    return out

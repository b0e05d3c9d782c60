"""Plots from the tables: days to train with the best method, and step time per method."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .results import atomic_write_text


def plot_files(folder: str) -> dict[str, str]:
    return {
        "days_png": f"{folder}/days_to_train.png",
        "days_svg": f"{folder}/days_to_train.svg",
        "methods_png": f"{folder}/step_time_by_method.png",
    }


def _setting(row: dict) -> str:
    return f"{row['gpu']} {row['nodes']}x{row['gpus_per_node']}"


def make_plots(cells_parquet: str, time_to_train_csv: str, out: dict[str, str], log_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for path in out.values():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    ttt = pl.read_csv(time_to_train_csv)
    cells = pl.read_parquet(cells_parquet).filter(pl.col("status") == "ok")

    # 1. days to train, best method per setting, one group of bars per model
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * max(1, ttt.height)), 4.5))
    labels = [f"{r['model']}\n{_setting(r)}\n{r['best_method']}" for r in ttt.iter_rows(named=True)]
    days = ttt["training_days"].fill_null(0).to_list()
    ax.bar(range(len(days)), days, color="tab:blue")
    ax.set_xticks(range(len(days)), labels, fontsize=7)
    ax.set_ylabel("days to train (recipe steps x median step)")
    ax.set_title("Time to train with the fastest method that fits")
    if days and min(days) > 0 and max(days) / min(days) > 100:
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(out["days_png"], dpi=120)
    fig.savefig(out["days_svg"])
    plt.close(fig)

    # 2. median step time per method, with the p10-p90 spread, per model x setting
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * max(1, cells.height)), 4.5))
    rows = cells.sort("model", "gpu", "nodes", "gpus_per_node", "method").iter_rows(named=True)
    rows = list(rows)
    med = [r["step_time_s"] for r in rows]
    err = [
        [r["step_time_s"] - r["step_time_p10_s"] for r in rows],
        [r["step_time_p90_s"] - r["step_time_s"] for r in rows],
    ]
    colors = ["tab:orange" if r["method"] == "naive" else "tab:green" for r in rows]
    ax.bar(range(len(rows)), med, yerr=err, color=colors, capsize=2)
    ax.set_xticks(range(len(rows)), [f"{r['model']}\n{_setting(r)}\n{r['method']}" for r in rows], fontsize=6)
    ax.set_ylabel("seconds per optimizer step (median, p10-p90)")
    ax.set_title("Step time by method")
    fig.tight_layout()
    fig.savefig(out["methods_png"], dpi=120)
    plt.close(fig)
    atomic_write_text(log_path, f"plotted {ttt.height} settings, {len(rows)} ok cells\n")

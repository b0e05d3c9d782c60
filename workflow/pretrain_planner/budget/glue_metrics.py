"""GLUE metrics from the libraries the reference's evaluation uses, and the protocol's aggregation over a grid.

The reference (IntelLabs/academic-budget-bert run_glue.py) computes its metrics with `datasets`' "glue" metric,
which calls scikit-learn (accuracy_score, f1_score, matthews_corrcoef) and scipy (pearsonr, spearmanr); so do we.
Its early-stopping monitor per task is `MONITOR` (Matthews for CoLA, F1 for MRPC / QQP, Spearman for STS-B,
accuracy otherwise). The paper (appendix B) runs every configuration of its grid with 5 seeds and reports the
median of the best configuration: `aggregate`.

Torch-free: imported by the table as well as by the fine-tuning job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# metric -> the library function that computes it (fully qualified), as the reference's evaluation
LIBRARY = {
    "acc": "sklearn.metrics.accuracy_score",
    "f1": "sklearn.metrics.f1_score",
    "mcc": "sklearn.metrics.matthews_corrcoef",
    "pearson": "scipy.stats.pearsonr",
    "spearman": "scipy.stats.spearmanr",
}
# the metric the reference monitors for the best checkpoint and early stopping (run_glue.py metric_monitor)
MONITOR = {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "spearman"}


def monitor(task: str) -> str:
    return MONITOR.get(task, "acc")


def compute(metric: str, y: Sequence, p: Sequence) -> float:
    """One metric of references `y` and predictions `p` (floats); NaN where the library gives NaN (e.g. a
    correlation of a constant prediction) or for no rows."""
    import warnings

    y, p = np.asarray(y), np.asarray(p)
    if len(y) == 0:
        return float("nan")
    with warnings.catch_warnings():  # constant inputs: scipy warns and returns NaN, sklearn warns and returns 0
        warnings.simplefilter("ignore")
        if metric in ("acc", "f1", "mcc"):
            from sklearn import metrics as skm

            fn = {"acc": skm.accuracy_score, "f1": skm.f1_score, "mcc": skm.matthews_corrcoef}[metric]
            return float(fn(y, p))
        from scipy import stats

        fn = {"pearson": stats.pearsonr, "spearman": stats.spearmanr}[metric]
        return float(fn(p, y)[0])


def task_metrics(metrics: Sequence[str], y: Sequence, p: Sequence) -> dict[str, float]:
    return {m: compute(m, y, p) for m in metrics}


def better(a: float | None, b: float | None) -> bool:
    """Whether score `a` beats `b` (higher is better; NaN or None never wins)."""
    a = -math.inf if a is None or math.isnan(a) else a
    b = -math.inf if b is None or math.isnan(b) else b
    return a > b


def _median(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.median(vals)) if vals else float("nan")


def aggregate(runs: list[dict[str, Any]], key: str, metrics: Sequence[str]) -> dict[str, Any]:
    """The paper's protocol over `runs` (one dict per setting x seed: lr, batch, epochs, seed and its metrics):
    per setting the median over seeds of every metric; the best setting is the one whose median `key` is
    highest (ties: the first in grid order). Returns {"setting", "seeds", "metrics" (its medians), "settings"
    (every setting's medians, grid order)}."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["lr"], r["batch"], r["epochs"]), []).append(r)
    settings = []
    for (lr, batch, epochs), rs in groups.items():
        med = {m: _median([r.get(m) for r in rs]) for m in metrics}
        settings.append({"lr": lr, "batch": batch, "epochs": epochs, "seeds": [r["seed"] for r in rs], **med})
    best = settings[0]
    for s in settings[1:]:
        if better(s[key], best[key]):
            best = s
    return {
        "setting": {k: best[k] for k in ("lr", "batch", "epochs")},
        "seeds": best["seeds"],
        "metrics": {m: best[m] for m in metrics},
        "settings": settings,
    }

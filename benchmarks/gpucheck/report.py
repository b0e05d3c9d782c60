"""The Markdown reports of a GPU run: a part's cells, the timing-honesty check, the sustained run, the comparison
with the H200 reference figures, and each cell's details. Every table goes through pretrain_planner.tables.markdown
(no polars on a GPU machine)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

from pretrain_planner.tables.markdown import table

from .plans import REFERENCE


def f(x: Any, fmt: str = "{:.3f}", none: str = "–") -> str:
    """A value in `fmt`, or `none`."""
    if x is None:
        return none
    try:
        return fmt.format(x)
    except (TypeError, ValueError):
        return str(x)


def trials(r: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{t['micro_batch']} {'fits' if t['fits'] else 'OOM'} ({t['seconds']:.1f}s)"
            for t in r.get("micro_batch_trials") or []
        )
        or "–"
    )


def check_text(rec: dict[str, Any]) -> str:
    checks = rec.get("checks") or []
    failed = [c for c, ok in checks if not ok]
    if failed:
        return "FAIL: " + "; ".join(failed)
    return f"all {len(checks)} pass" if checks else "–"


def status_text(rec: dict[str, Any]) -> str:
    r = rec.get("result") or {}
    status = rec.get("status") or "not run"
    if r.get("suspect"):
        status += " (SUSPECT)"
    if status not in ("ok", "not needed"):
        why = r.get("reason") or rec.get("reason") or rec.get("error") or ""
        status += f": {why}"[:200] if why else ""
    if rec.get("concurrent_workers"):
        status += f" [beside {rec['concurrent_workers']} other process(es): status only, not a timing]"
    return status


def failed(rec: dict[str, Any]) -> bool:
    """A cell that did not do what it must: an error, a crash, a time-out, a failed check."""
    return rec.get("status") in ("error", "crashed", "timeout") or any(not ok for _, ok in rec.get("checks") or [])


def _setting(key: str) -> Callable:
    return lambda rec, r, s: f(s.get(key), "{}")


# (header, value of a record) -- one list for every cell table
COLUMNS: list[tuple[str, Callable]] = [
    ("cell", lambda rec, r, s: rec["label"]),
    ("status", lambda rec, r, s: status_text(rec)),
    ("checks", lambda rec, r, s: check_text(rec)),
    ("micro-batch", lambda rec, r, s: f(r.get("micro_batch"), "{}")),
    ("accum", lambda rec, r, s: f(r.get("grad_accum_steps"), "{}")),
    (
        "global batch (recipe)",
        lambda rec, r, s: (
            f"{(rec.get('override') or {}).get('global_batch', '–')} "
            f"({(rec.get('override') or {}).get('recipe_global_batch', '–')})"
        ),
    ),
    ("step median s", lambda rec, r, s: f(r.get("step_time_s"), "{:.4f}")),
    ("p10", lambda rec, r, s: f(r.get("step_time_p10_s"), "{:.4f}")),
    ("p90", lambda rec, r, s: f(r.get("step_time_p90_s"), "{:.4f}")),
    ("tokens/s", lambda rec, r, s: f(r.get("tokens_per_s"), "{:,.0f}")),
    ("MFU", lambda rec, r, s: f(r.get("mfu"), "{:.1%}")),
    ("peak GiB", lambda rec, r, s: f(r.get("peak_mem_gib"), "{:.1f}")),
    ("attention", _setting("attn_implementation")),
    ("attention kernel", _setting("attention_kernel")),
    ("compile", _setting("compile")),
    ("parallel", _setting("parallel")),
    ("tf32", _setting("tf32")),
    ("autocast", _setting("autocast")),
    ("grad scaler", _setting("grad_scaler")),
    ("fused AdamW", _setting("fused_optimizer")),
    ("micro-batch trials", lambda rec, r, s: trials(r)),
    ("wall s", lambda rec, r, s: f(rec.get("cell_wall_s"), "{:.0f}")),
]
SHORT_COLUMNS = ("cell", "status", "micro-batch", "step median s", "tokens/s", "MFU", "peak GiB", "attention kernel")


def cell_table(records: list[dict[str, Any]], columns: tuple[str, ...] | None = None) -> str:
    """The cell records as a Markdown table (all COLUMNS, or the named ones)."""
    cols = [(h, fn) for h, fn in COLUMNS if columns is None or h in columns]
    rows = []
    for rec in records:
        r = rec.get("result") or {}
        rows.append([fn(rec, r, r.get("method_settings") or {}) for _, fn in cols])
    return table([h for h, _ in cols], rows)


def _reference_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for rec in records:
        key, r = (rec.get("plan") or {}).get("reference"), rec.get("result") or {}
        if not key or r.get("status") != "ok":
            continue
        ref = REFERENCE["cells"][key]
        s = r.get("method_settings") or {}
        diffs = []
        if bool(s.get("compile")) != ref["compile"]:
            diffs.append("compiled (reference: not)" if s.get("compile") else "not compiled (reference: compiled)")
        if s.get("autocast") != "bfloat16":
            diffs.append(
                f"{s.get('autocast')} autocast{' + GradScaler' if s.get('grad_scaler') else ''} (reference: bf16)"
            )
        if r.get("micro_batch") != ref["mb"]:
            diffs.append(f"micro-batch {r.get('micro_batch')} (reference: {ref['mb']})")
        ratio = r["tokens_per_s"] / ref["tokens_per_s"] if r.get("tokens_per_s") else None
        rows.append(
            [
                rec["label"],
                f"mb {r.get('micro_batch')}, {f(r.get('tokens_per_s'), '{:,.0f}')}, "
                f"{f(r.get('mfu'), '{:.1%}')}, {f(r.get('peak_mem_gib'), '{:.1f}')}",
                f"{ref['what']}: {ref['tokens_per_s']:,}, {ref['mfu']:.1%}, {ref['peak_gib']}",
                f(ratio, "{:.2f}"),
                "; ".join(diffs) or "same settings",
            ]
        )
    return rows


def honesty_section(rec: dict[str, Any] | None) -> list[str]:
    out = ["## Timing honesty: the reference benchmark's timer vs ours\n"]
    if rec is None:
        return [*out, "Not run.\n"]
    h = rec.get("honesty") or {}
    if rec.get("status") != "ok":
        return [*out, f"**{status_text(rec)}**\n"]
    out.append(
        f"{h['model']}, micro-batch {h['micro_batch']}, {h['accum']} accumulation micro-batches per step; "
        f"{h['settings']}. Reference method: {h['reference_steps']} steps of one micro-batch, perf_counter, "
        f"step = mean(micro) x {h['accum']} + mean(optimizer).\n"
    )
    rows = []
    for name, key, err in (
        ("reference (no synchronisation)", "reference_unsynchronised", "error_unsynchronised"),
        ("same, synchronised", "reference_synchronised", "error_synchronised"),
    ):
        d = h[key]
        rows.append(
            [
                name,
                f"{d['step_s']:.4f}",
                f"{statistics.mean(d['micro_s']):.4f}",
                f"{statistics.mean(d['optimizer_s']):.4f}",
                f"{h[err]:+.1%}",
            ]
        )
    act = h["actual"]
    rows.append(
        [
            f"actual: median of {len(act['step_times_s'])} whole synchronised steps ({act['warmup_steps']} "
            "warm-up dropped)",
            f"{act['step_s']:.4f}",
            "",
            "",
            "",
        ]
    )
    out.append(table(["timer", "step s", "mean micro s", "mean optimizer s", "vs actual"], rows))
    ref = REFERENCE["honesty"].get(h["model"])
    if ref:
        out.append(
            f"The H200 reference ({h['model']}; {REFERENCE['honesty_source']}): reference {ref['reference']} "
            f"s, synchronised {ref['synchronised']} s, actual {ref['actual']} s, reference error "
            f"{ref['error']:+.1%}.\n"
        )
    if (h.get("method_settings") or {}).get("device") == "cpu":
        out.append(
            "On the CPU there is no asynchronous device queue: both reference timers see the real work, so "
            "any gap to the actual step here is noise, not the timer's error.\n"
        )
    return out


def sustained_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for rec in records:
        p, s = rec.get("predicted") or {}, rec.get("sustained") or {}
        err = rec.get("prediction_error")
        rows.append(
            [
                rec["label"],
                rec.get("of") or "–",
                status_text(rec),
                f"{p.get('micro_batch', '–')} x {p.get('grad_accum_steps', '–')}",
                f"{p['step_time_s']:.4f} ({p['step_time_p10_s']:.4f}-{p['step_time_p90_s']:.4f})" if p else "–",
                f(s.get("mean_step_s"), "{:.4f}"),
                f(s.get("steps"), "{}"),
                f(err, "{:+.2%}"),
                "–" if err is None else "yes" if rec.get("within_target") else "no",
            ]
        )
    return rows


SUSTAINED_COLUMNS = [
    "run",
    "setting of",
    "status",
    "micro-batch x accum",
    "predicted step s (p10-p90)",
    "sustained mean step s",
    "steps",
    "error (predicted / sustained - 1)",
    "within +-3%",
]


def details(records: list[dict[str, Any]]) -> list[str]:
    out = ["## Per cell\n"]
    for rec in records:
        r = rec.get("result") or {}
        out.append(f"### {rec['label']}\n")
        out.append(f"status **{status_text(rec)}**\n")
        if rec.get("override"):
            out.append(f"spec overrides: `{json.dumps(rec['override'])}`; files: `{rec.get('folder')}`\n")
        if rec.get("grid_reason"):
            out.append(f"{rec['grid_reason']}\n")
        if rec.get("checks"):
            out.append("checks: " + ", ".join(f"{'PASS' if ok else '**FAIL**'} {c}" for c, ok in rec["checks"]) + "\n")
        if r.get("status") == "ok":
            out.append(
                f"device {r.get('device_name')}; step times (s): "
                + ", ".join(f"{st['time_s']:.4f}" for st in rec.get("steps") or [])
                + f"; final loss {f(r.get('final_loss'), '{:.4f}')}; flops/step "
                f"{f(r.get('flops_per_step'), '{:.3e}')}; peak TFLOP/s {r.get('peak_tflops')}; trials: "
                f"{trials(r)}\n"
            )
            out.append(f"method settings: `{json.dumps(r.get('method_settings'), default=str)}`\n")
        if rec.get("gpu_bytes_left_after_cleanup") is not None:
            out.append(
                f"GPU memory still allocated after the cell and cleanup: "
                f"{rec['gpu_bytes_left_after_cleanup'] / 2**20:.1f} MiB\n"
            )
        if rec.get("error"):
            out.append(f"error: `{rec['error'][:500]}`\n\n```\n{rec.get('traceback', '')}\n```\n")
        if rec.get("worker_log_tail"):
            out.append(f"end of the worker's log:\n\n```\n{rec['worker_log_tail'][-2500:]}\n```\n")
        if rec.get("cleanup_error"):
            out.append(f"cleanup error: `{rec['cleanup_error']}`\n")
    return out


def render_part(title: str, header: list[tuple[str, Any]], records: list[dict[str, Any]]) -> str:
    """One part's report: its facts, its cells, the sustained runs, the honesty check, the comparison with the
    H200 reference, and each cell's details."""
    out = [f"# {title}\n", table(["", ""], [[k, v] for k, v in header])]
    cells = [r for r in records if (r.get("plan") or {}).get("kind", "cell") == "cell"]
    if cells:
        out += [
            "## Cells\n",
            "In run order. Checks: what must hold if the trainer's path works (status, or "
            "`unsupported` with a reason where the back-end is absent; device, attention and the kernel that ran, "
            "compile, TF32, fused AdamW, autocast, grad scaler, the parts' evidence, batch arithmetic, "
            "steps.jsonl, not suspect, finite loss; the OOM probe: a failed trial then a fit).\n",
            cell_table(cells),
            "Peak GiB: CUDA max allocated during the timed steps (on CPU: the process's max RSS).\n",
        ]
    sustained = [r for r in records if (r.get("plan") or {}).get("kind") == "sustained"]
    if sustained:
        out += ["## Predicted step vs a sustained run\n", table(SUSTAINED_COLUMNS, sustained_rows(sustained))]
    honesty = next((r for r in records if (r.get("plan") or {}).get("kind") == "honesty"), None)
    if honesty is not None:
        out += honesty_section(honesty)
    ref_rows = _reference_rows(records)
    if ref_rows:
        out += [
            "## Against the H200 reference figures (reference_h200.json)\n",
            table(
                [
                    "cell",
                    "ours: micro-batch, tokens/s, MFU, peak GiB",
                    "reference",
                    "ratio tokens/s",
                    "ours vs reference",
                ],
                ref_rows,
            ),
            f"Reference: {REFERENCE['source']}\n",
        ]
    out += details(records)
    return "\n".join(out) + "\n"

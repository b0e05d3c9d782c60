"""summary.md of a GPU run: the five figures of issue 28 first (P2 the levers combined, P1 the predicted step against
a sustained run, P5 the train stage against its plan, P4 every method's status, the OOM probe and timing honesty),
then the time plan against what happened, then the machine and the exact command."""

from __future__ import annotations

from typing import Any

from pretrain_planner.tables.markdown import table

from .report import SUSTAINED_COLUMNS, check_text, f, honesty_section, status_text, sustained_rows, trials


def _records(summary: dict[str, Any], *parts: str) -> list[dict[str, Any]]:
    """The parts' records in the order of their plans (rows.jsonl keeps the order they ended in)."""
    out = []
    for p in parts:
        st = summary["parts"].get(p) or {}
        order = {label: i for i, label in enumerate(st.get("cells") or [])}
        out += sorted(st.get("records", []), key=lambda r: order.get(r["label"], len(order)))
    return out


def _levers(summary: dict[str, Any]) -> list[str]:
    rows = []
    for rec in _records(summary, "p2_1b", "p2_410m", "p2_cg"):
        r, target = rec.get("result") or {}, (rec.get("plan") or {}).get("target") or {}
        met = "–"
        if r.get("status") == "ok" and target and r.get("mfu") is not None:
            met = (
                "yes" if r["mfu"] >= target["mfu"] and (r.get("tokens_per_s") or 0) >= target["tokens_per_s"] else "no"
            )
        rows.append(
            [
                rec["label"],
                status_text(rec),
                f"{f(r.get('micro_batch'), '{}')} x {f(r.get('grad_accum_steps'), '{}')}",
                f(r.get("step_time_s"), "{:.4f}"),
                f(r.get("tokens_per_s"), "{:,.0f}"),
                f(r.get("mfu"), "{:.1%}"),
                f(r.get("peak_mem_gib"), "{:.1f}"),
                f"{target['mfu']:.0%} / {target['tokens_per_s']:,} ({target['source']})" if target else "–",
                met,
                check_text(rec),
            ]
        )
    if not rows:
        return ["Not run.\n"]
    return [
        table(
            [
                "cell",
                "status",
                "micro-batch x accum",
                "step s",
                "tokens/s",
                "MFU",
                "peak GiB",
                "target MFU / tokens/s",
                "met",
                "checks",
            ],
            rows,
        )
    ]


def _train(summary: dict[str, Any]) -> list[str]:
    rows = []
    for rec in _records(summary, "p5_train"):
        t = rec.get("throughput") or {}
        pred = t.get("prediction") or {}
        diffs = rec.get("settings_differences")
        rows.append(
            [
                rec["label"],
                status_text(rec),
                f"{rec.get('micro_batch', '–')} x {rec.get('accum', '–')}",
                f"{f(rec.get('trained_steps'), '{}')} ({f(t.get('steps_timed'), '{}')} timed)",
                f(t.get("step_time_s"), "{:.4f}"),
                f(t.get("step_time_median_s"), "{:.4f}"),
                f(pred.get("step_time_s"), "{:.4f}"),
                f(rec.get("ratio"), "{:.3f}"),
                "–" if rec.get("ratio") is None else "yes" if rec.get("within_target") else "no",
                "none" if diffs == [] else "; ".join(diffs) if diffs else "–",
                rec.get("data") or "–",
            ]
        )
    if not rows:
        return ["Not run.\n"]
    out = [
        table(
            [
                "run",
                "status",
                "micro-batch x accum",
                "steps",
                "sustained step s",
                "median step s",
                "predicted step s",
                "train / prediction",
                "within +-3%",
                "settings plan vs run",
                "data",
            ],
            rows,
        )
    ]
    for rec in _records(summary, "p5_train"):
        if rec.get("command"):
            out.append(f"Command: `{rec['command']}`; the plan: {rec.get('export')}\n")
        for note in rec.get("notes") or []:
            out.append(f"Note: {note}\n")
        if rec.get("log_tail"):
            out.append(f"End of the train stage's log:\n\n```\n{rec['log_tail'][-2500:]}\n```\n")
    return out


def _statuses(summary: dict[str, Any]) -> list[str]:
    recs = _records(summary, "p4_status")
    if not recs:
        return ["Not run.\n"]
    rows = [[rec["label"], status_text(rec), check_text(rec), f(rec.get("cell_wall_s"), "{:.0f}")] for rec in recs]
    return [table(["cell", "status", "checks", "wall s"], rows)]


def _probes(summary: dict[str, Any]) -> list[str]:
    recs = _records(summary, "p4_probes")
    oom = [r for r in recs if (r.get("plan") or {}).get("expect_failed_trial")]
    out = []
    for rec in oom:
        out.append(
            f"OOM probe {rec['label']}: {status_text(rec)}; trials {trials(rec.get('result') or {})}; checks "
            f"{check_text(rec)}\n"
        )
    honesty = next((r for r in recs if (r.get("plan") or {}).get("kind") == "honesty"), None)
    return out + honesty_section(honesty)[1:] if (oom or honesty) else ["Not run.\n"]


def _loss(summary: dict[str, Any]) -> list[str]:
    recs = _records(summary, "p6_loss")
    if not recs:
        return ["Not run.\n"]
    rows = [[rec["label"], rec.get("role") or "–", rec.get("loss") or "–", status_text(rec), check_text(rec),
             f(rec.get("band_runs"), "{}")] for rec in recs]  # fmt: skip
    return [
        table(["line", "role", "verdict", "status", "checks", "band runs"], rows),
        "`same`: the curve stays inside naive's band (its half-micro-batch and dropout-seed variants), the mean of "
        "the last 20% of steps within it and no step past 3x it (docs/methods.md, Loss equivalence); a `precision` "
        "line is naive at the levers' precision against naive itself, named, not judged.\n",
    ]


def _time_plan(summary: dict[str, Any]) -> list[str]:
    rows = []
    for name, st in summary["parts"].items():
        recs = st.get("records") or []
        counts: dict[str, int] = {}
        for r in recs:
            counts[r.get("status") or "?"] = counts.get(r.get("status") or "?", 0) + 1
        rows.append(
            [
                name,
                st["value"],
                st["title"],
                f(st.get("budget_s"), "{:.0f}"),
                f(st.get("predicted_s"), "{:.0f}"),
                f(st.get("ends_by_s"), "{:.0f}"),
                f(st.get("actual_s"), "{:.0f}"),
                st["status"]
                + (f": {st.get('reason') or st.get('error')}" if st.get("reason") or st.get("error") else ""),
                ", ".join(f"{v} {k}" for k, v in counts.items()) or "–",
            ]
        )
    return [table(["part", "value", "what", "budget s", "predicted s", "ends by s", "took s", "status", "cells"], rows)]


def render_summary(summary: dict[str, Any]) -> str:
    meta, env = summary["meta"], summary.get("environment") or {}
    v = env.get("versions") or {}
    mode = "smoke: CPU, tiny models (checks the script, not the GPU)" if meta["smoke"] else "GPU"
    out = [
        f"# GPU run ({mode})\n",
        f"{'finished' if meta['finished'] else 'NOT FINISHED (a partial summary, rewritten after every part)'}; "
        f"started {meta['started_utc']}, {meta['elapsed_s']:.0f} s of TOTAL_S {meta['total_s']:.0f} s.\n",
        "Known before running: " + ("; ".join(meta.get("known_before") or []) or "nothing absent") + ".\n",
        "## P2: the levers combined (tokens/s, MFU, peak memory)\n",
        *_levers(summary),
        "## P1: the predicted step against a sustained run\n",
    ]
    sustained = _records(summary, "p1_1b")
    out.append(table(SUSTAINED_COLUMNS, sustained_rows(sustained)) if sustained else "Not run.\n")
    out += [
        "## P5: the train stage from an exported plan (no Snakemake, no polars)\n",
        *_train(summary),
        "## P4: every method's status\n",
        *_statuses(summary),
        "## P4: the OOM probe and timing honesty\n",
        *_probes(summary),
        "## P6: do the levers train the same model as naive? (the loss check)\n",
        *_loss(summary),
        "## The time plan and what happened\n",
        *_time_plan(summary),
        "## The machine\n",
        table(
            ["", ""],
            [
                ["date (UTC)", env.get("date_utc")],
                ["host", env.get("host")],
                ["GPU", env.get("gpu_name") or "none (CPU)"],
                ["GPU memory GiB", env.get("gpu_memory_gib")],
                ["driver", env.get("driver")],
                ["nvidia-smi", env.get("nvidia_smi")],
                ["CUDA runtime / cuDNN", f"{env.get('cuda_runtime')} / {env.get('cudnn')}"],
                ["python", f"{env.get('python')} ({env.get('python_executable')})"],
                ["CPUs", env.get("cpu_count")],
                ["versions", ", ".join(f"{k} {val}" for k, val in v.items())],
                ["optional back-ends", ", ".join(f"{k}: {val}" for k, val in (env.get("imports") or {}).items())],
                ["environment", ", ".join(f"{k}={val}" for k, val in (env.get("env") or {}).items() if val)],
                ["command", f"`{meta['command']}`"],
            ],
        ),
        f"Every part's report, rows and cell files: reports.tgz (gpu_all/<part>/report.md, rows.jsonl, "
        f"cells/<cell>/result.json ...); left out of it (too big): {meta.get('left_out_of_reports') or 'nothing'}.\n",
    ]
    return "\n".join(str(x) for x in out) + "\n"

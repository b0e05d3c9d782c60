"""What a pre-training run's result says beside the reference (Izsak et al. 2021's 24-hour run): the comparison in
result.json (`reference_comparison`), summary.{csv,md} next to it with what checkpointing cost, and the loss plot
(loss.png: training and validation loss against hours on the run's clock). Imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import atomic_savefig, atomic_write_text
from pretrain_planner.tables import units
from pretrain_planner.tables.markdown import csv_text, table
from pretrain_planner.trainer.steplog import read_jsonl

# The reference's 24-hour run, for the result's comparison: ~23k optimizer steps at batch 4096, about 95M sequences.
# From the issue brief (issue 18); not in either paper's text - unverified.
REFERENCE_RUN = {"hours": 24.0, "steps": 23_000, "global_batch": 4096, "sequences": 95_000_000,
                 "source": "issue 18 (~23k steps at batch 4096, about 95M sequences, in 24 h); unverified"}  # fmt: skip


def reference_comparison(steps: int, sequences: int, budget_s: float) -> dict[str, Any]:
    """This run's steps and sequences beside the reference's 24-hour run (REFERENCE_RUN), whole and at its pace
    over this budget (the reference's numbers x budget / 24 h)."""
    ref = REFERENCE_RUN
    share = budget_s / (ref["hours"] * 3600.0)
    pace_steps, pace_seq = ref["steps"] * share, ref["sequences"] * share
    return {
        **ref, "pace_steps": pace_steps, "pace_sequences": pace_seq,
        "steps_vs_pace": steps / pace_steps if pace_steps else None,
        "sequences_vs_pace": sequences / pace_seq if pace_seq else None,
    }  # fmt: skip


def stop_note(result: dict[str, Any]) -> str:
    """Where on the run's clock it stopped against its budget, and what the finish (the last validation, checkpoint
    and model write) added after."""
    stopped, finish = result.get("stopped_s"), result.get("finish_s")
    if stopped is None:
        return ""
    clock = "wall time" if result["clock"] == "wall" else "training time"
    return (
        f"Stopped ({result['stop_reason']}) at {units.duration_s(stopped)} of {clock} (budget "
        f"{units.duration_s(result['budget_s'])}: the first check after the step that used it up); the finish "
        f"(last validation, checkpoint, model) took {units.duration_s(finish or 0.0)} more."
    )


def checkpoint_note(result: dict[str, Any]) -> str:
    """What checkpointing cost the run: how many were written, their wall time and its share of the budget."""
    every = result.get("checkpoint_every_s")
    cadence = (f"every {every:g} s of training time" if every else
               "none during the run (the reference's: its README run's --num_epochs_between_checkpoints 10000 is "
               "never reached in 24 hours), one at the end and one on a pre-emption signal")  # fmt: skip
    n, secs = result.get("checkpoints", 0), result.get("checkpoint_s", 0.0)
    note = (f"Checkpoints: {cadence}. {n} written, {secs:.3g} s of wall time ({100 * secs / result['budget_s']:.2g}% "
            "of the budget; every rank waits while rank 0 writes).")  # fmt: skip
    ck, up = result.get("checkpoint") or {}, result.get("startup") or {}
    if ck.get("bytes") is not None and ck.get("write_s") is not None:  # what a restart costs (result.json)
        read = f", a resume's read {ck['read_s']:.3g} s" if ck.get("read_s") is not None else ""
        note += f" One checkpoint: {ck['bytes'] / 1e6:.3g} MB, {ck['write_s']:.3g} s to write{read}."
    if up.get("total_s") is not None:
        note += f" The last start cost {up['total_s']:.3g} s before it trained (result.json `startup`)."
    return note


def write_summary(result: dict[str, Any], out_dir: Path) -> None:
    """summary.{csv,md} next to result.json: the run's steps and sequences within the budget beside the reference."""
    ref = result["reference"]
    hours = result["budget_s"] / 3600.0
    rows = [
        ("this run", hours, result["clock"], result["steps"], result["global_batch"], result["sequences"],
         result["wall_s"] / 3600.0, result["train_s"] / 3600.0, result["stop_reason"], result["val_loss"]),
        (f"reference at its pace over {units.duration_s(result['budget_s'])}", hours, "wall", ref["pace_steps"],
         ref["global_batch"], ref["pace_sequences"], None, None, None, None),
        ("reference, 24 h", ref["hours"], "wall", ref["steps"], ref["global_batch"], ref["sequences"], ref["hours"],
         None, None, None),
    ]  # fmt: skip
    head = ["run", "budget_h", "clock", "steps", "global_batch", "sequences", "wall_h", "train_h", "stop_reason",
            "val_loss"]  # fmt: skip
    md = (table(head, rows) + f"\nsequences = steps x global batch. Reference: {ref['source']}.\n"
          f"\n{stop_note(result)} {checkpoint_note(result)}\n")  # fmt: skip
    atomic_write_text(out_dir / layout.PRETRAIN_SUMMARY.format(ext="csv"), csv_text(head, rows))
    atomic_write_text(out_dir / layout.PRETRAIN_SUMMARY.format(ext="md"), md)


def plot_loss(steps_path: Path, val_path: Path, out: Path, clock: str = "wall") -> Path:
    """Training loss (each step) and validation loss against elapsed hours on the run's clock, as a PNG."""
    from pretrain_planner.report.plots import _canvas  # a Figure of its own: no pyplot state across threads

    steps, vals = read_jsonl(steps_path), read_jsonl(val_path)
    key = "wall_s" if clock == "wall" else "elapsed_s"
    by_step = {s["step"]: s.get(key, s["elapsed_s"]) for s in steps}
    fig = _canvas(6.4, 4.0)
    ax = fig.add_axes((0.12, 0.14, 0.84, 0.78))  # fixed margins (docs/architecture.md: no tight_layout)
    ax.plot([by_step[s["step"]] / 3600 for s in steps], [s["loss"] for s in steps], lw=0.8, label="training loss")
    pts = [(by_step[v["step"]] / 3600, v["val_loss"]) for v in vals if v["step"] in by_step]
    if pts:
        ax.plot(*zip(*pts, strict=True), "o-", ms=3, label="validation loss")
    ax.set_xlabel(f"hours ({'wall time' if clock == 'wall' else 'training time'})")
    ax.set_ylabel("MLM loss")
    ax.legend(loc="upper right")
    atomic_savefig(fig, out)
    return out

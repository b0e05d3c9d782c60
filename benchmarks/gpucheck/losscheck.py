"""P6 (issue 39): the loss-equivalence check of the lever cells, the levers one at a time and combined (Liger, the
fused linear + cross-entropy head, the compiled optimizer step, CUDA graphs) against naive, on Pythia-160M.

The pipeline's own pieces, as the `loss_check` rule runs them: the runs from `planning.losscheck.plan_runs` (naive,
its variants, naive at a method's precision where the method computes in another), one process running them all
by `trainer.losscheck.run_rank` from one saved init on the same batches, the verdicts by
`planning.losscheck.judge_records`. A lever whose back-end is absent here (Liger, CUDA graphs on a CPU) is
`unsupported` with the reason; a lever that trains another model fails its check. Imports no torch (the check runs
in its own process: `python -m gpucheck.losscheck spec.json`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.planning import losscheck as lc
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.spec import cell_spec

from .plans import LEVERS
from .runner import worker_env

SAME_CHECK = "trains the same model as naive (loss and gradient norm inside naive's band)"


@dataclass(frozen=True)
class LossPlan:
    """The check's setting: one rank of `model`, `methods` against naive, `steps` steps of `global_batch`
    sequences at micro-batch `micro` (naive's half-micro-batch variant at micro / 2)."""

    model: str
    methods: tuple[str, ...]
    micro: int
    global_batch: int
    steps: int
    compile_model: bool  # False: the model stays eager (`cstep` still compiles its optimizer step)
    fp32: bool  # the smoke's CPU: fp32 instead of the recipe's bf16 (bf16 autocast is ~5x slower there)

    @property
    def label(self) -> str:
        return f"{self.model} loss check"

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "methods": list(self.methods), "kind": "loss"}


def loss_plan(smoke: bool) -> LossPlan:
    """GPU: Pythia-160M, 20 steps of 16 sequences at micro-batch 8 (the check's defaults for steps and seeds);
    smoke: tiny-gptneox, 8 steps of 8 at 2, fp32, the model eager."""
    methods = ("fl+liger", "fl+flce", "fl+cstep", "fl+cg", LEVERS)
    if smoke:
        return LossPlan("tiny-gptneox", methods, 2, 8, 8, compile_model=False, fp32=True)
    return LossPlan("pythia-160m", methods, 8, 16, lc.settings().steps, compile_model=True, fp32=False)


def make_spec(plan: LossPlan, catalog: Catalog, gpu: str, threads: int, folder: Path) -> tuple[dict, list[dict]]:
    """The check job's spec (as launch/losscheck.py gives it to every rank) and its runs."""
    benchmark, launcher = BenchmarkSection.given({"seed": 0}), LauncherSection.given({"kind": "debug"})
    spec = cell_spec(Cell(plan.model, gpu, 1, 1, "naive"), catalog, benchmark, launcher, "", "")
    if plan.fp32:
        spec["model"]["recipe"]["precision"] = "fp32"
    if not plan.compile_model:
        spec["compile_model"] = False
    conf = lc.settings({"mode": "all", "steps": plan.steps, "global_batch": plan.global_batch})
    rows = {m: {"method": m, "status": "ok", "micro_batch": plan.micro} for m in ("naive", *plan.methods)}
    runs, why, size = lc.plan_runs(rows, conf, spec["model"], spec["gpu"], 1, 1, gpu != "cpu")
    if not runs:
        raise ValueError(f"the loss check plans no runs: {why}")
    spec.update(
        init_method="naive",
        threads_per_rank=threads,
        check={"steps": plan.steps, "global_batch": size, "seed": 0, "init": str(folder / "init-seed0.pt")},
        runs=runs,
        outputs={"curves": str(folder / "curves.json")},
    )
    return spec, runs


def run_loss_check(plan: LossPlan, catalog: Catalog, gpu: str, threads: int, folder: Path, deadline: float,
                   python: str = sys.executable) -> list[dict[str, Any]]:  # fmt: skip
    """Run the check in a process of its own (stopped at `deadline`); one record per verdict line."""
    folder.mkdir(parents=True, exist_ok=True)
    spec, runs = make_spec(plan, catalog, gpu, threads, folder)
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    t0, log = time.time(), folder / "loss_check.log"
    head = {"plan": plan.to_json(), "runs": [r["name"] for r in runs]}
    try:
        with log.open("w") as fh:
            proc = subprocess.run([python, "-m", "gpucheck.losscheck", str(folder / "spec.json")], stdout=fh,
                                  stderr=subprocess.STDOUT, env=worker_env(),
                                  timeout=max(1.0, deadline - t0), start_new_session=True)  # fmt: skip
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    wall = round(time.time() - t0, 1)
    curves = lc.read(spec["outputs"]["curves"])
    if code != 0 or curves is None:
        why = "stopped at the part's deadline" if code is None else f"exit status {code}"
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        return [{**head, "label": plan.label, "status": "timeout" if code is None else "error",
                 "reason": f"the check's process: {why}", "worker_log_tail": tail, "wall_s": wall}]  # fmt: skip
    conf = lc.settings()
    return [record(row, head, wall) for row in lc.judge_records([curves], conf.k, conf.tail)]


def record(row: dict[str, Any], head: dict[str, Any], wall: float) -> dict[str, Any]:
    """One verdict line as a GPU-run record: a method `ok` with its check (same as naive), `unsupported` with the
    reason where its back-end is absent, `error` where its run failed; a precision line `ok`, no check (it names
    the change, it does not judge it)."""
    rec = {**head, "label": f"{row['model']}/{row['method']} vs {row['against']}", "role": row["role"],
           "loss": row["loss"], "left_at": row.get("left_at"), "band_runs": row.get("band_runs"),
           "wall_s": wall}  # fmt: skip
    if row["loss"] == lc.NOT_CHECKED:
        note = str(row.get("note") or "")
        if note.startswith("unsupported: "):
            return {**rec, "status": "unsupported", "reason": note.removeprefix("unsupported: ")}
        return {**rec, "status": "error", "reason": note}
    if row["role"] == "precision":
        return {**rec, "status": "ok"}
    return {**rec, "status": "ok", "checks": [(SAME_CHECK, row["loss"] == lc.SAME)]}


def main() -> None:
    from pretrain_planner.trainer.losscheck import run_rank

    run_rank(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    main()

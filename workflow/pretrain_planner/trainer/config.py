"""One dataclass tree for a cell's run, built from the JSON spec the planner hands to the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pretrain_planner.planning.grid import Cell as CellConfig  # the planner's cell is the run's cell: one definition
from pretrain_planner.planning.methods import Method, parse_canonical
from pretrain_planner.planning.runspec import RunSpec


@dataclass(frozen=True)
class BenchConfig:
    """The config's `benchmark` section (workflow/schemas/config.schema.yaml holds every default)."""

    warmup_steps: int
    timed_steps: int
    max_micro_batch: int | None
    seed: int
    suspect_mfu: float
    max_spread: float  # p90/p10 above which the timing is repeated once, then kept as `noisy`
    device: str  # auto: CUDA for GPU types, CPU for `cpu`; cpu: force CPU (plumbing tests)
    loss_check: dict[str, Any] | None = None  # benchmark.loss_check (the check job reads it, launch/losscheck.py)


@dataclass(frozen=True)
class Outputs:
    result: str
    steps: str


@dataclass(frozen=True)
class RunConfig:
    cell: CellConfig
    method: Method
    model: dict[str, Any]  # ModelSpec.to_dict()
    gpu: dict[str, Any]  # GpuSpec.to_dict()
    bench: BenchConfig
    outputs: Outputs
    threads_per_rank: int = 1
    # free-lunch compiles the model where it supports compile; a check may leave it eager (the GPU check's CPU smoke:
    # a CPU compile is ~40 s) while `cstep` still compiles the optimizer step (RunSpec.compile_model)
    compile_model: bool = True

    @property
    def recipe(self) -> dict[str, Any]:
        return self.model["recipe"]

    def run_spec(self, env: Any) -> RunSpec:
        """The cell as the typed run the trainer checks and builds, on this rank's device (trainer.rank.RankEnv)."""
        return RunSpec.of(self.model, self.gpu, self.method, self.cell.world_size, cuda=env.device.type == "cuda",
                          compile_model=self.compile_model, nodes=self.cell.nodes)  # fmt: skip

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> RunConfig:
        cell = CellConfig(**spec["cell"])
        return cls(
            cell=cell,
            method=parse_canonical(cell.method),
            model=spec["model"],
            gpu=spec["gpu"],
            bench=BenchConfig(**spec["benchmark"]),  # its defaults filled once, by planning.spec.cell_spec
            outputs=Outputs(**spec["outputs"]),
            threads_per_rank=int(spec.get("threads_per_rank", 1)),
            compile_model=bool(spec.get("compile_model", True)),
        )

"""The validated config's sections as typed, frozen values: built once where the config is loaded (the facade, the
CLI) and passed down instead of a dict read by key far from where it was checked; turned into JSON only at a job's
boundary (its arguments, a rule's params). A class here states each key's type, never its value: every default is
the schema's (workflow/schemas/), filled by `schema.validate` before a section is typed. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from pretrain_planner import schema


def require(value: Any, cls: type, where: str) -> None:
    """TypeError naming `where` unless `value` is a `cls`: a function below the entrance takes the typed section,
    never a dict (a dict would be read by key again, its keys unchecked)."""
    if not isinstance(value, cls):
        raise TypeError(f"{where}: takes a {cls.__name__} (planning/configtypes.py, typed once where the config is "
                        f"loaded: {cls.__name__}.of(validated section)), not a {type(value).__name__}")  # fmt: skip


def _keys_of(cls: type, section: Any, where: str) -> dict[str, Any]:
    """The section's value of every field of `cls`; the section must be a validated one (its defaults filled, no
    other key): a missing or extra key is a section that did not come through `schema.validate`."""
    if not isinstance(section, Mapping):
        raise TypeError(f"{where}: expected the validated section (a mapping), not a {type(section).__name__}")
    names = [f.name for f in fields(cls)]
    missing, extra = [n for n in names if n not in section], sorted(k for k in section if k not in names)
    if missing or extra:
        raise ValueError(f"{where}: not a validated section (schema.validate fills every default): "
                         f"missing {missing}, unknown {extra}")  # fmt: skip
    return {n: section[n] for n in names}


@dataclass(frozen=True)
class TrainSection:
    """The config's `train:` section (workflow/schemas/config.schema.yaml): the train stage's budget, data,
    checkpoints, validation and device, as the train rule and `pretrain-planner train` read them (a CLI flag
    replaces a field: `dataclasses.replace`). A run's job gets `job_options()`, JSON."""

    steps: int | None
    time_budget_hours: float | None
    data: str | None
    data_dtype: str | None
    data_field: str | None
    tokenizer: str | None
    checkpoint_every_min: float
    eval_every: int
    eval_batches: int
    device: str

    @classmethod
    def of(cls, section: Mapping[str, Any], where: str = "train") -> TrainSection:
        """From the validated config's `train` section."""
        return cls(**_keys_of(cls, section, where))

    @classmethod
    def defaults(cls) -> TrainSection:
        """The schema's defaults alone: what a run launched without a config (torchrun, launch.sh) starts from."""
        return cls.of(schema.section("config", "train", None), "the schema's train section")

    def run_device(self, benchmark_device: str) -> str:
        """The device a train job runs on: cpu where this section or the benchmark (`benchmark.device`) says cpu
        (a GPU type's plan on CPU processes), else auto (the plan's GPU type)."""
        return "cpu" if self.device == "cpu" or benchmark_device == "cpu" else "auto"

    def job_options(self) -> dict[str, Any]:
        """The run's options as its job takes them (train.run.train_plan's keywords; JSON): the budget, the data,
        checkpoints and validation. The device is the job's own (`run_device`)."""
        return {"steps": self.steps, "time_budget_h": self.time_budget_hours, "data": self.data,
                "tokenizer": self.tokenizer, "data_dtype": self.data_dtype, "data_field": self.data_field,
                "checkpoint_every_min": self.checkpoint_every_min, "eval_every": self.eval_every,
                "eval_batches": self.eval_batches}  # fmt: skip

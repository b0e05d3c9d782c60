"""A run's metrics where a researcher's tools read them (rank 0, one row per optimizer step, written as it goes):
`metrics.csv` (spreadsheets, pandas / polars) and TensorBoard's event files in `tensorboard/` (`tensorboard --logdir
<run dir>`), both in the run folder beside steps.jsonl.

A resumed run continues both: metrics.csv is cut back to the checkpoint's step (the steps a killed run did after it
are redone), TensorBoard's writer purges the events from the step after it (`purge_step`), so either shows one
continuous run. TensorBoard is a dependency of the package (pyproject.toml); where it cannot be imported the run
writes metrics.csv alone and says so once.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

CSV_NAME = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
COLUMNS = ["step", "elapsed_s", "progress", "lr", "loss", "val_loss", "step_time_s", "samples_per_s", "tokens_per_s"]
# TensorBoard's tags of the columns (train/ and val/ group them in its scalars view)
TAGS = {"loss": "train/loss", "val_loss": "val/loss", "lr": "train/lr", "step_time_s": "train/step_time_s",
        "samples_per_s": "train/samples_per_s", "tokens_per_s": "train/tokens_per_s",
        "progress": "train/progress"}  # fmt: skip


def truncate_csv(path: Path, step: int) -> None:
    """Keep metrics.csv's rows up to `step` (what a resumed run has not redone)."""
    if not path.exists():
        return
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("step") and int(r["step"]) <= step]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


class Metrics:
    """Rank 0's writers from a (re)start at `step` on; `say(msg)`: a line for the log and the console."""

    def __init__(self, run_dir: Path, step: int, say: Callable[[str], None]) -> None:
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / CSV_NAME
        self.tb_dir = self.run_dir / TENSORBOARD_DIR
        truncate_csv(self.csv_path, step)
        new = not self.csv_path.exists()
        self._fh = self.csv_path.open("a", newline="")
        self._csv = csv.DictWriter(self._fh, COLUMNS, extrasaction="ignore")
        if new:
            self._csv.writeheader()
        self.tb: Any = None
        self.tb_note: str | None = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # the package's dependency missing in this environment: CSV alone
            self.tb_note = f"TensorBoard cannot be imported ({exc}): metrics in {self.csv_path} only"
            say(self.tb_note)
        else:
            # purge_step: events at or after it from an earlier start (a killed run's last steps) are discarded
            self.tb = SummaryWriter(str(self.tb_dir), purge_step=step + 1)
            say(f"metrics: {self.csv_path}; TensorBoard: tensorboard --logdir {self.tb_dir}")

    def write(self, rec: dict[str, Any], global_batch: int, tokens_per_sample: int | None) -> None:
        """One step's row (steps.jsonl's record, with its samples and tokens per second)."""
        dt = rec.get("step_time_s")
        row = {**rec, "samples_per_s": global_batch / dt if dt else None,
               "tokens_per_s": global_batch * tokens_per_sample / dt if dt and tokens_per_sample else None}  # fmt: skip
        self._csv.writerow(row)
        self._fh.flush()
        if self.tb is not None:
            for key, tag in TAGS.items():
                if row.get(key) is not None:
                    self.tb.add_scalar(tag, float(row[key]), int(rec["step"]))
            self.tb.flush()

    def record(self) -> dict[str, Any]:
        """result.json's `metrics`: where they are."""
        return {"csv": str(self.csv_path), "tensorboard": str(self.tb_dir) if self.tb is not None else None,
                "note": self.tb_note}  # fmt: skip

    def close(self) -> None:
        self._fh.close()
        if self.tb is not None:
            self.tb.close()

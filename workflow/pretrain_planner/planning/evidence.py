"""Measured training throughput as evidence for the cross-GPU model (planning/crossgpu.py): the public dataset shipped
with the package (data/evidence/public_throughput.csv, a source and an exact location per row; sources.md says what
was taken from where) and the cells measured here, each reduced to a `Run`: a workload's seconds per unit (a token for
text, a sample for images) on one GPU of a GPU type, beside the unit's matmul FLOPs and memory-bound bytes by the
family's formulas (planning/flops.py, planning/stepmodel.py).

data/evidence/models.yaml maps each public workload onto a catalog family and the shape its rows leave out; a row is
left out, with the reason, when its workload has no entry or is excluded there (or the entry lacks an arch key its
family requires: a Llama's kv heads are never the config class's default), its GPU type is not in the catalog
(no rates), its precision has no rate (fp8), its source flags it SUSPECT (a multi-GPU rate per GPU above 1.1x or below
0.5x the same suite's one-GPU rate: a super-linear or collapsed run, sources.md), or it implies more than the
`suspect` share of the dense peak. Each run carries the software it ran (`software`: the source, and for Lambda's
benchmark its suite v0 / v1 / v2, whose containers differ), which the cross-GPU model uses to tell a stand-in of the
same software from one of another and to leave a GPU type's runs of one software out when it checks itself.
Imports no torch.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pretrain_planner.planning import stepmodel
from pretrain_planner.planning.families import FAMILIES
from pretrain_planner.planning.flops import param_count, tokens_per_sample, train_flops_per_sample
from pretrain_planner.schema import load_yaml

DATA = Path(__file__).resolve().parents[1] / "data" / "evidence"
PUBLIC_CSV = DATA / "public_throughput.csv"
MODELS_YAML = DATA / "models.yaml"
SOURCES_MD = DATA / "sources.md"
HERE = "pretrain-planner"  # the software of this project's trainer: the cells measured here and its public H200 runs
HERE_SOURCES = ("measured here", "here-h200")
# A row whose method shards the model states (FSDP, ZeRO, tensor or pipeline parallel): a rank's share of them is not
# stated in a form to compute, so its model-state traffic is left out (stepmodel.state_bytes_per_sample)
SHARDED_TEXT = re.compile(r"fsdp|zero|hsdp|megatron|\bTP\s?\d|\bPP\s?\d", re.IGNORECASE)
UNITS = {"tokens/s/GPU": "token", "images/s/GPU": "sample", "samples/s/GPU": "sample", "sequences/s/GPU": "sample"}


@dataclass(frozen=True)
class Run:
    """One measured throughput: `seconds` per unit per GPU on `gpu` at `world` GPUs (compute only for a cell
    measured here, its communication split off; a public row as published: its framework overlaps communication)."""

    id: str  # the public row id (r0123) or the cell's folder and method
    source: str  # the public source id (sources.md) or "measured here"
    where: str  # the exact location of the number
    model: str  # the workload: a catalog model name, else the public `model` text
    kind: str  # causal_lm | masked_lm | image_classification (what it stands in for)
    params: float
    gpu: str
    world: int
    group: str  # runs of one group are one workload and setting on different GPU types
    method: str
    precision: str  # bf16 | fp16 | fp32
    seconds: float  # per unit per GPU
    flops: float  # per unit (forward + backward, model FLOPs)
    memory_bytes: float  # per unit, memory-bound
    public: bool = True
    tf32: bool = True
    note: str = ""
    formula: str = "transformer"  # the family's formula (families.py): what kind of model it stands in for
    software: str = ""  # what it ran (framework, container / suite); empty: its source
    origin: str = "shipped"  # shipped (data/evidence) | imported (another site's cells) | own (this sweep's cells)

    def __post_init__(self) -> None:
        if not self.software:
            object.__setattr__(self, "software", HERE if self.source in HERE_SOURCES else self.source)

    @property
    def label(self) -> str:
        return f"{self.id} ({self.source}: {self.model} on {self.world} x {self.gpu})"


@dataclass(frozen=True)
class Work:
    """What a unit of a workload costs, for a prediction's target."""

    model: str
    kind: str
    params: float
    flops: float
    memory_bytes: float
    precision: str
    tf32: bool = True
    tokens: int | None = None  # units per sample (tokens of a text sample, 1 for images)
    formula: str = "transformer"
    software: str = HERE  # what will run it: this project's trainer unless said otherwise


def same_software(a: str, b: str) -> bool:
    """Whether two runs ran the same software (the cross-GPU model's stand-in kinds)."""
    return a == b


def software_of(row: dict[str, str]) -> str:
    """A public row's software: its source, with the suite for Lambda's benchmark (v0 / v1 / v2 ran different
    containers: sources.md) and, where a v2 group names it, the container of its own (-nv2410: NGC 24.10); this
    project's own H200 runs ran the planner's trainer."""
    if row["source_id"] in HERE_SOURCES or row["source_id"].startswith("site:"):  # another site's planner cells
        return HERE
    suite = re.match(r"lambda-(v\d+)-.*?(-nv\d+)?$", row["group_id"])
    if not suite:
        return row["source_id"]
    return f"{row['source_id']} {suite.group(1)}{(' ' + suite.group(2)[1:]) if suite.group(2) else ''}"


@dataclass
class Evidence:
    runs: list[Run] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (row id, why)

    def origins(self) -> dict[str, int]:
        """Runs per origin (shipped, imported), in that order."""
        return origins_of(self.runs)


def origins_of(runs: list[Run]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in sorted(runs, key=lambda r: ORIGINS.index(r.origin) if r.origin in ORIGINS else len(ORIGINS)):
        counts[r.origin] = counts.get(r.origin, 0) + 1
    return counts


def origins_text(counts: dict[str, int]) -> str:
    """E.g. "412 shipped + 3 imported rows"."""
    return " + ".join(f"{n} {o}" for o, n in counts.items()) + " rows" if counts else "no rows"


ORIGINS = ("shipped", "imported", "own")


def work_of(model: dict[str, Any], eager: bool = False, extra_keys: int = 0, tf32: bool = True,
            micro_batch: float | None = None, samples_per_step: float | None = None) -> Work | None:  # fmt: skip
    """A model's (ModelSpec.to_dict()) work per unit: per token for text, per sample for images; None without a
    formula. `extra_keys`: keys attended beyond the sample's tokens (Transformer-XL's memory)."""
    flops, mem = train_flops_per_sample(model), stepmodel.memory_bytes_per_sample(model, eager)
    params = param_count(model)
    if not flops or mem is None or params is None:
        return None
    mem += stepmodel.state_bytes_per_sample(params, micro_batch, samples_per_step)
    fam = FAMILIES[model["family"]]
    tokens = tokens_per_sample(model) or 1
    if extra_keys:
        a = model["arch"]
        flops += 12 * a["num_hidden_layers"] * a["hidden_size"] * extra_keys * tokens
        if eager:
            width = 2.0 if model["recipe"].get("precision") == "fp32" else 1.0
            scores = stepmodel.EAGER_SCORE_B * a["num_attention_heads"] * extra_keys
            mem += width * tokens * a["num_hidden_layers"] * scores
    unit = tokens if fam.is_text else 1
    return Work(model.get("name", ""), fam.task, params, flops / unit, mem / unit, model["recipe"]["precision"], tf32,
                unit, fam.formula or "")  # fmt: skip


def catalog_work(spec: Any, eager: bool = False, tf32: bool = True, micro_batch: float | None = None,
                 samples_per_step: float | None = None) -> Work | None:  # fmt: skip
    """`work_of` a catalog model (a ModelSpec)."""
    return work_of(spec.to_dict(), eager, tf32=tf32, micro_batch=micro_batch, samples_per_step=samples_per_step)


def precision_of(text: str) -> str | None:
    t = text.lower()
    if "fp8" in t:
        return None
    return "bf16" if "bf16" in t else "fp16" if "fp16" in t else "fp32" if "fp32" in t or "tf32" in t else None


def _int(x: str) -> int | None:
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


def _public_model(row: dict[str, str], entry: dict[str, Any], catalog: Any) -> dict[str, Any] | None:
    """The row's workload as a ModelSpec.to_dict()-like record the formulas read."""
    if entry.get("catalog"):
        spec = catalog.models.get(entry["catalog"])
        return spec.to_dict() if spec else None
    arch = {"num_hidden_layers": _int(row["n_layers"]), "hidden_size": _int(row["hidden"]),
            "num_attention_heads": _int(row["heads"]), "vocab_size": _int(row["vocab"]) or 0}  # fmt: skip
    arch = {k: v for k, v in arch.items() if v is not None}
    arch.update(entry.get("arch", {}))
    if "hidden_size" in arch:
        arch.setdefault("intermediate_size", 4 * arch["hidden_size"])
    recipe = {"sequence_length": entry.get("sequence") or _int(row["seq_len"]),
              "precision": precision_of(row["precision"]) or "bf16", "image_size": arch.get("image_size")}  # fmt: skip
    return {"name": row["model"], "family": entry["family"], "arch": arch, "recipe": recipe}


@cache
def _models_yaml() -> dict[str, Any]:
    return (load_yaml(MODELS_YAML) or {}).get("models", {})


def public_evidence(catalog: Any, suspect_mfu: float = 0.85, path: Path = PUBLIC_CSV) -> Evidence:
    """The shipped public rows as Runs (those that cannot be used in `skipped`, with the reason)."""
    out = Evidence()
    entries = _models_yaml()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        rid = row["row_id"]
        entry = entries.get(row["model"])
        if entry is None:
            out.skipped.append((rid, f"{row['model']}: no entry in {MODELS_YAML.name} (no formula)"))
            continue
        if entry.get("exclude"):
            out.skipped.append((rid, f"{row['model']}: {entry['exclude']}"))
            continue
        if "SUSPECT" in row.get("notes", ""):
            flag = row["notes"][row["notes"].index("SUSPECT") :].split(";")[0].split(" (")[0]
            out.skipped.append((rid, f"flagged by its source notes: {flag}"))
            continue
        got = run_of_row(row, entry, catalog, suspect_mfu)
        if isinstance(got, str):
            out.skipped.append((rid, got))
        else:
            out.runs.append(got)
    return out


def run_of_row(row: dict[str, str], entry: dict[str, Any], catalog: Any, suspect_mfu: float = 0.85,
               origin: str = "shipped", tf32: bool = True) -> Run | str:  # fmt: skip
    """An evidence row (public_throughput.csv's columns) as a Run of the workload `entry` maps it onto (models.yaml's
    entry; {"catalog": name} for a catalog model), else why it cannot be one."""
    gpu = catalog.gpus.get(row["gpu_type"])
    if gpu is None:
        return f"GPU type {row['gpu_type']!r} is not in {catalog.gpus_path} (no rates)"
    precision = precision_of(row["precision"])
    if precision is None:
        return f"precision {row['precision']!r}: no matmul rate for it in the catalog"
    unit = UNITS.get(row["per_gpu_rate_unit"])
    rate = float(row["per_gpu_rate"] or 0)
    model = _public_model(row, entry, catalog)
    if unit is None or rate <= 0 or model is None:
        return f"no per-GPU rate in tokens or samples ({row['per_gpu_rate_unit']!r})"
    missing = [k for k in FAMILIES[model["family"]].required_arch if k not in model["arch"]]
    if missing:  # never a config class's default for what the formulas read (a Llama's kv heads: MHA otherwise)
        return f"{row['model']}: {MODELS_YAML.name} gives no {', '.join(missing)} for family {model['family']!r}"
    model["recipe"]["precision"] = precision
    micro_batch, per_step = None, None  # a replicated rank's model-state traffic per sample (unknown where sharded)
    if not SHARDED_TEXT.search(row["method"]):
        micro_batch = _int(row["micro_batch"])
        per_step = (_int(row["global_batch"]) or 0) / (_int(row["gpu_count"]) or 1)
    work = work_of(model, entry.get("attention") == "eager", int(entry.get("extra_keys", 0)), tf32, micro_batch,
                   per_step or None)  # fmt: skip
    if work is None:
        return f"{row['model']}: its family has no FLOPs or bytes formula"
    peak = gpu.peak_for(precision, tf32=True)
    per_unit = rate * (work.tokens or 1) if unit == "sample" else rate  # a text sample is `tokens` units
    if peak and per_unit * work.flops > suspect_mfu * peak * 1e12:
        return (f"implies {per_unit * work.flops / (peak * 1e12):.0%} of {gpu.name}'s dense peak, above the `suspect` "
                f"limit {suspect_mfu:.0%}")  # fmt: skip
    return Run(
        row["row_id"], row["source_id"], row["location"], entry.get("catalog") or row["model"], work.kind, work.params,
        row["gpu_type"], int(row["gpu_count"]), row["group_id"], row["method"], precision, 1.0 / per_unit, work.flops,
        work.memory_bytes, True, tf32, row.get("notes", ""), work.formula, software_of(row), origin,
    )  # fmt: skip

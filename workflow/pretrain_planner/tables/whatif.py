"""What-if tables: the PREDICTED days and cost of models on GPU types you do not own (whatif.csv, whatif.md) and the
inverse question's table (`fit_table`: what fits in N days), written from tables/predictor.py's predictions
(what a prediction rests on, its step, its band: said there).

whatif.csv has every prediction with every column, its rows in the order a reader asks (`reading_order`: the swept
models and those the config's `whatif.models` names, each ranked by days, then the other models); whatif.md answers
that question first (`whatif_markdown`): the measured error of this run's fit, each lead model's settings in one table
that fits 120 columns with its reasons said once, then each other model's fastest setting. Imports no torch.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import evidence_exchange as pp_exchange
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import (
    BenchmarkSection,
    CostsSection,
    EvidenceSection,
    StudySection,
    SweepSection,
    WhatifSection,
    require,
)
from pretrain_planner.planning.crossgpu import Kind
from pretrain_planner.planning.evidence import origins_text
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables.markdown import WIDTH
from pretrain_planner.tables.markdown import table as to_table
from pretrain_planner.tables.predictor import BOUND, OWN, PUBLIC, Predictor, units_per_sample
from pretrain_planner.tables.units import days as days_text
from pretrain_planner.tables.units import usd as usd_text

COLUMNS = {
    "model": pl.String, "gpu": pl.String, "nodes": pl.Int64, "gpus_per_node": pl.Int64, "world_size": pl.Int64,
    "status": pl.String, "evidence": pl.String, "method": pl.String, "micro_batch": pl.Int64, "why": pl.String,
    "basis": pl.String, "rests_on": pl.String, "sources": pl.String, "transfer": pl.String, "model_error": pl.String,
    "mfu_low": pl.Float64, "mfu_central": pl.Float64, "mfu_high": pl.Float64, "comm_share": pl.Float64,
    "days_optimistic": pl.Float64, "days_central": pl.Float64, "days_pessimistic": pl.Float64,
    "measured_days": pl.Float64, "hardware_usd": pl.Float64, "amortised_usd_optimistic": pl.Float64,
    "amortised_usd_pessimistic": pl.Float64, "note": pl.String,
}  # fmt: skip
INTRO = (
    "PREDICTIONS, not measurements: the days to train and the cost of a model on the catalog's GPU types at the "
    "sweep's counts, moved from measurements on other GPU types (your cells, else the public throughput evidence "
    "shipped with the planner) by each type's measured matmul rate and memory bandwidth and the per-GPU effects the "
    "evidence shows. A setting's own measurement is never used for its prediction (`measured` shows it beside)."
)
ERROR_LEAD = "Measured error of this run's cross-GPU model"  # opens the sentence report.md reads back (error_sentence)
# a model's rows in whatif.md and whatif.csv, in this order (each ranked by days)
STATUS_RANK = {"predicted": 0, "bound only": 1, "does not fit": 2, "invalid": 3, "no peak": 4}


FIT_COLUMNS = {
    "model": pl.String, "fits": pl.String, "basis": pl.String, "method": pl.String, "days": pl.Float64,
    "days_optimistic": pl.Float64, "days_pessimistic": pl.Float64, "tokens_in_time": pl.Float64, "unit": pl.String,
    "share_of_run": pl.Float64, "why": pl.String, "rests_on": pl.String,
}  # fmt: skip


def _verdict(days: float, opt: float | None, central: float | None, pess: float | None) -> str:
    if pess is not None and pess <= days:
        return "yes"
    if central is not None and central <= days:
        return "likely"
    if opt is not None and opt <= days:
        return "maybe"
    return "no"


def fit_table(predictor: Predictor, gpu: str, nodes: int, gpus_per_node: int, days: float,
              models: list[str] | None = None, measured: pl.DataFrame | None = None) -> pl.DataFrame:  # fmt: skip
    """The inverse question (what none of the anchors answer from measurements): per catalog model, the fastest
    setting on `nodes` x `gpus_per_node` x `gpu` measured here (`measured`: tables/time_to_train) or else
    predicted (Predictor.predict), the tokens (samples for images) it reaches in `days`, and whether the recipe's
    run fits: yes (measured so, or even the pessimistic end within the days), likely (the central value), maybe (the
    optimistic end only), no."""
    cat = predictor.catalog
    names = models or [n for n, s in cat.models.items() if s.recipe.steps and not n.startswith("tiny-")]
    got = {}
    if measured is not None and not measured.is_empty():
        here = (pl.col("gpu") == gpu) & (pl.col("nodes") == nodes) & (pl.col("gpus_per_node") == gpus_per_node)
        sel = measured.filter(here & pl.col("step_time_s").is_not_null())
        got = {r["model"]: r for r in sel.iter_rows(named=True)}
    rows = []
    for name in names:
        spec = cat.model(name)
        units = spec.recipe.global_batch * units_per_sample(spec)
        unit = "tokens" if spec.is_text else "samples"
        row: dict[str, Any] = {"model": name, "unit": unit}
        m = got.get(name)
        if m is not None and m.get("training_days"):
            step = m["step_time_s"]
            row.update(fits="yes" if m["training_days"] <= days else "no", basis="measured",
                       method=m.get("best_method"), days=m["training_days"], why="measured here")  # fmt: skip
        elif (p := predictor.predict(name, gpu, nodes, gpus_per_node)).status == "bound only":
            step = None
            row.update(fits="no" if p.days_optimistic > days else "maybe", basis=p.status,
                       days_optimistic=p.days_optimistic, why=predictor.bound_reason(spec, gpu))  # fmt: skip
        else:
            central = p.days_central
            step = central * 86400 / spec.recipe.steps if central and spec.recipe.steps else None
            row.update(fits=_verdict(days, p.days_optimistic, p.days_central, p.days_pessimistic) if central else
                       "no", basis=p.evidence or p.status, method=p.method, days=central,
                       days_optimistic=p.days_optimistic, days_pessimistic=p.days_pessimistic, why=p.why,
                       rests_on=p.rests_on)  # fmt: skip
        if step:
            row["tokens_in_time"] = days * 86400 / step * units
            row["share_of_run"] = days / row["days"] if row.get("days") else None
        rows.append(row)
    order = {"yes": 0, "likely": 1, "maybe": 2, "no": 3}
    rows.sort(key=lambda r: (order.get(r["fits"], 4), r.get("days") or math.inf))
    return pl.DataFrame(rows, schema=FIT_COLUMNS)


def evidence_models(predictor: Predictor) -> list[str]:
    """The catalog models the public evidence reaches (its own runs, or a model of its kind): the real models the
    default sweep's what-if shows beside the sweep's."""
    gpus = [name for name, g in predictor.catalog.gpus.items() if g.peak_tflops]
    real = [(n, s) for n, s in predictor.catalog.models.items() if not n.startswith("tiny-") and s.recipe.steps]
    return [name for name, spec in real if any(predictor.basis(spec, g) for g in gpus)]


def whatif_table(predictor: Predictor, models: list[str], counts: list[tuple[int, int]]) -> pl.DataFrame:
    """Every (model, catalog GPU type with a dense peak, count) as a Prediction row."""
    rows = [predictor.predict(m, g, n, k).to_dict()
            for m in dict.fromkeys(models) if m in predictor.catalog.models
            for g, spec in predictor.catalog.gpus.items() if spec.peak_tflops
            for n, k in counts]  # fmt: skip
    return pl.DataFrame(rows, schema=COLUMNS)


def table_files(folder: str) -> dict[str, str]:
    return {"whatif_csv": f"{folder}/whatif.csv", "whatif_md": f"{folder}/whatif.md"}


def counts_of(sweep: SweepSection, study: StudySection) -> list[tuple[int, int]]:
    """The (nodes, GPUs per node) the what-if predicts: the sweep's, and the study's GPU-days setting (the GPU-days
    plot shows the prediction where that setting was not measured)."""
    require(sweep, SweepSection, "tables.whatif.counts_of")
    require(study, StudySection, "tables.whatif.counts_of")
    counts = {(n, g) for n in sweep.nodes for g in sweep.gpus_per_node}
    counts.add((study.gpu_days_nodes, study.gpu_days_gpus_per_node))
    return sorted(counts, key=lambda c: (c[0] * c[1], c[0]))


# ---------------------------------------------------------------------------------------- the reading order


def _days_of(r: dict[str, Any]) -> float:
    """A row's days for ranking: the central, else the optimistic end (a bound), else none (last)."""
    d = r["days_central"] if r.get("days_central") is not None else r.get("days_optimistic")
    return math.inf if d is None else d


def _rank(r: dict[str, Any]) -> tuple[int, float, int, str]:
    return STATUS_RANK.get(r["status"], len(STATUS_RANK)), _days_of(r), r["world_size"], r["gpu"]


def _by_model(table: pl.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """model -> its rows ranked: predicted by days, then bound only, then does not fit, invalid, no peak."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in table.iter_rows(named=True):
        out.setdefault(r["model"], []).append(r)
    return {m: sorted(rows, key=_rank) for m, rows in out.items()}


def reading_order(table: pl.DataFrame, lead: list[str]) -> pl.DataFrame:
    """The rows in the order a reader asks: every setting of each `lead` model (the swept ones, then those the config
    names), each model's ranked (`_by_model`); then the fastest setting of each other model, those models ranked by
    it; then the rest of theirs, model by model. whatif.csv is written so, and the what-if plot draws its first
    rows: the plot is handed the CSV only, so the order is how it knows what leads."""
    rows = _by_model(table)
    first = [m for m in dict.fromkeys(lead) if m in rows]
    others = sorted((m for m in rows if m not in first), key=lambda m: (_rank(rows[m][0]), m))
    ordered = [r for m in first for r in rows[m]] + [rows[m][0] for m in others]
    ordered += [r for m in others for r in rows[m][1:]]
    return pl.DataFrame(ordered, schema=table.schema)


# ---------------------------------------------------------------------------------------- whatif.md


def error_sentence(predictor: Predictor) -> str:
    """The fitted model's out-of-sample error of the same model's transfer, to a GPU type the evidence did not and
    did measure: the figures of this run (report.md states them from here, never typed into a caption)."""
    cal = predictor.model.calibration

    def said(kind: Kind, where: str) -> str:
        e = cal.of(kind)
        if not e.n or e.mean_abs is None or e.max_abs is None:
            return f"to {where} not measured (too few cases in the evidence)"
        return f"to {where} {e.mean_abs:.1%} mean ({e.max_abs:.0%} worst, {e.n} runs)"

    unseen = said(Kind("same", False), "a GPU type absent from the evidence")
    seen = said(Kind("same", True), "one it measured")
    return (f"{ERROR_LEAD}, out of sample on the public evidence, for the same model moved {unseen} and {seen}; a "
            "stand-in model's transfer has its own.")  # fmt: skip


def read_error_sentence(whatif_md: str | Path) -> str | None:
    """The error sentence of a written whatif.md (its paragraph opening with ERROR_LEAD), on one line; None when the
    file or the paragraph is missing (a what-if of an older version)."""
    path = Path(whatif_md)
    if not path.is_file():
        return None
    for paragraph in path.read_text(encoding="utf-8").split("\n\n"):
        if paragraph.startswith(ERROR_LEAD):
            return " ".join(paragraph.split())
    return None


def _fill(text: str, width: int = WIDTH, **kw: Any) -> str:
    """textwrap.fill that keeps a name whole (tiny-gptneox, fl+ac+zero2, a100-40gb-pcie are not broken)."""
    return textwrap.fill(text, width, break_on_hyphens=False, break_long_words=False, **kw)


def _days_band(r: dict[str, Any]) -> str:
    """'14 d (12 - 17 d)': the central days and the band, the unit written once where both ends share it;
    '>= 1.2 ms' for a bound; the status for a row without days."""
    if r["status"] == "bound only" and r.get("days_optimistic") is not None:
        return f">= {days_text(r['days_optimistic'])}"
    if r.get("days_central") is None:
        return r["status"]
    lo, hi = days_text(r["days_optimistic"]), days_text(r["days_pessimistic"])
    lo_n, _, lo_u = lo.rpartition(" ")
    band = f"{lo_n} - {hi}" if hi.endswith(" " + lo_u) else f"{lo} - {hi}"
    return f"{days_text(r['days_central'])} ({band})"


def _rests_on(r: dict[str, Any]) -> str:
    """'public: same, seen, near': the evidence (your cells or public) and the kind of transfer in three words."""
    if r["status"] == "bound only":
        return "physics bound only"
    if r["status"] != "predicted":
        return ""
    t = r.get("transfer") or ""
    what = "other-sw" if "other software" in t else "stand-in" if t.startswith("stand-in") else "same"
    seen = "unseen" if "unmeasured GPU type" in t else "seen"
    near = "near" if "(near)" in t else "far" if "(far)" in t else ""
    who = {OWN: "yours", PUBLIC: "public"}.get(r.get("evidence") or "", r.get("evidence") or "")
    return f"{who}: " + ", ".join(x for x in (what, seen, near) if x)


def _cost(r: dict[str, Any]) -> str:
    lo, hi = r.get("amortised_usd_optimistic"), r.get("amortised_usd_pessimistic")
    if lo is None:
        return ""
    return f"{usd_text(lo)} - {usd_text(hi)}" if hi is not None else f">= {usd_text(lo)}"


def _measured(r: dict[str, Any]) -> str:
    return "" if r.get("measured_days") is None else days_text(r["measured_days"])


def _setting(r: dict[str, Any]) -> str:
    return f"{r['nodes']}x{r['gpus_per_node']}"


def _width(columns: list[str], rows: list[list[str]]) -> int:
    """The characters of a Markdown table's line (markdown.table's padding)."""
    return 1 + sum(max([len(c), 3, *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns))


def _compact(columns: list[tuple[str, Any]], rows: list[dict[str, Any]], optional: tuple[str, ...]) -> str:
    """A Markdown table of `rows` by `columns` (header, row -> text) that fits WIDTH, so that it is never cut into
    blocks: a column empty in every row is left out, then `optional` ones (last first) while a line is too wide."""
    texts = {h: [fn(r) for r in rows] for h, fn in columns}
    keep = [h for h, _ in columns if any(texts[h])]
    for h in reversed(optional):
        if _width(keep, [[texts[c][i] for c in keep] for i in range(len(rows))]) <= WIDTH:
            break
        if h in keep:
            keep.remove(h)
    return to_table(keep, [[texts[c][i] for c in keep] for i in range(len(rows))], keys=1).rstrip("\n")


def _dnf_kinds(whys: list[str]) -> str:
    kinds = {"memory model": "the memory model's lower bound at micro-batch 1 passes the GPU's memory",
             "out of memory measured": "measured out of memory on a GPU type with as much memory",
             "sharding on one GPU": "sharding on one GPU"}  # fmt: skip
    found = [text for key, text in kinds.items() if any(key in w for w in whys)]
    return "; ".join(found) or "no measured method fits"


def _grouped(rows: list[dict[str, Any]]) -> str:
    """'rtx3090 (1x1, 1x2), a6000 (1x1)': the settings of some rows, by GPU type."""
    by: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["world_size"], r["nodes"])):
        by.setdefault(r["gpu"], []).append(_setting(r))
    return ", ".join(f"{g} ({', '.join(s)})" for g, s in by.items())


def _model_section(predictor: Predictor, model: str, rows: list[dict[str, Any]], why: str) -> list[str]:
    """One lead model: what its rows rest on and why some do not predict, said once; its rows ranked by days."""
    n = {s: sum(r["status"] == s for r in rows) for s in STATUS_RANK}
    said_as = {"bound only": "the physics bound only", "does not fit": "do not fit", "no peak": "without a peak"}
    counts = ", ".join(f"{k} {said_as.get(s, s)}" for s, k in n.items() if k)
    said = [f"{len(rows)} settings ({counts})."]
    bases = list(dict.fromkeys(r["basis"] for r in rows if r["status"] == "predicted" and r["basis"]))
    if bases:
        said.append(f"Predicted from {'; '.join(bases)}.")
    bound = list(dict.fromkeys(r["why"].split(BOUND)[0] for r in rows if r["status"] == "bound only"))
    if bound:
        said.append(f"The physics bound only (the days at the `suspect` share of the dense peak): {'; '.join(bound)}.")
    unused = predictor.unused_cells(model)
    if unused:
        said.append(unused[0].upper() + unused[1:] + ".")
    dnf = [r for r in rows if r["status"] == "does not fit"]
    if dnf:
        said.append(f"Does not fit ({_dnf_kinds([r['why'] for r in dnf])}; each method's need in whatif.csv `why`): "
                    f"{_grouped(dnf)}.")  # fmt: skip
    for status in ("invalid", "no peak"):
        for reason in dict.fromkeys(r["why"] for r in rows if r["status"] == status):
            said.append(f"{status.capitalize()}: {reason} ({_grouped([r for r in rows if r['why'] == reason])}).")
    shown = [r for r in rows if r["status"] in ("predicted", "bound only")]
    columns = [("GPU", lambda r: r["gpu"]), ("GPUs", _setting), ("method", lambda r: r["method"] or ""),
               ("days (band)", _days_band), ("rests on", _rests_on), ("amortised cost", _cost),
               ("measured", _measured)]  # fmt: skip
    md = [f"### {model} ({why})", "", _fill(" ".join(said), WIDTH), ""]
    if shown:
        md.append(_compact(columns, shown, ("amortised cost",)))
    return md


def _others_section(predictor: Predictor, rows: dict[str, list[dict[str, Any]]], lead: list[str]) -> list[str]:
    """The other catalog models the evidence reaches: each one's fastest predicted setting, ranked by it; and the
    real catalog models it does not reach, each with why."""
    others = sorted((m for m in rows if m not in lead), key=lambda m: (_rank(rows[m][0]), m))
    fastest = [rows[m][0] for m in others if rows[m][0]["status"] == "predicted"]
    md: list[str] = []
    if fastest:
        total = sum(len(rows[m]) for m in others)
        predicted = sum(r["status"] == "predicted" for m in others for r in rows[m])
        md += ["## Other catalog models the evidence reaches", "",
               _fill(f"Each model's fastest predicted setting, the models ranked by it ({predicted} of their "
                             f"{total} settings are predicted; all of them in whatif.csv). Name a model in the "
                             "config's `whatif.models` to see each of its settings above.", WIDTH), "",
               _compact([("model", lambda r: r["model"]),
                         ("fastest setting", lambda r: f"{_setting(r)} {r['gpu']}, {r['method']}"),
                         ("days (band)", _days_band), ("rests on", _rests_on), ("amortised cost", _cost)], fastest,
                        ("amortised cost",))]  # fmt: skip
    rated = [g for g, spec in predictor.catalog.gpus.items() if spec.peak_tflops]
    unreached = [(n, spec) for n, spec in predictor.catalog.models.items()
                 if n not in rows and not n.startswith("tiny-") and spec.recipe.steps]  # fmt: skip
    if unreached and rated:
        md += ["", "Catalog models the evidence does not reach (the physics bound only; `pretrain-planner predict` "
               "gives it):", ""]  # fmt: skip
        for name, spec in unreached:
            gpu = next((g for g in rated if predictor.model.rates(g, spec.recipe.precision)), rated[0])
            md.append(_fill(f"- {name}: {predictor.bound_reason(spec, gpu)}", WIDTH, subsequent_indent="  "))
    return md


def _cost_notes(table: pl.DataFrame) -> str:
    """The cost notes of every row, said once: the GPU types without a price, then any other note."""
    notes: dict[str, None] = {}
    for note in table["note"].drop_nulls():
        if "cost: " in note:
            for part in note.split("cost: ", 1)[1].split("; "):
                notes[part] = None
    unpriced: dict[str, list[str]] = defaultdict(list)
    rest = []
    for n in notes:
        if n.startswith("no price_usd for ") and " in " in n:
            gpu, path = n[len("no price_usd for ") :].split(" in ", 1)
            unpriced[path].append(gpu)
        else:
            rest.append(n)
    said = [f"no price_usd in {path} for {', '.join(gpus)}: no cost shown" for path, gpus in unpriced.items()]
    return _fill("Costs: " + "; ".join([*said, *rest]) + ".", WIDTH) if said or rest else ""


def whatif_markdown(predictor: Predictor, table: pl.DataFrame, swept: list[str], named: list[str]) -> str:
    """whatif.md: the question a user asks first. The intro and the model's measured error by kind of transfer;
    each swept and named model's settings ranked by days, in one table of at most WIDTH characters; each other model
    the evidence reaches by its fastest setting; the reasons said once per model, not as numbered notes; every column
    and row in whatif.csv."""
    rows = _by_model(table)
    lead = [m for m in dict.fromkeys([*swept, *named]) if m in rows]
    years = predictor.costs.amortisation_years
    intro = _fill(f"{INTRO} The cross-GPU model: {predictor.model.params.describe()}.", WIDTH)
    kinds = [_fill(line, WIDTH, initial_indent="- ", subsequent_indent="  ")
             for line in predictor.model.calibration.lines()]  # fmt: skip
    legend = (
        "One row per setting (a catalog GPU type with a dense peak, a count): the predicted ones ranked by their "
        "central days (the band: optimistic - pessimistic), then the physics bound only (`>=`), then what does not "
        "fit (said under the model). `rests on`: your cells (yours) or the public evidence (public), and the kind of "
        "transfer: the same model or a stand-in of its kind (other-sw: from another software's runs), to a GPU type "
        f"the evidence measured (seen) or not (unseen), from a near or a far one. `amortised cost`: the hardware over "
        f"{years:g} years for the band's days."
    )  # fmt: skip
    md = ["# What-if (predictions)", "", intro, "", _fill(error_sentence(predictor), WIDTH), "",
          "By kind of transfer (each kind's band is its 5%-95% errors):", "", *kinds, ""]  # fmt: skip
    if lead:
        md += ["## " + ("The swept and named models" if any(m not in swept for m in lead) else "The swept models"),
               "", _fill(legend, WIDTH), ""]  # fmt: skip
        for m in lead:
            md += [*_model_section(predictor, m, rows[m], "swept" if m in swept else "named in whatif.models"), ""]
    md += _others_section(predictor, rows, lead)
    costs = _cost_notes(table)
    full = (f"The full table, every column and every row ({table.height}: the sources, the evidence rows, the "
            "method's reasons, the measured error of each row's kind, the notes), is whatif.csv.")  # fmt: skip
    md += ["", *([costs, ""] if costs else []), _fill(full, WIDTH)]
    return "\n".join(md).rstrip("\n") + "\n"


def rule_settings(
    sweep: SweepSection,
    benchmark: BenchmarkSection,
    evidence: EvidenceSection,
    costs: CostsSection,
    study: StudySection,
    whatif: WhatifSection,
    catalog: Catalog,
    results: str,
) -> dict[str, Any]:
    """What the `whatif` rule passes to build_whatif from the sweep's config (a change of any re-predicts): from the
    sections the facade typed (never the config's dict), JSON: the costs section's as the config wrote it (its
    repr is the rule's parameter), the study's GPU-days count, the models `whatif` names (checked against the
    catalog); `results`: the results folder (the evidence folder's default)."""
    where = "tables.whatif.rule_settings"
    for value, cls in ((sweep, SweepSection), (benchmark, BenchmarkSection), (evidence, EvidenceSection),
                       (costs, CostsSection), (study, StudySection), (whatif, WhatifSection)):  # fmt: skip
        require(value, cls, where)
    folder = evidence.folder_in(results)
    return {
        "models": list(sweep.models),
        "counts": counts_of(sweep, study),
        "suspect_mfu": benchmark.suspect_mfu,
        "costs_config": costs.to_json(),  # JSON at the rule's boundary: build_whatif types it back
        "named": whatif.named_in(catalog),
        # the site file's network over the catalog's (a change of it re-predicts the multi-node rows)
        "network": {g: spec.inter_node_gbit_s for g, spec in catalog.gpus.items() if spec.network_note},
        # the rows imported from other sites (an import re-predicts: its digest is the parameter that changes)
        "evidence_folder": str(folder),
        "evidence_digest": pp_exchange.folder_digest(folder),
    }


def build_whatif(
    cells_parquet: str,
    out: dict[str, str],
    log_path: str,
    catalog: Catalog,
    models: list[str],
    counts: list[tuple[int, int]],
    suspect_mfu: float,
    costs_config: Mapping[str, Any] | None = None,
    with_evidence_models: bool = True,
    named: list[str] | None = None,
    network: dict[str, float] | None = None,
    evidence_folder: str | None = None,
    evidence_digest: str = "",
) -> pl.DataFrame:
    """The `whatif` rule: tables/whatif.{csv,md} of the sweep's models (`models`), those the config names
    (`named`: whatif.models) and, `with_evidence_models`, every catalog model the public evidence reaches. The CSV
    has every row and column, in the reading order (`reading_order`); the .md leads with the swept and named.
    `network`: the site file's inter_node_gbit_s the catalog already carries (a rule parameter, so that a change
    of it reruns the rule; logged). `evidence_folder`: where other sites' rows were imported (`evidence_digest`,
    their digest, is the parameter an import changes). `costs_config`: the costs section's JSON (the rule's
    params: `CostsSection.to_json`), typed here, at the rule's entrance (None: the schema's defaults)."""
    t0 = time.perf_counter()
    costs = None if costs_config is None else CostsSection.of(costs_config, "the whatif rule's settings: costs_config")
    predictor = Predictor(pl.read_parquet(cells_parquet), catalog, suspect_mfu, costs,
                          evidence_folder=evidence_folder)  # fmt: skip
    named = [m for m in named or [] if m in catalog.models]
    lead = [*models, *named]
    every = [*lead, *evidence_models(predictor)] if with_evidence_models else lead
    table = reading_order(whatif_table(predictor, every, counts), lead)
    Path(out["whatif_csv"]).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out["whatif_csv"], table.write_csv())
    atomic_write_text(out["whatif_md"], whatif_markdown(predictor, table, models, named))
    error = predictor.model.calibration.describe()
    by = dict(table.group_by("status").len().sort("status").rows())
    atomic_write_text(log_path, f"whatif: {table.height} rows {by}; {len(predictor.public.runs)} evidence runs "
                                f"({origins_text(predictor.public.origins())} from {evidence_folder or 'no folder'}; "
                                f"{len(predictor.public.skipped)} rows not usable); {error}; the site's network "
                                f"{network or 'not given (config/gpus.yaml defaults)'} "
                                f"({time.perf_counter() - t0:.2f} s)\n")  # fmt: skip
    return table

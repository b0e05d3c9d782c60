"""`pretrain-planner predict`: days and cost on a GPU type you may not own, PREDICTED from measurements on others
(tables/predictor.py): your cells where there are some, else the public evidence shipped with the planner and the
rows imported from other sites, with the measured error of that kind of prediction."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.cli.config import context, evidence_folder, per_node
from pretrain_planner.cli.sources import predictor_of
from pretrain_planner.tables import units
from pretrain_planner.tables.units import days as _days
from pretrain_planner.tables.units import usd


@dataclass
class Predicted:
    prediction: Any  # tables.predictor.Prediction
    model: str
    gpu: str
    nodes: int
    source: str  # where the cells came from
    evidence_folder: Path  # where other sites' rows are imported (named beside their sources)
    config_source: str


def query(args: argparse.Namespace) -> Predicted:
    config, results, catalog = context(args)  # unknown names: the catalog's known ones
    predictor, source = predictor_of(config, catalog, results)
    p = predictor.predict(args.model, args.gpu, args.nodes, per_node(args.count, args.nodes))
    return Predicted(p, args.model, args.gpu, args.nodes, source, evidence_folder(config), args.answer_source)


def band(opt: float | None, central: float | None, pess: float | None) -> str:
    """'12 d (optimistic) / 14 d (central) / 17 d (pessimistic)'."""
    text = f"{_days(opt)} (optimistic)" if opt is not None else "?"
    if central is not None:
        text += f" / {_days(central)} (central)"
    return text + (f" / {_days(pess)} (pessimistic)" if pess is not None else " / no pessimistic end")


def render_json(a: Predicted) -> str:
    return json.dumps({**a.prediction.to_dict(), "source": a.source, "config_source": a.config_source}, indent=1)


def render_text(a: Predicted) -> str:
    from pretrain_planner.planning.evidence import SOURCES_MD
    from pretrain_planner.planning.evidence_exchange import SITE_PREFIX
    from pretrain_planner.tables.predictor import PUBLIC

    p = a.prediction
    kind = f" from {p.evidence}" if p.evidence else ""
    lines = [f"PREDICTION (not a measurement): {a.model} on {a.nodes}x{p.gpus_per_node} {a.gpu}: {p.status}{kind}"]
    if p.days_optimistic is not None:
        lines.append(f"  days to train: {band(p.days_optimistic, p.days_central, p.days_pessimistic)}")
    if p.method:
        lines.append(f"  assumes {p.method}: {p.why}")
        lines.append(f"  compute MFU {units.percent(p.mfu_low)} .. {units.percent(p.mfu_high)} (central "
                     f"{units.percent(p.mfu_central)})")  # fmt: skip
        lines.append(f"  rests on: {p.rests_on}")
        if p.evidence == PUBLIC:
            imported = f"; {SITE_PREFIX}<name>: a site's cells imported into {a.evidence_folder}"
            lines.append(f"  sources: {p.sources} (each shipped one described in {SOURCES_MD}"
                         f"{imported if SITE_PREFIX in p.sources else ''})")  # fmt: skip
        lines.append(f"  kind of transfer: {p.transfer}")
        lines.append(f"  measured error of that kind (out of sample): {p.model_error}")
    elif p.why:
        lines.append(f"  {p.why}")
    if p.amortised_usd_optimistic is not None or p.hardware_usd is not None:
        lines.append(f"  cost: hardware {usd(p.hardware_usd)}, amortised {usd(p.amortised_usd_optimistic)} .. "
                     f"{usd(p.amortised_usd_pessimistic)}")  # fmt: skip
    if p.measured_days is not None:
        lines.append(f"  measured here: {_days(p.measured_days)} (not used for the prediction)")
    if p.note:
        lines.append(f"  note: {p.note}")
    lines.append(f"  (cells: {a.source}; {a.config_source})")
    return "\n".join(lines)

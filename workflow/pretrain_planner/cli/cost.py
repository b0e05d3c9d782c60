"""`pretrain-planner cost`: the hardware, amortised and cloud cost of --count GPUs of --gpu (for --days), a
hypothetical priced from the catalog and the config's costs (tables/costs.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from pretrain_planner.cli.config import CliError, config_catalog, costs_of, load_config, per_node
from pretrain_planner.tables.units import usd


@dataclass
class Cost:
    """The price of a hypothetical and what it was priced for."""

    price: Any  # tables.costs.Price
    gpu: str
    label: str  # the GPU type's name in the catalog
    count: int
    nodes: int
    gpus_per_node: int
    days: float | None
    years: float
    gpus_path: str
    config_source: str


def query(args: argparse.Namespace) -> Cost:
    from pretrain_planner.tables import costs

    config = load_config(args)
    catalog = config_catalog(config, models=False)
    if args.gpu not in catalog.gpus:
        raise CliError(f"{catalog.gpus_path}: no GPU type {args.gpu!r}; known: {', '.join(catalog.gpus)}")
    gpn = per_node(args.count, args.nodes)
    years = args.years or costs_of(config).amortisation_years
    p = costs.price(catalog.gpus[args.gpu], args.gpu, args.nodes, gpn, args.days, catalog.base_machine_usd, years,
                    catalog.gpus_path)  # fmt: skip
    return Cost(p, args.gpu, catalog.gpus[args.gpu].label, args.count, args.nodes, gpn, args.days, years,
                catalog.gpus_path, args.answer_source)  # fmt: skip


def render_json(a: Cost) -> str:
    return json.dumps({**a.price.to_dict(), "config_source": a.config_source}, indent=1)


def render_text(a: Cost) -> str:
    p = a.price
    days = f", {a.days:g} days" if a.days is not None else ""
    lines = [f"{a.count} x {a.label} ({a.gpu}) on {a.nodes} node(s){days}"]
    hw_how = (
        f"{a.nodes} x base machine for {a.gpus_per_node} GPUs {usd(p.base_machine_usd)} + {a.count} x "
        f"{usd(p.gpu_price_usd)}"
    )
    lines.append(f"  hardware   {usd(p.hardware_usd):>12}   {hw_how if p.hardware_usd is not None else ''}".rstrip())
    if a.days is not None:
        lines.append(
            f"  amortised  {usd(p.amortised_usd):>12}   hardware x {a.days:g} days / ({a.years:g} years x 365)"
        )
        rate = f"{usd(p.cloud_usd_per_gpu_hour)}/GPU-hour x {p.gpu_hours:,.1f} GPU-hours"
        lines.append(f"  cloud      {usd(p.cloud_usd):>12}   {rate if p.cloud_usd is not None else ''}".rstrip())
    lines += [f"  note: {note}" for note in p.notes]
    lines.append(f"  (prices: {a.gpus_path} and the config's costs; {a.config_source})")
    return "\n".join(lines)

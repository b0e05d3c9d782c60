"""`pretrain-planner evidence export | import`: exchange measured cells as evidence for the cross-GPU what-if
(planning/evidence_exchange.py). `export`: the sweep's ok cells as evidence rows with their provenance; `import`:
other sites' exported rows into the config's evidence folder, all or nothing."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from pretrain_planner.cli.config import CliError, config_catalog, evidence_folder, evidence_of, load_config, results_dir
from pretrain_planner.cli.sources import cells_or_none


@dataclass
class Exported:
    rows: list[Any]  # the evidence rows
    left: list[tuple[str, str]]  # (cell, why it was left out)
    site: str
    source: str  # where the cells came from
    text: str  # the rows as CSV


@dataclass
class Imported:
    added: int
    repeated: int  # rows already in the folder, kept once
    target: Any  # the file they were added to
    origins: str  # what the what-if now rests on


def export(args: argparse.Namespace, config: dict[str, Any], catalog) -> Exported:
    import socket

    from pretrain_planner.planning import evidence_exchange as ex

    results = results_dir(config)
    cells, source = cells_or_none(results, catalog)
    site = args.site or evidence_of(config).site or socket.gethostname()
    try:
        rows, left = ex.export_rows(cells, catalog, site, interconnect=args.interconnect or "")
        if not rows:
            raise CliError(f"no cell to export from {source}: none ran ok on a GPU type"
                           + "".join(f"\n  {f}: {why}" for f, why in left))  # fmt: skip
        return Exported(rows, left, site, source, ex.csv_text(rows))
    except ex.EvidenceError as exc:
        raise CliError(str(exc)) from None


def import_(args: argparse.Namespace, config: dict[str, Any], catalog) -> Imported:
    from pretrain_planner.planning import evidence_exchange as ex

    try:
        added, repeated, target = ex.import_files(args.files, catalog, evidence_folder(config))
    except ex.EvidenceError as exc:
        raise CliError(str(exc)) from None
    return Imported(added, repeated, target, _origins(config, catalog))


def _origins(config: dict[str, Any], catalog) -> str:
    """What the what-if now rests on besides the sweep's cells."""
    from pretrain_planner.planning.evidence import origins_text
    from pretrain_planner.planning.evidence_exchange import loaded_evidence
    from pretrain_planner.schema import section

    limit = section("config", "benchmark", config.get("benchmark"))["suspect_mfu"]
    loaded = loaded_evidence(catalog, limit, evidence_folder(config))
    return f"the what-if's evidence: {origins_text(loaded.origins())} ({len(loaded.skipped)} rows not usable)"


def render_exported(a: Exported, where: str) -> str:
    """What was exported where (said on stderr: stdout may be the CSV itself)."""
    return (f"exported {len(a.rows)} cell(s) of site {a.site!r} from {a.source} to {where}"
            + "".join(f"\n  left out {f}: {why}" for f, why in a.left))  # fmt: skip


def render_imported(a: Imported) -> str:
    return (f"imported {a.added} row(s) into {a.target}" + (f"; {a.repeated} already there (kept once)"
                                                             if a.repeated else "") + f"; {a.origins}")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    catalog = config_catalog(config)
    if args.action == "export":
        a = export(args, config, catalog)
        if args.out:
            from pretrain_planner.results import atomic_write_text

            atomic_write_text(args.out, a.text)
        else:
            sys.stdout.write(a.text)
        print(render_exported(a, args.out or "stdout"), file=sys.stderr)
        return 0
    print(render_imported(import_(args, config, catalog)))
    return 0

"""`pretrain-planner preflight`: the site's preflight alone (launch/preflight.py), before a sweep is launched: one
short job per GPU type of the config's sweep on its partition, in the site's environment, and its findings in
results/site/preflight.md. It runs the workflow's `preflight` target through the SLURM profile, so the jobs, their
records and their re-use are the sweep's own (a preflight whose site entry and environment did not change is not
run again; --again runs it anyway)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pretrain_planner import layout
from pretrain_planner.cli.config import REPO, CliError, resolve


def command(args: argparse.Namespace) -> list[str]:
    """The Snakemake command line: the checkout's Snakefile, the profile, the `preflight` target, the config."""
    snakefile = REPO / "Snakefile"
    if not snakefile.is_file():
        raise CliError(f"no Snakefile at {snakefile}: run pretrain-planner from the project's checkout")
    profile = resolve(args.profile)
    if not (profile / "config.yaml").is_file():
        raise CliError(f"--profile {args.profile}: no Snakemake profile there (a folder with config.yaml)")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "--profile", str(profile), "preflight"]
    if args.again:
        cmd += ["--forcerun", "preflight_gpu"]
    if args.config:
        config = resolve(args.config)
        if not config.is_file():
            raise CliError(f"--config {args.config}: no such file")
        cmd += ["--configfile", str(config)]
    return cmd


def _results_key(config: str | None) -> str | None:
    """The config file's `results` folder, where the preflight's findings are written (None: the default)."""
    from pretrain_planner.schema import load_yaml

    data = load_yaml(resolve(config)) if config else None
    return data.get("results") if isinstance(data, dict) else None


def run(args: argparse.Namespace) -> int:
    cmd = command(args)
    print(f"pretrain-planner preflight: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    rc = subprocess.run(cmd).returncode
    results = Path(args.results or _results_key(args.config) or "results")
    md = results / layout.PREFLIGHT_MD
    if md.is_file():
        print(md.read_text())
    print(f"pretrain-planner preflight: {'passed' if rc == 0 else 'stopped'}; findings in {md}", file=sys.stderr)
    return 0 if rc == 0 else 1

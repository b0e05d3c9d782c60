"""`pretrain-planner train`: run an exported plan for real through the config's launcher (or --launcher):
train/jobs.py; the config's `train:` section gives the defaults of the flags left out."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.cli.config import REPO, CliError, load_config, results_dir


@dataclass
class Trained:
    result: dict[str, Any]  # train/jobs.run_plan's record: the run, its steps, its throughput against the prediction
    out: Path


def query(args: argparse.Namespace) -> Trained:
    """Runs the plan (the one command that acts; its answer is the run's record)."""
    from pretrain_planner.train import jobs

    config = load_config(args)
    rec = jobs.read_plan(args.plan)
    launcher = {**config["launcher"], **({"kind": args.launcher} if args.launcher else {})}
    if args.site:
        launcher["site"] = args.site
    if args.timeout_min:
        launcher["timeout_min"] = args.timeout_min
    launch = jobs.launch_settings(launcher, rec, REPO)
    out = Path(args.out) if args.out else layout.train_dir_of_plan(rec, results_dir(config))
    log_path = args.log or str(out / "launch.log")
    t = config["train"]  # the config's train section, as the train rule reads it; a flag given wins
    if args.steps or args.time_budget_h:
        steps, hours = args.steps, args.time_budget_h
    else:
        steps, hours = t["steps"], t["time_budget_hours"]
    device = args.device or ("cpu" if t["device"] == "cpu" or config["benchmark"].get("device") == "cpu" else "auto")
    try:
        jobs.check_data(rec, {"data": args.data or t["data"], "tokenizer": args.tokenizer or t["tokenizer"],
                              "data_dtype": args.data_dtype or t["data_dtype"],
                              "data_field": args.data_field or t["data_field"]})  # fmt: skip
    except jobs.DataError as exc:  # before any job or host lock: one line
        raise CliError(str(exc)) from None
    res = jobs.run_plan(args.plan, launch, out, log_path, threads=args.threads, device=device, steps=steps,
                        time_budget_h=hours, data=args.data or t["data"], tokenizer=args.tokenizer or t["tokenizer"],
                        data_dtype=args.data_dtype or t["data_dtype"], data_field=args.data_field or t["data_field"],
                        checkpoint_every_min=t["checkpoint_every_min"])  # fmt: skip
    return Trained(res, out)


def render_json(a: Trained) -> str:
    return json.dumps(a.result, indent=1, default=str)


def render_text(a: Trained) -> str:
    res, out = a.result, a.out
    t, ratio = res["throughput"], (res["throughput"].get("ratio") or {})
    return (f"{res['model']} on {res['nodes']}x{res['gpus_per_node']} {res['gpu']} ({res['method']}): {res['steps']} "
            f"steps ({res['stop_reason']}), sustained step {t.get('step_time_s')} s, train / prediction "
            f"{ratio.get('step_time_s')}; {out / layout.RESULT}, {out / layout.THROUGHPUT_MD}")  # fmt: skip

"""The command line: the parser (each command's options and help) and `main`, which runs the command asked and turns
a refusal into one line on stderr. Each command lives in its own module (cost, best, predict, fit, when, status,
evidence, train), with a query that computes the answer and the rendering that writes it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pretrain_planner.cli import best, cost, evidence, fit, predict, preflight, status, train, when
from pretrain_planner.cli.config import DEFAULT_CONFIG, CliError
from pretrain_planner.planning.corpus import TOKEN_DTYPES


def _positive(kind: type):
    """An argparse type: a number of `kind` above zero (a count, days, years), else a clear error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} must be a positive {'integer' if kind is int else 'number'}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _command(sub: Any, name: str, common: argparse.ArgumentParser, text: str) -> argparse.ArgumentParser:
    """A sub-command whose one-line help (in `pretrain-planner --help`) is also its --help's description."""
    return sub.add_parser(name, parents=[common], help=text, description=text)


def _setting(p: argparse.ArgumentParser, model: bool, count_required: bool) -> None:
    """The setting asked about: --model (where one is), --gpu, --count and --nodes. With --count optional (`best`),
    leaving out --count or --nodes means any; else --nodes defaults to one machine."""
    if model:
        p.add_argument("--model", required=True, help="the model (a name in the config's catalog.models)")
    p.add_argument("--gpu", required=True, help="the GPU type (a name in the config's catalog.gpus)")
    if count_required:
        p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
        p.add_argument("--nodes", type=_positive(int), default=1, help="machines the GPUs are spread over (default 1)")
    else:
        p.add_argument("--count", type=_positive(int), help="number of GPUs in all (default: any)")
        p.add_argument("--nodes", type=_positive(int), help="only this many nodes (default: any)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="a sweep config, as snakemake --configfile: not merged over "
                        f"{DEFAULT_CONFIG}; what it leaves out takes the schema's defaults (default: the config the "
                        "results folder was made from, recorded in its config.json; a --config that differs from "
                        "that record is an error)")  # fmt: skip
    common.add_argument("--results", help="results folder (default: --config's `results`, else the folder of the last "
                        "sweep run in this directory, else results/)")  # fmt: skip
    common.add_argument("--models", help="a models catalog FILE (default: the config's catalog.models); one model's "
                        "name goes to --model")  # fmt: skip
    common.add_argument("--gpus", help="a GPU catalog FILE with prices (default: the config's catalog.gpus); one GPU "
                        "type's name goes to --gpu")  # fmt: skip
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser = argparse.ArgumentParser(
        prog="pretrain-planner", description="Price, look up and follow pre-training benchmark sweeps."
    )
    from pretrain_planner import __version__

    parser.add_argument("--version", action="version", version=f"pretrain-planner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _command(sub, "cost", common, "price a hypothetical: hardware, amortised and cloud cost of --count GPUs of "
                 "--gpu (for --days)")  # fmt: skip
    _setting(p, model=False, count_required=True)
    p.add_argument("--days", type=_positive(float), help="days of training (for the amortised and cloud cost)")
    p.add_argument("--years", type=_positive(float),
                   help="amortisation years (default: the config's costs.amortisation_years)")  # fmt: skip
    p.set_defaults(func=answer(cost))

    p = _command(sub, "best", common, "the best measured setting of --model on --gpu: its method, days, cost, and "
                 "why nothing fits where nothing does")  # fmt: skip
    _setting(p, model=True, count_required=False)
    p.add_argument("--allow-differs", action="store_true",
                   help="pick the fastest method even if its loss check says it trains another model than "
                        "naive")  # fmt: skip
    p.set_defaults(func=best.run)

    p = _command(sub, "predict", common, "PREDICT days and cost on a GPU type from measurements on others (yours, "
                 "else public ones), with the measured error of that kind of prediction")  # fmt: skip
    _setting(p, model=True, count_required=True)
    p.set_defaults(func=answer(predict))

    p = _command(sub, "fit", common, "what fits in --days on --count x --gpu: per model the fastest setting "
                 "measured or predicted, the tokens it reaches, whether the recipe's run fits")  # fmt: skip
    _setting(p, model=False, count_required=True)
    until = p.add_mutually_exclusive_group(required=True)
    until.add_argument("--days", type=_positive(float), help="the time you have, days of compute")
    until.add_argument("--by", help="a date (YYYY-MM-DD): what finishes by then in calendar time, if submitted now "
                                    "(segments, restarts, the queue wait asked of the scheduler)")  # fmt: skip
    p.add_argument("--model", action="append", help="only this model (repeatable; default: every catalog model "
                                                    "with a step count)")  # fmt: skip
    p.set_defaults(func=answer(fit))

    p = _command(sub, "when", common, "if submitted now, when does training --model on --count x --gpu finish: "
                 "compute days (measured, else PREDICTED), segments under the site's time limit, restarts, the queue "
                 "wait asked of the scheduler (sbatch --test-only, nothing submitted)")  # fmt: skip
    p.add_argument("--model", required=True, help="the model (a name in the config's catalog.models)")
    p.add_argument("--gpu", required=True, help="the GPU type (a name in the config's catalog.gpus)")
    p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
    p.add_argument("--nodes", type=_positive(int),
                   help="machines the GPUs are spread over (default: every layout measured, else 1)")  # fmt: skip
    p.set_defaults(func=answer(when))

    p = _command(
        sub, "status", common, "where the sweep stands, per GPU type: done / running / failed cells and GPU-hours"
    )
    p.add_argument("--watch", action="store_true",
                   help="refresh a table of done / running / pending cells per GPU type and the live cells' progress "
                        "until nothing runs or waits (Ctrl-C to leave)")  # fmt: skip
    p.add_argument("--every", type=_positive(float), default=2.0, help="seconds between refreshes (default 2)")
    p.set_defaults(func=status.run)

    p = _command(sub, "evidence", common, "exchange measured cells as evidence for the cross-GPU what-if: export this "
                 "sweep's ok cells with their provenance, or import other sites' exported rows")  # fmt: skip
    actions = p.add_subparsers(dest="action", required=True, help="export: this sweep's cells; import: other sites'")
    text = "the sweep's ok cells (not suspect, not noisy) as evidence rows: the shipped evidence's columns, provenance"
    e = actions.add_parser("export", parents=[common], help=text, description=text)
    e.add_argument("--out", help="the CSV file to write (default: stdout)")
    e.add_argument("--site", help="your site's name, written into each row (default: the config's evidence.site, else "
                                  "this host's name)")  # fmt: skip
    e.add_argument("--interconnect", help="the nodes' interconnect, if known (e.g. 'NVLink 4, 8 x 400 Gb/s IB')")
    text = (
        "add exported rows to the evidence folder (the config's evidence.folder, default <results>/evidence): all "
        "or nothing, each refused row named"
    )
    i = actions.add_parser("import", parents=[common], help=text, description=text)
    i.add_argument("files", nargs="+", metavar="FILE", help="CSV files written by `evidence export`")
    p.set_defaults(func=evidence.run)

    p = _command(sub, "preflight", common, "check the site before a sweep: one short SLURM job per GPU type of the "
                 "config's sweep in the site's environment (torch, CUDA, GPUs and cores given, the device's type, "
                 "other jobs on the node); findings in results/site/preflight.md")  # fmt: skip
    p.add_argument("--profile", default="cluster/slurm", help="the Snakemake profile (default: cluster/slurm)")
    p.add_argument("--again", action="store_true", help="run every GPU type's preflight again, even where its site "
                   "entry and environment did not change")  # fmt: skip
    p.set_defaults(func=preflight.run)

    train_help = (
        "run an exported plan for real (local / SLURM / debug); the config's `train:` section gives the "
        "defaults of --steps, --time-budget-h, --data, --tokenizer, --device, --eval-every, --eval-batches"
    )
    p = _command(sub, "train", common, train_help)
    p.add_argument("--plan", required=True, help="results/optimal/{model}/{gpu}/{N}x{G}/ (or its plan.json)")
    p.add_argument("--launcher", choices=["local", "slurm", "debug"], help="default: the config's launcher.kind")
    p.add_argument("--site", help="the SLURM site file (default: the config's launcher.site)")
    p.add_argument("--timeout-min", type=_positive(int), help="the local launcher's limit (default: the config's)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=_positive(int),
                        help="optimizer steps (default: the config's train.steps, else the recipe's)")  # fmt: skip
    budget.add_argument(
        "--time-budget-h",
        type=_positive(float),
        help="hours of training time instead of steps (default: the config's train.time_budget_hours)",
    )
    p.add_argument("--out", help="output folder (default: <results>/train/{model}/{gpu}/{N}x{G})")
    p.add_argument("--log", help="the launcher's log (default: <out>/launch.log)")
    p.add_argument("--data", help="token ids (.npy, .bin), text (.txt, .jsonl, .parquet, a datasets folder; a file, "
                   "folder or glob) or an image folder (default: the config's train.data, else a generated corpus / "
                   "synthetic images); checked before any job")  # fmt: skip
    p.add_argument("--data-dtype", choices=TOKEN_DTYPES, help="a raw .bin's token dtype (default: the config's "
                   "train.data_dtype)")  # fmt: skip
    p.add_argument("--data-field", help="the text field of jsonl / parquet / datasets (default: the config's "
                   "train.data_field, else text)")  # fmt: skip
    p.add_argument("--tokenizer", help="a tokenizer.json or a local Hugging Face tokenizer folder; 'train': a BPE "
                   "trained on the corpus (default: the config's train.tokenizer)")  # fmt: skip
    p.add_argument("--device", choices=["auto", "cpu"],
                   help="cpu: a GPU plan on CPU processes (default: the config's train.device)")  # fmt: skip
    p.add_argument("--threads", type=_positive(int), default=1, help="cores for the run's ranks on this host")
    p.add_argument("--eval-every", type=int, help="steps between validation losses, 0: at the end only (default: the "
                                                 "config's train.eval_every)")  # fmt: skip
    p.add_argument("--eval-batches", type=int, help="held-out micro-batches per validation (default: the config's "
                                                   "train.eval_batches)")  # fmt: skip
    p.set_defaults(func=answer(train))
    return parser


def answer(command: Any) -> Any:
    """The run of a command whose answer is one value: its query, printed by its render_text (or render_json with
    --json)."""

    def run(args: argparse.Namespace) -> int:
        a = command.query(args)
        print(command.render_json(a) if args.json else command.render_text(a))
        return 0

    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pretrain_planner.schema import ConfigError

    try:
        return args.func(args)
    except (CliError, ConfigError, FileNotFoundError) as exc:  # a failed train job raises (see its log)
        print(f"pretrain-planner {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `pretrain-planner fit ... | head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0

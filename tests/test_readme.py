"""Every command in the README is run by a test, as the README writes it, so none drifts; and the CLI's help says
what the README says of it.

Each command of the README's ```bash blocks is in RUNS, which says how it is exercised:
- `here`: this file runs it verbatim (bash, the working directory a checkout with `.venv/` and the default sweep's
  `results/` as the pipeline leaves them, written without training), and every line of sample output the README
  shows under it (`# ...`) must be in what it prints;
- `dry`: as `here` with `-n` added (it needs GPUs or a day: the 24-hour BERT recipe);
- `e2e`: tests/test_pipeline_e2e.py runs it on its real sweep, taking the text from the README (`readme_command`),
  snakemake commands with that sweep's `--configfile` added;
- `train`: tests/test_train.py runs the three train commands verbatim, in order, in a checkout with a plan;
- `ci`: .ci/run runs it verbatim (the set-up and test command).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pretrain_planner import cli

from .conftest import REPO
from .demo_results import build_demo_results
from .readme_text import README, readme_blocks, readme_yaml

VENV = Path(sys.executable).parent.parent
RUNS = {
    # the default sweep: CI's set-up runs envs/setup.sh (test mode, a superset); test_pipeline_e2e runs the default
    # sweep's grid and prices through `snakemake --profile cluster/local`
    "bash envs/setup.sh && .venv/bin/snakemake --profile cluster/local": "e2e",
    'bash envs/setup.sh test && .venv/bin/python -m pytest -m "not slow" && .venv/bin/python -m pytest -m slow': "ci",
    ".venv/bin/pretrain-planner best --model tiny-gptneox --gpu cpu --count 2": "here",
    ".venv/bin/pretrain-planner status": "here",
    ".venv/bin/pretrain-planner status --watch": "here",
    ".venv/bin/pretrain-planner cost --gpu a100 --count 4 --days 17.57": "here",
    ".venv/bin/pretrain-planner when --model tiny-gptneox --gpu cpu --count 2": "here",
    ".venv/bin/pretrain-planner predict --model pythia-1b --gpu h100 --count 4": "here",
    ".venv/bin/pretrain-planner fit --gpu a100 --count 4 --days 14": "here",
    ".venv/bin/snakemake -n --profile cluster/local --configfile my-sweep.yaml": "here",
    ".venv/bin/snakemake -n --profile cluster/slurm --configfile my-sweep.yaml": "here",
    ".venv/bin/snakemake --unlock --profile cluster/slurm --configfile my-sweep.yaml": "here",
    # submits SLURM jobs: run as written (README_COMMAND) by tests/test_preflight_slurm.py on the testbed
    ".venv/bin/pretrain-planner preflight --config my-sweep.yaml": "slurm",
    ".venv/bin/snakemake --profile cluster/local results/train/tiny-gptneox/cpu/1x1/result.json": "train",
    ".venv/bin/pretrain-planner train --plan results/optimal/tiny-gptneox/cpu/1x1 --steps 20": "train",
    "bash results/optimal/tiny-gptneox/cpu/1x1/launch.sh --steps 40": "train",
    ".venv/bin/snakemake --profile cluster/local budget --config budget=config/budget-24h.yaml": "dry",
}
# inline commands the README's prose gives in `backticks` that a reader would copy: run like the blocks' ones
PROSE = {".venv/bin/snakemake --profile cluster/local --report report.html": "here"}


def test_every_readme_command_has_a_test_and_the_readme_stays_short():
    commands = [c for c, _ in readme_blocks()]
    assert sorted(commands) == sorted(RUNS), (sorted(set(commands) - set(RUNS)), sorted(set(RUNS) - set(commands)))
    text = README.read_text()
    for command in PROSE:
        assert f"`{command}`" in text, command
    assert len(text.splitlines()) <= 135  # ~130, and room for a line on the suite's duration
    ci = (REPO / ".ci/run").read_text().splitlines()
    for command, how in RUNS.items():
        if how == "ci":
            assert command in ci, f".ci/run does not run {command!r}"
    e2e = (REPO / "tests/test_pipeline_e2e.py").read_text()
    for command, how in RUNS.items():
        if how == "e2e":
            starts = re.findall(r'readme_command\("([^"]+)"\)', e2e)
            assert any(command.startswith(s) for s in starts), f"test_pipeline_e2e does not run {command!r}"
    train = re.findall(r'readme_command\("([^"]+)"\)', (REPO / "tests/test_train.py").read_text())
    for command, how in RUNS.items():
        if how == "train":
            assert any(command.startswith(s) for s in train), f"tests/test_train.py does not run {command!r}"
    slurm = (REPO / "tests/test_preflight_slurm.py").read_text()
    for command, how in RUNS.items():
        if how == "slurm":
            assert f'README_COMMAND = "{command}"' in slurm, f"tests/test_preflight_slurm.py does not run {command!r}"
    assert "snakemake --unlock" not in text.replace(".venv/bin/snakemake --unlock", "")  # every command from .venv


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder that looks like a clone after the default sweep: the repository's files (linked), `.venv/`, the
    README's my-sweep.yaml, and `results/` as the pipeline leaves it."""
    root = tmp_path_factory.mktemp("clone")
    for name in ("Snakefile", "workflow", "config", "cluster", "envs", "tests", "benchmarks", "pyproject.toml"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(VENV)
    (root / "my-sweep.yaml").write_text(readme_yaml("my-sweep.yaml"))
    corpus = root / "data/corpus"  # the 24-hour recipe's corpus.files: "point it at your text"
    corpus.mkdir(parents=True)
    (corpus / "books.txt").write_text("A line of text.\n" * 10)
    build_demo_results(root / "results", with_plots=True)
    return root


def _run(command: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow  # the README's commands in subprocesses (Snakemake among them) on demo results
@pytest.mark.parametrize("command", [c for c, how in {**RUNS, **PROSE}.items() if how in ("here", "dry")])
def test_the_readme_command_runs(checkout, command):
    how = {**RUNS, **PROSE}[command]
    samples = dict(readme_blocks()).get(command, [])
    line = f"{command} -n" if how == "dry" else command
    proc = _run(line, checkout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for sample in samples:
        assert _words(sample) in _words(out), (sample, out[-3000:])
    if "--report report.html" in command:
        assert (checkout / "report.html").stat().st_size > 100_000
    if "best" in command:
        assert proc.stdout.startswith("tiny-gptneox on 1x2 cpu: best method ")
        assert "MFU" in proc.stdout and "measured on the host" in proc.stdout and "NOMINAL" in proc.stdout
    if " when " in command:  # the demo's cells measured their start-up: a finish date, on local processes
        assert "compute: " in proc.stdout and "measured" in proc.stdout, proc.stdout
        assert "segments: 1 (one job, no time limit)" in proc.stdout and "finish: 20" in proc.stdout, proc.stdout


def test_the_cli_help_says_what_the_readme_says():
    """Every flag the README gives exists; every sub-command is in the README; --config's help says what the README
    says of a config file (not merged over the demo's)."""
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    text = README.read_text()
    for command, _ in readme_blocks():
        if command.startswith(".venv/bin/pretrain-planner "):
            parser.parse_args(command.split()[1:])  # an unknown flag or sub-command exits
    for name in subs:
        assert f"pretrain-planner {name}" in text, f"the README never shows `pretrain-planner {name}`"
    helps = {a.dest: a.help for a in subs["best"]._actions}
    assert "not merged" in helps["config"] and "not merged over config/config.yaml" in text
    train = _words(subs["train"].format_help())  # `pretrain-planner train --help`
    assert "the config's `train:` section gives the defaults of --steps" in train
    section = "The config's `train:` section (steps or a time budget, data, tokenizer, validation) applies to all three"
    assert section in text

"""A config file's mistake is said with its file and line however pretrain-planner was installed (issue 56).

Snakemake reads --configfile before any line of the Snakefile runs; the check is imported by Snakemake itself, as
the logger plugin shipped in this distribution (workflow/snakemake_logger_plugin_pretrain_planner). These runs start
Python with -S, so no .pth line of the environment's site-packages runs (the old hook of envs/setup.sh was one): only
site-packages and the checkout's workflow/ are on the path, as after a plain `pip install .`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from pretrain_planner.cli.config import CliError, _load_file_config
from pretrain_planner.schema import ConfigError, load_yaml

from .conftest import REPO

BAD = "sweep:\n  models: [tiny-gptneox\n  gpus: [cpu]\n"


def _bare_snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -S -m snakemake -n ...`: no site-packages .pth line runs (neither an editable install's nor a hook)."""
    path = os.pathsep.join([sysconfig.get_paths()["purelib"], str(REPO / "workflow")])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1"}
    cmd = [sys.executable, "-S", "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "-d", str(cwd), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    "text, said",
    [(BAD, "bad.yaml:3:7: not valid YAML"), ("# only a comment\n", "bad.yaml: the file is empty")],
    ids=["yaml-syntax", "empty"],
)
def test_snakemake_names_the_file_and_line_without_any_pth_hook(tmp_path, text, said):
    (tmp_path / "bad.yaml").write_text(text)
    proc = _bare_snakemake(tmp_path, "--configfile", "bad.yaml")
    err = proc.stdout + proc.stderr
    assert proc.returncode == 1 and said in err, err[-2000:]
    assert "Traceback" not in err and "is not valid JSON or YAML" not in err, err[-2000:]


def test_no_other_process_imports_the_check():
    """Only Snakemake imports the plugin: a torch rank's start-up (any other Python process) pays nothing."""
    probe = "import sys; print('pretrain_planner.configfiles' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "False"


def test_the_cli_and_every_yaml_reader_name_the_file_and_line(tmp_path):
    """`pretrain-planner ... --config FILE` and the catalogs, site and budget files (schema.load_yaml): one line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    with pytest.raises(ConfigError) as exc:
        load_yaml(bad)
    assert str(exc.value).startswith(f"{bad}:3:7: not valid YAML") and "\n" not in str(exc.value)
    with pytest.raises(CliError, match=r"bad\.yaml:3:7: not valid YAML"):
        _load_file_config(bad, str(bad))
    bad.write_text("# only a comment\n")
    with pytest.raises(CliError, match="the file is empty"):
        _load_file_config(bad, str(bad))

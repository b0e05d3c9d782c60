"""The site file: values that would break the generated sbatch script are refused, naming the key; what is
accepted lands in the script as one header line per option."""

from __future__ import annotations

import pytest
import yaml
from pretrain_planner.planning.site import load_site, sbatch_parameters
from pretrain_planner.schema import ConfigError
from submitit.slurm.slurm import _make_sbatch_string


def _site(tmp_path, a100: dict, defaults: dict | None = None):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults or {}, "gpus": {"a100": a100}}))
    return path


@pytest.mark.parametrize(
    ("a100", "key", "says"),
    [
        ({"partition": "gpu\n#SBATCH --time=99999"}, "gpus.a100.partition", "must be one word"),
        ({"account": "lab a"}, "gpus.a100.account", "no spaces"),
        ({"qos": "high\r"}, "gpus.a100.qos", "control characters"),
        ({"extra_sbatch": {"comment": "grant 123\n#SBATCH --time=1"}}, "gpus.a100.extra_sbatch.comment", "one line"),
        ({"extra_sbatch": {"mail type\n#SBATCH --x": "END"}}, "gpus.a100.extra_sbatch", "sbatch option name"),
        ({"setup": ["module load cuda\nexit 0"]}, "gpus.a100.setup[0]", "one line"),
    ],
)
def test_a_value_that_would_split_the_sbatch_header_is_refused(tmp_path, a100, key, says):
    with pytest.raises(ConfigError) as err:
        load_site(_site(tmp_path, a100), ["a100"])
    assert f"{key}: " in str(err.value) and says in str(err.value), str(err.value)


def test_accepted_values_stay_one_header_line_each(tmp_path):
    site = load_site(
        _site(tmp_path, {"partition": "gpu", "gres_type": "a100", "time_limit_min": 77, "signal_delay_s": 45,
                         "extra_sbatch": {"comment": "grant 123; rm -rf ~", "exclusive": True, "mail_type": "END"},
                         "setup": ["module load cuda/12.4", "source ~/venv/bin/activate"]}),
        ["a100"],
    )  # fmt: skip
    params = sbatch_parameters(site["gpus"]["a100"], 1, 2, "pp-cell")
    script = _make_sbatch_string(command="python -m x", folder=str(tmp_path), **params)
    header = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --time=77" in header and "#SBATCH --signal=USR2@45" in header
    assert "#SBATCH --comment='grant 123; rm -rf ~'" in header and "#SBATCH --exclusive" in header
    assert "#SBATCH --mail-type=END" in header
    body = script.split("# setup", 1)[1]
    assert "module load cuda/12.4\nsource ~/venv/bin/activate\n" in body
    assert "srun --unbuffered" in body and "--kill-on-bad-exit=1" in body  # one failed task ends the step
    # every header line before the first blank line: nothing split off the header
    assert script.split("\n\n")[1].splitlines()[0] == "# Parameters"

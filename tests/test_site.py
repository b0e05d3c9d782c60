"""The site file: values that would break the generated sbatch script are refused, naming the key; what is
accepted lands in the script as one header line per option."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from pretrain_planner.planning.site import job_lines, load_site, rank_python, sbatch_parameters
from pretrain_planner.schema import ConfigError
from submitit.slurm.slurm import _make_sbatch_string

from .conftest import REPO


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
        ({"python": "/opt/py\nrm -rf ~"}, "gpus.a100.python", "one line"),
        ({"container": "apptainer exec\nx"}, "gpus.a100.container", "one line"),
        ({"modules": ["cuda 12"]}, "gpus.a100.modules[0]", "no spaces"),
        ({"env": {"1BAD": "x"}}, "gpus.a100.env", "environment variable name"),
        ({"env": {"NCCL_SOCKET_IFNAME": "ib0\nexit"}}, "gpus.a100.env.NCCL_SOCKET_IFNAME", "one line"),
        ({"srun_args": ["--container-image=x\ny"]}, "gpus.a100.srun_args[0]", "one line"),
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
    params = sbatch_parameters(site.gpus["a100"], 1, 2, "pp-cell")
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


def _plan(tmp_path, site: dict, nodes: list[int], gpus_per_node: list[int], gpus: tuple[str, ...] = ("a100",)):
    """The plan of a tiny sweep on the slurm launcher with `site` as its site file (in process: a dry run's)."""
    from pretrain_planner.facade.pipeline import load

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    config = {"sweep": {"models": ["tiny-gptneox"], "gpus": list(gpus), "nodes": nodes, "gpus_per_node": gpus_per_node,
                        "methods": ["naive"]}, "launcher": {"kind": "slurm", "site": str(path)}}  # fmt: skip
    return {(p.cell.nodes, p.cell.gpus_per_node): p.reason for p in load(config, REPO).planned}


def test_a_cell_larger_than_its_partition_is_refused_at_plan_time(tmp_path):
    """Issue 37: a cell asking more nodes than its partition allows, or more GPUs per node than its nodes have, is
    invalid in the plan (the dry run), naming the partition, the limit and the site key; with the limits left out it
    is planned as before (nothing known to check)."""
    site = {"gpus": {"a100": {"partition": "gpu", "gres_type": "a100", "max_nodes": 2, "gpus_per_node": 4}}}
    plan = _plan(tmp_path, site, [1, 2, 4], [4, 8])
    assert plan[(1, 4)] is None and plan[(2, 4)] is None
    assert plan[(4, 4)] == (f"partition gpu allows at most 2 node(s) per job ({tmp_path / 'site.yaml'}: "
                            "gpus.a100.max_nodes); the cell asks 4")  # fmt: skip
    assert "a node of partition gpu has at most 4 GPU(s) of this type" in plan[(1, 8)]
    assert "gpus.a100.gpus_per_node); the cell asks 8 per node" in plan[(1, 8)]
    unchecked = _plan(tmp_path, {"gpus": {"a100": {"partition": "gpu", "gres_type": "a100"}}}, [1, 2], [8])
    assert set(unchecked.values()) == {None}


def test_a_plan_with_nothing_its_partition_can_hold_stops_the_dry_run(tmp_path):
    site = {"gpus": {"a100": {"partition": "gpu", "max_nodes": 1}}}
    with pytest.raises(ConfigError, match="(?s)has no valid cell.*partition gpu allows at most 1 node"):
        _plan(tmp_path, site, [2], [1])


def test_a_scheduler_that_cannot_be_asked_names_what_to_set(tmp_path):
    """ask_scheduler with no controller to ask (no scontrol here, or the daemon down): the dry run stops, naming
    the site keys that would make the question unnecessary."""
    from pretrain_planner.planning import site as pp_site

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"ask_scheduler": True, "gpus": {"a100": {"partition": "gpu"}}}))
    loaded = load_site(path, ["a100"])
    nowhere = lambda cmd: pp_site._run([str(tmp_path / "no-such-bin" / cmd[0]), *cmd[1:]])  # noqa: E731
    with pytest.raises(ConfigError, match="could not be asked for partition gpu's limits.*gpus.a100.max_nodes"):
        pp_site.resolve_limits(loaded, run=nowhere)


def test_a_cell_asking_more_time_than_its_partition_runs_a_job_is_refused(tmp_path):
    """Issue 38: a partition's MaxTime (site key max_time_h) shorter than the cells' time_limit_min would leave
    every cell pending for ever (PartitionTimeLimit): invalid in the plan, naming both."""
    short = {"gpus": {"a100": {"partition": "debug", "max_time_h": 1, "time_limit_min": 90}}}
    with pytest.raises(ConfigError) as err:  # the plan's only cell: nothing to run, and why
        _plan(tmp_path, short, [1], [1])
    assert (f"partition debug runs a job at most 60 min ({tmp_path / 'site.yaml'}: gpus.a100.max_time_h); the cell "
            "asks 90 min (time_limit_min): it would wait in the queue for ever") in str(err.value)  # fmt: skip
    roomy = {"gpus": {"a100": {"partition": "debug", "max_time_h": 2, "time_limit_min": 90}}}
    assert set(_plan(tmp_path, roomy, [1], [1]).values()) == {None}


def test_a_jobs_environment_is_the_sites(tmp_path):
    """Issue 52: how a rank starts is the site's: its modules loaded, its env exported (values quoted: a config value
    never becomes shell), its setup lines, then its `python` (not the driver's) behind its `container` prefix, and
    its srun options (pyxis's --container-image) after the project's own."""
    site = load_site(
        _site(tmp_path, {"python": "/opt/pp/bin/python", "container": "apptainer exec --nv /img/pp.sif",
                         "modules": ["cuda/12.4", "nccl"], "setup": ["source ~/pp/bin/activate"],
                         "env": {"GLOO_SOCKET_IFNAME": "lo", "NOTE": "$(touch x) `id`", "FLAG": True},
                         "srun_args": ["--container-image=nvcr.io#nvidia/pytorch:25.01-py3"]}),
        ["a100"],
    ).gpus["a100"]  # fmt: skip
    lines = job_lines(site)
    assert lines == [
        "module load cuda/12.4",
        "module load nccl",
        "export FLAG=true",
        "export GLOO_SOCKET_IFNAME=lo",
        "export NOTE='$(touch x) `id`'",
        "source ~/pp/bin/activate",
    ]  # fmt: skip (the file's order)
    shown = subprocess.run(["bash", "-c", "\n".join(lines) + '\nprintf "%s|" "$NOTE" "$FLAG"'], cwd=tmp_path,
                           capture_output=True, text=True)  # fmt: skip
    assert shown.stdout == "$(touch x) `id`|true|" and not (tmp_path / "x").exists()
    assert rank_python(site, "/login/bin/python") == "apptainer exec --nv /img/pp.sif /opt/pp/bin/python"
    assert rank_python({}, "/login/bin/python") == "/login/bin/python"  # no site python: the driver's own
    home = rank_python({"python": "~/my envs/pp/bin/python"}, "/login/bin/python")  # the job's home, quoted rest
    shown = subprocess.run(["bash", "-c", f"printf %s {home}"], capture_output=True, text=True, env={"HOME": "/h"})
    assert shown.stdout == "/h/my envs/pp/bin/python", (home, shown)
    params = sbatch_parameters(site, 1, 2, "pp-cell")
    assert params["setup"] == lines
    assert params["srun_args"] == ["--kill-on-bad-exit=1", f"--cpus-per-task={site['cpus_per_gpu']}",
                                   "--container-image=nvcr.io#nvidia/pytorch:25.01-py3"]  # fmt: skip
    script = _make_sbatch_string(command="python -m x", folder=str(tmp_path), **params)
    assert "export NOTE='$(touch x) `id`'" in script and "--container-image=nvcr.io" in script


def test_docs_cluster_names_every_site_key_in_its_tables():
    """docs/cluster.md's site-key tables name every key the site schema accepts, so none is undocumented."""
    schema = yaml.safe_load((REPO / "workflow/schemas/site.schema.yaml").read_text())
    top = [k for k in schema["properties"] if k not in ("defaults", "gpus")]
    keys = [*schema["$defs"]["settings"]["properties"], *top]
    rows = [ln for ln in (REPO / "docs/cluster.md").read_text().splitlines() if ln.lstrip().startswith("| `")]
    named = {k for ln in rows for k in re.findall(r"`([a-z_]+)`", ln.split("|")[1])}
    assert not [k for k in keys if k not in named], [k for k in keys if k not in named]

"""The `cpu` stand-in's bf16: native only where the host's CPU has bf16 instructions (planning/hostcpu.py), else
bf16 cells are invalid with the reason; the tiny recipes are fp32, and the bf16 paths (autocast, FSDP2's mixed
precision, DeepSpeed bf16) run here on a bf16 copy of tiny-gptneox, on any CPU (forced native: these tests check
the paths, not a timing)."""

from __future__ import annotations

import math
import sys

import pytest
from pretrain_planner.planning import hostcpu
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell, invalid_reason
from pretrain_planner.schema import ConfigError

from .conftest import HAVE_DS, REPO, write_config

ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx512f amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd aes crc32\n"


@pytest.mark.parametrize(
    "cpuinfo, machine, env, native",
    [
        (ZEN4, "x86_64", {}, True),
        (ZEN3, "x86_64", {}, False),
        (SAPPHIRE, "x86_64", {}, True),
        (GRAVITON3, "aarch64", {}, True),
        (GRAVITON2, "aarch64", {}, False),
        # oneDNN capped below its bf16 kernels emulates even on a CPU that has them
        (ZEN4, "x86_64", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
        (ZEN4, "x86_64", {"DNNL_MAX_CPU_ISA": "avx512_core"}, False),
        (ZEN4, "x86_64", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
        # the override wins either way
        (ZEN3, "x86_64", {hostcpu.OVERRIDE_ENV: "native"}, True),
        (ZEN4, "x86_64", {hostcpu.OVERRIDE_ENV: "emulated"}, False),
    ],
)
def test_detection(cpuinfo, machine, env, native):
    support = hostcpu.detect(env=env, cpuinfo=cpuinfo, machine=machine)
    assert support.native is native, support
    assert support.why


def test_a_bad_override_names_the_variable_and_the_values():
    with pytest.raises(ConfigError, match=rf"{hostcpu.OVERRIDE_ENV}='yes'.*native, emulated"):
        hostcpu.detect(env={hostcpu.OVERRIDE_ENV: "yes"}, cpuinfo=ZEN4, machine="x86_64")


@pytest.fixture
def host(monkeypatch):
    """Load the catalog as a host whose CPU computes bf16 `natively` or `emulated` would."""

    def load(kind: str):
        monkeypatch.setenv(hostcpu.OVERRIDE_ENV, kind)
        hostcpu.host_bf16.cache_clear()
        return load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")

    yield load
    hostcpu.host_bf16.cache_clear()


def _reason(catalog, model: str) -> str | None:
    return invalid_reason(Cell(model, "cpu", 1, 1, "naive"), catalog.model(model), catalog.gpu("cpu"), "local", catalog)


def test_bf16_on_an_emulating_cpu_is_invalid_with_the_reason(host):
    catalog = host("emulated")
    assert catalog.gpu("cpu").bf16 is False
    reason = _reason(catalog, "pythia-1b")  # a bf16 recipe
    assert reason and "emulated" in reason and "cpu.bf16 = host" in reason, reason
    assert f"{hostcpu.OVERRIDE_ENV}=native" in reason  # how to run it anyway
    assert _reason(catalog, "tiny-gptneox") is None  # the stand-ins are fp32: the demo runs on every CPU


def test_bf16_on_a_native_cpu_is_valid(host):
    catalog = host("native")
    assert catalog.gpu("cpu").bf16 is True and "native" in catalog.gpu("cpu").bf16_host
    assert _reason(catalog, "pythia-1b") is None


def test_gpu_types_keep_their_declared_bf16(host):
    catalog = host("emulated")  # the host's CPU says nothing about a GPU type's bf16
    assert catalog.gpu("a100").bf16 is True and catalog.gpu("a100").bf16_host is None
    assert catalog.gpu("v100").bf16 is False


def test_tiny_stand_ins_are_fp32(host):
    catalog = host("native")
    tiny = [m for m in catalog.models.values() if m.name.startswith("tiny-")]
    assert tiny and all(m.recipe.precision == "fp32" for m in tiny), [(m.name, m.recipe.precision) for m in tiny]


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_the_dry_run_of_a_bf16_sweep_on_an_emulating_host_says_why(tmp_path):
    """A user's bf16 sweep on the `cpu` type of a host without bf16 instructions stops before anything runs, with
    the reason per model (nothing left to run); on a native host the same dry run plans it."""
    from .conftest import snakemake

    cfg = write_config(
        tmp_path / "c.yaml",
        sweep={"models": ["tiny-bert", "pythia-1b"], "gpus": ["cpu"], "methods": ["naive"]},
        launcher={"kind": "local"},
    )
    proc = snakemake(tmp_path, "-n", "--configfile", str(cfg), env={hostcpu.OVERRIDE_ENV: "emulated"})
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "'pythia-1b' has no valid cell" in out and "is emulated on this host's CPU" in out, out[-3000:]
    assert "tiny-bert" not in out.split("nothing to run")[-1]  # fp32: runs
    proc = snakemake(tmp_path, "-n", "--configfile", str(cfg), env={hostcpu.OVERRIDE_ENV: "native"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


# ----------------------------------------------------------------------------------------- the bf16 paths, run
BF16_METHODS = ["naive", "naive+fsdp-full"] + (["naive+zero2"] if HAVE_DS else [])


@pytest.fixture(scope="module")
def bf16_runs():
    """Each bf16 path on 2 gloo ranks (tests/rank_workers.py bf16_paths): one process per rank for all methods."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from multirank import run_ranks

    out = run_ranks("tests.rank_workers:bf16_paths", 2, {"methods": BF16_METHODS}, 600)
    assert not out[0]["timed_out"], out[0]["stderr"][-3000:]
    for rec in out:
        assert rec["returncode"] == 0, (rec.get("error"), rec.get("traceback"), rec["stderr"][-3000:])
    return out[0]["result"]


@pytest.mark.slow
def test_bf16_paths_run_on_cpu(bf16_runs):
    naive = bf16_runs["naive"]
    assert naive["autocast"] == "bfloat16" and naive["parallel"] == "ddp"
    assert bf16_runs["naive+fsdp-full"]["fsdp_param_dtype"] == "bfloat16"  # FSDP2's MixedPrecisionPolicy
    if HAVE_DS:
        assert bf16_runs["naive+zero2"]["parallel"] == "deepspeed" and bf16_runs["naive+zero2"]["deepspeed_bf16"]
    for method, rec in bf16_runs.items():
        assert all(math.isfinite(v) for v in rec["losses"]), (method, rec)


@pytest.mark.slow
def test_bf16_methods_train_the_same_model(bf16_runs):
    """Same seed, same batches: every engine takes the same first step in bf16 (bf16's rounding: a loose bound)."""
    reference = bf16_runs["naive"]["losses"]
    for method in BF16_METHODS[1:]:
        assert bf16_runs[method]["losses"] == pytest.approx(reference, rel=2e-2), (method, bf16_runs[method])

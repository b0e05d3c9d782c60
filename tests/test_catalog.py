"""The catalog: config/models.yaml and config/gpus.yaml load, hold the studies' facts, and bad files fail clearly.

Facts are checked against the two papers (A = Khandelwal et al. 2024, "$100K or 100 Days"; B = Izsak et al.
2021, the 24-hour BERT) as docs/methods.md "Facts and their sources" quotes them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from pretrain_planner.planning.catalog import load_catalog, load_gpus, load_models
from pretrain_planner.planning.families import FAMILIES
from pretrain_planner.schema import ConfigError, validate

from .conftest import TINY_GPTNEOX_ARCH

ROOT = Path(__file__).resolve().parents[1]
MODELS_YAML = ROOT / "config" / "models.yaml"
GPUS_YAML = ROOT / "config" / "gpus.yaml"
MODEL_NAMES = list(yaml.safe_load(MODELS_YAML.read_text())["models"])
GPU_NAMES = list(yaml.safe_load(GPUS_YAML.read_text())["gpus"])


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(MODELS_YAML, GPUS_YAML)


# ------------------------------------------------------------------------------------------ loading


def test_config_files_list_models_and_gpus():
    assert len(MODEL_NAMES) >= 10
    assert {"pythia-1b", "roberta-large", "bert-24h", "tiny-gptneox", "tiny-bert"} <= set(MODEL_NAMES)
    assert {"rtx3090", "a6000", "a100", "h100", "h200", "v100", "cpu"} <= set(GPU_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_loads(catalog, name):
    spec = catalog.model(name)
    assert spec.name == name
    assert spec.family in FAMILIES
    assert spec.task == FAMILIES[spec.family].task
    r = spec.recipe
    assert r.global_batch >= 1
    assert r.steps is not None or r.time_budget_hours is not None
    assert r.precision in ("fp32", "bf16", "fp16")
    assert r.optimizer.lr > 0
    assert len(r.optimizer.betas) == 2
    if spec.is_text:
        assert r.sequence_length and r.image_size is None
        assert spec.tokens_per_sample == r.sequence_length
    else:
        assert r.image_size and r.sequence_length is None
        assert spec.tokens_per_sample is None
    # a job's spec is plain JSON
    d = spec.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["task"] == spec.task
    assert d["recipe"]["optimizer"]["betas"] == list(r.optimizer.betas)


@pytest.mark.parametrize("name", GPU_NAMES)
def test_every_gpu_loads(catalog, name):
    gpu = catalog.gpu(name)
    assert gpu.name == name and gpu.label
    assert gpu.supports("fp32")
    assert set(gpu.peak_tflops) <= {"bf16", "fp16", "tf32", "fp32"}
    for precision in ("bf16", "fp16"):
        if precision in gpu.peak_tflops:
            assert gpu.supports(precision)
    d = gpu.to_dict()
    assert json.loads(json.dumps(d)) == d


def test_unknown_names_raise_config_error_naming_the_file(catalog):
    with pytest.raises(ConfigError, match=r"models\.yaml.*no model 'gpt-5'.*pythia-1b"):
        catalog.model("gpt-5")
    with pytest.raises(ConfigError, match=r"gpus\.yaml.*no GPU type 'mi300x'.*a100"):
        catalog.gpu("mi300x")


# ------------------------------------------------------------------------------ model facts (Khandelwal et al. 2024)

PYTHIA = {
    # name: (hidden, layers, heads, lr)
    "pythia-160m": (768, 12, 12, 6e-4),
    "pythia-410m": (1024, 24, 16, 3e-4),
    "pythia-1b": (2048, 16, 8, 3e-4),
    "pythia-1.4b": (2048, 24, 16, 2e-4),
    "pythia-2.8b": (2560, 32, 32, 1.6e-4),
    "pythia-6.9b": (4096, 32, 32, 1.2e-4),
    "pythia-14m": (128, 6, 4, 1.0e-3),
    "pythia-31m": (256, 6, 8, 1.0e-3),
    "pythia-70m": (512, 6, 8, 1.0e-3),
    "pythia-12b": (5120, 36, 40, 1.2e-4),
}


@pytest.mark.parametrize("name", list(PYTHIA))
def test_pythia_facts(catalog, name):
    hidden, layers, heads, lr = PYTHIA[name]
    spec = catalog.model(name)
    a, r = spec.arch, spec.recipe
    assert spec.family == "gptneox" and spec.task == "causal_lm"
    assert (a["hidden_size"], a["num_hidden_layers"], a["num_attention_heads"]) == (hidden, layers, heads)
    assert a["intermediate_size"] == 4 * hidden
    assert a["vocab_size"] == 50304
    assert a["rotary_pct"] == 0.25
    assert a["use_parallel_residual"] is True
    assert a["tie_word_embeddings"] is False
    assert r.global_batch == 1024
    assert r.steps == 143000
    assert r.sequence_length == 2048
    assert r.precision == ("bf16" if name == "pythia-1b" else "fp16")
    assert r.optimizer.name == "adam"
    assert r.optimizer.lr == pytest.approx(lr)
    assert r.optimizer.betas == (0.9, 0.95)
    assert r.optimizer.eps == pytest.approx(1e-8)
    assert r.optimizer.weight_decay == pytest.approx(0.01)
    assert r.schedule["name"] == "cosine"
    assert r.schedule["min_lr_ratio"] == pytest.approx(0.1)
    assert r.schedule["warmup_steps"] == 1430
    assert r.grad_clip == 1.0


def test_pythia_1b_spot_check(catalog):
    spec = catalog.model("pythia-1b")
    assert spec.arch["hidden_size"] == 2048
    assert spec.arch["num_hidden_layers"] == 16
    assert spec.arch["num_attention_heads"] == 8
    assert spec.recipe.precision == "bf16"
    assert spec.recipe.optimizer.lr == pytest.approx(3e-4)
    assert spec.recipe.global_batch == 1024
    assert spec.recipe.steps == 143000
    # 1024 x 2048 x 143,000 tokens = 299.9B, as in the study
    assert spec.recipe.global_batch * spec.tokens_per_sample * spec.recipe.steps == 299_892_736_000


def test_roberta_large_facts(catalog):
    spec = catalog.model("roberta-large")
    a, r = spec.arch, spec.recipe
    assert spec.family == "roberta" and spec.task == "masked_lm"
    assert (a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"]) == (24, 1024, 16)
    assert a["vocab_size"] == 50265
    assert r.global_batch == 8192
    assert r.steps == 500000
    assert r.sequence_length == 512
    assert r.precision == "fp16"
    assert r.optimizer.name == "adam"
    assert r.optimizer.lr == pytest.approx(4e-4)
    assert r.optimizer.betas == (0.9, 0.98)
    assert r.optimizer.eps == 1e-8  # the study sets none (src/models/roberta.py): torch.optim.Adam's default
    assert r.optimizer.weight_decay == pytest.approx(0.01)
    assert r.schedule == {"name": "linear", "warmup_steps": 30000}
    assert r.grad_clip is None


def test_mamba_facts(catalog):
    spec = catalog.model("mamba-2.8b")
    r = spec.recipe
    assert spec.family == "mamba" and spec.task == "causal_lm"
    assert (r.global_batch, r.steps, r.sequence_length, r.precision) == (128, 572204, 4096, "bf16")
    assert r.optimizer.name == "adamw"
    assert r.optimizer.lr == pytest.approx(8e-4)
    assert r.optimizer.betas == (0.9, 0.95)
    assert r.optimizer.weight_decay == pytest.approx(0.1)
    assert r.schedule["name"] == "cosine"
    assert r.schedule["warmup_fraction"] == pytest.approx(0.1)
    assert r.schedule["min_lr"] == pytest.approx(1e-5)
    assert r.grad_clip == 1.0
    assert spec.supports_compile is False
    assert spec.supports_checkpointing is True  # default filled


def test_convnext_facts(catalog):
    spec = catalog.model("convnext-xlarge-22k")
    r = spec.recipe
    assert spec.task == "image_classification" and not spec.is_text
    assert spec.arch["num_labels"] == 21841
    assert (r.global_batch, r.steps, r.image_size, r.precision) == (4096, 311940, 224, "fp32")
    assert r.optimizer.name == "adamw"
    assert r.optimizer.lr == pytest.approx(4e-3)
    assert r.optimizer.weight_decay == pytest.approx(0.05)
    assert r.schedule["name"] == "cosine"
    assert r.grad_clip is None


def test_vit_facts(catalog):
    spec = catalog.model("vit-large-in21k")
    a, r = spec.arch, spec.recipe
    assert spec.family == "vit" and spec.task == "image_classification"
    assert (a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"], a["patch_size"]) == (24, 1024, 16, 16)
    assert a["num_labels"] == 21841
    assert (r.global_batch, r.steps, r.image_size, r.precision) == (4096, 311948, 224, "fp32")
    assert r.optimizer.name == "adam"
    assert r.optimizer.lr == pytest.approx(1e-3)
    assert r.optimizer.weight_decay == pytest.approx(0.03)
    assert r.schedule == {"name": "linear", "warmup_steps": 10000}
    assert r.grad_clip == 1.0


def test_bert_24h_facts(catalog):
    """Izsak et al. 2021: the 24-hour BERT recipe."""
    spec = catalog.model("bert-24h")
    a, r = spec.arch, spec.recipe
    assert spec.task == "masked_lm"
    assert (a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"]) == (24, 1024, 16)
    assert a["intermediate_size"] == 4096
    assert a["hidden_act"] == "gelu"
    assert a["hidden_dropout_prob"] == 0.1 and a["attention_probs_dropout_prob"] == 0.1
    assert r.sequence_length == 128
    assert r.global_batch == 4096
    assert r.steps is None
    assert r.time_budget_hours == 24
    assert r.precision == "fp16"
    assert r.optimizer.name == "adamw"
    assert r.optimizer.lr == pytest.approx(1e-3)
    assert r.optimizer.betas == (0.9, 0.98)
    assert r.optimizer.eps == pytest.approx(1e-6)
    assert r.optimizer.weight_decay == pytest.approx(0.01)
    assert r.grad_clip is None
    assert r.schedule["warmup_fraction"] == pytest.approx(0.06)
    assert r.mlm_probability == pytest.approx(0.15)


# ------------------------------------------------------------------------------------------ GPU facts


def test_gpu_peaks(catalog):
    a100, h100, v100 = catalog.gpu("a100"), catalog.gpu("h100"), catalog.gpu("v100")
    assert a100.peak_tflops["bf16"] == 312 and a100.peak_tflops["tf32"] == 156
    assert h100.peak_tflops["bf16"] == 989
    assert catalog.gpu("a6000").peak_tflops["bf16"] == pytest.approx(154.8)
    assert catalog.gpu("a6000").peak_tflops["tf32"] == pytest.approx(77.4)
    assert catalog.gpu("rtx3090").peak_tflops["bf16"] == 71
    assert catalog.gpu("rtx3090").peak_tflops["tf32"] == pytest.approx(35.6)
    assert v100.bf16 is False and v100.tf32 is False and v100.fp16 is True
    assert not v100.supports("bf16") and v100.supports("fp16")
    assert "bf16" not in v100.peak_tflops


def test_study_gpu_types_a40_l40(catalog):
    """The GPU types the study's code knows beyond those it swept (src/gpus.py): datasheet dense peaks, no price."""
    a40, l40 = catalog.gpu("a40"), catalog.gpu("l40")
    assert (a40.memory_gib, l40.memory_gib) == (48, 48)
    assert a40.peak_tflops == {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4}
    assert l40.peak_tflops == {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}
    assert a40.price_usd is None and l40.price_usd is None
    assert a40.interconnect_gb_s == 64 and catalog.gpu("a100").interconnect_gb_s == 600


def test_study_models_convnext_large_and_original_runs(catalog):
    """ConvNeXt-L (1k / 22k) as the study's src/models/convnext.py, and the originally reported resources
    (scripts/plotting/gpu_days.py) behind the GPU-days view."""
    for name, labels, steps, warmup in (("convnext-large-1k", 1000, 93600, 6240),
                                        ("convnext-large-22k", 21841, 311940, 17330)):  # fmt: skip
        spec = catalog.model(name)
        assert spec.arch["hidden_sizes"] == [192, 384, 768, 1536] and spec.arch["depths"] == [3, 3, 27, 3]
        assert spec.arch["num_labels"] == labels
        assert (spec.recipe.steps, spec.recipe.schedule["warmup_steps"]) == (steps, warmup)
    assert catalog.model("convnext-xlarge-22k").recipe.schedule["warmup_steps"] == 17330
    assert catalog.model("vit-large-in21k").arch["hidden_dropout_prob"] == 0.1
    original = {n: (m.original_training or {}).get("gpus", 0) * (m.original_training or {}).get("days", 0)
                for n, m in catalog.models.items() if m.original_training}  # fmt: skip
    assert original == {"pythia-160m": 32, "pythia-410m": 96, "pythia-1b": 192, "pythia-2.8b": 576,
                        "pythia-6.9b": 1280, "roberta-large": 1024, "convnext-xlarge-22k": 384,
                        "vit-large-in21k": 240}  # fmt: skip


def test_gpu_memory(catalog):
    mem = {n: catalog.gpu(n).memory_gib for n in ("rtx3090", "a6000", "a100", "h100")}
    assert mem == {"rtx3090": 24, "a6000": 48, "a100": 80, "h100": 80}


def test_peak_for(catalog):
    a100, v100, cpu = catalog.gpu("a100"), catalog.gpu("v100"), catalog.gpu("cpu")
    assert a100.peak_for("bf16") == 312
    assert a100.peak_for("fp32") == 19.5
    assert a100.peak_for("fp32", tf32=True) == 156
    assert v100.peak_for("fp32", tf32=True) == 15.7  # no TF32 on V100: the fp32 peak
    assert v100.peak_for("bf16") is None
    assert cpu.peak_for("bf16") is None and cpu.peak_for("fp32") is None


def test_cpu_stand_in(catalog):
    cpu = catalog.gpu("cpu")
    assert not cpu.supports("fp16") and cpu.supports("fp32")
    assert cpu.supports("bf16") is cpu.bf16 and cpu.bf16_host  # the host decides (tests/test_cpu_bf16.py)
    assert cpu.peak_tflops == {} and cpu.memory_gib is None and cpu.price_usd is None


def test_prices(catalog):
    prices = {n: catalog.gpu(n).price_usd for n in ("rtx3090", "a6000", "a100", "h100")}
    assert prices == {"rtx3090": 1300, "a6000": 4800, "a100": 19000, "h100": 30000}
    assert catalog.gpu("h200").price_usd is None
    assert catalog.base_machine_usd == {1: 1000.0, 2: 1500.0, 4: 7500.0, 8: 10500.0}
    assert all(isinstance(k, int) for k in catalog.base_machine_usd)


# ------------------------------------------------------------------------------------------ defaults


def _tiny_model(**recipe_overrides):
    recipe = {
        "global_batch": 16,
        "steps": 10,
        "sequence_length": 32,
        "precision": "fp32",
        "optimizer": {"name": "adamw", "lr": 1.0e-3},
    }
    recipe.update(recipe_overrides)
    return {
        "family": "gptneox",
        "arch": dict(TINY_GPTNEOX_ARCH),
        "recipe": recipe,
    }


def _write(tmp_path: Path, data, name="models.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_defaults_are_filled(tmp_path):
    path = _write(tmp_path, {"models": {"m": _tiny_model()}})
    spec = load_models(path)["m"]
    r = spec.recipe
    assert spec.supports_compile is True
    assert spec.supports_checkpointing is True
    assert r.grad_clip is None
    assert r.time_budget_hours is None
    assert r.image_size is None
    assert r.mlm_probability == pytest.approx(0.15)
    assert r.schedule == {"name": "constant"}
    assert r.optimizer.betas == (0.9, 0.999)
    assert r.optimizer.eps == pytest.approx(1e-8)
    assert r.optimizer.weight_decay == 0.0
    assert spec.source == ""


def test_supports_partial_override(tmp_path):
    model = _tiny_model()
    model["supports"] = {"activation_checkpointing": False}
    spec = load_models(_write(tmp_path, {"models": {"m": model}}))["m"]
    assert spec.supports_checkpointing is False
    assert spec.supports_compile is True


def test_gpu_defaults_are_filled(tmp_path):
    path = _write(tmp_path, {"gpus": {"x1": {"name": "X", "bf16": True, "fp16": True, "tf32": False}}}, "gpus.yaml")
    gpus, base = load_gpus(path)
    x = gpus["x1"]
    assert x.memory_gib is None and x.price_usd is None and x.cloud_usd_per_gpu_hour is None
    assert x.peak_tflops == {}
    assert base == {}


def test_defaults_are_not_shared_between_loads():
    """Defaults are copied out of the (cached) schema: editing one validated config leaves the next alone."""
    first = validate({"sweep": {"models": ["m"], "gpus": ["g"]}}, "config", "a.yaml")
    assert first["sweep"]["methods"] == ["naive", "fl"]
    first["sweep"]["methods"].append("fl+ac")
    first["launcher"]["kind"] = "slurm"
    second = validate({"sweep": {"models": ["m"], "gpus": ["g"]}}, "config", "b.yaml")
    assert second["sweep"]["methods"] == ["naive", "fl"]
    assert second["launcher"]["kind"] == "local"


# ------------------------------------------------------------------------------------------ bad files


def _broken(tmp_path, mutate) -> Path:
    data = {"models": {"m": _tiny_model()}}
    mutate(data["models"]["m"])
    return _write(tmp_path, data)


def _error(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_models(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    return msg


def _image_family(m):
    m["family"] = "vit"


def _image_size_instead_of_sequence_length(m):
    m["recipe"].pop("sequence_length")
    m["recipe"]["image_size"] = 32


# a broken entry -> what the error must name: the dotted key, the bad value, what is allowed
BROKEN_ENTRIES = {
    "unknown family": (lambda m: m.update(family="falcon"), ["models.m.family", "'falcon'", "gptneox"]),
    "missing global_batch": (
        lambda m: m["recipe"].pop("global_batch"),
        ["models.m.recipe", "'global_batch' is a required property"],
    ),
    "wrong type": (
        lambda m: m["recipe"].update(global_batch="lots"),
        ["models.m.recipe.global_batch", "'lots'", "integer"],
    ),
    "wrong type nested in a list": (
        lambda m: m["recipe"]["optimizer"].update(betas=[0.9, "x"]),
        ["models.m.recipe.optimizer.betas[1]", "'x'"],
    ),
    "unknown key": (
        lambda m: m.update(colour="blue"),
        ["models.m:", "'colour'", "allowed keys: family, arch, recipe, supports, source"],
    ),
    "unknown recipe key": (
        lambda m: m["recipe"].update(batch_size=8),
        ["models.m.recipe:", "'batch_size'", "allowed keys:", "global_batch", "sequence_length"],
    ),
    "text model without sequence_length": (
        lambda m: m["recipe"].pop("sequence_length"),
        ["models.m.recipe", "sequence_length"],
    ),
    "text model with image_size": (
        _image_size_instead_of_sequence_length,
        ["models.m.recipe", "'gptneox' needs sequence_length"],
    ),
    "image model with sequence_length": (_image_family, ["models.m.recipe", "needs image_size"]),
    "both sequence_length and image_size": (lambda m: m["recipe"].update(image_size=32), ["models.m.recipe"]),
    "neither steps nor time budget": (
        lambda m: m["recipe"].pop("steps"),
        ["models.m.recipe", "steps", "time_budget_hours"],
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_ENTRIES))
def test_broken_entry_names_key_value_and_allowed(tmp_path, case):
    mutate, expected = BROKEN_ENTRIES[case]
    msg = _error(_broken(tmp_path, mutate))
    missing = [e for e in expected if e not in msg]
    assert not missing, (missing, msg)


def test_unknown_gpu_key_lists_allowed_keys(tmp_path):
    path = _write(
        tmp_path,
        {"gpus": {"x1": {"name": "X", "bf16": True, "fp16": True, "tf32": False, "fp8": True}}},
        "gpus.yaml",
    )
    with pytest.raises(ConfigError) as info:
        load_gpus(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "gpus.x1:" in msg and "'fp8'" in msg
    assert "allowed keys: name, memory_gib, peak_tflops, bf16, fp16, tf32, price_usd" in msg


@pytest.mark.parametrize(
    "text, expected",
    [("models:\n  m: {family: gptneox, arch: [\n", "not valid YAML"), ("- a\n- b\n", "mapping")],
    ids=["invalid YAML", "top level not a mapping"],
)
def test_unreadable_file(tmp_path, text, expected):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    assert expected in _error(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    msg = _error(path)
    assert "file not found" in msg
    with pytest.raises(ConfigError, match="file not found"):
        load_catalog(path, GPUS_YAML)
    with pytest.raises(ConfigError, match="file not found"):
        load_catalog(MODELS_YAML, tmp_path / "nogpus.yaml")


def test_bad_model_name(tmp_path):
    data = {"models": {"Bad Name": _tiny_model()}}
    msg = _error(_write(tmp_path, data))
    assert "Bad Name" in msg


def test_real_file_with_one_broken_entry_names_it(tmp_path):
    """A copy of the real models.yaml with one mistake: the message points at that model's key."""
    data = yaml.safe_load(MODELS_YAML.read_text())
    data = copy.deepcopy(data)
    data["models"]["pythia-1b"]["recipe"]["precision"] = "fp8"
    path = _write(tmp_path, data)
    msg = _error(path)
    assert "models.pythia-1b.recipe.precision" in msg
    assert "'fp8'" in msg
    assert "bf16" in msg


def test_base_machine_bad_value_names_the_key(tmp_path):
    path = _write(
        tmp_path,
        {"base_machine_usd": {1: -5}, "gpus": {"x1": {"name": "X", "bf16": True, "fp16": True, "tf32": True}}},
        "gpus.yaml",
    )
    with pytest.raises(ConfigError) as info:
        load_gpus(path)
    msg = str(info.value)
    assert str(path) in msg and "base_machine_usd" in msg and "-5" in msg


def test_base_machine_non_integer_gpu_count_is_rejected(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "base_machine_usd: {1: 1000, 1.5: 99}\ngpus:\n  x1: {name: X, bf16: true, fp16: true, tf32: true}\n"
    )
    with pytest.raises(ConfigError, match="base_machine_usd"):
        load_gpus(path)

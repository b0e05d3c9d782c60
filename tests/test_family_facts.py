"""Family facts live in the registry (planning/families.py) and are read through it (issue 41, 2): the study's order,
the position ids a family skips (the budget stage's model and the masked-LM data), and the closed forms each family
points to (planning/formulas.py), which flops.py, memory.py and stepmodel.py ask without naming a formula."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
from pretrain_planner.planning import families, flops, memory, stepmodel
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.families import DISPLAY_ORDER, FAMILIES, Family
from pretrain_planner.planning.formulas import Formula, Transformer

from .conftest import REPO


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def test_display_order_names_every_family_once():
    assert sorted(DISPLAY_ORDER) == sorted(FAMILIES) and len(set(DISPLAY_ORDER)) == len(DISPLAY_ORDER)


def test_the_study_lists_models_in_the_registrys_order(catalog, monkeypatch):
    from pretrain_planner.tables import study

    models = ["tiny-vit", "tiny-gptneox", "tiny-convnext", "tiny-bert", "tiny-mamba"]
    rank = study.model_rank(catalog, models)
    assert sorted(models, key=rank.get) == ["tiny-gptneox", "tiny-bert", "tiny-mamba", "tiny-convnext", "tiny-vit"]
    monkeypatch.setattr(study, "DISPLAY_ORDER", tuple(reversed(DISPLAY_ORDER)))  # the name the study reads
    rank = study.model_rank(catalog, models)
    assert sorted(models, key=rank.get) == ["tiny-vit", "tiny-convnext", "tiny-mamba", "tiny-bert", "tiny-gptneox"]
    assert "FAMILY_ORDER" not in vars(study)  # no second list of the families


def test_position_offset():
    assert FAMILIES["roberta"].position_offset(0) == 1  # numbered from pad_token_id + 1
    assert FAMILIES["roberta-prelayernorm"].position_offset() == 2  # RobertaConfig's default pad_token_id, 1
    assert FAMILIES["bert"].position_offset(0) == 0 and FAMILIES["gptneox"].position_offset() == 0


def _with_offset(monkeypatch, name: str, positions_from_pad: int | None) -> None:
    monkeypatch.setitem(FAMILIES, name, dataclasses.replace(FAMILIES[name], positions_from_pad=positions_from_pad))


@pytest.mark.parametrize("positions_from_pad", [None, 1, 6])
def test_the_family_offset_drives_the_budget_models_positions(monkeypatch, positions_from_pad):
    """The budget stage's model holds the sequence plus the positions its family skips (the tokenizer's pad + 1)."""
    from pretrain_planner.budget.pretrain import model_dict
    from pretrain_planner.planning.configtypes import BudgetModel, BudgetTokenizer
    from pretrain_planner.schema import section

    _with_offset(monkeypatch, "roberta-prelayernorm", positions_from_pad)
    model = BudgetModel("m", "roberta-prelayernorm", {"max_position_embeddings": 1})
    tokenizer = BudgetTokenizer.of(section("budget", "tokenizer", None))
    index = {"vocab_size": 100, "seq_len": 128, "special_ids": {"pad": 4, "unk": 1, "cls": 2, "sep": 3, "mask": 0}}
    expect = 128 + (0 if positions_from_pad is None else 4 + 1)
    assert model_dict(model, tokenizer, index)["arch"]["max_position_embeddings"] == expect


@pytest.mark.parametrize("positions_from_pad", [None, 1, 6])
def test_the_family_offset_drives_the_mlm_datas_sequence_length(monkeypatch, positions_from_pad):
    """The masked-LM data leaves the positions the family skips free (its tokenizer not trained yet: the config
    class's default pad id)."""
    from pretrain_planner.trainer.data.mlm import mlm_config

    _with_offset(monkeypatch, "roberta", positions_from_pad)
    model = {"family": "roberta", "arch": {"max_position_embeddings": 130, "vocab_size": 1000},
             "recipe": {"sequence_length": 128, "mlm_probability": 0.15}}  # fmt: skip
    seq_len = mlm_config([], None, model, 0).data.seq_len
    assert seq_len == min(128, 130 - (0 if positions_from_pad is None else positions_from_pad + 1))


# ------------------------------------------------------------------------------------------------ the formulas
@dataclass(frozen=True)
class _Cube(Formula):
    """A made-up formula: the registry's entry is all that flops.py, memory.py and stepmodel.py need."""

    name: ClassVar[str] = "cube"

    def tokens(self, model):
        return 2 * model["recipe"]["sequence_length"]

    def params(self, model):
        return float(model["arch"]["hidden_size"] ** 3)

    def train_flops(self, model):
        return 6.0 * self.params(model) * self.tokens(model)

    def layer_elements(self, model, compiled, eager_attention):
        return 3.0 * model["arch"]["hidden_size"] if compiled else 5.0 * model["arch"]["hidden_size"]

    def memory_bytes(self, model, eager_attention):
        return 100.0 * self.tokens(model) + (1.0 if eager_attention else 0.0)


@pytest.fixture
def cube(catalog, monkeypatch):
    """tiny-gptneox's recipe on a family of the made-up formula, registered in FAMILIES only."""
    monkeypatch.setitem(FAMILIES, "cube", Family("cube", "causal_lm", "GPTNeoXConfig", "GPTNeoXForCausalLM", False,
                                                 False, _Cube(), ("hidden_size", "num_hidden_layers")))  # fmt: skip
    base = catalog.models["tiny-gptneox"]
    arch = {"hidden_size": 10, "num_hidden_layers": 3, "vocab_size": 7}
    return dataclasses.replace(base, name="tiny-cube", family="cube", arch=arch)


def test_a_new_formula_is_one_registry_entry(cube):
    d, seq = cube.to_dict(), cube.recipe.sequence_length
    assert FAMILIES["cube"].formula == "cube"
    assert flops.tokens_per_sample(d) == 2 * seq
    assert flops.param_count(d) == 1000.0
    assert flops.train_flops_per_sample(d) == 6.0 * 1000 * 2 * seq
    width = 2 if cube.recipe.precision == "fp32" else 1
    assert stepmodel.memory_bytes_per_sample(d) == width * 100.0 * 2 * seq
    assert stepmodel.memory_bytes_per_sample(d, eager_attention=True) == width * (100.0 * 2 * seq + 1)
    # naive: not compiled, 5 h elements per token and layer, plus the plain head's fp32 log-probabilities
    b, head = memory.width(cube.recipe.precision), 2 * seq * 7 * 4
    assert memory.activation_bytes_per_sample(cube, "naive") == 2 * seq * 3 * 5.0 * 10 * b + head
    assert memory.activation_bytes_per_sample(cube, "fl") == 2 * seq * 3 * 3.0 * 10 * b + head  # compiled: 3 h
    assert memory.activation_bytes_per_sample(cube, "naive+ac") == 2 * seq * 3 * 10 * b + head  # each layer's input
    assert memory.predicted_micro_batch(cube, "naive", 1, 80, 8) == 8


def test_a_family_without_a_formula_has_no_estimate(catalog, monkeypatch):
    monkeypatch.setitem(FAMILIES, "free", dataclasses.replace(FAMILIES["gptneox"], name="free", closed_form=None))
    spec = dataclasses.replace(catalog.models["tiny-gptneox"], family="free")
    d = spec.to_dict()
    assert FAMILIES["free"].formula is None
    assert flops.param_count(d) is None and flops.train_flops_per_sample(d) is None
    assert flops.tokens_per_sample(d) == spec.recipe.sequence_length  # a text family's sequence still
    assert stepmodel.memory_bytes_per_sample(d) is None and memory.activation_bytes_per_sample(spec, "fl") is None


def test_gpt_neox_facts_are_its_formulas_settings(catalog):
    """GPT-NeoX's untied head and parallel residual are settings of its formula, not a test of its name."""
    assert FAMILIES["gptneox"].closed_form == Transformer(tied=False, parallel_residual=True)
    spec = catalog.models["tiny-gptneox"]
    a = spec.arch
    embed = a["vocab_size"] * a["hidden_size"]
    untied, tied = (flops.param_count({**spec.to_dict(), "arch": {**a, "tie_word_embeddings": t}}) for t in (0, 1))
    assert untied - tied == embed and flops.param_count(spec.to_dict()) == untied
    off = dataclasses.replace(spec, arch={**a, "use_parallel_residual": False})
    tokens = spec.recipe.sequence_length
    drop = memory.activation_bytes_per_sample(off, "naive") - memory.activation_bytes_per_sample(spec, "naive")
    assert drop == a["num_hidden_layers"] * a["hidden_size"] * tokens * memory.width(spec.recipe.precision)


def test_no_module_tests_a_formulas_name():
    """The closed forms are chosen by the family's formula object, never by testing its name against a literal
    (a new formula would otherwise need an edit in every module with such a chain). Comparing two workloads'
    formulas (the what-if's stand-ins) is no such test."""
    pkg = REPO / "workflow/pretrain_planner"
    pattern = re.compile(r"""formula\s*(==|!=|(not\s+)?in\s*[(\[{])\s*["']""")
    hits = [f"{p.relative_to(pkg)}:{i}" for p in sorted(pkg.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]  # fmt: skip
    assert hits == []


def test_the_registry_is_the_formulas_one_home():
    """flops.py, memory.py and stepmodel.py keep no closed form of their own."""
    for mod in (flops, memory, stepmodel):
        assert not [n for n in vars(mod) if n in ("_transformer_block", "_mamba_block", "_convnext_macs", "_patches",
                                                   "_layer_elements")], mod.__name__  # fmt: skip
    assert families.FAMILIES["vit"].closed_form.tokens({"arch": {"image_size": 224, "patch_size": 16}}) == 197

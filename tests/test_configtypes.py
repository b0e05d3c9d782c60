"""One typed config at the entrance (issue 56): the validated config's sections become frozen dataclasses where the
config is loaded (the facade, the CLI), with every value the schema's or the file's, and the functions below the
entrance take them, never a dict read by key. No training: the facade in-process, each refusal before a job."""

from __future__ import annotations

import copy
from dataclasses import FrozenInstanceError, asdict, fields
from types import SimpleNamespace

import pytest
import yaml
from pretrain_planner.facade.pipeline import load
from pretrain_planner.planning.configtypes import TrainSection
from pretrain_planner.schema import load_schema, resolve_path, schema_defaults

from .conftest import REPO, write_plan

DEMO = yaml.safe_load((REPO / "config/config.yaml").read_text())


def _demo(**sections) -> dict:
    config = copy.deepcopy(DEMO)
    config.update(sections)
    return config


def test_the_default_config_gives_the_typed_train_section_with_the_schemas_values():
    """Every key of the schema's `train:` is a field (none more), each the file's value or the schema's default;
    the value is frozen: a change goes through dataclasses.replace, never by key."""
    schema_keys = list(load_schema("config")["properties"]["train"]["properties"])
    assert [f.name for f in fields(TrainSection)] == schema_keys
    pipe = load(_demo(), REPO)
    assert isinstance(pipe.train, TrainSection)
    defaults = {k.split(".", 1)[1]: v for k, v in schema_defaults("config").items() if k.startswith("train.")}
    assert asdict(pipe.train) == {**defaults, **DEMO.get("train", {})}
    assert pipe.train.steps == DEMO["train"]["steps"] and pipe.train.eval_every == defaults["eval_every"]
    assert TrainSection.defaults() == TrainSection(**defaults)
    with pytest.raises(FrozenInstanceError):
        pipe.train.steps = 3  # type: ignore[misc]


def test_the_train_device_is_typed_once_from_the_train_and_benchmark_sections():
    assert load(_demo(), REPO).train_device == "auto"
    assert load(_demo(train={"device": "cpu"}), REPO).train_device == "cpu"
    assert load(_demo(benchmark={**DEMO.get("benchmark", {}), "device": "cpu"}), REPO).train_device == "cpu"


def test_a_section_that_was_not_validated_is_refused_naming_its_keys():
    with pytest.raises(ValueError, match=r"missing \[.*'eval_every'.*unknown \['step'\]"):
        TrainSection.of({"step": 3})
    with pytest.raises(TypeError, match="mapping"):
        TrainSection.of(None)  # type: ignore[arg-type]


def test_the_train_stage_below_the_entrance_refuses_a_dict(tmp_path):
    """train/jobs.py's rule, launcher and data check and train/run.py's run take the TrainSection the facade (or the
    CLI) typed; the config's dict is refused in one line naming the class, before any job or torch work."""
    from pretrain_planner.train import jobs
    from pretrain_planner.train.run import RunOptions, _Train

    plan = write_plan(tmp_path / "plan", "tiny-gptneox")
    section = load(_demo(), REPO).config["train"]  # the validated dict: what used to be passed down
    launch = {"kind": "debug"}
    wildcards = SimpleNamespace(model="tiny-gptneox", gpu="cpu", nodes="1", gpus_per_node="1")
    calls = {
        "train.jobs.check_data": lambda: jobs.check_data(yaml.safe_load(plan.read_text()), section),
        "train.jobs.run_plan": lambda: jobs.run_plan(plan, launch, tmp_path / "out", tmp_path / "log", section),
        "train.jobs.train_rule": lambda: jobs.train_rule(str(plan), wildcards, section, {"kind": "debug"}, "cpu",
                                                          str(tmp_path / "out/result.json"), str(tmp_path / "log"), 1,
                                                          REPO),
        "train.run._Train": lambda: _Train({}, plan, tmp_path / "out", {"threads": 1, **section}),  # type: ignore
    }  # fmt: skip
    for where, call in calls.items():
        with pytest.raises(TypeError, match=rf"{where}: takes a (TrainSection|RunOptions)"):
            call()
    assert not (tmp_path / "out").exists()  # refused before anything was made
    assert RunOptions.__dataclass_params__.frozen  # type: ignore[attr-defined]


def _budget_stage(tmp_path):
    from pretrain_planner.facade.budget import BudgetStage

    return BudgetStage("config/budget.yaml", REPO, str(tmp_path / "results"), load(_demo(), REPO).config, 2)


def test_the_default_budget_file_gives_its_typed_recipe_with_the_files_and_the_schemas_values(tmp_path):
    """config/budget.yaml through the facade (BudgetStage): its recipe typed once, every key of the schema's
    `train:` a field, each the file's value or the schema's default (nested sections too); the job's JSON reads
    back to the same typed section."""
    from pretrain_planner.planning.configtypes import BudgetGlue, BudgetRecipe, BudgetTrain, BudgetValidation

    stage = _budget_stage(tmp_path)
    recipe = stage.recipe("")
    assert isinstance(recipe, BudgetRecipe) and recipe.train is stage.train and isinstance(stage.train, BudgetTrain)
    train_schema = load_schema("budget")["properties"]["train"]["properties"]
    assert [f.name for f in fields(BudgetTrain)] == list(train_schema)
    assert [f.name for f in fields(BudgetValidation)] == list(train_schema["validation"]["properties"])
    given = yaml.safe_load((REPO / "config/budget.yaml").read_text())["train"]
    defaults = schema_defaults("budget")
    flat = {k: v for k, v in asdict(stage.train).items() if not isinstance(v, dict)}
    for key, value in flat.items():
        want = given.get(key, defaults.get(f"train.{key}"))
        assert value == (tuple(want) if isinstance(want, list) else want), key
    for key, value in asdict(stage.train.validation).items():
        assert value == (given.get("validation") or {}).get(key, defaults[f"train.validation.{key}"]), key
    assert recipe.model == given_model() and recipe.recipe is None and recipe.setting.world_size == 1
    assert BudgetTrain.of(recipe.to_job()["train"]) == recipe.train  # the job types its JSON back to the same
    glue_schema = load_schema("budget")["properties"]["glue"]["properties"]
    assert [f.name for f in fields(BudgetGlue)] == list(glue_schema) and stage.glue is recipe.glue
    given_glue = yaml.safe_load((REPO / "config/budget.yaml").read_text()).get("glue") or {}
    for key, value in asdict(stage.glue).items():
        want = given_glue.get(key, defaults[f"glue.{key}"])
        want = str(resolve_path(want, REPO)) if key == "data_dir" else want  # resolved as budget/config.load does
        assert value == (tuple(want) if isinstance(want, list) else want if key not in AXES else (want,)), key
    assert BudgetGlue.of(recipe.to_job()["glue"]) == recipe.glue


AXES = ("lr", "batch", "epochs", "seeds", "tasks", "from_mnli")  # a single value there is a one-value axis


def given_model() -> str:
    return yaml.safe_load((REPO / "config/budget.yaml").read_text())["model"]["name"]


def test_the_budget_stage_below_the_entrance_refuses_a_dict(tmp_path):
    """budget/jobs.py's rules, budget/config.py's launcher and threads and budget/pretrain.py's run spec take the
    recipe / train section the facade typed; the config's dict is refused in one line naming the class."""
    from pretrain_planner.budget import config as bconfig
    from pretrain_planner.budget import glue, glue_train, jobs, pretrain

    stage = _budget_stage(tmp_path)
    cfg = stage.recipes[""]  # the validated recipe's dict: what used to be passed down
    debug, log = {"kind": "debug", "timeout_min": 1, "slurm": None}, str(tmp_path / "log")
    calls = {
        "budget.jobs.pretrain": lambda: jobs.pretrain(cfg, debug, "i", "m", "r", str(tmp_path / "run"), log),
        "budget.jobs.finetune": lambda: jobs.finetune(cfg, debug, "rte", "m", str(tmp_path / "glue/m.json"), log),
        "budget.config.launch_settings": lambda: bconfig.launch_settings({"kind": "debug"}, cfg["train"], "b", REPO),
        "budget.config.set_torch_threads": lambda: bconfig.set_torch_threads(cfg["train"], 1),
        "budget.pretrain.run_spec": lambda: pretrain.run_spec(cfg["train"], cfg["setting"], {}, {}, 8, None),
        "budget.glue.grid": lambda: glue.grid(cfg["glue"]),
        "budget.glue_train.train_run": lambda: glue_train.train_run(None, None, [], [], {}, None, cfg["glue"], lr=1e-3,
                                                                   batch=4, epochs=1, seed=0, device=None),
    }  # fmt: skip
    for where, call in calls.items():
        with pytest.raises(TypeError, match=rf"{where}: takes a (BudgetRecipe|BudgetTrain|BudgetGlue)"):
            call()
    assert not (tmp_path / "run").exists() and not (tmp_path / "glue").exists() and not (tmp_path / "log").exists()

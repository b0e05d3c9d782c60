"""One typed config at the entrance (issue 56): the validated config's sections become frozen dataclasses where the
config is loaded (the facade, the CLI), with every value the schema's or the file's, and the functions below the
entrance take them, never a dict read by key. No training: the facade in-process, each refusal before a job."""

from __future__ import annotations

import copy
import json
from dataclasses import FrozenInstanceError, asdict, fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pretrain_planner.facade.pipeline import load
from pretrain_planner.planning.configtypes import BudgetRecipe, TrainSection
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
    assert recipe.model.name == given_model() and recipe.recipe is None and recipe.setting.world_size == 1
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


def test_the_budget_files_data_sections_and_model_are_typed_once_with_the_files_values(tmp_path):
    """seed, corpus, tokenizer and data (what prepares the data) and the resolved model are typed in the recipe;
    every schema key a field; the prepare_data rule's params (`BudgetPrep.to_json`) are the file's sections as
    they were (keys in order: a changed params would prepare the data again)."""
    from pretrain_planner.planning.configtypes import BudgetCorpus, BudgetData, BudgetModel, BudgetPrep, BudgetTokenizer

    stage = _budget_stage(tmp_path)
    cfg, recipe = stage.recipes[""], stage.recipe("")
    props = load_schema("budget")["properties"]
    for cls, key in ((BudgetCorpus, "corpus"), (BudgetTokenizer, "tokenizer"), (BudgetData, "data")):
        assert [f.name for f in fields(cls)] == list(props[key]["properties"]), key
    assert isinstance(recipe.prep, BudgetPrep) and recipe.prep.seed == cfg["seed"]
    old_params = {k: cfg[k] for k in ("seed", "corpus", "tokenizer", "data")}
    assert recipe.prep.to_json() == old_params  # the data's fingerprint (sorted keys)
    params = stage.data_params(SimpleNamespace(data="data"))
    assert repr(params) == repr(old_params)  # Snakemake compares params by repr: the file's key order kept
    assert stage.data == {"data": recipe.prep} and stage.corpus() == cfg["corpus"]["files"]
    assert recipe.model == BudgetModel(cfg["model"]["name"], cfg["model"]["family"], cfg["model"]["arch"])
    job = BudgetRecipe.of(recipe.to_job())
    assert (job.prep, job.model, job.named) == (recipe.prep, recipe.model, None)
    with pytest.raises(ValueError, match=r"corpus: not a validated section .*missing \['format', 'text_field'"):
        BudgetCorpus.of({"files": ["a.txt"], "validation_fraction": 0.1}, "corpus")


def test_a_swept_recipe_types_its_own_data_and_names_itself(tmp_path):
    """budget.sweep's seq_len gives a recipe data of its own ({data} wildcard data-seq<N>), typed; the recipe's
    name and values are what its result records."""
    from pretrain_planner.budget import sweep

    stage = _budget_stage(tmp_path)
    base = stage.recipes[""]
    swept = sweep.recipes({**copy.deepcopy(base), "sweep": {"seq_len": [base["data"]["seq_len"] // 2]}})
    typed = {k: BudgetRecipe.of(v) for k, v in swept.items()}
    (name,) = sweep.swept(swept)
    half = base["data"]["seq_len"] // 2
    assert sweep.data_sets(typed) == {"data": typed[""], f"data-seq{half}": typed[name]}
    assert typed[name].named == {"name": f"seq{half}", "values": {"seq_len": half}} and typed[""].named is None


def test_the_budget_data_and_model_below_the_entrance_refuse_a_dict(tmp_path):
    """prepare_data (the prepare_data rule, the train stage's masked-LM data), the pre-training's model and run,
    and the {data} wildcard take the typed sections; the dict is refused naming the class, before any file."""
    from pretrain_planner.budget import pretrain, sweep
    from pretrain_planner.trainer.data import mlm

    cfg = _budget_stage(tmp_path).recipes[""]
    index = {"vocab_size": 100, "seq_len": 32, "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}
    calls = {
        "trainer.data.mlm.prepare_data": lambda: mlm.prepare_data(cfg, tmp_path / "data/index.json"),
        "budget.pretrain.model_dict": lambda: pretrain.model_dict(cfg, cfg, index),
        "budget.sweep.data_key": lambda: sweep.data_key(cfg, cfg),
        "budget.pretrain._Run": lambda: pretrain._Run(cfg, tmp_path / "i.json", tmp_path / "run", None, 1, 0.0),
    }
    for where, call in calls.items():
        with pytest.raises(TypeError, match=rf"{where}: takes a (BudgetPrep|BudgetModel|BudgetRecipe)"):
            call()
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_the_typed_sections_keep_the_fingerprints_of_data_and_checkpoints_made_before(tmp_path):
    """The prepared data's and a pre-training checkpoint's fingerprints are those of the sections by key (as the
    code before the types computed them): data and checkpoints made before are reused, not made again."""
    from pretrain_planner.budget import pretrain
    from pretrain_planner.planning.configtypes import BudgetPrep
    from pretrain_planner.planning.corpus import content_fingerprint
    from pretrain_planner.runlog import fingerprint
    from pretrain_planner.trainer.data import mlm

    from .conftest import budget_cfg

    cfg = budget_cfg(tmp_path)
    recipe = BudgetRecipe.of(cfg)
    assert mlm.prepare_data(recipe.prep, tmp_path / "data/index.json", stop_after_shards=1) is None
    progress = json.loads((tmp_path / "data/progress.json").read_text())
    old = fingerprint(cfg["seed"], cfg["corpus"], cfg["tokenizer"], cfg["data"],
                      content_fingerprint(cfg["corpus"]["files"]))  # fmt: skip
    assert progress["fingerprint"] == old
    index = {"fingerprint": "f", "vocab_size": 300, "seq_len": 32,
             "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}  # fmt: skip
    mdict = pretrain.model_dict(recipe.model, recipe.prep.tokenizer, index)
    job = json.loads(json.dumps(recipe.to_job()))  # what the job gets
    keyed = {k: v for k, v in job["train"].items() if k not in ("max_steps", "checkpoint_every_s", "log_every",
                                                                  "device", "threads", "setting", "micro_batch",
                                                                  "method", "plot")}  # fmt: skip
    setting = recipe.setting
    used = {k: setting.to_json()[k] for k in ("micro_batch", "grad_accum_steps", "world_size", "method")}
    assert pretrain._run_fingerprint(BudgetRecipe.of(job), setting, index, mdict) == fingerprint(
        "f", job["seed"], mdict, keyed, used
    )
    assert isinstance(BudgetPrep.of(job), BudgetPrep)


def test_the_calendar_takes_the_typed_train_section(tmp_path):
    """tables/calendar.py's train-stage rows read the TrainSection the facade typed (the calendar rule's params
    hold its JSON); the config's dict is refused naming the class, before a file is written."""
    import polars as pl
    from pretrain_planner.tables import calendar

    section = load(_demo(), REPO).config["train"]
    out = {"calendar_csv": str(tmp_path / "t/calendar.csv"), "calendar_md": str(tmp_path / "t/calendar.md")}
    calls = {
        "tables.calendar.settings_of": lambda: calendar.settings_of(pl.DataFrame(), pl.DataFrame(), section),
        "tables.calendar.build_calendar": lambda: calendar.build_calendar({}, out, str(tmp_path / "log"), None,
                                                                          None, section),  # type: ignore[arg-type]
    }  # fmt: skip
    for where, call in calls.items():
        with pytest.raises(TypeError, match=rf"{where}: takes a TrainSection"):
            call()
    assert not (tmp_path / "t").exists() and not (tmp_path / "log").exists()
    budget = TrainSection.of({**section, "time_budget_hours": 2.0})
    assert calendar.train_hours(budget, None) == (2.0, "the config's train.time_budget_hours (training time)")


def test_the_evidence_section_is_typed_once_and_names_the_folder(tmp_path):
    """The config's `evidence:` is typed where the config is loaded (the facade; the CLI from the answered config,
    the schema's defaults for a record without it); the whatif rule's settings take it typed, the dict refused."""
    from pretrain_planner.cli.config import evidence_folder, evidence_of
    from pretrain_planner.planning.configtypes import EvidenceSection
    from pretrain_planner.tables import whatif

    assert [f.name for f in fields(EvidenceSection)] == list(
        load_schema("config")["properties"]["evidence"]["properties"]
    )
    pipe = load(_demo(), REPO)
    assert isinstance(pipe.evidence, EvidenceSection)
    assert pipe.evidence.folder_in(pipe.results) == Path(pipe.results) / "evidence"  # no folder: under the results
    moved = load(_demo(evidence={"folder": str(tmp_path / "ev"), "site": "here"}), REPO)
    assert moved.evidence == EvidenceSection(str(tmp_path / "ev"), "here")
    settings = whatif.rule_settings(moved.config, moved.catalog, moved.evidence)
    assert settings["evidence_folder"] == str(tmp_path / "ev") and settings["evidence_digest"] == "none"
    with pytest.raises(TypeError, match=r"tables.whatif.rule_settings: takes a EvidenceSection"):
        whatif.rule_settings(moved.config, moved.catalog, moved.config["evidence"])  # type: ignore[arg-type]
    assert evidence_of({"results": "r"}) == EvidenceSection(None, None)  # a record without the section
    assert str(evidence_folder({"results": "r"})) == "r/evidence"


def test_the_train_stages_masked_lm_data_keeps_its_fingerprint(tmp_path):
    """The train stage's masked-LM data (trainer/tasks.masked_lm: mlm_config, typed) is fingerprinted by the corpus
    keys its settings had as a dict (files, validation fraction, text field; the format always detected): its data
    and the runs checkpointed on it (their identity holds the data's fingerprint) are not made again."""
    import math

    from pretrain_planner.planning.corpus import content_fingerprint
    from pretrain_planner.planning.families import family
    from pretrain_planner.runlog import fingerprint
    from pretrain_planner.schema import section
    from pretrain_planner.trainer.data import mlm

    from .conftest import CATALOG

    model = CATALOG.model("tiny-bert").to_dict()
    files = [str(p) for p in sorted((REPO / "tests/data/corpus").glob("*.txt"))]
    prep = mlm.mlm_config(files, None, model, 3, "text")
    index = mlm.prepare_data(prep, tmp_path / "d/index.json", corpus_keys=mlm.TRAIN_CORPUS_KEYS)
    seq, p = model["recipe"]["sequence_length"], model["recipe"]["mlm_probability"]
    room = model["arch"]["max_position_embeddings"] - family(model["family"]).position_offset()
    old = {  # the settings as the train stage made them before they were typed
        "corpus": {"files": files, "validation_fraction": 0.05, "text_field": "text"},
        "tokenizer": section("budget", "tokenizer", {"path": None, "vocab_size": 512}),
        "data": section("budget", "data", {"seq_len": min(seq, room), "mlm_probability": p, "duplication_factor": 2,
                                           "max_predictions": max(1, math.ceil(seq * p)), "samples_per_shard": 4096}),
    }  # fmt: skip
    want = fingerprint(3, old["corpus"], old["tokenizer"], old["data"], content_fingerprint(files))
    assert index is not None and index["fingerprint"] == want

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

    return BudgetStage("config/budget.yaml", REPO, str(tmp_path / "results"), load(_demo(), REPO).launcher, 2)


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


# --- the config's sweep, benchmark and launcher sections (and a job's launch with its site settings) -------------
def _section_keys(*path: str) -> list[str]:
    schema = load_schema("config")
    for key in path:
        schema = schema["properties"][key]
    return list(schema["properties"])


def test_the_sweep_benchmark_and_launcher_sections_are_typed_once_with_the_files_and_the_schemas_values():
    """Every key of the schema's `sweep:`, `benchmark:` (and its `loss_check:`) and `launcher:` is a field (none
    more), each the file's value or the schema's default; the facade types each section once, frozen."""
    from pretrain_planner.planning.configtypes import (
        BenchmarkSection,
        LauncherSection,
        LossCheckSection,
        SweepSection,
    )

    for cls, path in ((SweepSection, ("sweep",)), (BenchmarkSection, ("benchmark",)), (LauncherSection, ("launcher",)),
                      (LossCheckSection, ("benchmark", "loss_check"))):  # fmt: skip
        assert [f.name for f in fields(cls)] == _section_keys(*path), cls.__name__
    pipe = load(_demo(), REPO)
    defaults = schema_defaults("config")
    assert pipe.sweep == SweepSection(**{k: tuple(DEMO["sweep"].get(k, defaults.get(f"sweep.{k}"))) for k in
                                         _section_keys("sweep")})  # fmt: skip
    for key in _section_keys("launcher"):
        assert getattr(pipe.launcher, key) == DEMO["launcher"].get(key, defaults[f"launcher.{key}"]), key
    for key in _section_keys("benchmark"):
        if key != "loss_check":
            assert getattr(pipe.benchmark, key) == DEMO["benchmark"].get(key, defaults[f"benchmark.{key}"]), key
    for key in _section_keys("benchmark", "loss_check"):
        given = DEMO["benchmark"]["loss_check"]
        assert getattr(pipe.loss_check, key) == given.get(key, defaults[f"benchmark.loss_check.{key}"]), key
    assert pipe.loss_check is pipe.benchmark.loss_check
    for value in (pipe.sweep, pipe.benchmark, pipe.launcher, pipe.loss_check):
        with pytest.raises(FrozenInstanceError):
            value.seed = 1  # type: ignore[misc,union-attr]
    off = load(_demo(benchmark={"loss_check": {"mode": False}}), REPO)  # YAML's unquoted off
    assert off.loss_check.mode == "off" and off.loss_check_folders() == []


def test_the_site_file_is_typed_where_the_config_is_loaded_each_gpu_type_with_its_full_settings():
    """A slurm config's site file (launcher.site) is read once by the facade into a SiteFile: its schema's keys
    (and where it is), narrowed to the sweep's GPU types, each with the file's defaults under its entry and its
    partition's limits resolved; a cell's `slurm` is that GPU type's settings as JSON."""
    from pretrain_planner.planning.configtypes import SiteFile

    pipe = load(_demo(launcher={"kind": "slurm", "site": "cluster/slurm/site.yaml"}), REPO)
    assert isinstance(pipe.site, SiteFile)
    assert [f.name for f in fields(SiteFile)] == ["path", *load_schema("site")["properties"]]
    given = yaml.safe_load((REPO / "cluster/slurm/site.yaml").read_text())
    assert set(pipe.site.gpus) == set(DEMO["sweep"]["gpus"]) and pipe.site.poll_max_s == given["poll_max_s"]
    cpu = pipe.site.gpus["cpu"]
    defaults = schema_defaults("site")
    for key in load_schema("site")["$defs"]["settings"]["properties"]:
        want = (given["gpus"]["cpu"] or {}).get(key, given["defaults"].get(key, defaults.get(f"defaults.{key}")))
        assert cpu[key] == want, key
    assert set(cpu["limits"]) == {"max_nodes", "gpus_per_node", "max_time_h"}  # resolved at load
    wildcards = SimpleNamespace(model="tiny-bert", gpu="cpu", nodes="1", gpus_per_node="1", method="fl")
    spec = pipe.spec(wildcards, SimpleNamespace(result="r.json", steps="s.jsonl"))
    assert spec["slurm"] == {**cpu, "gpu_type": "cpu", "site": pipe.site.path}
    with pytest.raises(FrozenInstanceError):
        pipe.site.poll_max_s = 1  # type: ignore[misc]


def test_a_jobs_json_is_the_config_it_was_given_key_for_key_in_its_order():
    """The cell's and the check's specs and the plan's params are the rules' params, which Snakemake compares by
    their repr: typed or not, each is the validated section, in the order the config wrote its keys (a config that
    writes `device` before `seed`, as config/paper.yaml does, keeps every measured cell)."""
    from pretrain_planner.planning.configtypes import BenchmarkSection, Launch, LauncherSection

    config = _demo(benchmark={"timed_steps": 3, "device": "cpu", "warmup_steps": 1, "loss_check": {"steps": 4}},
                   launcher={"timeout_min": 9, "kind": "local"},
                   sweep={**DEMO["sweep"], "methods": ["naive", "fl"], "nodes": [1],
                          "models": ["tiny-bert"]})  # fmt: skip
    pipe = load(config, REPO)
    validated = pipe.config
    wildcards = SimpleNamespace(model="tiny-bert", gpu="cpu", nodes="1", gpus_per_node="1", method="fl")
    spec = pipe.spec(wildcards, SimpleNamespace(result="r.json", steps="s.jsonl"))
    assert list(spec["benchmark"].items()) == [(k, v) for k, v in validated["benchmark"].items() if k != "loss_check"]
    assert list(spec["launcher"].items()) == [(k, v) for k, v in validated["launcher"].items() if k != "site"]
    assert list(pipe.plan_params()["sweep"].items()) == list(validated["sweep"].items())
    check = pipe.loss_check_spec({"model": "tiny-bert", "gpu": "cpu", "nodes": "1", "gpus_per_node": "1"})
    assert list(check["benchmark"]) == list(validated["benchmark"]) and check["benchmark"]["loss_check"]["steps"] == 4
    # the job types its JSON back at its entrance: the same values
    assert BenchmarkSection.of_job(check["benchmark"]) == pipe.benchmark
    assert BenchmarkSection.of_job(spec["benchmark"]).device == "cpu"
    launch = Launch.of_job(spec)
    assert launch.launcher == LauncherSection.of({**validated["launcher"], "site": None}) and launch.slurm is None
    with pytest.raises(ValueError, match=r"the job's spec: launcher: .*missing \['timeout_min'"):
        Launch.of_job({**spec, "launcher": {"kind": "local"}})  # a spec that did not come from the facade


def test_the_loss_check_job_types_its_spec_at_its_entrance(tmp_path):
    """launch/losscheck.run_check reads the check's settings typed from its spec: a setting whose naive did not
    train records why, with the spec's steps and seed, and starts no job."""
    import json

    from pretrain_planner.launch.losscheck import run_check

    pipe = load(_demo(results=str(tmp_path / "results")), REPO)
    spec = pipe.loss_check_spec({"model": "tiny-bert", "gpu": "cpu", "nodes": "1", "gpus_per_node": "1"})
    curves = tmp_path / "curves.json"
    record = run_check(spec, [], str(curves), str(tmp_path / "check.log"))
    assert record["note"].startswith("naive did not train at this setting") and record["runs"] == []
    assert record["check"]["steps"] == DEMO["benchmark"]["loss_check"]["steps"] and record["check"]["seed"] == 0
    assert json.loads(curves.read_text()) == record and not (tmp_path / "submitit").exists()


def test_the_sweep_benchmark_and_launcher_below_the_entrance_refuse_a_dict(tmp_path):
    """The planning, launch, table and stage functions take the sections the facade typed (and a job's launch);
    the config's dict is refused in one line naming the class, before any job."""
    from pretrain_planner.budget import jobs as bjobs
    from pretrain_planner.facade.budget import BudgetStage
    from pretrain_planner.launch import stage
    from pretrain_planner.launch.rankjob import EntryJob
    from pretrain_planner.planning import grid, losscheck, site
    from pretrain_planner.planning.spec import cell_spec
    from pretrain_planner.tables import aggregate, whatif
    from pretrain_planner.train import jobs

    pipe = load(_demo(), REPO)
    config = pipe.config  # the validated dicts: what used to be passed down
    sweep, bench, launcher = config["sweep"], config["benchmark"], config["launcher"]
    launch = {**launcher, "slurm": None}  # what launch/stage.launch_settings used to return
    cell = pipe.cells[0]
    plan = yaml.safe_load(write_plan(tmp_path / "plan", "tiny-gptneox").read_text())
    site_file = site.read_site(REPO / "cluster/slurm/site.yaml")
    site_dict = {**asdict(site_file), "gpus": dict(site_file.gpus)}  # what planning/site.read_site used to return
    calls = {
        "planning.grid.expand": lambda: grid.expand(sweep, launcher, pipe.catalog),  # type: ignore[arg-type]
        "planning.grid.check_sweep": lambda: grid.check_sweep(sweep, pipe.catalog),  # type: ignore[arg-type]
        "planning.spec.cell_spec": lambda: cell_spec(cell, pipe.catalog, bench, launcher, "r", "s"),  # type: ignore
        "planning.losscheck.plan_runs": lambda: losscheck.plan_runs({}, bench["loss_check"], {}, {}, 1, 1, False),
        "planning.losscheck.unplanned": lambda: losscheck.unplanned(bench["loss_check"], ["naive"]),
        "launch.stage.launch_settings": lambda: stage.launch_settings(launcher, "cpu", 1, 1, REPO, "c", "r", "g"),
        "launch.stage.placement": lambda: stage.placement(launch, "cpu", "cpu", 1, 1),  # type: ignore[arg-type]
        "launch.stage.limits": lambda: stage.limits(launch, 1.0),  # type: ignore[arg-type]
        "launch.stage.request": lambda: stage.request(EntryJob("m:f", {}), "n", launch, tmp_path, {}),  # type: ignore
        "train.jobs.launch_settings": lambda: jobs.launch_settings(launcher, plan, REPO),  # type: ignore[arg-type]
        "budget.jobs.pretrain": lambda: bjobs.pretrain(_budget_stage(tmp_path).recipe(""), launch, "i", "m", "r",
                                                       str(tmp_path / "run"), str(tmp_path / "log")),
        "budget.jobs.finetune": lambda: bjobs.finetune(_budget_stage(tmp_path).recipe(""), launch, "rte", "m",
                                                       str(tmp_path / "glue/m.json"), str(tmp_path / "log")),
        "train.jobs.run_plan": lambda: jobs.run_plan(tmp_path / "plan", launch, tmp_path / "out", tmp_path / "log",
                                                     pipe.train),
        "facade.budget.BudgetStage": lambda: BudgetStage("config/budget.yaml", REPO, "r", config, 2),  # type: ignore
        "tables.aggregate.loss_check_table": lambda: aggregate.loss_check_table([], bench["loss_check"]),
        "tables.whatif.counts_of": lambda: whatif.counts_of(sweep, None),  # type: ignore[arg-type]
        "tables.whatif.rule_settings": lambda: whatif.rule_settings(pipe.sweep, bench, pipe.evidence, pipe.costs,
                                                                    pipe.study, pipe.whatif, pipe.catalog,
                                                                    pipe.results),
        "planning.site.for_gpus": lambda: site.for_gpus(site_dict, ["cpu"]),
        "planning.site.resolve_limits": lambda: site.resolve_limits(site_dict),
        "planning.site.within_limits": lambda: site.within_limits(pipe.planned, site_dict),
        "planning.site.gpu_settings": lambda: site.gpu_settings(site_dict, "cpu"),
    }  # fmt: skip
    for where, call in calls.items():
        with pytest.raises(TypeError, match=rf"{where}: takes a (SweepSection|BenchmarkSection|LauncherSection|"
                                            r"LossCheckSection|Launch|SiteFile)\b"):  # fmt: skip
            call()
    assert not any((tmp_path / p).exists() for p in ("run", "log", "glue", "out"))
    # launch/stage.launch_settings's answer is typed (a Launch) for every stage's jobs
    assert stage.launch_settings(pipe.launcher, "cpu", 1, 1, REPO, "c", "r", "g").launcher is pipe.launcher


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
    settings = whatif.rule_settings(moved.sweep, moved.benchmark, moved.evidence, moved.costs, moved.study,
                                    moved.whatif, moved.catalog, moved.results)  # fmt: skip
    assert settings["evidence_folder"] == str(tmp_path / "ev") and settings["evidence_digest"] == "none"
    with pytest.raises(TypeError, match=r"tables.whatif.rule_settings: takes a EvidenceSection"):
        whatif.rule_settings(moved.sweep, moved.benchmark, moved.config["evidence"], moved.costs, moved.study,
                             moved.whatif, moved.catalog, moved.results)  # type: ignore[arg-type]  # fmt: skip
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


# -- the costs, study and whatif sections: the tables' settings ---------------------------------------------------


def _written_out_of_order() -> dict:
    """A sweep config whose costs and study keys are written out of the schema's order (the prices' own keys too):
    what the rules' params must repeat byte for byte."""
    return _demo(
        costs={"prices": {"cpu": {"note": "a quote", "price_usd": 10.0}}, "pareto_cost": "amortised"},
        study={"average_families": ["gptneox"], "gpu_days_gpus_per_node": 4},
        whatif={"models": ["pythia-1b"]},
    )


def test_the_costs_study_and_whatif_sections_are_typed_once_with_the_schemas_keys():
    """Every schema key of `costs:`, `study:` and `whatif:` is a field (none more), each the file's value or the
    schema's default, typed once by the facade (`Pipeline.costs`, `.study`, `.whatif`; the study's GPU type checked
    against the catalog at parse time) and by the CLI (cli/config.costs_of: the schema's defaults for a record
    without the section)."""
    from pretrain_planner.cli.config import costs_of
    from pretrain_planner.planning.configtypes import CostsSection, StudySection, WhatifSection
    from pretrain_planner.schema import ConfigError

    props = load_schema("config")["properties"]
    for cls, key in ((CostsSection, "costs"), (StudySection, "study"), (WhatifSection, "whatif")):
        assert [f.name for f in fields(cls)] == list(props[key]["properties"]), key
    pipe = load(_written_out_of_order(), REPO)
    assert pipe.costs == CostsSection(5, "amortised", {"cpu": {"note": "a quote", "price_usd": 10.0}})
    assert pipe.study == StudySection("a100", 1, 4, ("gptneox",)) and pipe.whatif == WhatifSection(("pythia-1b",))
    assert pipe.catalog.gpus["cpu"].price_usd == 10.0  # the typed section's prices are the catalog's
    assert costs_of(pipe.config) == pipe.costs and costs_of({"results": "r"}) == CostsSection.given()
    with pytest.raises(FrozenInstanceError):
        pipe.costs.pareto_cost = "cloud"  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"study.gpu_days_gpu: 'a1000' is not a GPU type of .*gpus.yaml"):
        load(_demo(study={"gpu_days_gpu": "a1000"}), REPO)  # at parse time, not in the study job
    with pytest.raises(ValueError, match=r"costs: not a validated section .*missing \['amortisation_years'"):
        CostsSection.of({"pareto_cost": "cloud", "prices": {}})


def test_the_rules_params_repeat_the_costs_and_study_sections_byte_for_byte():
    """Snakemake compares a rule's params by their repr (a changed repr reruns a finished rule): the aggregate, plots
    and report rules' costs, the study_tables rule's study and the whatif rule's settings, typed and turned back into
    JSON, are what they were as the config's dicts (the costs keys as the config wrote them, the prices' keys too;
    the study's in the schema's order, as tables/study.study_settings wrote them)."""
    from pretrain_planner.schema import section
    from pretrain_planner.tables import whatif

    for config in (_demo(), _written_out_of_order()):
        pipe = load(config, REPO)
        old = pipe.config  # the validated dicts the rules' params were made of
        assert repr(pipe.costs.to_json()) == repr(old.get("costs", {}))  # aggregate, plots, report
        assert repr(pipe.study.to_json()) == repr(section("config", "study", old.get("study")))  # study_tables
        settings = whatif.rule_settings(pipe.sweep, pipe.benchmark, pipe.evidence, pipe.costs, pipe.study,
                                        pipe.whatif, pipe.catalog, pipe.results)  # fmt: skip
        assert repr(settings["costs_config"]) == repr(old.get("costs", {}))
        assert settings["named"] == old["whatif"]["models"]
        counts = {(n, g) for n in old["sweep"]["nodes"] for g in old["sweep"]["gpus_per_node"]}
        counts.add((old["study"]["gpu_days_nodes"], old["study"]["gpu_days_gpus_per_node"]))
        assert settings["counts"] == sorted(counts, key=lambda c: (c[0] * c[1], c[0]))
    assert list(pipe.costs.to_json()) == ["prices", "pareto_cost", "amortisation_years"]  # as written, then defaults


def test_the_tables_report_and_predictor_refuse_the_costs_study_and_whatif_dicts(tmp_path):
    """Below the facade the cost tables, the Pareto front, the plots, the report, the predictor, the study's views
    and the what-if's settings take the typed sections; the config's dict (what each used to take) is refused in one
    line naming the function and the class, before a file is written. A rule's JSON params are typed at its
    entrance, a section that did not come from the facade named there."""
    import polars as pl
    from pretrain_planner.report import document
    from pretrain_planner.report import plots as pp_plots
    from pretrain_planner.tables import aggregate, study, whatif
    from pretrain_planner.tables.predictor import Predictor, empty_cells

    pipe = load(_demo(), REPO)
    config, catalog, log = pipe.config, pipe.catalog, str(tmp_path / "log")
    costs, study_dict, whatif_dict = config["costs"], config["study"], config["whatif"]  # what used to be passed
    out = {**study.table_files(str(tmp_path / "t")), "report": str(tmp_path / "t/report.md")}

    def rule_settings(**given):
        def call():
            typed = {"costs": pipe.costs, "study": pipe.study, "whatif": pipe.whatif, **given}
            return whatif.rule_settings(pipe.sweep, pipe.benchmark, pipe.evidence, typed["costs"], typed["study"],
                                        typed["whatif"], catalog, pipe.results)  # fmt: skip

        return call

    calls = [
        ("tables.aggregate.costs_table", "CostsSection", lambda: aggregate.costs_table(pl.DataFrame(), catalog, costs)),
        ("tables.aggregate.pareto_table", "CostsSection", lambda: aggregate.pareto_table(pl.DataFrame(), costs)),
        ("tables.predictor.Predictor", "CostsSection", lambda: Predictor(empty_cells(), catalog, 0.85, costs)),
        ("report.plots.figures", "CostsSection", lambda: pp_plots.figures({}, costs)),
        ("report.document.write_report", "CostsSection",
         lambda: document.write_report({}, {}, None, out["report"], log, costs)),
        ("tables.study.build_all", "StudySection", lambda: study.build_all(pl.DataFrame(), catalog, 0.85, study_dict)),
        ("tables.study.intro", "StudySection", lambda: study.intro("gpu_days", study_dict)),
        ("tables.study.build_study_tables", "StudySection",
         lambda: study.build_study_tables(str(tmp_path / "cells.parquet"), out, log, catalog, 0.85, study_dict)),
        ("tables.whatif.counts_of", "StudySection", lambda: whatif.counts_of(pipe.sweep, study_dict)),
        ("tables.whatif.rule_settings", "CostsSection", rule_settings(costs=costs)),
        ("tables.whatif.rule_settings", "StudySection", rule_settings(study=study_dict)),
        ("tables.whatif.rule_settings", "WhatifSection", rule_settings(whatif=whatif_dict)),
    ]  # fmt: skip
    for where, cls, call in calls:
        with pytest.raises(TypeError, match=rf"{where}: takes a {cls} \(planning/configtypes.py"):
            call()
    with pytest.raises(ValueError, match=r"the aggregate rule's params: costs: not a validated section"):
        aggregate.aggregate_rule(None, None, log, catalog, {"costs": {"pareto_cost": "cloud"}, "loss_check": {}})
    with pytest.raises(ValueError, match=r"the whatif rule's settings: costs_config: not a validated section"):
        whatif.build_whatif(str(tmp_path / "cells.parquet"), out, log, catalog, [], [], 0.85, {"pareto_cost": "x"})
    assert not (tmp_path / "t").exists() and not (tmp_path / "log").exists()


def test_no_function_below_the_facade_takes_the_whole_config():
    """Below the entrance (every module but cli/ and facade/) a function takes the typed sections, never the
    config's dict: no parameter is the `config`. The one module that takes it whole is sweeprecord.py, which
    records it as JSON in the results folder (a boundary, as a job's arguments are)."""
    import ast

    package = REPO / "workflow/pretrain_planner"
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(("cli/", "facade/")) or rel == "sweeprecord.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
                if "config" in names:
                    found.append(f"{rel}:{node.lineno} {getattr(node, 'name', 'lambda')}")
    assert not found, f"functions below the facade that take the whole config: {found}"

"""A cell job's entry point on every rank: measure, and (rank 0) write result.json + steps.jsonl."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import time
from typing import Any

import torch

from pretrain_planner.launch.probe import PACKAGES, interpreter
from pretrain_planner.launch.rankjob import job_id_here, observe_rank, recorded_job
from pretrain_planner.planning import flops
from pretrain_planner.planning.catalog import GpuSpec
from pretrain_planner.planning.devices import device_mismatch
from pretrain_planner.planning.flops import mfu, train_flops_per_sample
from pretrain_planner.planning.settings import has_attention
from pretrain_planner.results import write_result, write_steps
from pretrain_planner.trainer import collectives, hostpeak, kernels, methodbuild, startup
from pretrain_planner.trainer.config import RunConfig
from pretrain_planner.trainer.measure import batches_for, measure, percentile
from pretrain_planner.trainer.oom import FakeOom
from pretrain_planner.trainer.rank import RankEnv, Unsupported, close_rank, init_rank
from pretrain_planner.trainer.ranks import Ranks
from pretrain_planner.trainer.step import TrainStep
from pretrain_planner.versions import installed_versions


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Python, CUDA and each package's installed version (None: not installed), for a result's `versions`."""
    return {"python": platform.python_version(), "cuda": torch.version.cuda, **installed_versions(packages)}


def check_device(gpu: dict[str, Any], device: torch.device) -> None:
    """Refuse to measure a device that is not the cell's GPU type (planning/devices: its name and memory against
    the catalog's): a partition mapped to the wrong type would measure, and predict, the wrong GPU."""
    props = torch.cuda.get_device_properties(device)
    why = device_mismatch(GpuSpec.from_dict(gpu), props.name, props.total_memory)
    if why:
        raise RuntimeError(why)


def _device_name(env: RankEnv | None) -> str:
    if env is not None and env.device.type == "cuda":
        return torch.cuda.get_device_name(env.device)
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU ({model or platform.machine()})"


def _counted_flops(cfg: RunConfig, step: TrainStep, env: RankEnv) -> float | None:
    """FLOPs of one sample's forward + backward, counted, for families without a declared formula."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = batches_for(cfg, env, 1, 1)[0]
    with FlopCounterMode(display=False) as counter:
        step.micro(batch, 1.0, sync_grads=not env.distributed)
    step.reset_after_trial()
    return float(counter.get_total_flops())


def check_supported(cfg: RunConfig, env: RankEnv) -> None:
    """Raise Unsupported, the same on every rank and before any collective, if the cell cannot run here."""
    methodbuild.check(cfg.run_spec(env), env)


def _attention_evidence(cfg: RunConfig, env: RankEnv, step: TrainStep, micro_batch: int) -> dict[str, Any] | None:
    """Which attention kernel ran: one more micro-batch of the timed size (no recompile), profiled."""
    if not has_attention(cfg.model):
        return None
    batch = batches_for(cfg, env, micro_batch, 1)[0]
    try:
        return kernels.attention_kernel(lambda: step.micro(batch, 1.0, sync_grads=not env.distributed))
    except Exception as exc:  # noqa: BLE001 - evidence is secondary: the timing is already taken
        if env.distributed:  # a rank that failed inside a collective: the group cannot be trusted
            raise
        return {"attention_kernel": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        step.reset_after_trial()


def make_builder(cfg: RunConfig, env: RankEnv, built: list[dict[str, Any]],
                 timings: list[dict[str, float]] | None = None):  # fmt: skip
    """`build(micro_batch, accum)`: a fresh model (same seed, same weights on every rank and in every
    method) with the method applied, as a TrainStep (trainer/methodbuild.py: the one build path). Appends each
    instance's settings to `built` (and the seconds of its model build and method wrapping to `timings`)."""
    spec, fake = cfg.run_spec(env), FakeOom.from_env()

    def build(micro_batch: int, accum: int) -> TrainStep:
        step = methodbuild.build(spec, env, micro_batch, accum, cfg.bench.seed, lr_every_step=False, fake_oom=fake,
                                 lr_schedule="constant (benchmark; schedule cost is nil)").step  # fmt: skip
        built.append(step.settings)
        if timings is not None:
            timings.append(dict(step.build_timings))
        return step

    return build


def _startup(env: RankEnv, clock: startup.Clock | None, build: dict[str, float], measured: Any) -> dict[str, Any]:
    """result.json `startup`: what one restart of this setting costs before it trains (startup.CELL_RULE); each
    phase the slowest rank's (a collective: every rank calls)."""
    first = measured.first or measured.timing
    trial = measured.trial_micro_s
    values = [
        clock.rank_up_s if clock is not None and clock.rank_up_s is not None else 0.0,
        build.get("model_build_s", 0.0),
        build.get("method_wrap_s", 0.0),
        first.data_s or 0.0,
        (startup.compile_cost(*trial) or 0.0) if trial else 0.0,  # the search's trial: compile at this shape
        startup.compile_cost(first.first_step_s, measured.timing.median) or 0.0,  # a fresh instance's first step
    ]
    values = Ranks.of(env).max(*values)
    where = clock.process_start if clock is not None else "run_rank"
    *before, trial_s, first_s = values
    phases = dict(zip(startup.PHASES, [*before, trial_s + first_s], strict=True))
    return startup.phases(phases, where, startup.CELL_RULE, compile_trial_s=trial_s, first_step_extra_s=first_s)


def measure_cell(
    cfg: RunConfig, env: RankEnv, clock: startup.Clock | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The cell's result fields and its timed steps: search the micro-batch, time, gather the evidence, and what
    a restart costs (`startup`; `clock`: run_rank's, the rank's start)."""
    check_supported(cfg, env)
    built: list[dict[str, Any]] = []
    timings: list[dict[str, float]] = []
    measured = measure(cfg, env, make_builder(cfg, env, built, timings))
    result: dict[str, Any] = {"method_settings": built[-1] if built else None, "micro_batch_trials": measured.trials}
    if built:  # after an OOM every rank joined a fresh process group (oom.py)
        built[-1]["process_group_rebuilds"] = env.generation
    if measured.micro_batch is None:
        last = measured.trials[-1] if measured.trials else {}
        where = f" (out of memory on rank {', '.join(map(str, last.get('oom_ranks') or []))}: {last.get('error')})"
        return {**result, "status": "oom", "reason": "micro-batch 1 does not fit on every rank" + where}, []
    step, timing, micro_batch = measured.step, measured.timing, measured.micro_batch
    settings = _evidence(cfg, env, step, micro_batch, timing)
    settings["timing_spreads"] = measured.spreads
    result["method_settings"] = settings
    result.update(_throughput(cfg, env, step, timing, settings))
    result["step_split"] = collectives.step_split(
        cfg, env, timing.median, micro_batch
    )  # every rank: it is a collective
    result["startup"] = _startup(env, clock, timings[0] if timings else {}, measured)  # every rank: a collective
    step.close()
    accum = cfg.recipe["global_batch"] // cfg.cell.world_size // micro_batch
    spreads = " then ".join(f"{x:.2f}" for x in measured.spreads)
    result.update(
        status="noisy" if measured.noisy else "ok",
        reason=(
            f"timed steps spread p90/p10 {spreads} (timed twice): above benchmark.max_spread "
            f"{cfg.bench.max_spread:g}; something else used this device meanwhile? Excluded from time_to_train"
            if measured.noisy
            else None
        ),
        spread=timing.spread,
        micro_batch=micro_batch,
        grad_accum_steps=accum,
        step_time_p10_s=percentile(timing.step_times, 0.1),
        step_time_p90_s=percentile(timing.step_times, 0.9),
        timed_steps=len(timing.step_times),
        warmup_steps=cfg.bench.warmup_steps,
        peak_mem_gib=timing.peak_mem_gib,
        peak_mem_kind=timing.peak_mem_kind,
        final_loss=timing.losses[-1],
        skipped_steps=timing.skipped_steps if step_scales(timing) else None,
        loss_scale=timing.loss_scales[-1] if timing.loss_scales else None,
    )
    return result, _step_records(timing, micro_batch, accum)


def _evidence(cfg: RunConfig, env: RankEnv, step: TrainStep, micro_batch: int, timing: Any) -> dict[str, Any]:
    """The method's settings with the proof it was in effect: what the step observed, the attention kernel
    that ran, what compilation covered, the collectives of a step, the loss scaling."""
    settings = step.settings
    settings["observed"] = step.observed()
    settings["attention"] = _attention_evidence(cfg, env, step, micro_batch)
    settings["attention_kernel"] = (settings["attention"] or {}).get("attention_kernel")
    if settings.get("compile"):  # what compilation covered (ZeRO-3 breaks the graph at every hooked module)
        settings["compile_observed"] = (settings["attention"] or {}).get("compile_observed") or _compile_evidence(
            cfg, env, step, micro_batch
        )
    settings["collectives_per_step"] = timing.collectives  # c10d ops of one whole step (last warm-up step)
    settings["loss_scaling"] = _loss_scaling_record(step, timing)
    return settings


def _throughput(cfg: RunConfig, env: RankEnv, step: TrainStep, timing: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Step time, samples and tokens per second, FLOPs, MFU against the dense peak (suspect above
    benchmark.suspect_mfu), and what the recipe's steps or time budget make of them."""
    median, gb = timing.median, cfg.recipe["global_batch"]
    per_sample = train_flops_per_sample(cfg.model)
    settings["flops_source"] = "formula"
    if per_sample is None:
        per_sample, settings["flops_source"] = _counted_flops(cfg, step, env), "flop_counter"
    flops_per_step = per_sample * gb if per_sample else None
    if env.device.type == "cuda":  # the catalog's one rule: the dense peak of the precision the step ran in
        peak = GpuSpec.from_dict(cfg.gpu).peak_for(cfg.recipe["precision"], tf32=bool(settings["tf32"]))
        peak_source = "datasheet (the GPU catalog's peak_tflops)" if peak else None
    else:  # a CPU process: no datasheet fits the host, so the host's matmul rate is measured (trainer/hostpeak.py)
        peak, peak_source = hostpeak.matmul_tflops(cfg.recipe["precision"])
    util = mfu(flops_per_step, median, cfg.cell.world_size, peak)
    suspect, suspect_reason = flops.suspect(util, cfg.bench.suspect_mfu)
    tokens = cfg.model["recipe"].get("sequence_length") if cfg.model["task"] != "image_classification" else None
    recipe_steps, budget_h = cfg.recipe.get("steps"), cfg.recipe.get("time_budget_hours")
    return {
        "step_time_s": median,
        "samples_per_s": gb / median,
        "tokens_per_s": gb * tokens / median if tokens else None,
        "flops_per_step": flops_per_step,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "mfu": util,
        "suspect": suspect,
        "suspect_reason": suspect_reason,
        "recipe_steps": recipe_steps,
        "training_days": recipe_steps * median / 86400 if recipe_steps else None,
        "steps_in_budget": budget_h * 3600 / median if budget_h else None,
    }


def _step_records(timing: Any, micro_batch: int, accum: int) -> list[dict[str, Any]]:
    """steps.jsonl: one line per timed step (fp16: the scale it ran with and the steps skipped before it)."""
    steps = [
        {"step": i, "time_s": t, "loss": loss, "micro_batch": micro_batch, "grad_accum_steps": accum}
        for i, (t, loss) in enumerate(zip(timing.step_times, timing.losses, strict=True))
    ]
    if step_scales(timing):
        for rec, scale, skipped in zip(steps, timing.loss_scales, timing.skipped_before, strict=True):
            rec.update(loss_scale=scale, skipped_before=skipped)
    return steps


def step_scales(timing: Any) -> bool:
    """Whether the timed steps ran with a loss scaler (fp16)."""
    return any(s is not None for s in timing.loss_scales)


def _loss_scaling_record(step: TrainStep, timing: Any) -> dict[str, Any] | None:
    if not step_scales(timing):
        return None
    return {
        "skipped_steps": timing.skipped_steps,
        "loss_scales": timing.loss_scales,
        "rule": "a step the loss scaler skipped (inf/nan gradients) is never timed: another step runs instead",
    }


def _compile_evidence(cfg: RunConfig, env: RankEnv, step: TrainStep, micro_batch: int) -> dict[str, Any] | None:
    """What compilation covered over one profiled micro-batch (for models without attention evidence)."""
    batch = batches_for(cfg, env, micro_batch, 1)[0]
    try:
        return kernels.compile_observed(
            kernels.profiled_names(lambda: step.micro(batch, 1.0, sync_grads=not env.distributed))
        )
    except Exception as exc:  # noqa: BLE001 - evidence is secondary: the timing is already taken
        if env.distributed:
            raise
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        step.reset_after_trial()


def run_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Run on every rank of the cell's job; rank 0 writes the files and returns them (the driver can
    re-materialise them from the job's pickled return value)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the cell's own process (a submitit task) starts the start-up clock at its start; the debug launcher's (the
    # driver's process) at this call
    in_driver = (spec.get("launch_context") or {}).get("kind") == "debug"
    clock = startup.Clock(own=not in_driver and startup.own_process(), fallback="run_rank")
    t0, started = time.time(), dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    cfg = RunConfig.from_spec(spec)
    env: RankEnv | None = None
    steps: list[dict[str, Any]] = []
    try:
        env = init_rank(cfg)
        if env.device.type == "cuda":
            check_device(cfg.gpu, env.device)
        clock.rank_up()
        result, steps = measure_cell(cfg, env, clock)
    except Unsupported as exc:
        result = {"status": "unsupported", "reason": str(exc)}
    except Exception as exc:
        if env is None:
            raise
        watch = env.watch
        peer = watch.check() if watch is not None else None  # another rank's failure, announced first
        if watch is not None and peer is None:
            watch.announce(f"{type(exc).__name__}: {exc}")  # this rank failed first: every other rank stops now
        killed = watch.oom_killed() if watch is not None else None  # a peer killed for host memory just now?
        if watch is not None and watch.host_oom:
            # a rank was killed by the kernel for host memory: a result (like a CUDA OOM), not a crash
            why = peer or f"a rank was killed by the kernel's out-of-memory killer ({killed}); here: {exc}"
            result = {"status": "oom", "reason": f"host memory: {why}"[:500]}
        elif "out of memory" in str(exc).lower():
            result = {"status": "oom", "reason": f"out of memory while timing: {exc}"[:500]}
        elif peer and "out of memory" in peer.lower():
            result = {"status": "oom", "reason": f"out of memory while timing, {peer}"[:500]}
        elif peer:
            raise RuntimeError(f"rank {env.rank} stopped because {peer}") from exc
        else:
            raise
    finally:
        if env is not None:
            close_rank(env)
    rank = env.rank if env is not None else int(os.environ.get("RANK", "0"))
    devices = {**observe_rank(), "threads": torch.get_num_threads()}
    if rank != 0:
        return {"rank": rank, "devices": devices}
    c = cfg.cell
    result.update(
        model=c.model,
        gpu=c.gpu,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        world_size=c.world_size,
        method=c.method,
        precision=cfg.recipe["precision"],
        global_batch=cfg.recipe["global_batch"],
        versions=versions(),
        interpreter=interpreter(),
        device_name=_device_name(env),
        hostname=socket.gethostname(),
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
        slurm_nodelist=os.environ.get("SLURM_JOB_NODELIST"),
        submitit_job_id=job_id_here(),
        started_at=started,
        finished_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        wall_time_s=time.time() - t0,
        devices={
            "placement": (spec.get("launch_context") or {}).get("placement"),
            "threads_per_rank": cfg.threads_per_rank,
            "interval": [t0, time.time()],
            "ranks": [devices],
        },  # fmt: skip
    )
    owner = recorded_job(os.path.dirname(cfg.outputs.result))
    if owner is not None and job_id_here() is not None and owner != job_id_here():
        # a job the launcher no longer waits for (requeued after a node failure while a replacement ran, ...)
        print(f"pretrain-planner: job {job_id_here()} is not the cell's recorded job {owner}: its result is "
              "not written", flush=True)  # fmt: skip
        return {"rank": 0, "superseded_by": owner}
    write_steps(cfg.outputs.steps, steps)
    write_result(cfg.outputs.result, result)
    return {"rank": 0, "result": result, "steps": steps, "devices": devices}

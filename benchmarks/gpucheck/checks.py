"""What must hold for a cell if the trainer's path works: (description, passed) pairs. The method's parts come from
`planning.methods.parse` and the expected settings from `planning.settings` (the rules the trainer applies)."""

from __future__ import annotations

from typing import Any

from pretrain_planner.planning.methods import SHARDING_ENGINE, parse
from pretrain_planner.planning.settings import AUTOCAST, attention_for, compiles

from .plans import Plan

KERNEL_PREFIX = {"eager": "eager", "sdpa": "sdpa:", "flash_attention_2": "flash-attn"}  # kernels.ATTENTION_OPS


def _finite(x: Any) -> bool:
    return isinstance(x, float) and x == x and abs(x) != float("inf")


def checks_for(plan: Plan, rec: dict[str, Any], on_gpu: bool, gpu_spec: dict[str, Any]) -> list[tuple[str, bool]]:
    """The checks of one cell record (its result.json as `rec["result"]`)."""
    r = rec.get("result") or {}
    status = r.get("status")
    if plan.expect_unsupported:
        return [("status unsupported, with a reason", status == "unsupported" and bool(r.get("reason")))]
    if plan.may_be_unsupported and status == "unsupported":
        return [("unsupported here, with a reason (back-end absent)", bool(r.get("reason")))]
    out: list[tuple[str, bool]] = [("status ok", status == "ok")]
    if status != "ok":
        return out
    s = r.get("method_settings") or {}
    precision = r.get("precision")
    m = parse(plan.method)
    engine = SHARDING_ENGINE.get(m.sharding or "")
    compiled = compiles(m, {"supports_compile": rec.get("supports_compile", True)})  # as the cell's spec had it
    attn = attention_for(m)
    kernel = KERNEL_PREFIX[attn]
    tf32 = m.free_lunch and on_gpu and bool(gpu_spec.get("tf32"))
    fused = m.free_lunch and on_gpu and not m.offload
    out += [
        ("device " + ("cuda" if on_gpu else "cpu"), s.get("device") == ("cuda" if on_gpu else "cpu")),
        (f"attention {attn}", s.get("attn_implementation") == attn),
        (f"attention kernel {kernel}*", str(s.get("attention_kernel") or "").startswith(kernel)),
        (f"compile {compiled}", bool(s.get("compile")) is compiled),
        (f"tf32 {tf32}", s.get("tf32") is tf32),
        (f"fused AdamW {fused}", s.get("fused_optimizer") is fused),
        (
            "micro-batch x accum x ranks = global batch",
            (r.get("micro_batch") or 0) * (r.get("grad_accum_steps") or 0) * plan.ranks == r.get("global_batch"),
        ),
        ("steps.jsonl has one line per timed step", len(rec.get("steps") or []) == r.get("timed_steps")),
        (
            "p10 <= median <= p90",
            (r.get("step_time_p10_s") or 0) <= (r.get("step_time_s") or 0) <= (r.get("step_time_p90_s") or 0),
        ),
        ("not suspect", r.get("suspect") is False),
        ("finite final loss", _finite(r.get("final_loss"))),
    ]
    if engine is None:  # ZeRO's engine and FSDP2's MixedPrecisionPolicy cast instead of autocast
        out += [
            (f"autocast {AUTOCAST.get(precision)}", s.get("autocast") == AUTOCAST.get(precision)),
            (f"grad scaler {precision == 'fp16'}", bool(s.get("grad_scaler")) is (precision == "fp16")),
        ]
    elif engine == "zero":
        out.append(("DeepSpeed engine", s.get("parallel") == "deepspeed"))
    else:
        out.append(("FSDP2", s.get("parallel") == "fsdp2"))
    parts = s.get("method_parts") or {}
    if m.checkpointing:
        out.append(("activation checkpointing on", s.get("activation_checkpointing") is True))
    if m.fused_ce:
        out.append(("fused CE head recorded", bool(parts.get("fused_ce"))))
    if m.compile_mode == "cstep":
        out.append(("optimizer step compiled", bool(s.get("compile_optimizer_step"))))
    if m.compile_mode == "cg":
        out.append(("CUDA graphs", s.get("compile_mode") == "reduce-overhead"))
    if m.liger:
        out.append(("Liger applied", bool((parts.get("liger") or {}).get("applied"))))
    if on_gpu:
        out.append(("MFU reported", r.get("mfu") is not None))
    out += issue14_checks(plan, r, s, on_gpu)
    if plan.expect_failed_trial:
        trials = r.get("micro_batch_trials") or []
        out.append(
            ("a trial hit OOM and the search backed off", any(not t["fits"] for t in trials) and trials[-1]["fits"])
        )
    return out


def issue14_checks(plan: Plan, r: dict[str, Any], s: dict[str, Any], on_gpu: bool) -> list[tuple[str, bool]]:
    """What issue 14's fixes must show in a cell that ran (status ok)."""
    tuned = parse(plan.method).free_lunch and on_gpu
    out: list[tuple[str, bool]] = [(f"cudnn.benchmark {tuned} (13)", s.get("cudnn_benchmark") is tuned)]
    if r.get("precision") == "fp16":  # 9: skipped steps counted, never timed; the scale of every timed step
        out.append(("fp16: skipped steps counted (9)", isinstance(r.get("skipped_steps"), int)))
        out.append(("fp16: loss scale recorded (9)", r.get("loss_scale") is not None))
    if s.get("compile"):
        out.append(("compile_observed recorded (11)", bool((s.get("compile_observed") or {}).get("how"))))
    if plan.ranks > 1:
        trials = r.get("micro_batch_trials") or []
        out.append(("the forced OOM on rank 1, agreed by both (6)", bool(trials) and trials[0].get("oom_ranks") == [1]))
        out.append(("process group rebuilt once (3, 5, 6)", s.get("process_group_rebuilds") == 1))
        fsdp = s.get("fsdp") or {}
        if fsdp:
            units = sum((fsdp.get("sharded_modules") or {}).values()) + 1
            rs = (s.get("collectives_per_step") or {}).get("reduce_scatter")
            accum = r.get("grad_accum_steps") or 1
            want = units if fsdp.get("grad_sync") == "last" else units * accum
            out.append((f"reduce-scatters per step {want} (8)", rs == want))
            out.append(("rank 1 built on the meta device (7)", "meta device" in str(fsdp.get("build"))))
        ds = s.get("deepspeed") or {}
        if ds.get("zero_stage") == 3:
            out.append(("ZeRO-3 partitioned by zero.Init (7)", "zero.Init" in str(ds.get("build"))))
    return out


def cross_checks(records: list[dict[str, Any]]) -> None:
    """Item 2: `cg` (CUDA graphs) under gradient accumulation trains like `fl`: final losses within 5%."""
    by_label = {rec["label"]: rec for rec in records}
    for rec in records:
        if parse(rec["plan"]["method"]).compile_mode != "cg" or (rec.get("result") or {}).get("status") != "ok":
            continue
        ref = (by_label.get(rec["label"].replace("+cg", "")) or {}).get("result") or {}
        mine = rec["result"]
        ok = (
            ref.get("status") == "ok"
            and mine.get("grad_accum_steps", 1) > 1
            and abs(mine["final_loss"] - ref["final_loss"]) <= 0.05 * abs(ref["final_loss"])
        )
        check = ("cg with accumulation: final loss within 5% of fl's (2)", ok)
        if check not in (rec.get("checks") or []):
            rec.setdefault("checks", []).append(check)

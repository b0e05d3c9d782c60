"""Throughput levers (#7): the fused linear + cross-entropy head (`flce`) and the compiled step (`cstep`).

flce must give the dense head's loss and gradients (causal LM, masked LM, sparse prediction) and hold
less memory; measured with the profiler's CPU allocation events, never assumed.
"""

from __future__ import annotations

import pytest
import torch
from pretrain_planner.trainer import heads
from pretrain_planner.trainer.models import build_model
from pretrain_planner.trainer.tasks import synthetic_batch

GPTNEOX = {
    "name": "t-gptneox",
    "family": "gptneox",
    "arch": {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 300,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    },
    "recipe": {"sequence_length": 40},
    "task": "causal_lm",
}
_MLM_ARCH = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 300,
    "max_position_embeddings": 80,
    "type_vocab_size": 1,
}
MODELS = {
    "gptneox": GPTNEOX,
    "bert": {**GPTNEOX, "family": "bert", "arch": _MLM_ARCH, "task": "masked_lm"},
    "bert-sparse": {**GPTNEOX, "family": "bert", "arch": {**_MLM_ARCH, "sparse_prediction": True}, "task": "masked_lm"},
    "roberta": {**GPTNEOX, "family": "roberta", "arch": {**_MLM_ARCH, "pad_token_id": 1}, "task": "masked_lm"},
}


def _pair(model: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The dense-head model and the flce model with the same weights, dropout off."""
    torch.manual_seed(0)
    dense, _ = build_model(model, "sdpa")
    fused, _ = build_model(model, "sdpa", fused_ce=True)
    fused.load_state_dict(dense.state_dict())
    return dense.eval(), fused.eval()


def _loss_and_grads(net, batch, autocast=None):
    net.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        loss = net(**batch).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(MODELS))
def test_flce_same_loss_and_gradients_as_dense_head(name):
    model = MODELS[name]
    dense, fused = _pair(model)
    assert type(fused).__name__.endswith("WithFusedCE")
    batch = synthetic_batch(model, 3, torch.Generator().manual_seed(1))
    loss_d, grads_d = _loss_and_grads(dense, batch)
    loss_f, grads_f = _loss_and_grads(fused, batch)
    assert torch.allclose(loss_d, loss_f, rtol=1e-5, atol=1e-6), (loss_d, loss_f)
    assert grads_d.keys() == grads_f.keys()
    worst = max((grads_d[k] - grads_f[k]).abs().max().item() for k in grads_d)
    assert worst < 1e-5, worst
    # the fused head returns no logits (that is the point) but inference still gets them
    assert fused(input_ids=batch["input_ids"]).logits.shape[-1] == model["arch"]["vocab_size"]


def test_flce_under_bf16_autocast():
    dense, fused = _pair(GPTNEOX)
    batch = synthetic_batch(GPTNEOX, 2, torch.Generator().manual_seed(2))
    loss_d, grads_d = _loss_and_grads(dense, batch, torch.bfloat16)
    loss_f, grads_f = _loss_and_grads(fused, batch, torch.bfloat16)
    assert abs(loss_d.item() - loss_f.item()) < 2e-2 * loss_d.item()
    for k in grads_d:
        assert grads_f[k].dtype == grads_d[k].dtype == torch.float32
        rel = (grads_d[k] - grads_f[k]).norm() / grads_d[k].norm().clamp(min=1e-12)
        assert rel < 5e-2, (k, rel.item())


@pytest.mark.parametrize("rows", [1, 127, 300])
def test_chunked_function_matches_dense_cross_entropy(rows):
    """Chunk boundaries (one chunk, a ragged last chunk), ignored rows, bias and no bias."""
    g = torch.Generator().manual_seed(rows)
    for with_bias in (True, False):
        x = torch.randn(rows, 16, generator=g, requires_grad=True)
        w = torch.randn(1000, 16, generator=g, requires_grad=True)
        b = torch.randn(1000, generator=g, requires_grad=True) if with_bias else None
        target = torch.randint(0, 1000, (rows,), generator=g)
        target[::3] = heads.IGNORE_INDEX
        target[0] = 5  # at least one target
        ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w, b), target)
        ref_grads = torch.autograd.grad(ref, [t for t in (x, w, b) if t is not None])
        out = heads.ChunkedLinearCrossEntropy.apply(x, w, b, target, 128, torch.float32)
        grads = torch.autograd.grad(out * 1.0, [t for t in (x, w, b) if t is not None])
        assert torch.allclose(out, ref, atol=1e-5)
        for a, r in zip(grads, ref_grads, strict=True):
            assert torch.allclose(a, r, atol=1e-5), (a - r).abs().max()


def _peak_cpu_bytes(fn) -> int:
    """Peak of live CPU allocations while `fn` runs, from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    assert events, "the profiler recorded no CPU allocations"
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def test_flce_lowers_peak_memory_with_a_large_vocabulary(record_property):
    vocab = 32768
    model = {**GPTNEOX, "arch": {**GPTNEOX["arch"], "vocab_size": vocab, "max_position_embeddings": 512}}
    dense, fused = _pair(model)
    ids = torch.randint(0, vocab, (2, 256), generator=torch.Generator().manual_seed(0))
    peaks = {}
    for name, net in (("dense", dense), ("flce", fused)):
        net(input_ids=ids, labels=ids).loss.backward()  # allocate gradients once: measure the step, not them
        peaks[name] = _peak_cpu_bytes(lambda net=net: net(input_ids=ids, labels=ids).loss.backward())
    logits_bytes = 2 * 255 * vocab * 4
    ratio = peaks["flce"] / peaks["dense"]
    record_property("flce_peak_ratio", round(ratio, 3))
    print(f"peak CPU allocations: dense {peaks['dense'] / 2**20:.1f} MiB, flce {peaks['flce'] / 2**20:.1f} MiB")
    assert peaks["dense"] > 2 * logits_bytes  # the dense head holds fp32 logits and their gradient at once
    assert ratio < 0.6, peaks


@pytest.mark.slow  # two training runs, one with a compiled step (~30 s on 2 cores)
def test_cstep_same_update_as_an_eager_step(tmp_path):
    """`cstep` compiles the optimizer step (with clipping): after two steps, the same weights as eager."""
    from pretrain_planner.planning.catalog import load_catalog
    from pretrain_planner.planning.grid import Cell
    from pretrain_planner.planning.spec import cell_spec
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder

    from .conftest import GPUS_YAML, MODELS_YAML, sections

    catalog = load_catalog(MODELS_YAML, GPUS_YAML)
    config = {"benchmark": {"seed": 0}, "launcher": {"kind": "debug", "timeout_min": 5}}
    weights = {}
    for slug in ("fl", "fl+cstep"):
        # the optimizer step only: the model stays eager (a model without compile has no cstep in its settings,
        # RunSpec.reason: the step is compiled by hand here), so the two differ by the compiled step alone
        spec = cell_spec(Cell("tiny-gptneox", "cpu", 1, 1, "fl"), catalog, *sections(config), str(tmp_path / "r"), "s")
        spec["model"]["supports_compile"] = False
        spec["model"]["recipe"]["precision"] = "fp32"
        spec["model"]["arch"].update(num_hidden_layers=1, hidden_size=32, intermediate_size=64, vocab_size=128)
        spec["model"]["recipe"]["sequence_length"] = 32
        cfg = RunConfig.from_spec(spec)
        env = init_rank(cfg)
        try:
            step = make_builder(cfg, env, [])(2, 1)
            if slug == "fl+cstep":
                step.compile_optimizer_step()
            batches = batches_for(cfg, env, 2, 1)
            for _ in range(2):
                step(batches, 1)
            weights[slug] = {n: p.detach().clone() for n, p in step.applied.raw.named_parameters()}
            if slug == "fl+cstep":
                assert step.settings["compile_optimizer_step"] == "clip_grad_norm_ + optimizer.step"
                assert step.compiled_step is not None
            step.close()
        finally:
            close_rank(env)
    worst = max((weights["fl"][k] - weights["fl+cstep"][k]).abs().max().item() for k in weights["fl"])
    moved = max((weights["fl"][k]).abs().max().item() for k in weights["fl"])
    assert moved > 0 and worst < 1e-5, worst

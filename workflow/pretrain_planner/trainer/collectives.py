"""A multi-rank cell's step split into collectives and compute, and where its ranks ran.

The what-if moves a step's communication by the step model's volume (planning/stepmodel.py: one ring all-reduce of
the gradients, times the syncs of a step) at an interconnect's bandwidth; a measured cell is the evidence for that
term only if it says what its own communication took. After the timed steps every rank times that one all-reduce
(the gradients' size, capped at PROBE_MAX_BYTES and scaled linearly above it: a ring all-reduce of that size is
bandwidth-bound), the slowest rank's time counts (as for the steps), and the step is split into `syncs x` that and
the rest. Where every rank ran on one host (the SLURM testbed's virtual nodes share one machine), the "interconnect"
is loopback and the record says so: the split there measures the host's memory, not a network.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as torch_dist

from pretrain_planner.planning import stepmodel
from pretrain_planner.planning.flops import param_count

PROBE_MAX_BYTES = 256 * 2**20  # the probe's buffer at most (a 7B model's fp32 gradients would be 28 GB)
REPEATS = 5


def where() -> dict[str, Any]:
    """Where this rank runs: its SLURM node (the scheduler's name of it) and its host."""
    return {"node": os.environ.get("SLURMD_NODENAME"), "host": socket.gethostname()}


def layout(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """{node: [ranks]} and whether the ranks span hosts, from each rank's `where()`."""
    nodes: dict[str, list[int]] = {}
    for i, r in enumerate(ranks):
        nodes.setdefault(r.get("node") or r.get("host") or "?", []).append(i)
    hosts = sorted({r.get("host") for r in ranks})
    slurm = sorted({r["node"] for r in ranks if r.get("node")})
    if len(hosts) == 1:
        on = f" ({len(slurm)} SLURM node(s) of one machine)" if slurm else ""
        link = f"loopback: every rank on host {hosts[0]}{on}, not a network"
    else:
        link = f"between {len(hosts)} hosts"
    return {"nodes": nodes, "hosts": hosts, "interconnect": link}


def _allreduce_s(env: Any, numel: int) -> float:
    """The slowest rank's median seconds for one all-reduce of `numel` fp32 elements."""
    buf = torch.ones(numel, dtype=torch.float32, device=env.device)
    torch_dist.all_reduce(buf)  # warm-up: the first call sets up the ring
    times = []
    for _ in range(REPEATS):
        torch_dist.barrier()
        env.sync()
        t = time.perf_counter()
        torch_dist.all_reduce(buf)
        env.sync()
        times.append(time.perf_counter() - t)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=env.device)
    torch_dist.all_reduce(slowest, op=torch_dist.ReduceOp.MAX)
    return float(slowest.item())


def step_split(cfg: Any, env: Any, step_s: float, micro_batch: int) -> dict[str, Any] | None:
    """The step split into collectives and compute, with the ranks' layout (every rank calls it; None on one rank)."""
    if not env.distributed:
        return None
    ranks: list[Any] = [None] * env.world_size
    torch_dist.all_gather_object(ranks, where())
    params = param_count(cfg.model) or 0.0
    grad_bytes = stepmodel.GRAD_COMM_B * params
    probe_bytes = min(grad_bytes, PROBE_MAX_BYTES)
    numel = max(1, int(probe_bytes // 4))
    allreduce = _allreduce_s(env, numel) * (grad_bytes / (numel * 4) if grad_bytes > probe_bytes else 1.0)
    per_rank = cfg.recipe["global_batch"] // env.world_size
    feats = stepmodel.of_method(cfg.cell.method, micro_batch, per_rank, env.world_size)
    collective = min(step_s, feats.syncs * allreduce)
    return {
        **layout(ranks),
        "ranks": ranks,
        "allreduce_s": allreduce,
        "allreduce_bytes": grad_bytes,
        "probe_bytes": numel * 4,
        "syncs_per_step": feats.syncs,
        "collective_s": collective,
        "compute_s": step_s - collective,
        "collective_share": collective / step_s if step_s else None,
        "how": "after the timed steps: the slowest rank's median of one fp32 all-reduce of the gradients' size "
        f"(probed on at most {PROBE_MAX_BYTES // 2**20} MiB, scaled by size above it) x the step model's syncs per "
        "step (planning/stepmodel.py); compute = the median step - that",
    }

"""The dense matmul peak of the CPU a rank runs on, MEASURED: the `cpu` stand-in's peak for MFU, the analytic
estimate and the `suspect` check, where a GPU type has its datasheet figure (config/gpus.yaml declares none for
`cpu`: a CPU's rate depends on the host, its instruction set, the cores a rank holds and its neighbours).

A few square torch.matmul of the cell's precision on the rank's own threads, timed after a warm-up; the best of
them counts (a peak is a best case, as a datasheet's is). The result records the figure and how it was taken
(`peak_source`), and the tables say that such an MFU is against a measured peak, not a datasheet one.

A product is timed by the shorter of its wall time and the CPU time the process spent on it per thread: on a host
shared with other work (a login node, a test suite on several workers), a neighbour that takes the core half the
time doubles the wall time of a product but not the CPU time it needed, and a peak lowered that way would make the
cell's steps, timed when the core was free, read as an MFU above 100% (`suspect`).
"""

from __future__ import annotations

import time

import torch

SIZE = 1024  # a square matrix side: 2 GFLOP per product, tens of milliseconds on one core
WARMUP, REPS = 2, 10
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_tflops(precision: str, size: int = SIZE, reps: int = REPS) -> tuple[float, str]:
    """(TFLOP/s, how it was measured) of the best of `reps` size x size products in `precision` on this thread."""
    dtype = DTYPES[precision]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    for _ in range(WARMUP):
        torch.matmul(a, b)
    threads, best = torch.get_num_threads(), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        torch.matmul(a, b)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = min(best, wall, cpu / threads if cpu > 0 else wall)
    tflops = 2 * size**3 / best / 1e12
    how = (f"measured on this host, not a datasheet: best of {reps} {size}x{size} {precision} torch.matmul on "
           f"{threads} thread(s) per rank, each timed by its CPU time where neighbours slowed it "
           "(trainer/hostpeak.py)")  # fmt: skip
    return tflops, how

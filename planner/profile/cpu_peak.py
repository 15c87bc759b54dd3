"""The ``cpu`` entry of the GPU catalog: this machine's peaks, measured once per profile.

A CPU has no datasheet figure worth planning with, so ``--gpu cpu`` measures what the
roofline needs, with the thread count and clock the measured profiler uses: one square
matrix product for fp32 and one for the profile's precision (FLOP/s = 2 n^3 / time, the
median of a few runs after a warm-up) and one large copy (bytes/s = bytes read and written
/ time). The numbers are recorded in the profile (``meta.analytic.gpu``), so a profile says
what it assumed. They are what this machine reached at that moment; on a shared machine,
noisy.

Example::

    spec = measure_cpu(gpu_spec("cpu"), threads=1)
    spec.peak_flops_per_s["fp32"], spec.memory_bytes_per_s
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from planner.gpus import GpuSpec

__all__ = ["gemm_flops_per_s", "copy_bytes_per_s", "measure_cpu"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _median_seconds(fn: Callable[[], Any], repeat: int, clock: Callable[[], float]) -> float:
    fn()  # warm-up: first-touch of the buffers, kernel selection
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return max(statistics.median(times), 1e-9)


def _clock(threads: int) -> Callable[[], float]:
    # As the measured profiler: one thread's own CPU time, else the wall clock.
    return time.thread_time if threads == 1 else time.perf_counter


def gemm_flops_per_s(precision: str, threads: int = 1, repeat: int = 5) -> float:
    """FLOP/s of a square matrix product at ``precision`` on this CPU: the side doubles from
    256 while one product takes under 20 ms (up to 1024), so that a precision the CPU
    emulates (fp16 on many) is measured in a second, not a minute.

    Example::

        gemm_flops_per_s("fp32")    # e.g. 1e11 on one core of the development VM
    """
    clock = _clock(threads)
    n = 256
    while True:
        seconds = _median_seconds(_product(n, _DTYPES[precision]), repeat, clock)
        if seconds >= 0.02 or n >= 1024:
            return 2.0 * n**3 / seconds
        n *= 2


def _product(n: int, dtype: torch.dtype) -> Callable[[], Any]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(dtype)
    b = torch.randn(n, n, generator=generator).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def copy_bytes_per_s(threads: int = 1, nbytes: int = 64 << 20, repeat: int = 5) -> float:
    """Bytes/s of copying ``nbytes`` (read and written: twice that moved) on this CPU.

    Example::

        copy_bytes_per_s()    # e.g. 1e10
    """
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), repeat, _clock(threads))
    return 2.0 * nbytes / seconds


def measure_cpu(spec: GpuSpec, threads: int = 1, precision: str = "fp32") -> GpuSpec:
    """``spec`` (the catalog's ``cpu`` entry) with this machine's measured peaks filled in,
    for fp32 and ``precision`` (the profile's), at ``threads`` threads (restored afterwards).

    Example::

        measure_cpu(gpu_spec("cpu"), threads=1, precision="bf16").peak_flops_per_s
    """
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        peaks = {p: gemm_flops_per_s(p, threads) for p in dict.fromkeys(("fp32", precision))}
        bandwidth = copy_bytes_per_s(threads)
    finally:
        torch.set_num_threads(old)
    return spec.with_measured(peaks, bandwidth)

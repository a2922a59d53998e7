"""How many worker processes per GPU, and compile threads per worker: the engine's layout.

Sized from the cores this process may use and the GPUs' memory (read with ``nvidia-smi``,
never by initialising CUDA here); given counts always win. See :func:`default_layout`.
"""

from __future__ import annotations

import os
import subprocess

from autotune.space.outcomes import DeviceKind


def cpu_count() -> int:
    """CPU cores this process may use (its affinity mask, e.g. a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


# At most this many worker processes per GPU by default, and this many compile threads each.
_MAX_WORKERS_PER_GPU = 8


_MAX_COMPILE_THREADS = 8


# GPU memory a worker may need: its CUDA context (a few hundred MiB) and one config's inputs,
# reference and outputs at a time. The default layout gives the workers of a GPU at most half
# of its memory (the rest stays for the kernels' own buffers and the baseline's).
WORKER_GPU_MEMORY_MIB = 4096


def gpu_memory_mib(gpu: int | None = None) -> int | None:
    """Total memory of GPU ``gpu`` (all visible ones: the smallest) from ``nvidia-smi``,
    without initialising CUDA in this process; None where it cannot tell."""
    cmd = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    if gpu is not None:
        cmd.append(f"--id={gpu}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
        sizes = [int(float(x)) for x in out.split() if x.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None


def default_layout(
    mode: str,
    n_gpus: int,
    cores: int,
    workers_per_gpu: int | None = None,
    compile_threads: int | None = None,
    gpu_memory_mib: int | None = None,
) -> tuple[int, int]:
    """``(workers_per_gpu, compile_threads)``: what is given, the rest by default.

    Workers per GPU: ``min(8, cores // (2 x GPUs))``, at least 1 (fake mode: 1, the engine's
    tests). On the H200 host (16 cores, 1 GPU) that is 8 workers. Why: the GIL-bound lowering
    was the bottleneck there (8 threads in one process: 2.36x over sequential, each compile
    2-4.7 s instead of 0.6-2 s alone), and in separate processes a compile costs about what it
    costs alone, so N processes compile about N times as fast until the cores run out; a compile
    uses more than one core at times (XLA's thread pools, ptxas as a child process) and the
    timing threads, the engine and the tuner need some too, hence half the cores. Past that the
    serialized device work (inputs, reference, check, 20 timed runs: a fraction of a second per
    config) is the bound, which 8 parallel compiles of ~1 s already keep fed. The benchmark
    (``benchmarks/throughput.py --workers-per-gpu 4,8``) re-measures this on the GPU host.

    Compile threads per worker: with one worker per GPU, the cores shared out among the GPUs, at
    most 8 (threads are all a lone worker has); with several, ``cores // (2 x workers)``
    clamped to 1..2: one thread already overlaps a worker's next compile with its timing, and
    every extra thread is another config in flight that an adaptive sampler chose blind.

    GPU memory (``gpu_memory_mib``, the smallest GPU's): the workers of a GPU get at most half
    of it, :data:`WORKER_GPU_MEMORY_MIB` each (an H200's 141 GiB allows 17, so the cores
    decide; a 16 GiB GPU allows 2).
    """
    if workers_per_gpu is None:
        if mode == DeviceKind.FAKE:
            workers_per_gpu = 1
        else:
            workers_per_gpu = max(1, min(_MAX_WORKERS_PER_GPU, cores // (2 * n_gpus)))
            if gpu_memory_mib:  # a CUDA context each: half the GPU's memory at most
                workers_per_gpu = max(1, min(
                    workers_per_gpu, gpu_memory_mib // 2 // WORKER_GPU_MEMORY_MIB))
    if compile_threads is None:
        if workers_per_gpu == 1:
            compile_threads = max(1, min(_MAX_COMPILE_THREADS, cores // n_gpus))
        else:
            compile_threads = max(1, min(2, cores // (2 * n_gpus * workers_per_gpu)))
    return workers_per_gpu, compile_threads

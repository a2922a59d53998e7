"""The memory-bound targets in one run: tuned softmax vs XLA and vs the streaming bandwidth.

    python3 benchmarks/memory_bound.py --db sqlite:///results/autotune.db [--rows 8192 --cols 32768]

Times, by CUPTI medians on fresh random bf16 inputs, in one process: a streaming XLA kernel over
the same bytes (``-x``: one read and one write of every element, the copy-bandwidth ceiling),
XLA's ``jax.nn.softmax``, and the bundled softmax with its best stored config (else default).
Prints each time, GB/s (bytes read + written), the speedup over XLA and the fraction of the
streaming bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# jax must not take 75% of the GPU up front: the copy measurement below allocates through cupy.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=32768)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--db", default=None)
    ap.add_argument("--iterations", type=int, default=50)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.mosaic.gpu import profiler

    from autotune.queries.best import best_config
    from autotune.space.kernel import BuildOptions, get_kernel
    from autotune.space.problem import Config

    kernel = get_kernel("softmax")
    problem = kernel.problem({"rows": args.rows, "cols": args.cols}, args.dtype)
    stored = best_config("softmax", problem.dims, problem.dtype, device="gpu", db=args.db)
    config = Config(stored) if stored else Config(kernel.default_config(problem))
    (x,) = kernel.make_inputs(problem, jax.random.key(1234))
    nbytes = 2 * x.size * x.dtype.itemsize

    def median_us(fn, *inputs) -> float:
        _, times_ms = profiler.measure(jax.jit(fn), iterations=args.iterations)(*inputs)
        return statistics.median(times_ms) * 1e3

    tuned = kernel.build(problem, config, BuildOptions())
    out = jax.jit(tuned)(x)
    ref = jax.nn.softmax(x.astype(jnp.float32), axis=-1)
    rel = float(jnp.linalg.norm((out.astype(jnp.float32) - ref).ravel()) / jnp.linalg.norm(ref.ravel()))

    rows = []
    copy_us = device_copy_us(x.size * x.dtype.itemsize, args.iterations)
    if copy_us is not None:
        rows.append(("D2D copy (cupy)", copy_us))
    rows += [
        ("stream -x (XLA)", median_us(lambda a: -a, x)),
        ("softmax (XLA)", median_us(lambda a: jax.nn.softmax(a, axis=-1), x)),
        ("softmax (tuned)", median_us(tuned, x)),
    ]
    stream_us, xla_us, tuned_us = (t for _, t in rows[-3:])
    ceiling_us = min(copy_us or stream_us, stream_us)
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; problem {problem}; "
          f"{nbytes / 2**20:.0f} MiB moved per call; config {config.to_json()} "
          f"({'stored best' if stored else 'kernel default'}); rel error {rel:.2e}")
    print(f"{'kernel':<18} {'median us':>10} {'GB/s':>8}")
    for name, t in rows:
        print(f"{name:<18} {t:>10.1f} {nbytes / t / 1e3:>8.0f}")
    print(f"tuned softmax: {xla_us / tuned_us:.2f}x faster than XLA softmax; "
          f"{ceiling_us / tuned_us:.1%} of the best copy/streaming bandwidth measured here")
    assert np.isfinite(rel) and rel < 2e-2, f"tuned softmax is wrong: rel error {rel}"


def device_copy_us(nbytes: int, iterations: int) -> float | None:
    """Median time of a device-to-device copy of ``nbytes`` (cudaMemcpy through cupy, CUDA
    events, warm-up excluded); None where cupy is not installed."""
    try:
        import cupy as cp
    except ImportError:
        return None
    src = cp.random.randint(0, 255, size=nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    for _ in range(3):
        cp.copyto(dst, src)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(iterations):
        start.record()
        cp.copyto(dst, src)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    assert bool((dst[:4096] == src[:4096]).all())
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return statistics.median(times)


if __name__ == "__main__":
    main()

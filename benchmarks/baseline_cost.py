"""Where a baseline's time goes on a GPU (issue 16): XLA's autotuning compile against the rest.

    python3 benchmarks/baseline_cost.py examples/gpu_evidence.toml --out $OUT/baseline_cost.json  # H200

The baselines held the GPU's lock for 22-34 s of a 76 s batch job on the H200 (benchmarks/RESULTS.md §10):
each is compiled with XLA's autotuning, which runs candidate kernels on the GPU and so must run
alone. Per problem of the job file, in one process, this compiles the kernel's baseline from
one lowering in four ways and times every executable the way the tuner does (CUPTI, L2 flushed
between iterations, every launch counted):

- ``autotuned``: XLA's default (autotuning on), as a user's ``jax.jit`` gets it, the first time
  in this process;
- ``again``: the same program compiled once more (XLA keeps autotuning results in the process);
- ``no_autotune``: ``xla_gpu_autotune_level=0`` (XLA's heuristics, no kernel runs);
- ``cublas_only``: autotuning on, Triton GEMM fusions off (cuBLAS algorithm selection only).

NVML's utilization during the ``autotuned`` compile says how much must hold the lock. Writes
``--out``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import nvml_gpu0  # noqa: E402

from autotune.evaluation.cold_timing import L2Flush  # noqa: E402
from autotune.evaluation.pipeline import NO_AUTOTUNE, measure_baseline  # noqa: E402
from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.tuning.jobs import load_job  # noqa: E402

VARIANTS: dict[str, dict[str, Any] | None] = {
    "autotuned": None,
    "again": None,
    "no_autotune": NO_AUTOTUNE,
    "cublas_only": {"xla_gpu_enable_triton_gemm": False},
}


class _Utilization:
    """Samples NVML's GPU utilization (percent of the last sample period with a kernel
    running) every 10 ms on a thread; ``None`` figures without nvidia-ml-py."""

    def __init__(self) -> None:
        self._nvml, self._handle = nvml_gpu0() or (None, None)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Utilization:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            time.sleep(0.01)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def busy(self) -> float | None:
        return statistics.fmean(self.samples) / 100 if self.samples else None


def measure_problem(spec: Any, iterations: int, flush: Any) -> dict[str, Any]:
    import jax

    problem = spec.problem
    kernel = get_kernel(problem.kernel, allow_import=True)
    inputs = tuple(kernel.make_inputs(problem, jax.random.key(1)))
    jax.block_until_ready(inputs)
    fn = kernel.baseline(problem)
    start = time.perf_counter()
    lowered = jax.jit(fn).trace(*inputs).lower()
    row: dict[str, Any] = {"problem": str(problem), "lower_s": time.perf_counter() - start}
    for name, options in VARIANTS.items():
        with _Utilization() as util:
            start = time.perf_counter()
            exe = lowered.compile(options) if options else lowered.compile()
            compile_s = time.perf_counter() - start
        result = measure_baseline(fn, inputs, iterations=iterations, timing="cupti",
                                  cache="cold", flush=flush, compiled=exe)
        row[name] = {
            "compile_s": compile_s,
            "gpu_busy_during_compile": util.busy(),
            "median_us": result.median_us,
            "outcome": str(result.outcome),
        }
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="a job file (its problems' baselines are measured)")
    p.add_argument("--iterations", type=int, default=50, help="timed runs per executable")
    p.add_argument("--out", help="write every figure here (JSON)")
    args = p.parse_args(argv)
    import jax

    job = load_job(args.job, allow_import=True)
    flush = L2Flush()
    rows = []
    for spec in job.problems:
        row = measure_problem(spec, args.iterations, flush)
        rows.append(row)
        cells = "  ".join(
            f"{name} {row[name]['compile_s']:6.2f} s {row[name]['median_us'] or float('nan'):8.1f} us"
            for name in VARIANTS
        )
        print(f"{row['problem'][:48]:48}  lower {row['lower_s']:5.2f} s  {cells}", flush=True)
        busy = row["autotuned"]["gpu_busy_during_compile"]
        if busy is not None:
            print(f"{'':48}  GPU busy during the autotuned compile: {busy:.0%}", flush=True)
    total = {name: sum(r[name]["compile_s"] for r in rows) for name in VARIANTS}
    print("total compile s: " + ", ".join(f"{k} {v:.2f}" for k, v in total.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"job": args.job, "jax": jax.__version__, "device": jax.devices()[0].device_kind,
             "iterations": args.iterations, "rows": rows, "total_compile_s": total},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

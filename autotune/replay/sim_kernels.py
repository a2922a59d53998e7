"""Simulated kernels for the CPU modes of the scheduling benchmarks (``--device fake``).

The fake evaluator does what a config says: ``compile_ms`` of compiling (in a worker's compile
thread), ``run_ms`` on the "GPU" (under its lock), and ``cost_us`` as the measured time. ``SIM``
takes about what a hopper_matmul config takes on the H200 (a compile of ~0.8 s, 30 ms of GPU
work: a check and 20 timed runs); its 128 configs differ in ``cost_us``. Named
``autotune.replay.sim_kernels:SIM`` (jobs need ``--allow-import``).
"""

from __future__ import annotations

from typing import Any

from autotune.space.kernel import Kernel
from autotune.space.search_space import Choice, Space


def _never(*args: Any) -> Any:
    raise NotImplementedError("only the fake evaluator runs this kernel")


def sim_kernel(name: str, *, compile_ms: int, run_ms: int, configs: int = 128) -> Kernel:
    return Kernel(
        name=f"autotune.replay.sim_kernels:{name}",
        space=Space(
            params=(
                Choice("cost_us", tuple(range(100, 100 + configs)), ordered=True),
                Choice("compile_ms", (compile_ms,)),
                Choice("run_ms", (run_ms,)),
            ),
        ),
        shape_keys=("n",),
        dtypes=("float32",),
        build=_never,
        make_inputs=_never,
        reference=_never,
        description=f"simulated: {compile_ms} ms compile, {run_ms} ms on the GPU",
    )


SIM = sim_kernel("SIM", compile_ms=800, run_ms=30)
# For benchmarks/scale_out.py: no compile, a few ms of GPU: the database is the bottleneck.
QUICK = sim_kernel("QUICK", compile_ms=0, run_ms=5, configs=4096)

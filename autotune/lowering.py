"""The validity oracle: lower a kernel for CUDA on a machine without a GPU.

``jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))`` runs the whole Mosaic GPU
lowering on the CPU and raises the real alignment, divisibility and shared-memory errors
(PLATFORM.md). A space may only propose configs that pass this; tests check that it does, and
``autotune check`` runs it over a sample of a user's space before any GPU time is spent.
"""

from __future__ import annotations

import dataclasses
import time
import traceback

from autotune.kernel import BuildOptions, Kernel
from autotune.problem import Config, Problem

__all__ = ["LoweringResult", "lower_for_cuda", "input_specs", "H200_NUM_SMS"]

# What a config lowers for when no device can be asked (PLATFORM.md: the H200 has 132 SMs).
H200_NUM_SMS = 132


@dataclasses.dataclass(frozen=True)
class LoweringResult:
    ok: bool
    error: str = ""
    error_type: str = ""
    seconds: float = 0.0


def input_specs(kernel: Kernel, problem: Problem) -> tuple:
    """``ShapeDtypeStruct``s of the kernel's inputs, without making any array."""
    import jax

    return tuple(jax.eval_shape(lambda key: kernel.make_inputs(problem, key), jax.random.key(0)))


def lower_for_cuda(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    options: BuildOptions | None = None,
) -> LoweringResult:
    """Lowers ``kernel`` for ``problem`` and ``config`` for CUDA; never raises for the config.

    The error of a failed lowering is returned (type and message), not raised.
    """
    import jax

    options = options or BuildOptions()
    start = time.perf_counter()
    try:
        fn = kernel.build(problem, config, options)
        specs = input_specs(kernel, problem)
        jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
    except Exception as e:  # noqa: BLE001 - the oracle reports every failure as a value
        tb = traceback.format_exception_only(type(e), e)
        return LoweringResult(
            ok=False,
            error="".join(tb).strip()[-2000:],
            error_type=type(e).__name__,
            seconds=time.perf_counter() - start,
        )
    return LoweringResult(ok=True, seconds=time.perf_counter() - start)

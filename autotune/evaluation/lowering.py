"""The validity oracle: lower a kernel for CUDA on a machine without a GPU.

``jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))`` runs the whole Mosaic GPU
lowering on the CPU and raises the real alignment, divisibility and shared-memory errors
(PLATFORM.md). A space may only propose configs that pass this; tests check that it does, and
``autotune check`` runs it over a sample of a user's space before any GPU time is spent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from autotune._jax_compat import default_backend_is_gpu
from autotune.space.kernel import BuildOptions, Kernel
from autotune.space.problem import Config, Problem

__all__ = ["LoweringResult", "lower_for_cuda", "input_specs", "again_after_races"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_CALLBACK_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_trace_dump(active: bool) -> Iterator[None]:
    """Drops the host callback that writes a traced kernel's trace file, while lowering.

    With ``profile_space`` set, Pallas lowers the kernel (profiler buffer included, so its
    shared memory and seed 000's block-size check are real) and then a ``jax.debug.callback``
    that dumps the buffer; without a GPU backend that callback cannot be lowered for CUDA
    ("the platform for the specified backend cpu is different from the lowering platform
    cuda"). Nothing runs here, so the dump is not needed.
    """
    if not active:
        yield
        return
    import jax

    with _CALLBACK_PATCH_LOCK:
        saved = jax.debug.callback
        jax.debug.callback = lambda *args, **kwargs: None  # type: ignore[assignment]
        try:
            yield
        finally:
            jax.debug.callback = saved


@dataclasses.dataclass(frozen=True)
class LoweringResult:
    ok: bool
    error: str = ""
    error_type: str = ""
    seconds: float = 0.0


def input_specs(kernel: Kernel, problem: Problem) -> tuple[Any, ...]:
    """``ShapeDtypeStruct``s of the kernel's inputs, without making any array."""
    import jax

    return tuple(jax.eval_shape(lambda key: kernel.make_inputs(problem, key), jax.random.key(0)))


def lower_built_for_cuda(fn: Callable[..., Any], specs: Sequence[Any]) -> None:
    """Lowers a built kernel ``fn`` for CUDA with its input ``specs`` (the oracle's one step;
    raises what Mosaic GPU raises), again after a race (:func:`again_after_races`)."""
    import jax

    again_after_races(lambda: jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)))


def lower_for_cuda(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    options: BuildOptions | None = None,
) -> LoweringResult:
    """Lowers ``kernel`` for ``problem`` and ``config`` for CUDA; never raises for the config.

    The error of a failed lowering is returned (type and message), not raised.
    """
    options = options or BuildOptions()
    start = time.perf_counter()
    try:
        fn = kernel.build(problem, config, options)
        specs = input_specs(kernel, problem)
        no_gpu = not default_backend_is_gpu()
        with _without_trace_dump(bool(options.profile_space) and no_gpu):
            lower_built_for_cuda(fn, specs)
    except Exception as e:  # noqa: BLE001 - the oracle reports every failure as a value
        tb = traceback.format_exception_only(type(e), e)
        return LoweringResult(
            ok=False,
            error="".join(tb).strip()[-2000:],
            error_type=type(e).__name__,
            seconds=time.perf_counter() - start,
        )
    return LoweringResult(ok=True, seconds=time.perf_counter() - start)


# CPython's words for a set or dict that another thread changed while this one iterated it: a
# race inside the libraries while threads lower side by side (seen once in GPU interpret mode,
# "Set changed size during iteration" at a worker's first configs), never the config's fault.
# Such a lowering is done again, so that no config is stored as failing because of it.
RACE_MESSAGE = "changed size during iteration"
RACE_RETRIES = 2


def again_after_races(step: Callable[[], T]) -> T:
    """``step()``, done again (at most :data:`RACE_RETRIES` times) where it fails with the
    RuntimeError of a race (:data:`RACE_MESSAGE`), whose traceback goes to the log; any other
    error, and the last race, are raised."""
    races = 0
    while True:
        try:
            return step()
        except RuntimeError as e:
            if RACE_MESSAGE not in str(e) or races == RACE_RETRIES:
                raise
            races += 1
            log.warning("A race in the libraries (done again):\n%s",
                        "".join(traceback.format_exception(type(e), e, e.__traceback__)))

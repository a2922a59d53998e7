"""Timing a compiled kernel: CUPTI around its own launches, or the wall clock.

``warm`` timing is Mosaic GPU's ``profiler.measure`` (iterations back to back on the same
inputs); ``cold`` timing flushes the L2 before every iteration (:mod:`.cold_timing`). Only the
kernel's own launches count (:func:`select_kernel_time`).

:func:`time_program` times a program as a program's loop calls it (the program check,
:data:`autotune.space.outcomes.PROGRAM_METHOD`): the host's clock around batches of calls back
to back, one wait each, which counts what CUPTI's kernel times leave out (the GPU's gaps
between launches, whatever a call costs the GPU beyond its kernels). jax is imported inside
functions.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["select_kernel_time", "time_program", "program_input_sets", "PROGRAM_BLOCKS"]

log = logging.getLogger(__name__)


# A Mosaic GPU kernel is launched under its host function's name plus "_kernel":
# "<kernel_name>_mosaic_gpu_kernel" (Pallas names it after the kernel body or pallas_call name).
MOSAIC_KERNEL_PATTERN = r"_mosaic_gpu"


# XLA's own launches around a custom call: fusions, copies, layout changes, fills.
XLA_GLUE_PATTERN = (
    r"(?i)(fusion|copy|transpose|convert|broadcast|memset|memcpy|concatenate|slice|pad|iota|"
    r"bitcast|reshape|select|scatter|gather|reduce|rng|dynamic_update|zeros|fill)"
)


def select_kernel_time(
    iter_timings: Sequence[Any],
    *,
    kernel_pattern: str = MOSAIC_KERNEL_PATTERN,
    glue_names: Collection[str] = (),
) -> list[float]:
    """Per-iteration time in µs of the tuned kernel's own launches, from CUPTI timings.

    ``iter_timings`` is what ``profiler.measure(f, aggregate=False, iterations=N)`` returns:
    per iteration a list of ``(kernel_name, ms)`` (for N == 1, that list alone).

    The rule:

    1. Launches whose name matches ``kernel_pattern`` are the kernel's own (Mosaic GPU names
       them ``<name>_mosaic_gpu_kernel``); their times are summed per iteration, so a kernel
       made of several Mosaic GPU calls counts all of them, and XLA's glue (input casts,
       layout copies, the zero fill of a scratch buffer) counts for nothing.
    2. When no launch matches (a kernel that is not Mosaic GPU, or a later JAX naming its
       launches differently), every launch counts except XLA glue: names matching
       :data:`XLA_GLUE_PATTERN` (fusions, copies, transposes, converts, fills) and names in
       ``glue_names`` (the launches seen when running the glue alone).

    Raises:
      ValueError: no iteration, iterations with different kernels, or nothing left to time.
    """
    if not iter_timings:
        raise ValueError("CUPTI recorded no iteration.")
    if (
        isinstance(iter_timings[0], tuple)
        and iter_timings[0]
        and isinstance(iter_timings[0][0], str)
    ):
        iter_timings = [iter_timings]  # measure() returns one iteration's list unnested
    first = [name for name, _ in iter_timings[0]]
    own = re.compile(kernel_pattern)
    glue = re.compile(XLA_GLUE_PATTERN)
    if any(own.search(name) for name in first):

        def keep(name: str) -> bool:
            return bool(own.search(name))

    else:

        def keep(name: str) -> bool:
            return name not in glue_names and not glue.search(name)

    samples = []
    for i, launches in enumerate(iter_timings):
        names = [name for name, _ in launches]
        if names != first:
            raise ValueError(f"CUPTI iteration {i} launched {names}, iteration 0 {first}.")
        kept = [float(ms) for name, ms in launches if keep(name)]
        if not kept:
            raise ValueError(
                f"No launch of the tuned kernel among {first}: expected a name matching "
                f"{kernel_pattern!r} or one that is not XLA glue."
            )
        samples.append(sum(kept) * 1000.0)
    return samples


# Blocks of back-to-back calls per program and round of a program check; the round keeps each.
PROGRAM_BLOCKS = 3
# Cold program checks rotate through input sets holding at least this many times the L2, so
# that no call finds its inputs in the L2 (as a program's later layers do not); at most
# PROGRAM_MAX_SETS sets.
PROGRAM_COLD_L2_MULTIPLE = 2
PROGRAM_MAX_SETS = 32


def program_input_sets(cache: str, set_bytes: int, l2_bytes: int) -> int:
    """How many input sets a program check rotates through: 1 warm (the same inputs, as a
    loop over one batch), else enough sets to hold :data:`PROGRAM_COLD_L2_MULTIPLE` x the L2
    and one more (at least 2, at most :data:`PROGRAM_MAX_SETS`).

    Raises:
      ValueError: a cache policy other than "warm" or "cold", or sizes below 1 byte.
    """
    if cache not in ("warm", "cold"):
        raise ValueError(f"a program check times cache policy 'warm' or 'cold', not {cache!r}.")
    if set_bytes < 1 or l2_bytes < 1:
        raise ValueError(f"input sets and the L2 need sizes of at least 1 byte, but got "
                         f"{set_bytes} and {l2_bytes}.")
    if cache == "warm":
        return 1
    needed = -(-PROGRAM_COLD_L2_MULTIPLE * l2_bytes // set_bytes) + 1
    return int(min(PROGRAM_MAX_SETS, max(2, needed)))


def time_program(
    fn: Any, input_sets: Sequence[Sequence[Any]], calls: int, *, blocks: int = PROGRAM_BLOCKS
) -> list[float]:
    """Per block, the µs per call of ``calls`` calls of ``fn`` back to back (cycling through
    ``input_sets``), on the host's clock around the batch with one wait at its end: what a
    program's loop pays per call. One call per input set first, excluded (warm-up).

    Raises:
      ValueError: no input set, or fewer than one call or block.
    """
    import jax

    if not input_sets or calls < 1 or blocks < 1:
        raise ValueError(f"a program check needs input sets, calls >= 1 and blocks >= 1, but "
                         f"got {len(input_sets)} set(s), calls={calls}, blocks={blocks}.")
    for inputs in input_sets:
        jax.block_until_ready(fn(*inputs))
    n = len(input_sets)
    out = []
    for _ in range(blocks):
        start = time.perf_counter()
        last = None
        for i in range(calls):
            last = fn(*input_sets[i % n])
        jax.block_until_ready(last)
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def device_still_works() -> bool:
    """Whether the default device still runs a trivial computation (False once poisoned)."""
    try:
        import jax
        import jax.numpy as jnp

        jax.block_until_ready(jnp.ones((8,), jnp.float32) + 1)
        return True
    except Exception:  # noqa: BLE001
        return False


def _time_wallclock(fn: Any, inputs: Sequence[Any], iterations: int) -> tuple[list[float], Any]:
    import jax

    out = jax.block_until_ready(fn(*inputs))  # warm-up, excluded
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*inputs))
        samples.append((time.perf_counter() - start) * 1e6)
    return samples, out


def _time_cupti(
    fn: Any, inputs: Sequence[Any], iterations: int, *, aggregate: bool
) -> tuple[list[float], Any]:
    """GPU time per iteration in µs via CUPTI (``measure`` runs one warm-up call itself)."""
    from jax.experimental.mosaic.gpu import profiler

    measure: Any = profiler.measure  # its overloads want literal arguments
    out, timings = measure(fn, aggregate=aggregate, iterations=iterations)(*inputs)
    if timings is None:
        raise RuntimeError("CUPTI recorded no kernel launch.")
    if aggregate:
        values = timings if isinstance(timings, list) else [timings]
        return [float(ms) * 1000.0 for ms in values], out
    return select_kernel_time(timings), out


def time_runs(
    fn: Any,
    inputs: Sequence[Any],
    iterations: int,
    timing: str,
    *,
    aggregate: bool = False,
    cache: str = "warm",
    flush: Any = None,
) -> tuple[list[float], Any]:
    if timing == "cupti" and cache == "cold":
        # The L2 flushed before every iteration (autotune.evaluation.cold_timing): a failure here is the
        # method's, not the config's, so it is not retried as a stray launch would be.
        from autotune.evaluation.cold_timing import time_cold

        return time_cold(fn, inputs, iterations, flush, aggregate=aggregate,
                         select=select_kernel_time)
    if timing == "cupti":
        try:
            return _time_cupti(fn, inputs, iterations, aggregate=aggregate)
        except Exception:  # noqa: BLE001
            # A launch by another thread (an XLA autotuning compile) can land inside the
            # measured window and break measure()'s per-iteration split: try once more.
            if not device_still_works():
                raise
            log.debug("CUPTI measurement failed; retrying once.", exc_info=True)
            return _time_cupti(fn, inputs, iterations, aggregate=aggregate)
    return _time_wallclock(fn, inputs, iterations)

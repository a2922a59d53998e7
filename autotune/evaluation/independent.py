"""The second timing method (``autotune verify``): the host's clock, no profiler.

The search times with CUPTI, the kernel's own launches, inside one session per config, with the
L2 flushed by :mod:`autotune.evaluation.cold_timing` between iterations. This method shares none
of that: no CUPTI, no launch names, no session, a flush of its own. For each program it times,
with ``time.perf_counter`` around ``jax.block_until_ready``:

* ``calls`` x (flush, program), enqueued back to back, and
* ``calls`` x (flush) alone,

and takes the difference over ``calls`` as the program's time per call: the GPU stays busy
throughout (each call is queued while the previous one runs), as in a program's own loop, and
the flush's cost cancels out. Each round times every program once (in a rotating order),
:data:`BLOCKS` times, and keeps the median of the blocks; rounds repeat so that their spread
and the paired ratios between programs show how far the figures can be trusted.

The flush is an in-place ``x ^ 0x5A5A5A5A`` over an int32 buffer of :data:`FLUSH_L2_MULTIPLE`
times the L2 (asked of the CUDA driver; a small buffer on a CPU-only machine), another program
than the search's. What the method cannot see: a program shorter than the host's dispatch
time (about 10-20 us per call on the lent GPUs) is timed as the host's pace, not the GPU's.

jax is imported inside functions only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["METHOD", "BLOCKS", "FLUSH_L2_MULTIPLE", "WallClockTimer", "rotation", "time_configs"]

METHOD = "wallclock-difference"
BLOCKS = 3  # blocks per program and round; the round keeps their median
FLUSH_L2_MULTIPLE = 4
_CPU_FLUSH_BYTES = 1 << 20  # no L2 to speak of: the method's shape, at a small cost


def rotation(n_programs: int, round_index: int) -> list[int]:
    """The order of the programs in round ``round_index``: each round starts one later."""
    return [(round_index + i) % n_programs for i in range(n_programs)]


class WallClockTimer:
    """Times compiled programs by the host clock with a flush between calls (module docstring).

    ``flush_bytes``: the flush buffer's size (default: :data:`FLUSH_L2_MULTIPLE` x the L2 of the
    first GPU, or a small buffer without one); ``blocks``: blocks per program and round.
    """

    method = METHOD

    def __init__(self, flush_bytes: int | None = None, *, blocks: int = BLOCKS) -> None:
        import jax
        import jax.numpy as jnp

        if flush_bytes is None:
            flush_bytes = _CPU_FLUSH_BYTES
            if jax.default_backend() in ("gpu", "cuda"):
                from autotune.evaluation.cold_timing import l2_cache_bytes

                flush_bytes = FLUSH_L2_MULTIPLE * l2_cache_bytes(jax.devices()[0])[0]
        size = max(1, int(flush_bytes) // 4)
        self.flush_bytes = size * 4
        self.blocks = int(blocks)
        self._flip = jax.jit(lambda b: b ^ jnp.int32(0x5A5A5A5A), donate_argnums=0)
        self._buf = jax.block_until_ready(jnp.arange(size, dtype=jnp.int32))
        self._buf = jax.block_until_ready(self._flip(self._buf))  # compiled, warm

    def _flush(self) -> None:
        self._buf = self._flip(self._buf)

    def block_us(self, fn: Callable[..., Any], inputs: Sequence[Any], calls: int) -> float:
        """One block: ``calls`` x (flush, ``fn``) minus ``calls`` x flush, per call, in us."""
        import jax

        jax.block_until_ready(fn(*inputs))  # warm-up, excluded
        jax.block_until_ready(self._buf)
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            self._flush()
            out = fn(*inputs)
        jax.block_until_ready((out, self._buf))
        both = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(calls):
            self._flush()
        jax.block_until_ready(self._buf)
        alone = time.perf_counter() - start
        return (both - alone) / calls * 1e6

    def rounds(
        self,
        programs: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
        *,
        rounds: int,
        calls: int,
    ) -> list[list[float]]:
        """Per round, per program (in the order given), its time per call in us: the median
        of ``blocks`` blocks; programs in :func:`rotation` order within each round."""
        if rounds < 1 or calls < 1 or not programs:
            raise ValueError(
                f"a re-time needs at least one program, round and call, but got "
                f"{len(programs)} program(s), {rounds} round(s) and {calls} call(s)."
            )
        table: list[list[float]] = []
        for r in range(rounds):
            row = [0.0] * len(programs)
            for i in rotation(len(programs), r):
                fn, inputs = programs[i]
                row[i] = statistics.median(self.block_us(fn, inputs, calls)
                                           for _ in range(self.blocks))
            table.append(row)
        return table


def time_configs(
    problem: Any,
    configs: Sequence[Any],
    *,
    baseline: bool,
    rounds: int,
    calls: int,
    interpret: bool = False,
    allow_import: bool = False,
    seed: int = 0,
    timer: WallClockTimer | None = None,
) -> tuple[list[tuple[tuple[float, ...], ...]], tuple[tuple[float, ...], ...] | None]:
    """Compiles ``configs`` of ``problem`` (and its baseline when ``baseline``) in this process,
    checks each on fresh random inputs against the reference, then times them all with
    :class:`WallClockTimer` in ``rounds`` interleaved rounds. Returns per config its per-round
    times (one value a round), and the baseline's (None without one).

    Raises:
      ValueError: a config that does not compile or computes a wrong result, or a kernel
        without a baseline asked to time one.
    """
    import jax

    from autotune.evaluation.pipeline import compile_config, relative_error, tolerance_for
    from autotune.space.kernel import BuildOptions, get_kernel

    kernel = get_kernel(problem.kernel, allow_import=allow_import)
    where = jax.devices("cpu")[0] if interpret else jax.devices()[0]
    with jax.default_device(where):
        inputs = tuple(kernel.make_inputs(problem, jax.random.key(seed)))
        expected = kernel.reference(problem)(*inputs)
        tolerance = tolerance_for(kernel, problem.dtype)
        programs = []
        for config in configs:
            compiled = compile_config(kernel, problem, config, BuildOptions(interpret=interpret))
            if not hasattr(compiled, "executable"):
                raise ValueError(f"config {config} does not compile here: {compiled.error}")
            error = relative_error(compiled.executable(*inputs), expected)
            if not error <= tolerance:
                raise ValueError(f"config {config} computes a wrong result here (relative error "
                                 f"{error:.3g} > {tolerance:.3g}).")
            programs.append((compiled.executable, inputs))
        if baseline:
            if kernel.baseline is None:
                raise ValueError(f"kernel {kernel.name!r} declares no baseline to time.")
            fn = jax.jit(kernel.baseline(problem)).trace(*inputs).lower().compile()
            programs.append((fn, inputs))
        table = (timer or WallClockTimer()).rounds(programs, rounds=rounds, calls=calls)
    per_program = [tuple((row[i],) for row in table) for i in range(len(programs))]
    if baseline:
        return per_program[:-1], per_program[-1]
    return per_program, None

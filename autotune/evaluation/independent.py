"""The second timing methods (``autotune verify``), sharing no timing code with the search.

The search times with CUPTI, the kernel's own launches picked by name, inside one session of
many iterations per config, with the L2 flushed by :mod:`autotune.evaluation.cold_timing`
between iterations. Two methods here share none of that:

:class:`CuptiIsolatedTimer` (``cupti-isolated``, the default on a GPU): each call on its own,
after a flush of its own (an in-place xor over :data:`FLUSH_L2_MULTIPLE` x the L2) and a host
sync, in a CUPTI session of that one call; every launch of the call counts (no names picked,
nothing split); a round's time is the median of ``calls`` such calls. What it shares with the
search is jax's CUPTI extension, reached through the one adapter module
(:func:`autotune._jax_compat.cupti_session`). Each call starts on an idle GPU, after the session
opens: on the H100 that read 1.1-1.2% above the search's back-to-back cold timing for XLA and
the kernel alike, so their ratio held within 0.1-0.4% at 4096^3 and 128x8192x8192
(benchmarks/RESULTS.md §12).

:class:`CuptiFlushedTimer` (``cupti-flushed``): the protocol of Triton's ``do_bench`` with CUPTI
for its events: ``calls`` x (a flush of its own, the program) enqueued back to back with no
host sync between, in one CUPTI session; the session's launches are split per call where the
flush's launches begin (:func:`split_at_flush`: their names learnt from sessions of the flush
alone, a scan by name, not the search's fixed split), and every launch of the program counts.
It shares with the search the back-to-back protocol, so a bias of that protocol would pass it;
what differs is the code, the flush, the process (XLA's picks and the kernel's compile are
this process's own) and the launches counted.

:class:`WallClockTimer` (``wallclock-difference``, the method where there is no CUPTI: interpret
mode) uses no profiler at all. For each program it times, with ``time.perf_counter`` around
``jax.block_until_ready``:

* ``calls`` x (flush, program), enqueued back to back, and
* ``calls`` x (flush) alone,

and takes the difference over ``calls`` as the program's time per call: the GPU stays busy
throughout (each call is queued while the previous one runs), as in a program's own loop, and
the flush's cost cancels out. Each round times every program once (in a rotating order),
:data:`BLOCKS` times, and keeps the median of the blocks. It needs the GPU to stay ahead of the
host: on the H100 a flush-only loop came close to the host's dispatch pace, and its round
medians moved by up to 12-17%, so it is no GPU method there.

Both: rounds repeat so that their spread and the paired ratios between programs show how far
the figures can be trusted. The flush is an in-place ``x ^ 0x5A5A5A5A`` over an int32 buffer
(asked of the CUDA driver for the L2's size; a small buffer on a CPU-only machine), another
program than the search's.

jax is imported inside functions only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "METHOD",
    "CUPTI_METHOD",
    "FLUSHED_METHOD",
    "CuptiFlushedTimer",
    "split_at_flush",
    "BLOCKS",
    "FLUSH_L2_MULTIPLE",
    "WallClockTimer",
    "CuptiIsolatedTimer",
    "make_timer",
    "rotation",
    "time_configs",
]

METHOD = "wallclock-difference"
CUPTI_METHOD = "cupti-isolated"
FLUSHED_METHOD = "cupti-flushed"
BLOCKS = 3  # blocks per program and round; the round keeps their median
FLUSH_L2_MULTIPLE = 4
_CPU_FLUSH_BYTES = 1 << 20  # no L2 to speak of: the method's shape, at a small cost


def rotation(n_programs: int, round_index: int) -> list[int]:
    """The order of the programs in round ``round_index``: each round starts one later."""
    return [(round_index + i) % n_programs for i in range(n_programs)]


def _flush_program(flush_bytes: int | None) -> tuple[Any, Any, int]:
    """The flush: (jitted in-place xor, its buffer, bytes); the buffer sized from the L2."""
    import jax
    import jax.numpy as jnp

    if flush_bytes is None:
        flush_bytes = _CPU_FLUSH_BYTES
        if jax.default_backend() in ("gpu", "cuda"):
            from autotune.evaluation.cold_timing import l2_cache_bytes

            flush_bytes = FLUSH_L2_MULTIPLE * l2_cache_bytes(jax.devices()[0])[0]
    size = max(1, int(flush_bytes) // 4)
    flip = jax.jit(lambda b: b ^ jnp.int32(0x5A5A5A5A), donate_argnums=0)
    buf = jax.block_until_ready(jnp.arange(size, dtype=jnp.int32))
    buf = jax.block_until_ready(flip(buf))  # compiled, warm
    return flip, buf, size * 4


def _interleaved(
    programs: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
    rounds: int,
    calls: int,
    time_one: Callable[[Callable[..., Any], Sequence[Any]], float],
) -> list[list[float]]:
    """Per round, per program (in the order given), ``time_one(fn, inputs)``; the programs in
    :func:`rotation` order within each round.

    Raises:
      ValueError: no program, or fewer than one round or call.
    """
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
            row[i] = time_one(fn, inputs)
        table.append(row)
    return table


class CuptiIsolatedTimer:
    """Times each call alone: flush, host sync, a CUPTI session of the one call, every launch
    counted (module docstring). ``flush_bytes`` as for :class:`WallClockTimer`."""

    method = CUPTI_METHOD

    def __init__(self, flush_bytes: int | None = None) -> None:
        self._flip, self._buf, self.flush_bytes = _flush_program(flush_bytes)

    def call_us(self, fn: Callable[..., Any], inputs: Sequence[Any]) -> float:
        import jax

        from autotune._jax_compat import cupti_session

        self._buf = jax.block_until_ready(self._flip(self._buf))
        launches = cupti_session(lambda: fn(*inputs))
        if not launches:
            raise ValueError("CUPTI recorded no launch of the program.")
        return sum(ms for _, ms in launches) * 1000.0

    def rounds(
        self,
        programs: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
        *,
        rounds: int,
        calls: int,
    ) -> list[list[float]]:
        """Per round, per program, the median time of ``calls`` isolated calls in us."""
        import jax

        for fn, inputs in programs:
            jax.block_until_ready(fn(*inputs))  # warm-up, excluded
        return _interleaved(programs, rounds, calls, lambda fn, inputs: statistics.median(
            self.call_us(fn, inputs) for _ in range(calls)))


def split_at_flush(
    launches: Sequence[tuple[str, float]], flush_names: Sequence[str], calls: int
) -> list[float]:
    """Per call, the µs of every launch between one flush and the next, from the launches
    (``(name, ms)``, in order) of ``calls`` x (flush, program): a call begins where the flush's
    launches (``flush_names``, in order) are found.

    Raises:
      ValueError: the record does not begin with the flush, or does not split into ``calls``
        calls each with a launch of its own.
    """
    names = tuple(flush_names)
    f = len(names)
    if f == 0:
        raise ValueError("the flush launched nothing that CUPTI recorded.")
    per_call: list[float] = []
    current: float | None = None
    i = 0
    while i < len(launches):
        if tuple(n for n, _ in launches[i:i + f]) == names:
            if current is not None:
                per_call.append(current)
            current, i = 0.0, i + f
            continue
        if current is None:
            raise ValueError(f"the recorded launches begin with {launches[i][0]!r}, not with "
                             f"the flush's {list(names)}.")
        current += float(launches[i][1]) * 1000.0
        i += 1
    if current is not None:
        per_call.append(current)
    if len(per_call) != calls or not all(t > 0 for t in per_call):
        raise ValueError(f"the recorded launches split into {len(per_call)} call(s) (times "
                         f"{[round(t, 2) for t in per_call][:8]}), not {calls} that each launch "
                         "something of their own.")
    return per_call


class CuptiFlushedTimer:
    """Times ``calls`` calls back to back, each after a flush, in one CUPTI session (module
    docstring); ``flush_bytes`` as for :class:`WallClockTimer`."""

    method = FLUSHED_METHOD

    def __init__(self, flush_bytes: int | None = None) -> None:
        self._flip, self._buf, self.flush_bytes = _flush_program(flush_bytes)
        self._names: tuple[str, ...] | None = None

    def _flush(self) -> Any:
        self._buf = self._flip(self._buf)
        return self._buf

    def flush_names(self) -> tuple[str, ...]:
        """The flush's launches as CUPTI names them: two sessions of it alone that agree."""
        from autotune._jax_compat import cupti_session

        if self._names is None:
            first = tuple(name for name, _ in cupti_session(self._flush))
            second = tuple(name for name, _ in cupti_session(self._flush))
            if not first or first != second:
                raise ValueError(f"two CUPTI sessions of the flush alone recorded {list(first)} "
                                 f"and {list(second)}: something else launches GPU work here.")
            self._names = first
        return self._names

    def calls_us(self, fn: Callable[..., Any], inputs: Sequence[Any], calls: int) -> list[float]:
        """Per call, its launches' µs, from one session of ``calls`` x (flush, ``fn``)."""
        import jax

        from autotune._jax_compat import cupti_session

        names = self.flush_names()
        jax.block_until_ready(fn(*inputs))  # warm-up, excluded
        last: list[Any] = [None]

        def loop() -> Any:
            for _ in range(calls):
                self._flush()
                last[0] = fn(*inputs)
            return (last[0], self._buf)

        return split_at_flush(cupti_session(loop), names, calls)

    def rounds(
        self,
        programs: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
        *,
        rounds: int,
        calls: int,
    ) -> list[list[float]]:
        """Per round, per program, the median of its ``calls`` flushed calls in us."""
        return _interleaved(programs, rounds, calls, lambda fn, inputs: statistics.median(
            self.calls_us(fn, inputs, calls)))


def make_timer(method: str) -> Timer:
    """The timer of ``method`` (:data:`CUPTI_METHOD`, :data:`FLUSHED_METHOD` or :data:`METHOD`).

    Raises:
      ValueError: another name.
    """
    if method == CUPTI_METHOD:
        return CuptiIsolatedTimer()
    if method == FLUSHED_METHOD:
        return CuptiFlushedTimer()
    if method == METHOD:
        return WallClockTimer()
    raise ValueError(f"the re-time method must be {CUPTI_METHOD!r}, {FLUSHED_METHOD!r} or "
                     f"{METHOD!r}, got {method!r}.")


class WallClockTimer:
    """Times compiled programs by the host clock with a flush between calls (module docstring).

    ``flush_bytes``: the flush buffer's size (default: :data:`FLUSH_L2_MULTIPLE` x the L2 of the
    first GPU, or a small buffer without one); ``blocks``: blocks per program and round.
    """

    method = METHOD

    def __init__(self, flush_bytes: int | None = None, *, blocks: int = BLOCKS) -> None:
        self._flip, self._buf, self.flush_bytes = _flush_program(flush_bytes)
        self.blocks = int(blocks)

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
        return _interleaved(programs, rounds, calls, lambda fn, inputs: statistics.median(
            self.block_us(fn, inputs, calls) for _ in range(self.blocks)))


Timer = WallClockTimer | CuptiIsolatedTimer | CuptiFlushedTimer


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
    timer: Timer | None = None,
) -> tuple[list[tuple[tuple[float, ...], ...]], tuple[tuple[float, ...], ...] | None]:
    """Compiles ``configs`` of ``problem`` (and its baseline when ``baseline``) in this process,
    checks each on fresh random inputs against the reference, then times them all with
    ``timer`` (default: :class:`WallClockTimer`) in ``rounds`` interleaved rounds. Returns per config its per-round
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
    per_program: list[tuple[tuple[float, ...], ...]] = [
        tuple((row[i],) for row in table) for i in range(len(programs))]
    if baseline:
        return per_program[:-1], per_program[-1]
    return per_program, None

"""Timing with a cache policy on the GPU: the L2 flush, and CUPTI around a flushed loop.

``warm`` timing is Mosaic GPU's ``profiler.measure`` (iterations back to back on the same
inputs; :func:`autotune.evaluation.pipeline.run_compiled`). ``cold`` timing (:func:`time_cold`) runs,
inside one CUPTI session, ``iterations`` times: the L2 flush (:class:`L2Flush`), then the
program. CUPTI records every kernel launch with its name and GPU time; each iteration's
launches are split into the flush's (the first ones, whose names must be those the flush
launched when measured alone) and the program's, and only the program's count. The flush is a
separate jitted program, never fused with the timed one, on the same stream, so it has finished
before the timed kernel starts.

The flush reads and writes an int32 buffer of :data:`FLUSH_FACTOR` times the L2's size (100 MiB
on an H100, whose L2 is 50 MiB; 120 MiB on an H200, whose driver reports 60 MiB): every line the
previous iteration left in L2 is evicted. The L2 size comes from :func:`l2_cache_bytes`.

:func:`time_cold_interleaved` times several programs so, interleaved call by call in one session
(``iterations`` x (flush, program 1, flush, program 2, ...)): the calls of a pair are a few
hundred microseconds apart, so a clock that moves within a round (the power cap) moves both
(``benchmarks/timing_study.py --methods pair``).

jax is imported inside functions only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from autotune.devices import current_device, read_device

__all__ = [
    "FLUSH_FACTOR",
    "l2_cache_bytes",
    "L2Flush",
    "split_flushed",
    "split_calls",
    "time_cold",
    "time_cold_interleaved",
]

log = logging.getLogger(__name__)

FLUSH_FACTOR = 2
# CUPTI sessions of the flush alone, at most, until two in a row agree on its launches.
CALIBRATION_SESSIONS = 4


def l2_cache_bytes(device: Any = None) -> tuple[int, str]:
    """``(bytes, source)``: the L2 size of ``device`` (a jax device; default: the first GPU).

    Asked of jax (a device attribute ``l2_cache_size``, where jax exposes one), else of the CUDA
    driver (:func:`autotune.devices.read_device`), else taken from the device profile
    (:func:`autotune.devices.current_device`: ``--device-profile``, default h100-sxm);
    ``source`` says which: ``"jax"``, ``"cuda"`` or ``"profile:<name>"``.
    """
    if device is not None:
        size = getattr(device, "l2_cache_size", None)
        if isinstance(size, int) and size > 0:
            return size, "jax"
    ordinal = int(getattr(device, "local_hardware_id", 0) or 0) if device is not None else 0
    facts = read_device(ordinal)
    if facts is not None:
        return facts.l2_bytes, "cuda"
    fallback = current_device(ordinal=ordinal)
    return fallback.l2_bytes, fallback.source


class L2Flush:
    """A program that evicts the L2: ``buffer + 1`` in place over ``FLUSH_FACTOR`` x L2 bytes.

    Making one compiles its programs (host work); ``launch()`` enqueues it (asynchronously,
    like any jax call; the first makes its buffer); ``names`` are the kernel launches CUPTI saw
    for one flush (set by :meth:`calibrate`).
    """

    def __init__(self, nbytes: int | None = None) -> None:
        import jax
        import jax.numpy as jnp

        if nbytes is None:
            l2, source = l2_cache_bytes(jax.devices()[0])
            nbytes = FLUSH_FACTOR * l2
            log.debug("L2 flush of %d bytes (L2 %d bytes, from %s).", nbytes, l2, source)
        self.nbytes = int(nbytes)
        size = max(1, self.nbytes // 4)
        # Compiled here and the buffer made at the first launch, so that it can be made ahead
        # of the GPU's lock (Evaluator.warm_host, a problem's prepare): nothing runs on the
        # device until then.
        self._fn = jax.jit(lambda b: b + 1, donate_argnums=0).lower(
            jax.ShapeDtypeStruct((size,), jnp.int32)).compile()
        self._zeros = jax.jit(lambda: jnp.zeros((size,), jnp.int32)).lower().compile()
        self._buf: Any = None
        self.names: tuple[str, ...] | None = None

    def launch(self) -> None:
        if self._buf is None:
            self._buf = self._zeros()
        self._buf = self._fn(self._buf)

    def calibrate(self, session: Callable[[Callable[[], Any]], list[tuple[str, float]]]) -> None:
        """Learns the names of the flush's own launches from CUPTI ``session``s.

        A session records every launch of the process, so one made by another thread meanwhile
        (XLA autotuning a compile) would be taken for the flush's: the names are those two
        sessions in a row agree on (at most :data:`CALIBRATION_SESSIONS`).
        """
        if self.names is not None:
            return
        if self._buf is None:  # made before the sessions, which must see the flush alone
            import jax

            self._buf = jax.block_until_ready(self._zeros())
        def launched() -> Any:
            self.launch()
            return self._buf

        seen: list[tuple[str, ...]] = []
        for _ in range(CALIBRATION_SESSIONS):
            names = tuple(name for name, _ in session(launched))
            if not names:
                raise RuntimeError("CUPTI recorded no launch of the L2 flush.")
            if seen and names == seen[-1]:
                self.names = names
                return
            seen.append(names)
        raise RuntimeError(
            f"cold timing: {CALIBRATION_SESSIONS} CUPTI sessions of the L2 flush alone recorded "
            f"different launches each time ({[list(n) for n in seen]}): something else in this "
            "process launches GPU work meanwhile."
        )


def split_flushed(
    launches: Sequence[tuple[str, float]], iterations: int, flush_names: Sequence[str]
) -> list[list[tuple[str, float]]]:
    """Per iteration, the timed program's launches of a flushed loop (the flush's removed).

    ``launches`` is the CUPTI record of ``iterations`` x (flush, program), in launch order.

    Raises:
      RuntimeError: the record does not split into equal iterations that each begin with the
        flush's launches (by name), or an iteration has no launch of the program.
    """
    n, f = len(launches), len(flush_names)
    if iterations < 1 or n % iterations:
        raise RuntimeError(
            f"cold timing: {n} kernel launches do not split into {iterations} iterations."
        )
    per = n // iterations
    out = []
    for i in range(iterations):
        chunk = list(launches[i * per:(i + 1) * per])
        names = tuple(name for name, _ in chunk[:f])
        if names != tuple(flush_names):
            raise RuntimeError(
                f"cold timing: iteration {i} does not begin with the L2 flush's launches "
                f"{list(flush_names)}, but with {list(names)}."
            )
        if len(chunk) == f:
            raise RuntimeError(f"cold timing: iteration {i} launched nothing but the L2 flush.")
        out.append(chunk[f:])
    return out


def time_cold(
    fn: Any,
    inputs: Sequence[Any],
    iterations: int,
    flush: L2Flush,
    *,
    aggregate: bool,
    select: Callable[[list[list[tuple[str, float]]]], list[float]],
) -> tuple[list[float], Any]:
    """GPU time per iteration in µs with the L2 flushed before each; and the last output.

    One warm-up call first (excluded). ``aggregate``: every launch of the program counts (a
    baseline: XLA's kernels); otherwise ``select`` picks the tuned kernel's own launches
    (:func:`autotune.evaluation.timing.select_kernel_time`).
    """
    import jax

    from autotune._jax_compat import cupti_session

    out = jax.block_until_ready(fn(*inputs))  # warm-up, excluded
    flush.calibrate(cupti_session)
    assert flush.names is not None
    last: list[Any] = [out]

    def loop() -> Any:
        for _ in range(iterations):
            flush.launch()
            last[0] = fn(*inputs)  # earlier outputs are freed as the loop goes
        return last[0]

    names = flush.names
    per_iteration = _split_once_more(
        lambda: split_flushed(cupti_session(loop), iterations, names), "Cold timing")
    return _per_call_us(per_iteration, aggregate, select), last[0]


_T = TypeVar("_T")


def _split_once_more(split: Callable[[], _T], what: str) -> _T:
    """``split()`` (a recorded window split into calls), once more if it raises: a launch by
    another thread of this process (an XLA autotuning compile) can land in the recorded window
    and break the split, as warm timing also retries."""
    try:
        return split()
    except RuntimeError:
        log.debug("%s did not split; retrying once.", what, exc_info=True)
        return split()


def _per_call_us(calls: list[list[tuple[str, float]]], aggregate: bool,
                 select: Callable[[list[list[tuple[str, float]]]], list[float]]) -> list[float]:
    """µs per call: every launch of a call (``aggregate``: a baseline), else what ``select``
    picks (the tuned kernel's own launches)."""
    if aggregate:
        return [sum(float(ms) for _, ms in it) * 1000.0 for it in calls]
    return select(calls)


def split_calls(
    launches: Sequence[tuple[str, float]], flush_names: Sequence[str]
) -> list[list[tuple[str, float]]]:
    """Per call, the program's launches of a flushed loop whose programs may launch different
    numbers of kernels: a call begins where the flush's launches (``flush_names``, in order)
    are found, and holds every launch up to the next flush.

    Raises:
      RuntimeError: the flush launched nothing, or the record does not begin with it.
    """
    names = tuple(flush_names)
    f = len(names)
    if f == 0:
        raise RuntimeError("cold timing: the flush launched nothing that CUPTI recorded.")
    calls: list[list[tuple[str, float]]] = []
    i = 0
    while i < len(launches):
        if tuple(name for name, _ in launches[i:i + f]) == names:
            calls.append([])
            i += f
            continue
        if not calls:
            raise RuntimeError(f"cold timing: the record begins with {launches[i][0]!r}, not "
                               f"with the flush's {list(names)}.")
        calls[-1].append(launches[i])
        i += 1
    return calls


def time_cold_interleaved(
    fns: Sequence[Any],
    inputs: Sequence[Sequence[Any]],
    iterations: int,
    flush: Any,
    *,
    aggregate: Sequence[bool],
    select: Callable[[list[list[tuple[str, float]]]], list[float]],
    session: Callable[[Callable[[], Any]], list[tuple[str, float]]] | None = None,
) -> list[list[float]]:
    """Per program (``fns[i]`` on ``inputs[i]``), its GPU time per call in µs, timed
    interleaved: one CUPTI session (``session``, default CUPTI's) over ``iterations`` x
    (flush, ``fns[0]``, flush, ``fns[1]``, ...), the L2 flushed before every call. One
    warm-up call of each first (excluded). ``aggregate[i]``: every launch of program ``i``
    counts (a baseline); otherwise ``select`` picks the tuned kernel's own launches, as in
    :func:`time_cold`.

    Raises:
      ValueError: no program, fewer than one iteration, or counts that do not match.
      RuntimeError: the record does not split into ``iterations`` x programs calls that each
        launched something of their own, twice in a row (a stray launch once is timed again).
    """
    import jax

    if session is None:
        from autotune._jax_compat import cupti_session

        session = cupti_session
    k = len(fns)
    if k == 0 or iterations < 1 or len(inputs) != k or len(aggregate) != k:
        raise ValueError(f"interleaved cold timing needs programs, inputs and aggregate flags "
                         f"of one count and at least one iteration, but got {k} program(s), "
                         f"{len(inputs)} input set(s), {len(aggregate)} flag(s) and "
                         f"{iterations} iteration(s).")
    for fn, args in zip(fns, inputs, strict=True):
        jax.block_until_ready(fn(*args))  # warm-up, excluded
    flush.calibrate(session)
    assert flush.names is not None
    names = flush.names

    def loop() -> Any:
        last = None
        for _ in range(iterations):
            for fn, args in zip(fns, inputs, strict=True):
                flush.launch()
                last = fn(*args)
        return last

    def recorded() -> list[list[tuple[str, float]]]:
        calls = split_calls(session(loop), names)
        if len(calls) != iterations * k or not all(calls):
            raise RuntimeError(f"cold timing: {len(calls)} call(s) recorded, not {iterations} "
                               f"x {k} that each launched something of their own.")
        return calls

    calls = _split_once_more(recorded, "Interleaved cold timing")
    return [_per_call_us(calls[j::k], aggregate[j], select) for j in range(k)]

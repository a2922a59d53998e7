"""Trial outcomes as values: what measuring one config produced, and how it was timed.

Every way a trial can end is an :class:`Outcome`, stored as such; nothing a kernel does is
allowed to escape as an exception into the tuner. No jax here.

How a timing was taken is part of what it means, so the vocabulary of measurements lives here
too (docs/measurement.md):

* **cache policy** (:class:`CachePolicy`), stored with every timing. ``cold``: the L2 cache is
  flushed before every timed iteration by a separate program whose launches are left out of the
  kernel's time (:mod:`autotune.evaluation.cold_timing`), as Triton's ``do_bench`` and NVIDIA's nvbench
  do; the default on GPUs. ``warm``: iterations back to back on the same inputs, which stay in
  L2 when they fit (every row stored before schema revision 0003); the default in GPU interpret
  mode and with the fake evaluator, where ``cold`` is refused or means nothing. Times of two
  policies are never compared.
* **spread** (:func:`relative_spread`): ``(p90 - p10) / median`` of a measurement's samples.
* **interleaved rounds** (:func:`round_order`): the order in which a confirmation round times
  its programs.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Sequence

from autotune.devices import DeviceFacts

__all__ = [
    "Outcome", "TrialResult", "DeviceInfo", "DeviceKind", "DEVICE_KINDS", "CachePolicy",
    "CACHE_POLICIES", "PROGRAM_METHOD",
    "resolve_cache_policy", "relative_spread", "round_order",
    "time_problem", "plausible_us", "MIN_TIME_US", "MAX_TIME_US",
]

# The one validity gate for stored times (microseconds): a time outside
# [MIN_TIME_US, MAX_TIME_US], or not a finite number, was not measured by a timer (another
# tool wrote it, a timer broke) and is never served, exported, imported or plotted. A GPU clock
# cycle is about 1 ns; no trial's time limit lets a kernel run for hours.
MIN_TIME_US = 1e-3
MAX_TIME_US = 1e10


def time_problem(value: object, *, name: str = "median_us") -> str | None:
    """Why ``value`` is not a plausible time in microseconds (naming ``name``, the rule and the
    value), or None when it is one: a finite number from 1 ns to about 2.8 hours."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} must be a number of microseconds, got {value!r}"
    if not math.isfinite(value) or value <= 0:
        return f"{name} must be a positive, finite number of microseconds, got {value!r}"
    if not MIN_TIME_US <= value <= MAX_TIME_US:
        return (f"{name} = {value!r} is not a plausible time: a measured time lies between "
                f"{MIN_TIME_US:g} and {MAX_TIME_US:g} us")
    return None


def plausible_us(value: object) -> bool:
    """Whether ``value`` is a plausible time in microseconds (:func:`time_problem`)."""
    return time_problem(value) is None


class DeviceKind(enum.StrEnum):
    """What a trial ran on: a GPU (CUPTI timing), GPU interpret mode on the CPU (functional
    runs, wall-clock times that are not GPU timings) or the fake evaluator (tests)."""

    GPU = "gpu"
    INTERPRET = "interpret"
    FAKE = "fake"


DEVICE_KINDS = tuple(k.value for k in DeviceKind)


class CachePolicy(enum.StrEnum):
    """Whether the L2 cache is flushed between timed iterations (see the module docstring)."""

    COLD = "cold"
    WARM = "warm"


CACHE_POLICIES = tuple(p.value for p in CachePolicy)

# The method of a problem's program check (a verification row of its own): its crowned config
# and its baseline timed as a program calls them (the host's clock around batches of calls
# back to back, one wait), paired by round. CUPTI's kernel times leave out what a call costs
# the GPU beyond its kernels (on the H100 a cuDNN attention call 12 us, a Mosaic GPU call
# 5 us: benchmarks/RESULTS.md §19), so this check, where stored, decides which implementation
# a program runs.
PROGRAM_METHOD = "program-batch"


def resolve_cache_policy(requested: str | None, device_kind: str) -> CachePolicy:
    """The policy a job times with: ``requested``, else ``cold`` on a GPU and ``warm`` elsewhere.

    Raises:
      ValueError: an unknown policy, or ``cold`` where there is no GPU L2 to flush.
    """
    if requested is None or requested == "auto":
        return CachePolicy.COLD if device_kind == DeviceKind.GPU else CachePolicy.WARM
    if requested not in CACHE_POLICIES:
        raise ValueError(
            f"cache must be one of {', '.join(CACHE_POLICIES)} (or auto), but got {requested!r}."
        )
    policy = CachePolicy(requested)
    if policy is CachePolicy.COLD and device_kind == DeviceKind.INTERPRET:
        raise ValueError(
            "cache = 'cold' needs a GPU: GPU interpret mode runs on the CPU and has no L2 to "
            "flush. Use cache = 'warm' (or leave it out) in interpret mode."
        )
    return policy


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``percentile``)."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def relative_spread(samples: Sequence[float]) -> float | None:
    """``(p90 - p10) / median`` of ``samples`` (0 for one sample); None when there are none."""
    values = sorted(float(s) for s in samples)
    if not values:
        return None
    median = statistics.median(values)
    if median <= 0:
        return None
    return (_quantile(values, 0.9) - _quantile(values, 0.1)) / median


def round_order(n_programs: int, rounds: int) -> list[list[int]]:
    """The interleaved schedule: per round, the programs' indices in the order they are timed.

    Round ``r`` times every program once, starting at program ``r mod n`` (A B C base, then
    B C base A, ...): each program is timed after each other one, so a position effect (the
    first timing after a pause, a clock that ramps up) does not always land on the same one.
    """
    if n_programs < 1 or rounds < 1:
        raise ValueError(
            f"a confirmation needs at least one program and one round, but got "
            f"{n_programs} program(s) and {rounds} round(s)."
        )
    return [[(r + i) % n_programs for i in range(n_programs)] for r in range(rounds)]


class Outcome(enum.StrEnum):
    """How a trial ended."""

    OK = "ok"  # compiled, correct, timed
    INVALID = "invalid"  # failed to lower: the space let through a config it should not have
    COMPILE_ERROR = "compile_error"  # lowered, but compiling or launching failed
    WRONG_RESULT = "wrong_result"  # ran, but the output does not match the reference
    TIMEOUT = "timeout"  # compile or run took longer than allowed; the worker was killed
    CRASHED = "crashed"  # the worker died (segfault, abort, CUDA error)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The device a trial ran on. Interpret-mode rows say so in ``name`` and ``kind``.

    ``facts``: what the tuner knew of the device (:class:`autotune.devices.DeviceFacts`, read
    from the driver on a GPU; in interpret mode, the profile the CPU stands in for), stored
    with the device's row; None where unknown. Not part of its identity (equality, hashing,
    the stored device key): name, kind, compute capability and driver are.
    """

    name: str  # "NVIDIA H200", or "cpu-interpret (...)"
    kind: DeviceKind  # a plain string of one of DEVICE_KINDS is converted
    compute_capability: str = ""
    driver: str = ""
    facts: DeviceFacts | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DeviceKind(self.kind))

    @property
    def is_gpu(self) -> bool:
        return self.kind is DeviceKind.GPU


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What measuring one config produced. Times in microseconds, compile time in seconds."""

    outcome: Outcome
    samples_us: tuple[float, ...] = ()
    compile_s: float | None = None
    error: str = ""
    rel_error: float | None = None  # ||out - ref|| / ||ref||
    timing: str = ""  # "cupti" | "wallclock" | "fake"
    # The log of the worker process that crashed on this config (not stored; for progress).
    log_path: str = ""
    cache: str = ""  # the cache policy it was timed with: "cold" | "warm" (CachePolicy)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def median_us(self) -> float | None:
        return statistics.median(self.samples_us) if self.samples_us else None

    @property
    def min_us(self) -> float | None:
        return min(self.samples_us) if self.samples_us else None

    @property
    def max_us(self) -> float | None:
        return max(self.samples_us) if self.samples_us else None

    @property
    def spread(self) -> float | None:
        """``(p90 - p10) / median`` of the samples (:func:`relative_spread`)."""
        return relative_spread(self.samples_us)

    @classmethod
    def failed(cls, outcome: Outcome, error: str, *, compile_s: float | None = None) -> TrialResult:
        return cls(outcome=outcome, error=error[-4000:], compile_s=compile_s)

    @classmethod
    def timed(
        cls,
        samples_us: Sequence[float],
        *,
        compile_s: float | None,
        rel_error: float | None,
        timing: str,
        cache: str = "",
    ) -> TrialResult:
        return cls(
            outcome=Outcome.OK,
            samples_us=tuple(float(s) for s in samples_us),
            compile_s=compile_s,
            rel_error=rel_error,
            timing=timing,
            cache=cache,
        )

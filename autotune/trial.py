"""Trial outcomes as values: what measuring one config produced.

Every way a trial can end is an :class:`Outcome`, stored as such; nothing a kernel does is
allowed to escape as an exception into the tuner. No jax here.
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
from collections.abc import Sequence

__all__ = ["Outcome", "TrialResult", "DeviceInfo"]


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
    """The device a trial ran on. Interpret-mode rows say so in ``name`` and ``kind``."""

    name: str  # "NVIDIA H200", or "cpu-interpret (...)"
    kind: str  # "gpu" | "interpret" | "fake"
    compute_capability: str = ""
    driver: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What measuring one config produced. Times in microseconds, compile time in seconds."""

    outcome: Outcome
    samples_us: tuple[float, ...] = ()
    compile_s: float | None = None
    error: str = ""
    rel_error: float | None = None  # ||out - ref|| / ||ref||
    timing: str = ""  # "cupti" | "wallclock" | "fake"
    cache: str = ""  # the cache policy it was timed with: "cold" | "warm" (autotune.measurement)

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
        """``(p90 - p10) / median`` of the samples (:func:`autotune.measurement.relative_spread`)."""
        from autotune.measurement import relative_spread

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

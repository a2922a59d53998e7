"""The GPU's clocks, temperature and throttling, read before and after a job (NVML).

A timing holds for the clock the SMs ran at. nvbench watches the clock and the temperature for
the same reason: a GPU that throttles (power cap, heat) or whose clock moved between the
beginning and the end of a job measured its configs at different speeds. :func:`read_clocks`
takes a :class:`ClockSnapshot` through NVML (the maintained ``nvidia-ml-py`` package, an
optional extra: ``pip install 'autotune[nvml]'``; imported only when called), and
:func:`clock_warnings` compares two of them.

Without ``nvidia-ml-py``, or without a GPU, the snapshot says it is unavailable and why; nothing
fails. No jax here: the job runner calls this from the process that never touches CUDA itself.

What is read, per GPU: the current and maximum SM clock (MHz), the temperature (C), the active
clock-event ("throttle") reasons, and NVML's cumulative time spent throttled by the power and
the thermal policies (``nvmlDeviceGetViolationStatus``, in ns): their increase between two
snapshots is throttling that happened in between, even when the GPU is idle at both moments.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["ClockSnapshot", "read_clocks", "clock_warnings", "gpu_index", "THROTTLE_REASONS"]

log = logging.getLogger(__name__)

# NVML clock-event reason bits that slow the SMs down (idle and application clocks do not).
THROTTLE_REASONS = {
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
_IDLE = 0x0000000000000001
# nvmlPerfPolicyType_t
_POLICY_POWER = 0
_POLICY_THERMAL = 1
# A clock that moved by more than this between two busy snapshots is worth a warning.
CLOCK_MOVED_FRACTION = 0.02


@dataclasses.dataclass(frozen=True)
class ClockSnapshot:
    """One reading of a GPU; ``available`` False (with ``reason``) when it could not be read."""

    available: bool
    reason: str = ""
    gpu: int | None = None
    taken_at: str = ""  # ISO 8601, UTC
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    idle: bool | None = None
    throttle_reasons: tuple[str, ...] = ()
    power_violation_ns: int | None = None
    thermal_violation_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["throttle_reasons"] = list(self.throttle_reasons)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClockSnapshot:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["throttle_reasons"] = tuple(values.get("throttle_reasons") or ())
        return cls(**values)


def gpu_index(gpus: Sequence[int] | None = None) -> int:
    """The NVML index of the GPU a job times on: the first of ``gpus``, else the first of
    ``CUDA_VISIBLE_DEVICES`` when it is a number, else 0."""
    if gpus:
        return int(gpus[0])
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def read_clocks(gpu: int = 0, *, nvml: Any = None) -> ClockSnapshot:
    """A snapshot of GPU ``gpu`` through NVML; never raises.

    ``nvml`` is the ``pynvml`` module (imported here when None; tests pass a stand-in).
    """
    if nvml is None:
        try:
            import pynvml  # the nvidia-ml-py package
        except ImportError:
            return ClockSnapshot(
                available=False, gpu=gpu, taken_at=_now(),
                reason="nvidia-ml-py is not installed (pip install 'autotune[nvml]')",
            )
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no driver, no GPU: recorded, not raised
        return ClockSnapshot(available=False, gpu=gpu, taken_at=_now(), reason=f"NVML: {e}")
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
        clock = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        max_clock = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        temp = int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        get_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        bits = int(get_reasons(handle))
        violations: list[int | None] = []
        for policy in (_POLICY_POWER, _POLICY_THERMAL):
            try:
                violations.append(int(nvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime))
            except Exception:  # noqa: BLE001 - not every GPU reports every policy
                violations.append(None)
        return ClockSnapshot(
            available=True,
            gpu=gpu,
            taken_at=_now(),
            sm_clock_mhz=clock,
            sm_clock_max_mhz=max_clock,
            temperature_c=temp,
            idle=bool(bits & _IDLE),
            throttle_reasons=tuple(name for bit, name in THROTTLE_REASONS.items() if bits & bit),
            power_violation_ns=violations[0],
            thermal_violation_ns=violations[1],
        )
    except Exception as e:  # noqa: BLE001
        return ClockSnapshot(available=False, gpu=gpu, taken_at=_now(), reason=f"NVML: {e}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def clock_warnings(before: ClockSnapshot, after: ClockSnapshot) -> list[str]:
    """What a user should know about the timings taken between two snapshots; [] when fine.

    Warns when a throttle reason was active in either snapshot, when the power or thermal
    throttle time grew in between, and when the SM clock of two busy (not idle) snapshots
    differs by more than :data:`CLOCK_MOVED_FRACTION`.
    """
    if not (before.available and after.available):
        return []
    out = []
    for label, snap in (("before", before), ("after", after)):
        if snap.throttle_reasons:
            out.append(f"the GPU was throttled {label} the job ({', '.join(snap.throttle_reasons)})")
    for what, a, b in (
        ("power", before.power_violation_ns, after.power_violation_ns),
        ("thermal", before.thermal_violation_ns, after.thermal_violation_ns),
    ):
        if a is not None and b is not None and b > a:
            out.append(f"the GPU spent {(b - a) / 1e9:.3f} s throttled by its {what} limit during the job")
    if (
        before.idle is False and after.idle is False
        and before.sm_clock_mhz and after.sm_clock_mhz
        and abs(after.sm_clock_mhz - before.sm_clock_mhz) > CLOCK_MOVED_FRACTION * before.sm_clock_mhz
    ):
        out.append(
            f"the SM clock moved from {before.sm_clock_mhz} MHz to {after.sm_clock_mhz} MHz "
            "during the job"
        )
    return out

"""GPU clocks through NVML: read without failing, compared into warnings."""

from __future__ import annotations

import dataclasses
import sys
import types

from autotune.evaluation import clocks
from autotune.evaluation.clocks import ClockSnapshot, clock_warnings, read_clocks


class FakeNvml:
    """A stand-in for pynvml: one GPU with settable readings."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, clock=1980, temp=45, reasons=0, power_ns=0, thermal_ns=0, fail=None):
        self.clock, self.temp, self.reasons = clock, temp, reasons
        self.violations = {0: power_ns, 1: thermal_ns}
        self.fail = fail
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError(self.fail)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return self.clock

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, handle, kind):
        return self.temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        return types.SimpleNamespace(violationTime=self.violations[policy])


def test_a_snapshot_reads_clock_temperature_reasons_and_throttle_time():
    """Every reading lands in the snapshot, throttle reasons by name, and NVML is shut down."""
    nvml = FakeNvml(clock=1755, temp=61, reasons=0x4 | 0x1, power_ns=5, thermal_ns=7)
    snap = read_clocks(3, nvml=nvml)
    assert snap.available and snap.gpu == 3
    assert (snap.sm_clock_mhz, snap.sm_clock_max_mhz, snap.temperature_c) == (1755, 1980, 61)
    assert snap.idle is True and snap.throttle_reasons == ("sw_power_cap",)
    assert (snap.power_violation_ns, snap.thermal_violation_ns) == (5, 7)
    assert nvml.shutdowns == 1
    assert ClockSnapshot.from_dict(snap.to_dict()) == snap


def test_without_nvidia_ml_py_or_a_driver_the_snapshot_says_why(monkeypatch):
    """No pynvml installed, or NVML failing to start: unavailable, with the reason; no error."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    snap = read_clocks(0)
    assert not snap.available and "nvidia-ml-py is not installed" in snap.reason
    broken = read_clocks(0, nvml=FakeNvml(fail="NVML Shared Library Not Found"))
    assert not broken.available and "Not Found" in broken.reason
    assert clock_warnings(snap, broken) == []


def test_throttling_and_a_moving_clock_are_warned_about():
    """A throttle reason, throttle time that grew, or a busy clock that moved >2% warns."""
    before = read_clocks(0, nvml=FakeNvml(power_ns=10))
    busy = dataclasses.replace(before, idle=False)
    assert clock_warnings(before, read_clocks(0, nvml=FakeNvml(power_ns=10))) == []
    grew = read_clocks(0, nvml=FakeNvml(power_ns=2_000_000_010))
    assert any("2.000 s throttled by its power limit" in w for w in clock_warnings(before, grew))
    hot = read_clocks(0, nvml=FakeNvml(reasons=0x40, power_ns=10))
    assert any("hw_thermal_slowdown" in w for w in clock_warnings(before, hot))
    slower = dataclasses.replace(busy, sm_clock_mhz=1700)
    assert any("moved from 1980 MHz to 1700 MHz" in w for w in clock_warnings(busy, slower))
    # Idle snapshots say nothing about the clock under load.
    assert clock_warnings(before, dataclasses.replace(before, sm_clock_mhz=345, idle=True)) == []


def test_gpu_index_follows_the_engine_then_cuda_visible_devices(monkeypatch):
    """The engine's first GPU, else the first visible device's number, else 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    assert clocks.gpu_index([2, 3]) == 2
    assert clocks.gpu_index(None) == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert clocks.gpu_index(None) == 0

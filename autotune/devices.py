"""Device facts in one place: what every hardware number of the tuner comes from.

A :class:`DeviceFacts` describes one GPU: its name, compute capability and architecture, SM
count, shared memory per block and per SM, L2 size, memory bandwidth, peak bf16 FLOP/s and
clocks. :func:`read_device` reads them from the CUDA driver API (``libcuda.so.1`` through
ctypes: no jax, no CUDA context); where there is no driver or no GPU, a named profile of
:data:`PROFILES` stands in (``--device-profile NAME``, ``autotune.tune(device_profile=...)``,
or ``$AUTOTUNE_DEVICE_PROFILE``; default :data:`DEFAULT_PROFILE`). :func:`current_device` is
the one place that chooses, and kernel builds (their persistent grids), the spaces' shared
memory rule, the cost model's waves and the L2 flush all take their numbers from it.

Profiles are datasheet values (NVIDIA's H100, H200, H20, H800, GH200, A100 and B200 datasheets
and the CUDA programming guide's per-architecture limits); a value the datasheets leave open
is marked where it is set. Shared memory per block is the opt-in maximum a kernel may ask for
(``cudaDevAttrMaxSharedMemoryPerBlockOptin``: 227 KiB on every Hopper part).

Core layer: imports nothing of autotune but :mod:`autotune.errors`, and never jax.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from autotune.errors import JobError, did_you_mean

__all__ = [
    "DeviceFacts",
    "PROFILES",
    "DEFAULT_PROFILE",
    "PROFILE_ENV_VAR",
    "HOPPER_ARCHS",
    "UnsupportedDeviceError",
    "arch_of",
    "profile",
    "profile_for_name",
    "read_device",
    "facts_from_driver",
    "current_device",
    "using_profile",
    "check_arch",
]

log = logging.getLogger(__name__)

PROFILE_ENV_VAR = "AUTOTUNE_DEVICE_PROFILE"
DEFAULT_PROFILE = "h100-sxm"  # the most common Hopper GPU
HOPPER_ARCHS = ("sm_90a",)

KIB = 1024
MIB = 1024 * KIB


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the tuner knows of one GPU.

    Attributes:
      name: the device's name as the driver gives it (``"NVIDIA H100 80GB HBM3"``).
      compute_capability: ``"9.0"``.
      arch: the target Mosaic GPU compiles for (``"sm_90a"``; :func:`arch_of`).
      num_sms: streaming multiprocessors: a persistent kernel's grid, the cost model's waves.
      smem_per_block: the opt-in maximum of shared memory one block may use (bytes).
      smem_per_sm: shared memory of one SM (bytes).
      l2_bytes: L2 cache size (the cold-cache flush is twice this).
      mem_bandwidth_gbs: device memory bandwidth (GB/s); None where unknown.
      peak_bf16_tflops: dense bf16 tensor-core peak (TFLOP/s); None where unknown.
      peak_fp32_tflops: float32 CUDA-core peak (TFLOP/s), for reports; None where unknown.
      sm_clock_mhz: the SM clock's maximum (MHz); None where unknown.
      mem_clock_mhz: the memory clock (MHz); None where unknown.
      source: ``"driver"`` (read from the device) or ``"profile:<name>"``.
    """

    name: str
    compute_capability: str
    arch: str
    num_sms: int
    smem_per_block: int
    smem_per_sm: int
    l2_bytes: int
    mem_bandwidth_gbs: float | None = None
    peak_bf16_tflops: float | None = None
    peak_fp32_tflops: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    source: str = "driver"

    def __post_init__(self) -> None:
        for field in ("num_sms", "smem_per_block", "smem_per_sm", "l2_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"DeviceFacts.{field} must be a positive integer, got {value!r}.")

    def to_dict(self) -> dict[str, object]:
        """The facts as JSON-able values (stored with each device row)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> DeviceFacts:
        """Facts from :meth:`to_dict`'s output (keys it does not know are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line: ``NVIDIA H100 PCIe (sm_90a, 114 SMs, 50 MiB L2; profile:h100-pcie)``."""
        return (f"{self.name} ({self.arch}, {self.num_sms} SMs, {self.l2_bytes / MIB:g} MiB L2; "
                f"{self.source})")


def arch_of(compute_capability: str) -> str:
    """The compile target of a compute capability: ``"9.0"`` -> ``"sm_90a"``.

    From Hopper on, Mosaic GPU compiles for the architecture-specific target (``a``: wgmma,
    TMA multicast, ``setmaxnreg``); older parts have none.
    """
    major, _, minor = compute_capability.partition(".")
    suffix = "a" if int(major) >= 9 else ""
    return f"sm_{int(major)}{int(minor or 0)}{suffix}"


def _hopper(name: str, *, num_sms: int, l2_mib: float, bandwidth_gbs: float | None,
            bf16_tflops: float | None, fp32_tflops: float | None, sm_clock_mhz: float | None,
            mem_clock_mhz: float | None, key: str) -> DeviceFacts:
    return DeviceFacts(
        name=name, compute_capability="9.0", arch=arch_of("9.0"), num_sms=num_sms,
        # Hopper: 228 KiB per SM, 227 KiB of it opt-in for one block (CUDA guide, CC 9.0).
        smem_per_block=227 * KIB, smem_per_sm=228 * KIB, l2_bytes=int(l2_mib * MIB),
        mem_bandwidth_gbs=bandwidth_gbs, peak_bf16_tflops=bf16_tflops,
        peak_fp32_tflops=fp32_tflops, sm_clock_mhz=sm_clock_mhz, mem_clock_mhz=mem_clock_mhz,
        source=f"profile:{key}",
    )


# Datasheet values; dense (no sparsity) tensor-core peaks at the boost clock.
PROFILES: dict[str, DeviceFacts] = {
    "h100-sxm": _hopper("NVIDIA H100 80GB HBM3", num_sms=132, l2_mib=50, bandwidth_gbs=3350.0,
                        bf16_tflops=989.0, fp32_tflops=67.0, sm_clock_mhz=1980.0,
                        mem_clock_mhz=2619.0, key="h100-sxm"),
    "h100-pcie": _hopper("NVIDIA H100 PCIe", num_sms=114, l2_mib=50, bandwidth_gbs=2000.0,
                         bf16_tflops=756.0, fp32_tflops=51.0, sm_clock_mhz=1755.0,
                         mem_clock_mhz=1593.0, key="h100-pcie"),
    # The H200 is the H100's GH100 die (132 SMs) with 141 GB of HBM3e; its driver reports a 60 MiB
    # L2 (the flush's 2x-L2 buffer passed 120 MiB through DRAM under Nsight Compute; the devices
    # under benchmarks/RESULTS.md's Conventions), not the H100's 50.
    "h200": _hopper("NVIDIA H200", num_sms=132, l2_mib=60, bandwidth_gbs=4800.0,
                    bf16_tflops=989.0, fp32_tflops=67.0, sm_clock_mhz=1980.0,
                    mem_clock_mhz=None, key="h200"),  # memory clock: not on the datasheet
    # The H20: 78 SMs, 96 GB HBM3 at 4.0 TB/s, 148 TFLOP/s bf16. Its L2 is reported as 60 MB
    # (not on NVIDIA's datasheet: uncertain); the clock is the H100 SXM's (uncertain).
    "h20": _hopper("NVIDIA H20", num_sms=78, l2_mib=60, bandwidth_gbs=4000.0,
                   bf16_tflops=148.0, fp32_tflops=44.0, sm_clock_mhz=1980.0,
                   mem_clock_mhz=None, key="h20"),
    # The H800 SXM: the H100 SXM with a narrower NVLink; compute and memory as the H100's.
    "h800": _hopper("NVIDIA H800", num_sms=132, l2_mib=50, bandwidth_gbs=3350.0,
                    bf16_tflops=989.0, fp32_tflops=67.0, sm_clock_mhz=1980.0,
                    mem_clock_mhz=2619.0, key="h800"),
    # The GH200 (96 GB HBM3 part: 4.0 TB/s; the 144 GB HBM3e part has 4.9 TB/s).
    "gh200": _hopper("NVIDIA GH200 480GB", num_sms=132, l2_mib=50, bandwidth_gbs=4000.0,
                     bf16_tflops=989.0, fp32_tflops=67.0, sm_clock_mhz=1980.0,
                     mem_clock_mhz=None, key="gh200"),
    # Not Hopper: here so that a device no bundled kernel supports can be named (tests, and
    # the one-line refusal of every command).
    "a100-sxm": DeviceFacts(
        name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", arch=arch_of("8.0"), num_sms=108,
        smem_per_block=163 * KIB, smem_per_sm=164 * KIB, l2_bytes=40 * MIB,
        mem_bandwidth_gbs=2039.0, peak_bf16_tflops=312.0, peak_fp32_tflops=19.5,
        sm_clock_mhz=1410.0, mem_clock_mhz=1593.0, source="profile:a100-sxm"),
    # B200: 148 SMs; L2 as the driver reports it on B200s seen (126.5 MiB: uncertain).
    "b200": DeviceFacts(
        name="NVIDIA B200", compute_capability="10.0", arch=arch_of("10.0"), num_sms=148,
        smem_per_block=227 * KIB, smem_per_sm=228 * KIB, l2_bytes=int(126.5 * MIB),
        mem_bandwidth_gbs=8000.0, peak_bf16_tflops=2250.0, peak_fp32_tflops=None,
        sm_clock_mhz=None, mem_clock_mhz=None, source="profile:b200"),
}

# A driver's device name -> the profile it is, first match wins (GH200 before H200, H200 and
# H800 before H20, the PCIe H100 before the SXM one).
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "gh200"),
    (r"\bH200\b", "h200"),
    (r"\bH800\b", "h800"),
    (r"\bH20\b", "h20"),
    (r"\bH100\b.*\bPCIE\b", "h100-pcie"),
    (r"\bH100\b", "h100-sxm"),
    (r"\bA100\b", "a100-sxm"),
    (r"\bB200\b", "b200"),
)


class UnsupportedDeviceError(JobError):
    """The device (or profile) is of an architecture the kernel does not support."""


def profile(name: str) -> DeviceFacts:
    """The named profile.

    Raises:
      JobError: an unknown name; the message lists the known ones.
    """
    facts = PROFILES.get(name.strip().lower()) if isinstance(name, str) else None
    if facts is None:
        raise JobError(
            f"Unknown device profile {name!r}: the known profiles are {', '.join(PROFILES)} "
            f"(--device-profile NAME, or ${PROFILE_ENV_VAR})." + did_you_mean(name, PROFILES)
        )
    return facts


def profile_for_name(device_name: str) -> str | None:
    """The profile a device's name is (``"NVIDIA H100 PCIe"`` -> ``"h100-pcie"``), or None."""
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return key
    return None


# CUdevice_attribute values (cuda.h).
_ATTR = {
    "clock_khz": 13,
    "num_sms": 16,
    "mem_clock_khz": 36,
    "bus_width_bits": 37,
    "l2_bytes": 38,
    "major": 75,
    "minor": 76,
    "smem_per_sm": 81,
    "smem_per_block": 97,
}


def _driver_attributes(ordinal: int) -> tuple[str, dict[str, int]] | None:
    """``(name, attributes)`` from the CUDA driver API, or None where it cannot be asked."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    try:
        if cuda.cuInit(0) != 0:
            return None
        device = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            return None
        name = ctypes.create_string_buffer(256)
        if cuda.cuDeviceGetName(name, len(name), device) != 0:
            return None
        values: dict[str, int] = {}
        for key, attr in _ATTR.items():
            value = ctypes.c_int()
            if cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, device) != 0:
                return None
            values[key] = int(value.value)
        return name.value.decode(errors="replace"), values
    except (AttributeError, OSError):
        return None


def facts_from_driver(name: str, attrs: Mapping[str, int]) -> DeviceFacts | None:
    """:class:`DeviceFacts` from the driver's name and attributes (:data:`_ATTR`'s keys), or
    None where they are not a usable GPU's. Bandwidth is memory clock x bus width x 2 (double
    data rate); the peaks come from the profile the name matches, where one does."""
    if min(attrs.get(k, 0) for k in ("num_sms", "smem_per_block", "smem_per_sm", "l2_bytes")) <= 0:
        return None
    cc = f"{attrs['major']}.{attrs['minor']}"
    mem_khz, bus_bits = attrs.get("mem_clock_khz", 0), attrs.get("bus_width_bits", 0)
    bandwidth = mem_khz * 1e3 * 2 * bus_bits / 8 / 1e9 if mem_khz > 0 and bus_bits > 0 else None
    key = profile_for_name(name)
    known = PROFILES[key] if key is not None else None
    return DeviceFacts(
        name=name, compute_capability=cc, arch=arch_of(cc), num_sms=attrs["num_sms"],
        smem_per_block=attrs["smem_per_block"], smem_per_sm=attrs["smem_per_sm"],
        l2_bytes=attrs["l2_bytes"],
        mem_bandwidth_gbs=round(bandwidth, 1) if bandwidth else None,
        peak_bf16_tflops=known.peak_bf16_tflops if known else None,
        peak_fp32_tflops=known.peak_fp32_tflops if known else None,
        sm_clock_mhz=attrs["clock_khz"] / 1e3 if attrs.get("clock_khz", 0) > 0 else None,
        mem_clock_mhz=mem_khz / 1e3 if mem_khz > 0 else None,
        source="driver",
    )


# Ordinal -> what the driver said (None: no driver or no such GPU), once per process.
_DRIVER: dict[int, DeviceFacts | None] = {}
_DRIVER_LOCK = threading.Lock()


def read_device(ordinal: int = 0) -> DeviceFacts | None:
    """The facts of GPU ``ordinal`` read from the CUDA driver (no jax), or None where there is
    no driver or no such GPU. Read once per process and ordinal."""
    with _DRIVER_LOCK:
        if ordinal not in _DRIVER:
            found = _driver_attributes(ordinal)
            _DRIVER[ordinal] = None if found is None else facts_from_driver(*found)
        return _DRIVER[ordinal]


def current_device(profile_name: str | None = None, *, ordinal: int = 0,
                   ask_driver: bool = True) -> DeviceFacts:
    """The device the tuner works for: GPU ``ordinal`` read from the driver when there is
    one; else the profile ``profile_name``, else ``$AUTOTUNE_DEVICE_PROFILE``, else
    :data:`DEFAULT_PROFILE`. The one place that chooses.

    ``ask_driver=False`` (the query side, which never touches CUDA): the driver's answer only
    where this process has already read it, else the profile.

    Raises:
      JobError: an unknown profile name (also when no driver is there to override it).
    """
    name = profile_name if profile_name is not None else os.environ.get(PROFILE_ENV_VAR) or None
    named = profile(name) if name is not None else None  # a bad name is an error everywhere
    facts = read_device(ordinal) if ask_driver else _DRIVER.get(ordinal)
    if facts is not None:
        if named is not None and named.name != facts.name:
            log.info("device profile %s ignored: the driver reports %s", name, facts.name)
        return facts
    return named if named is not None else PROFILES[DEFAULT_PROFILE]


@contextmanager
def using_profile(profile_name: str | None) -> Iterator[DeviceFacts]:
    """Within the block, :func:`current_device` (here and in worker processes started in it)
    falls back to ``profile_name`` (None: leaves the choice as it is, and asks no driver: every
    command passes through here). Yields the current device. Raises :class:`JobError` for an
    unknown name, before changing anything."""
    if profile_name is None:
        yield current_device(ask_driver=False)
        return
    profile(profile_name)
    saved = os.environ.get(PROFILE_ENV_VAR)
    os.environ[PROFILE_ENV_VAR] = profile_name.strip().lower()
    try:
        yield current_device()
    finally:
        if saved is None:
            os.environ.pop(PROFILE_ENV_VAR, None)
        else:
            os.environ[PROFILE_ENV_VAR] = saved


def check_arch(kernel_name: str, archs: tuple[str, ...], device: DeviceFacts) -> None:
    """Raises :class:`UnsupportedDeviceError` (one line) when ``device`` is of an architecture
    not in ``archs``; an empty ``archs`` supports every device."""
    if archs and device.arch not in archs:
        raise UnsupportedDeviceError(
            f"Kernel {kernel_name!r} supports {', '.join(archs)}, but the device is "
            f"{device.name} ({device.arch}, {device.source}); run it on a GPU of a supported "
            f"architecture, or pick one with --device-profile (e.g. {DEFAULT_PROFILE})."
        )

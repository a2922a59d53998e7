"""NVIDIA's matmul heuristics (``nvidia-matmul-heuristics``) mapped onto ``hopper_matmul``.

The package ranks GEMM configurations analytically per shape and GPU, on a CPU in about a
millisecond. This module maps them onto the kernel's tunables and back, for the replay
(``benchmarks/vendor_prior.py``) and ``benchmarks/ground_truth.py --vendor N``:

vendor (``nvmmhKernelConfiguration``) -> ``hopper_matmul``:

- ``cta = (M, N, K)``: the output tile, two consumer warpgroups along ``wg_dimension`` (``M``
  when ``M/2`` is whole 64-row WGMMA slabs, else ``N``); ``tile_k = K``. ``loadStages``:
  ``max_concurrent_steps``. ``cluster`` (1,1)/(2,1)/(1,2): ``cluster_dimension`` None/M/N.
- ``ctaOrder`` 0/1: ``grid_minor_dim`` M/N; ``gridSwizzle``: ``grid_tile_width``. ``splitK``
  only 1; ``warp``, ``instr`` derived. The epilogue: upstream's 64 x 64, canonical.

A benchmark helper: no better a prior than the kernel's cost model on the H200's shapes
(``docs/vendor_prior.md``), so the tuner does not use it. Licence: NVIDIA's SDK licence.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.devices import DeviceFacts, profile_for_name  # noqa: E402
from autotune.space.problem import Config, Problem  # noqa: E402
from autotune.space.search_space import BoundSpace  # noqa: E402

__all__ = [
    "VENDOR_GPUS",
    "PRECISIONS",
    "TARGETS",
    "DEFAULT_TARGET",
    "VendorPriorError",
    "vendor_available",
    "check_installed",
    "vendor_gpu",
    "from_vendor",
    "to_vendor",
    "VendorModel",
]

# Our device profiles -> the package's predefined GPUs (``NvMatmulHeuristicsNvidiaGpu``). The
# H800 is the H100 SXM's compute and memory; profiles without a counterpart are refused.
VENDOR_GPUS = {
    "h100-sxm": "H100_SXM",
    "h100-pcie": "H100_PCIE",
    "h800": "H100_SXM",
    "h200": "H200_SXM",
    "h20": "H20_SXM",
}
# Input dtype -> the package's precision string (inputs, compute, output): the kernel reads
# 16-bit inputs, accumulates in float32 and writes the input dtype.
PRECISIONS = {"bfloat16": "TST", "float16": "HSH"}
# The package's heuristic targets that fit a warp-specialized TMA/WGMMA kernel with clusters.
TARGETS = ("CUTLASS3", "GENERIC")
DEFAULT_TARGET = "CUTLASS3"
# The package answers for one GEMM, row-major A (m, k) and B (k, n).
_LAYOUT = "NN_ROW_MAJOR"
_WGMMA_ROWS = 64
_CONSUMER_WARPS = 8
_INSTR_TILE = (64, 8, 16)
_DEFAULT_EPILOGUE = 64  # upstream TuningConfig's epi_tile_m and epi_tile_n
_INSTALL = "pip install nvidia-matmul-heuristics"


class VendorPriorError(ImportError):
    """The vendor's heuristics cannot be used here: the package is missing, or the device or
    dtype has no counterpart in it. The message says which and what to do."""


def check_installed() -> None:
    """Raises :class:`VendorPriorError`, saying what to install, where the package cannot be
    used."""
    _package()


def vendor_available() -> bool:
    """Whether ``nvidia-matmul-heuristics`` can be imported (without importing it twice)."""
    try:
        _package()
    except VendorPriorError:
        return False
    return True


@functools.cache
def _package() -> Any:
    try:
        import nvMatmulHeuristics
    except ImportError as error:
        raise VendorPriorError(
            f"the vendor prior needs NVIDIA's matmul heuristics, which are not installed: "
            f"{_INSTALL}"
        ) from error
    except OSError as error:  # the wheel's shared library failed to load
        raise VendorPriorError(
            f"nvidia-matmul-heuristics is installed but its library did not load ({error}); "
            f"reinstall it: {_INSTALL}"
        ) from error
    return nvMatmulHeuristics


def vendor_gpu(device: DeviceFacts | str) -> str:
    """The package's GPU name for a device (facts, a profile name or a driver's device name).

    Raises:
      VendorPriorError: the device has no counterpart; the message lists those that do.
    """
    name = device.name if isinstance(device, DeviceFacts) else device
    key = name.strip().lower() if name.strip().lower() in VENDOR_GPUS else profile_for_name(name)
    if key is None or key not in VENDOR_GPUS:
        raise VendorPriorError(
            f"the vendor prior knows no GPU for device {name!r}: it covers the profiles "
            f"{', '.join(VENDOR_GPUS)} (--device-profile NAME on a CPU)"
        )
    return VENDOR_GPUS[key]


def _canonical_epilogue(tile: int) -> int | None:
    """Upstream's default epilogue piece along a dim, ``None`` where it is the whole tile."""
    piece = _DEFAULT_EPILOGUE if tile % _DEFAULT_EPILOGUE == 0 else tile
    return None if piece == tile else piece


def from_vendor(
    cta: Sequence[int], *, stages: int, cluster: Sequence[int], cta_order: int, swizzle: int,
    split_k: int = 1,
) -> list[Config]:
    """``hopper_matmul`` configs for one vendor configuration (the table of the module doc),
    the preferred warpgroup split first: none when it has no counterpart (a split K, a
    cluster of more than two blocks, a CTA tile no two 64-row warpgroups make)."""
    cta_m, cta_n, cta_k = (int(v) for v in cta)
    cl_m, cl_n = (int(v) for v in cluster)
    clusters = {(1, 1): None, (2, 1): "M", (1, 2): "N"}
    if split_k != 1 or (cl_m, cl_n) not in clusters or stages < 1:
        return []
    splits = []
    if cta_m % (2 * _WGMMA_ROWS) == 0:
        splits.append(("M", cta_m // 2, cta_n))
    if cta_m % _WGMMA_ROWS == 0 and cta_n % 2 == 0:
        splits.append(("N", cta_m, cta_n // 2))
    out = []
    for wg, tile_m, tile_n in splits:
        out.append(Config(
            tile_m=tile_m, tile_n=tile_n, tile_k=cta_k, max_concurrent_steps=int(stages),
            wg_dimension=wg, cluster_dimension=clusters[(cl_m, cl_n)],
            grid_minor_dim="M" if cta_order == 0 else "N", grid_tile_width=max(1, int(swizzle)),
            epi_tile_m=_canonical_epilogue(tile_m), epi_tile_n=_canonical_epilogue(tile_n),
        ))
    return out


def to_vendor(config: Mapping[str, Any]) -> dict[str, Any]:
    """The vendor configuration of a ``hopper_matmul`` config (the inverse of
    :func:`from_vendor`, less the epilogue, which it has no field for)."""
    wg_m = config["wg_dimension"] == "M"
    cta_m = config["tile_m"] * (2 if wg_m else 1)
    cta_n = config["tile_n"] * (1 if wg_m else 2)
    cluster = {None: (1, 1), "M": (2, 1), "N": (1, 2)}[config["cluster_dimension"]]
    return {
        "cta": (cta_m, cta_n, config["tile_k"]),
        # The kernel's 8 consumer warps, 64-row slabs along M, the rest along N.
        "warp": (_WGMMA_ROWS, max(8, cta_m * cta_n // (_CONSUMER_WARPS * _WGMMA_ROWS)),
                 config["tile_k"]),
        "instr": _INSTR_TILE,
        "stages": config["max_concurrent_steps"],
        "cluster": cluster,
        "cta_order": 0 if config["grid_minor_dim"] == "M" else 1,
        "swizzle": config["grid_tile_width"],
        "split_k": 1,
    }


class VendorModel:
    """The vendor's heuristics for one GPU: its ranked configurations for a problem, mapped
    onto the kernel's valid ones, and its runtime estimate of any config.

    Args:
      device: the device (facts, a profile name or a driver's device name).
      target: the package's heuristic target (:data:`TARGETS`).

    Raises:
      VendorPriorError: the package is missing, or the device has no counterpart.
      ValueError: an unknown target.
    """

    def __init__(self, device: DeviceFacts | str, *, target: str = DEFAULT_TARGET) -> None:
        if target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
        pkg = _package()
        self.gpu = vendor_gpu(device)
        self.target = target
        self._pkg = pkg
        self._target = pkg.NvMatmulHeuristicsTarget[target]
        self._flags = pkg.NvMatmulHeuristicsFlags.PERF_MODEL_BASED_AUTO_TUNING
        self._nv = pkg.NvMatmulHeuristicsInterfaceEx(
            backend=self._target, flags=self._flags, gpu=pkg.NvMatmulHeuristicsNvidiaGpu[self.gpu])
        self._struct = pkg.NvMatmulHeuristicsInterface.nvmmhKernelConfiguration
        self._layout = pkg.NvMatmulHeuristicsMatmulLayout[_LAYOUT]

    def _problem(self, problem: Problem) -> Any:
        return self._nv.makeNvMatmulHeuristicsProblem(
            int(problem["m"]), int(problem["n"]), int(problem["k"]), self._layout)

    @staticmethod
    def _precision(problem: Problem) -> str:
        try:
            return PRECISIONS[problem.dtype]
        except KeyError:
            raise VendorPriorError(
                f"the vendor prior covers the dtypes {', '.join(PRECISIONS)}, not {problem.dtype!r}"
            ) from None

    def ranked(self, space: BoundSpace, count: int = 16) -> list[tuple[Config, float]]:
        """The vendor's best ``count`` configurations for ``space``'s problem, best first,
        as configs valid in ``space`` with the vendor's estimate (seconds); a vendor
        configuration maps to one or two configs (both warpgroup splits), so more than
        ``count`` may come back. Configurations the kernel cannot run are excluded during the
        vendor's own search (its validity callback asks ``space``)."""
        if count < 1:
            raise ValueError(f"count must be a positive whole number, got {count!r}")
        precision = self._precision(space.problem)
        kinds = self._pkg.NvMatmulHeuristicsBackendPropertyCallbackKind

        def mapped(kc: Any) -> list[Config]:
            return [c for c in from_vendor(
                tuple(kc.cta), stages=kc.loadStages, cluster=tuple(kc.cluster),
                cta_order=kc.ctaOrder, swizzle=kc.gridSwizzle, split_k=kc.splitK)
                if space.is_valid(c)]

        def valid(kc_pointer: Any, _problem: Any) -> int:
            try:
                return int(bool(mapped(kc_pointer.contents)))
            except Exception:  # an exception must not cross the C callback
                return 0

        backend = self._nv.createBackend(self._target)
        try:
            self._nv.setBackendCallbackProperty(
                backend, kinds.KERNEL_ADDITIONAL_VALIDITY_CHECK, valid)
            found = self._nv.getEx(self._problem(space.problem), count, backend, precision=precision)
        finally:
            self._nv.destroyBackend(backend)
        out: list[tuple[Config, float]] = []
        seen: set[str] = set()
        for entry in found:
            for config in mapped(entry["nvmmhKernelConfiguration"]):
                if config.digest() not in seen:
                    seen.add(config.digest())
                    out.append((config, float(entry["runtime"])))
        return out

    def estimate_seconds(self, problem: Problem, config: Mapping[str, Any]) -> float:
        """The vendor's runtime estimate of ``config`` (seconds; 0 where it rejects it)."""
        v = to_vendor(config)
        kc = self._struct()
        kc.cta[:] = v["cta"]
        kc.warp[:] = v["warp"]
        kc.instr[:] = v["instr"]
        kc.splitK = v["split_k"]
        kc.loadStages = v["stages"]
        kc.gridSwizzle = v["swizzle"]
        kc.ctaOrder = v["cta_order"]
        kc.cluster[:] = v["cluster"]
        nv = self._nv
        return float(nv.nvMatmulHeuristicsEstimateRuntime(
            nv.handle, self._precision(problem).encode("ascii"), ctypes.c_int(int(self._target)),
            ctypes.byref(self._problem(problem)), ctypes.byref(kc), nv.hardware_descriptor))

    def cost_model(self) -> Callable[[Problem, Mapping[str, Any]], float]:
        """:meth:`estimate_seconds` as a kernel's ``cost_model`` (a config the vendor rejects
        is estimated ten times its slowest: positive and finite, as the ranked sampler
        requires)."""

        def estimate(problem: Problem, config: Mapping[str, Any]) -> float:
            seconds = self.estimate_seconds(problem, config)
            return seconds if seconds > 0 else 10.0 * self._worst(problem)

        return estimate

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one model per device, few problems
    def _worst(self, problem: Problem) -> float:
        m, n, k = (int(problem[d]) for d in ("m", "n", "k"))
        # A flop per 10 ps: slower than any Hopper config of a 16-bit GEMM.
        return max(2.0 * m * n * k * 1e-11, 1e-6)

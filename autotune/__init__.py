"""autotune: find the fastest config of a JAX Pallas Mosaic GPU kernel, and keep it.

The public API is small and loaded lazily, so that ``autotune.best_config`` (a database
query) never imports jax or touches CUDA.

Declaring a space::

    from autotune import Space, Aligned, PowerOfTwo, Choice, Bool, Constraint

A kernel of your own (``docs/user_kernels.md``)::

    KERNEL = autotune.Kernel(name="bias_gelu", space=..., build=..., make_inputs=..., ...)
    autotune.tune(KERNEL, [{"rows": 64, "cols": 512}], dtype="float32", trials=8)

Tuning and asking::

    autotune.tune("hopper_matmul", [{"m": 4096, "n": 4096, "k": 4096}], dtype="bfloat16")
    autotune.best_config("hopper_matmul", {"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Problem": "autotune.space.problem",
    "Config": "autotune.space.problem",
    "parse_shape": "autotune.space.problem",
    "Space": "autotune.space.search_space",
    "BoundSpace": "autotune.space.search_space",
    "Env": "autotune.space.search_space",
    "Aligned": "autotune.space.search_space",
    "PowerOfTwo": "autotune.space.search_space",
    "Choice": "autotune.space.search_space",
    "Bool": "autotune.space.search_space",
    "Constraint": "autotune.space.search_space",
    "Violation": "autotune.space.search_space",
    "transfer_bytes": "autotune.space.search_space",
    "is_aligned_transfer": "autotune.space.search_space",
    "threads": "autotune.space.search_space",
    "per_128_bytes": "autotune.space.search_space",
    "elems_per_bytes": "autotune.space.search_space",
    "profiler_smem_bytes": "autotune.space.search_space",
    "WARP_SIZE": "autotune.space.search_space",
    "WARPGROUP_SIZE": "autotune.space.search_space",
    "SMEM_LIMIT_BYTES": "autotune.space.search_space",
    "SMEM_ALIGNMENT_BYTES": "autotune.space.search_space",
    "MBARRIER_BYTES": "autotune.space.search_space",
    "smem_aligned": "autotune.space.search_space",
    "Kernel": "autotune.space.kernel",
    "BuildOptions": "autotune.space.kernel",
    "get_kernel": "autotune.space.kernel",
    "interpret_params": "autotune._jax_compat",
    "profile_params": "autotune._jax_compat",
    "check_space": "autotune.evaluation.checking",
    "Outcome": "autotune.space.outcomes",
    "TrialResult": "autotune.space.outcomes",
    "tune": "autotune.api",
    "best_config": "autotune.queries.best",
    "best_result": "autotune.queries.best",
    "list_results": "autotune.queries.best",
    "results_frame": "autotune.queries.best",
    "tuned": "autotune.api",
    "lookup_config": "autotune.queries.lookup",
    "AutotuneError": "autotune.errors",
    "SpaceError": "autotune.errors",
    "NoValidConfigError": "autotune.errors",
    "JobError": "autotune.errors",
    "KernelNotFoundError": "autotune.errors",
    "StorageError": "autotune.errors",
    "NothingTunedError": "autotune.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from autotune._jax_compat import interpret_params, profile_params
    from autotune.api import tune, tuned
    from autotune.errors import (
        AutotuneError,
        JobError,
        KernelNotFoundError,
        NothingTunedError,
        NoValidConfigError,
        SpaceError,
        StorageError,
    )
    from autotune.evaluation.checking import check_space
    from autotune.queries.best import best_config, best_result, list_results, results_frame
    from autotune.queries.lookup import lookup_config
    from autotune.space.kernel import BuildOptions, Kernel, get_kernel
    from autotune.space.outcomes import Outcome, TrialResult
    from autotune.space.problem import Config, Problem, parse_shape
    from autotune.space.search_space import (
        MBARRIER_BYTES,
        SMEM_ALIGNMENT_BYTES,
        SMEM_LIMIT_BYTES,
        WARP_SIZE,
        WARPGROUP_SIZE,
        Aligned,
        Bool,
        BoundSpace,
        Choice,
        Constraint,
        Env,
        PowerOfTwo,
        Space,
        Violation,
        elems_per_bytes,
        is_aligned_transfer,
        per_128_bytes,
        profiler_smem_bytes,
        smem_aligned,
        threads,
        transfer_bytes,
    )

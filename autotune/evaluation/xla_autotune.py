"""One XLA program per baseline: its GEMM algorithm pinned across processes.

XLA autotunes a baseline's GEMM when it compiles it, and the pick moves from one process to the
next: on an H200 (JAX 0.11.2), four fresh processes compiling the 4096^3 bf16 matmul picked
``nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NNN`` three times (176.0-176.3 us) and
``nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT`` once (177.7 us); at 128x8192x8192 three
algorithms came out of six processes (39.6-40.8 us). Each worker of a job compiles the baseline
itself, and ``autotune verify`` compiles it again, so without a pin a baseline is a different
program from one worker, run or check to the next (benchmarks/RESULTS.md §12).

XLA's per-fusion autotune cache (``--xla_gpu_per_fusion_autotune_cache_dir``) keeps the first
pick in a folder that every later compile reads: two processes sharing it picked the same
algorithm at both shapes. The engine gives its GPU workers one such folder (beside JAX's
persistent compilation cache, so that later runs and ``verify`` read it too); a folder the user
set in ``XLA_FLAGS`` is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

__all__ = ["AUTOTUNE_CACHE_FLAG", "pinned_xla_flags", "autotune_cache_folder", "pin_in"]

AUTOTUNE_CACHE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"


def pinned_xla_flags(xla_flags: str, folder: str | os.PathLike[str]) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with the autotune cache in ``folder``, unless it
    already names one (the user's choice wins)."""
    if AUTOTUNE_CACHE_FLAG in xla_flags:
        return xla_flags
    return f"{xla_flags} {AUTOTUNE_CACHE_FLAG}={folder}".strip()


def autotune_cache_folder(compilation_cache: str | None, scratch: str | os.PathLike[str]) -> Path:
    """Where a job keeps XLA's autotune picks: ``<compilation cache>/xla_autotune`` when JAX's
    persistent cache is on (later runs pick the same programs), else ``<scratch>/xla_autotune``
    (one job's workers agree). Made if missing."""
    folder = Path(compilation_cache if compilation_cache else scratch) / "xla_autotune"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pin_in(env: MutableMapping[str, str], folder: str | os.PathLike[str],
           source: Mapping[str, str] | None = None) -> None:
    """Sets ``env["XLA_FLAGS"]`` to pin XLA's autotuning in ``folder`` (from ``source``'s
    ``XLA_FLAGS``, default ``env``'s). Before jax starts its GPU backend, or it has no effect."""
    current = (source if source is not None else env).get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = pinned_xla_flags(current, folder)

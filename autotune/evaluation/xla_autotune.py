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
algorithm at both shapes. The engine gives its GPU workers one such folder, and ``autotune
verify`` reads it too. It must be the very folder JAX itself hands XLA where its persistent
compilation cache is on: JAX then writes ``<cache>/xla_gpu_per_fusion_autotune_cache_dir`` into
every compile's options, over ``XLA_FLAGS``. A job's workers (compilation cache on) and ``verify``
(off) once kept their picks in two folders, so each autotuned the baseline anew and could time
another GEMM. So the folder is :data:`JAX_AUTOTUNE_SUBFOLDER` of the compilation cache (a scratch
folder when the cache is off), and a folder the user set in ``XLA_FLAGS`` is kept by telling JAX
not to override it (:func:`keep_flagged_folder`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

__all__ = [
    "AUTOTUNE_CACHE_FLAG",
    "JAX_AUTOTUNE_SUBFOLDER",
    "pinned_xla_flags",
    "flagged_folder",
    "autotune_cache_folder",
    "pin_in",
    "keep_flagged_folder",
]

AUTOTUNE_CACHE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
# The folder JAX gives XLA inside its persistent compilation cache (jax._src.compiler,
# jax_persistent_cache_enable_xla_caches; checked by tests/evaluation/test_xla_autotune.py).
JAX_AUTOTUNE_SUBFOLDER = "xla_gpu_per_fusion_autotune_cache_dir"


def pinned_xla_flags(xla_flags: str, folder: str | os.PathLike[str]) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with the autotune cache in ``folder``, unless it
    already names one (the user's choice wins)."""
    if flagged_folder(xla_flags) is not None:
        return xla_flags
    return f"{xla_flags} {AUTOTUNE_CACHE_FLAG}={folder}".strip()


def flagged_folder(xla_flags: str) -> str | None:
    """The autotune folder ``xla_flags`` (an ``XLA_FLAGS`` value) names, the last one given;
    None if it names none."""
    found = None
    for word in xla_flags.split():
        if word.startswith(AUTOTUNE_CACHE_FLAG + "="):
            found = word.split("=", 1)[1]
    return found


def autotune_cache_folder(compilation_cache: str | None, scratch: str | os.PathLike[str]) -> Path:
    """Where a job keeps XLA's autotune picks: ``<compilation cache>/``
    :data:`JAX_AUTOTUNE_SUBFOLDER` when JAX's persistent cache is on (the folder JAX itself
    uses there; later runs and ``verify`` pick the same programs), else
    ``<scratch>/xla_autotune`` (one job's workers agree). Made if missing."""
    if compilation_cache:
        folder = Path(compilation_cache) / JAX_AUTOTUNE_SUBFOLDER
    else:
        folder = Path(scratch) / "xla_autotune"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pin_in(env: MutableMapping[str, str], folder: str | os.PathLike[str],
           source: Mapping[str, str] | None = None) -> None:
    """Sets ``env["XLA_FLAGS"]`` to pin XLA's autotuning in ``folder`` (from ``source``'s
    ``XLA_FLAGS``, default ``env``'s). Before jax starts its GPU backend, or it has no effect."""
    current = (source if source is not None else env).get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = pinned_xla_flags(current, folder)


def keep_flagged_folder(compilation_cache: str | os.PathLike[str],
                        environ: Mapping[str, str] | None = None) -> bool:
    """Where ``XLA_FLAGS`` names an autotune folder other than JAX's own inside
    ``compilation_cache``, tells JAX not to write its folder into the compile options
    (``jax_persistent_cache_enable_xla_caches``), so that the named folder holds in this
    process as in those without the cache. Call when turning the cache on. Returns whether it
    did."""
    flags = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    named = flagged_folder(flags)
    if named is None or Path(named) == Path(compilation_cache) / JAX_AUTOTUNE_SUBFOLDER:
        return False
    import jax

    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    return True

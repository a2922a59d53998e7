"""Hopper matmul: JAX's warp-specialized Pallas Mosaic GPU matmul (``hopper_matmul_mgpu``).

``C = A @ B`` with ``A: (m, k)``, ``B: (k, n)``, ``C: (m, n)`` in the input dtype, float32
accumulation. One persistent block per SM: two consumer warpgroups, each owning a
``tile_m x tile_n`` accumulator (stacked along ``wg_dimension``), and one producer warpgroup
streaming ``max_concurrent_steps`` stages of A and B tiles through shared memory with TMA.
Optionally two blocks form a cluster along ``cluster_dimension`` and share one operand by
multicast. The output leaves through shared memory in ``epi_tile_m x epi_tile_n`` pieces.
``grid_minor_dim``/``grid_tile_width`` choose the order the persistent blocks walk the output
tiles in (a snake over strips ``grid_tile_width`` tiles wide).

The tunables are the fields of upstream's ``TuningConfig``, under the same names; enums by name
(``"M"``/``"N"``), ``None`` as ``None``.

Rule kinds (``RULE_KINDS``):
  lowering     a config breaking it fails to lower (the kernel's own check or Mosaic GPU's).
  correctness  a config breaking it lowers but computes the wrong thing.
  policy       a config breaking it lowers and is correct, but compiles to the same kernel as
               a config the space keeps (canonical forms, so no kernel is measured twice).
  problem      the problem itself is unsupported (dtype); no config can help.
  interpret    only GPU interpret mode (tuning on a CPU) cannot run it; binds only there.
               ``interpret_two_tiles``: a config whose output is one cluster tile crashes
               XLA's CPU compiler when interpreted (SIGFPE in stablehlo's FoldRemOpPattern);
               ``benchmarks/interpret_crash_sweep.py`` at 256^3 bf16 (jax 0.10.2): 2 of 2
               one-tile configs crashed, 7 of 7 with two tiles ran (tile_k 32/64, steps 2-6).

Oracle sweep (``autotune.evaluation.lowering.lower_for_cuda``, jax 0.10.2 on CPU, num_sms=132), recorded
to justify the rules:
  5,308 configs over 12 problems (m, n, k in 128..12288, bf16 and f16): a structured grid
  (tile shapes x wg x cluster x tile_k; epilogue tiles 8..128 incl. None; stages 1..8), random
  raw configs, random valid ones, and probes past the domains. 2,270 lowered, 3,038 failed:
     851 "exceeds available shared memory: smem_bytes=..."         -> smem_within_limit
     542 / 500 / 2 "n= / m= / k= must be divisible by ..." (kernel) -> n_/m_/k_divisible
     524 AssertionError, 211 "slice ... divisible by the tile size" -> b_tile_swizzle
                                        (tile_n not a multiple of B's swizzle width)
     261 "Failed to infer a possible set of layouts"              -> epi_tile_m_rows (8/16/32-row
                                        pieces; out of the epi_tile_m domain), epi_tile_n_divides
     145 "Swizzle 16 is not supported" (16-byte rows)              -> operand_swizzle, epi_swizzle
       2 "N must be a multiple of 8 and <= 256" (tile_n > 256)     -> the tile_n domain
  Every failed config breaks a rule; all 1,612 configs the rules accept lowered; the 1,255
  rejected only by lowering rules all failed (each lowering rule alone: m_divisible 65/65,
  n_divisible 87/87, b_tile_swizzle 157/157, smem_within_limit 433/433 failed). The 402
  rejected only by policy rules all lowered. ``smem_bytes`` equals Mosaic GPU's count on all
  3,121 configs measured (``artificial_shared_memory_limit(0)``), incl. 128x256x64 wg N
  4 stages = 360,512 B. Lowering but excluded: an epilogue piece larger than the tile (the
  epilogue loop runs zero times: correctness rules). Lowering but outside the domains (policy
  caps): tile_m up to 512 is in; stages 9..16, grid_tile_width > 16, non-power-of-two tile_k
  (48, 96, 192) and epilogue pieces of 96 or 192 lower too. float32, float8_e4m3fn,
  float8_e5m2 and int8 inputs fail for every config tried (24): "Only f16 WGMMA supports
  transposes" / an integer-signedness TypeError on the float32 accumulator.
  PLATFORM.md's tune-jax grid (648 configs at 4096^3 bf16): these rules reject exactly the 312
  that failed on the H200, all by smem_within_limit; register-hungry tiles (128x256 per
  warpgroup) lower and compiled there, so no register rule is imposed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import autotune.kernels as ak
from search_spaces import scaffolding as sc

if TYPE_CHECKING:
    import numpy as np

__all__ = ["KERNEL", "SPACE", "RULE_KINDS", "KNOWN_GOOD", "BLOCK_THREADS", "SUPPORTED_DTYPES",
           "default_config", "smem_bytes", "cta_tile", "cluster_tile", "estimate_seconds",
           "cost_model", "Hopper", "FITTED_ON", "snake_order", "operand_traffic", "grid_variants"]

# Threads of one block: two consumer warpgroups and one producer (TMA) warpgroup.
BLOCK_THREADS = ak.threads(warpgroups=3)
# WGMMA accumulators are laid out in 64-row slabs, one per warpgroup instruction.
WGMMA_ROWS = 64
# Mosaic GPU swizzles shared-memory tiles by 32, 64 or 128 bytes ("Swizzle 16 is not supported").
MIN_SWIZZLE_BYTES = 32
SUPPORTED_DTYPES = ("bfloat16", "float16")


# ---------------------------------------------------------------------------------------------
# Derived sizes, as the kernel computes them.


def cta_tile(c: Mapping[str, Any], axis: str) -> int:
    """The block's output tile along ``axis`` ("m"/"n"): the two consumer warpgroups are
    stacked along ``wg_dimension``. Reads only ``tile_<axis>`` and ``wg_dimension``."""
    return c[f"tile_{axis}"] * (2 if c["wg_dimension"] == axis.upper() else 1)


def cluster_tile(c: Mapping[str, Any], axis: str) -> int:
    """The cluster's output tile along ``axis``: two blocks stacked along ``cluster_dimension``."""
    return cta_tile(c, axis) * (2 if c["cluster_dimension"] == axis.upper() else 1)


def cta_tiles(c: Mapping[str, Any]) -> tuple[int, int]:
    return cta_tile(c, "m"), cta_tile(c, "n")


def cluster_tiles(c: Mapping[str, Any]) -> tuple[int, int]:
    return cluster_tile(c, "m"), cluster_tile(c, "n")


def epilogue_tiles(c: Mapping[str, Any]) -> tuple[int, int]:
    """The output piece each store moves (``None`` means the whole warpgroup tile)."""
    return (c["epi_tile_m"] or c["tile_m"], c["epi_tile_n"] or c["tile_n"])


def swizzle_bytes(row_bytes: int) -> int:
    """The swizzle ``plgpu.find_swizzle`` picks for rows of ``row_bytes`` bytes (0: none)."""
    for swizzle in (128, 64, 32, 16):
        if row_bytes % swizzle == 0:
            return swizzle
    return 0


def operand_swizzle_elems(tile_k: int, dtype: str) -> int:
    """Columns of one swizzled tile of A and B in shared memory (the kernel derives it from
    ``tile_k``); B's ``tile_n`` columns are cut into such tiles."""
    return swizzle_bytes(tile_k * ak.dtype_bytes(dtype)) // ak.dtype_bytes(dtype)


def smem_bytes(c: Mapping[str, Any], dtype: str, *, k: int | None = None) -> int:
    """Shared memory one block allocates, as Pallas Mosaic GPU counts it.

    Pipeline buffers ``steps x (cta_tile_m x tile_k + tile_k x cta_tile_n)``, the output staging
    buffer ``2 warpgroups x slots x epi_tile_m x epi_tile_n`` (two slots unless one epilogue
    piece covers the tile), each rounded up to 1024 bytes, and two mbarriers per stage (loaded,
    consumed). Matches the ``smem_bytes=`` of Mosaic GPU's errors exactly on every config of the
    sweep (module docstring). The profiler's share is added by ``Env.smem_budget``. Given
    ``k``, the pipeline's own clamp of the stages to ``k // tile_k`` is applied.
    """
    itemsize = ak.dtype_bytes(dtype)
    cta_m, cta_n = cta_tiles(c)
    steps, tile_k = c["max_concurrent_steps"], c["tile_k"]
    if k is not None:
        steps = min(steps, k // tile_k)
    a_bytes = steps * cta_m * tile_k * itemsize
    b_bytes = steps * tile_k * cta_n * itemsize
    epi_m, epi_n = epilogue_tiles(c)
    slots = min(2, (c["tile_m"] * c["tile_n"]) // (epi_m * epi_n))
    out_bytes = 2 * slots * epi_m * epi_n * itemsize
    barrier_bytes = 2 * steps * ak.MBARRIER_BYTES
    return ak.smem_aligned(a_bytes) + ak.smem_aligned(b_bytes) + ak.smem_aligned(out_bytes) + barrier_bytes


def _grid_iters(c: Mapping[str, Any], env: ak.Env) -> tuple[int, int]:
    """Output tiles of the cluster grid along M and N."""
    cl_m, cl_n = cluster_tiles(c)
    return env["m"] // cl_m, env["n"] // cl_n


# ---------------------------------------------------------------------------------------------
# The space.


def _min_swizzle_elems(env: ak.Env) -> int:
    """Elements in 32 bytes of the problem's dtype: the finest tile_k / tile_n step."""
    return max(1, MIN_SWIZZLE_BYTES // ak.dtype_bytes(env.dtype))


PARAMS = (
    ak.Aligned("tile_m", unit=WGMMA_ROWS, low=WGMMA_ROWS, high=512),
    ak.Aligned("tile_n", unit=_min_swizzle_elems, low=_min_swizzle_elems, high=256),
    ak.Choice("wg_dimension", ("M", "N")),
    ak.Choice("cluster_dimension", (None, "M", "N")),
    ak.Choice("grid_minor_dim", ("M", "N")),
    ak.Aligned("grid_tile_width", unit=1, low=1, high=16),
    ak.PowerOfTwo("tile_k", low=_min_swizzle_elems, high=512),
    ak.Aligned("max_concurrent_steps", unit=1, low=1, high=8),
    ak.Choice("epi_tile_m", (None, 64, 128)),
    ak.Choice("epi_tile_n", (None, 16, 32, 64, 128)),
)
PARAM_NAMES = tuple(p.name for p in PARAMS)
# What the shared-memory and the grid-order rules read (narrow reads keep counting fast).
SMEM_READS = (
    "tile_m",
    "tile_n",
    "wg_dimension",
    "tile_k",
    "max_concurrent_steps",
    "epi_tile_m",
    "epi_tile_n",
)
GRID_READS = (
    "tile_m",
    "tile_n",
    "wg_dimension",
    "cluster_dimension",
    "grid_minor_dim",
    "grid_tile_width",
)


def _derived(c: Mapping[str, Any], env: ak.Env) -> dict[str, Any]:
    """The config, the problem, and the sizes the rules speak of (those computable from ``c``)."""
    values: dict[str, Any] = dict(env.problem.dims)
    values.update(c, dtype=env.dtype, itemsize=ak.dtype_bytes(env.dtype))
    values["budget"] = env.smem_budget(block_threads=BLOCK_THREADS)
    derivations: tuple[tuple[tuple[str, ...], Callable[[], dict[str, Any]]], ...] = (
        (("tile_m", "wg_dimension"), lambda: {"cta_tile_m": cta_tile(c, "m")}),
        (("tile_n", "wg_dimension"), lambda: {"cta_tile_n": cta_tile(c, "n")}),
        (
            ("tile_m", "wg_dimension", "cluster_dimension"),
            lambda: {"cluster_tile_m": cluster_tile(c, "m")},
        ),
        (
            ("tile_n", "wg_dimension", "cluster_dimension"),
            lambda: {"cluster_tile_n": cluster_tile(c, "n")},
        ),
        (
            ("tile_k",),
            lambda: {
                "k_iters": env["k"] // c["tile_k"],
                "row_bytes": c["tile_k"] * ak.dtype_bytes(env.dtype),
                "swizzle": swizzle_bytes(c["tile_k"] * ak.dtype_bytes(env.dtype)),
                "swizzle_elems": operand_swizzle_elems(c["tile_k"], env.dtype),
            },
        ),
        (("tile_m", "epi_tile_m"), lambda: {"epi_m": c["epi_tile_m"] or c["tile_m"]}),
        (("tile_n", "epi_tile_n"), lambda: {"epi_n": c["epi_tile_n"] or c["tile_n"]}),
        (SMEM_READS, lambda: {"smem": smem_bytes(c, env.dtype, k=env["k"])}),
        (
            GRID_READS,
            lambda: dict(zip(("m_iters", "n_iters"), _grid_iters(c, env), strict=True)),
        ),
    )
    for needs, derive in derivations:
        if all(name in c for name in needs):
            values.update(derive())
    return values


# A rule's reason: a template ``autotune spaces`` shows as is, and that a violation's message
# fills in with the config's values and the sizes derived from them.
_says = sc.reasons(_derived)


def _epi_n(c: Mapping[str, Any]) -> int:
    return c["epi_tile_n"] or c["tile_n"]


def _epi_m(c: Mapping[str, Any]) -> int:
    return c["epi_tile_m"] or c["tile_m"]


def _tiles(c: Mapping[str, Any], env: ak.Env) -> int:
    m_iters, n_iters = _grid_iters(c, env)
    return m_iters * n_iters


def _minor_iters(c: Mapping[str, Any], env: ak.Env) -> int:
    m_iters, n_iters = _grid_iters(c, env)
    return m_iters if c["grid_minor_dim"] == "M" else n_iters


def _cluster_divisible(axis: str) -> ak.Constraint:
    """``m_divisible``/``n_divisible``: the problem's ``axis`` is a whole number of cluster
    tiles (the kernel checks it)."""
    up = axis.upper()
    return ak.Constraint(
        f"{axis}_divisible",
        (f"tile_{axis}", "wg_dimension", "cluster_dimension"),
        lambda c, env: env[axis] % cluster_tile(c, axis) == 0,
        _says(
            f"{axis}={{{axis}}} must be divisible by the cluster tile {{cluster_tile_{axis}}} "
            f"(tile_{axis}={{tile_{axis}}} x2 when wg_dimension={up}, x2 when cluster_dimension="
            f"{up}; got wg_dimension={{wg_dimension}}, cluster_dimension={{cluster_dimension}}); "
            "the kernel checks it"
        ),
        kind="lowering",
    )


def _operand_transfer_128b(operand: str) -> ak.Constraint:
    """``a_transfer_128b``/``b_transfer_128b``: each TMA copy of an A (cta_tile_m x tile_k) or
    B (tile_k x cta_tile_n) tile moves a whole multiple of 128 bytes."""
    axis = "m" if operand == "a" else "n"

    def tile(c: Mapping[str, Any]) -> tuple[int, int]:
        return (cta_tile(c, "m"), c["tile_k"]) if operand == "a" else (c["tile_k"], cta_tile(c, "n"))

    shape = ("cta_tile_m={cta_tile_m} x tile_k={tile_k}" if operand == "a"
             else "tile_k={tile_k} x cta_tile_n={cta_tile_n}")
    return ak.Constraint(
        f"{operand}_transfer_128b",
        (f"tile_{axis}", "wg_dimension", "tile_k"),
        lambda c, env: ak.is_aligned_transfer(tile(c), env.dtype),
        _says(
            f"the {operand.upper()} tile copy ({shape} x {{itemsize}} B) must move a multiple "
            "of 128 bytes (TMA transfers split over a 128-thread warpgroup)"
        ),
        kind="lowering",
    )


def _epilogue_divides(axis: str) -> ak.Constraint:
    """``epi_tile_m_divides``/``epi_tile_n_divides``: the epilogue piece divides the
    warpgroup tile along ``axis`` (correctness: a larger piece never writes the output)."""
    epi, tile = f"epi_tile_{axis}", f"tile_{axis}"
    pieces, comma, otherwise = {
        "m": ("row", ",", "and a non-dividing one leaves rows unwritten"),
        "n": ("column", "", "(a smaller non-dividing one fails layout inference)"),
    }[axis]
    return ak.Constraint(
        f"{epi}_divides",
        (tile, epi),
        lambda c, env: c[tile] % (c[epi] or c[tile]) == 0,
        _says(
            f"{epi}={{{epi}}} must divide {tile}={{{tile}}}: the epilogue stores "
            f"{tile} // {epi} {pieces} pieces, so a larger piece lowers but never writes the "
            f"output{comma} {otherwise}"
        ),
        kind="correctness",
    )


CONSTRAINTS = (
    ak.Constraint(
        "wgmma_16bit_inputs",
        (),
        lambda c, env: env.dtype in SUPPORTED_DTYPES,
        _says(
            "hopper_matmul inputs must be bfloat16 or float16 (here {dtype}): its B tile "
            "(tile_k x tile_n) is N-major in shared memory, which WGMMA reads only for 16-bit "
            "floats (float32/float8 fail to lower with 'Only f16 WGMMA supports transposes'; "
            "int8 fails on the float32 accumulator)"
        ),
        kind="problem",
    ),
    _cluster_divisible("m"),
    _cluster_divisible("n"),
    sc.divisible("k_divisible", "k", "tile_k", _says),
    ak.Constraint(
        "operand_swizzle",
        ("tile_k",),
        lambda c, env: c["tile_k"] * ak.dtype_bytes(env.dtype) % MIN_SWIZZLE_BYTES == 0,
        _says(
            "a tile_k row of A and B ({tile_k} x {itemsize} B = {row_bytes} B) must be a "
            "multiple of 32 bytes: Mosaic GPU swizzles shared memory by 32, 64 or 128 bytes "
            "('Swizzle 16 is not supported')"
        ),
        kind="lowering",
    ),
    ak.Constraint(
        "b_tile_swizzle",
        ("tile_n", "tile_k"),
        lambda c, env: c["tile_n"] % operand_swizzle_elems(c["tile_k"], env.dtype) == 0,
        _says(
            "tile_n={tile_n} must be a multiple of {swizzle_elems}, the width of one swizzled "
            "tile of B in shared memory (rows of tile_k={tile_k} x {itemsize} B = {row_bytes} B "
            "get a {swizzle}-byte swizzle): each warpgroup slices B by tile_n columns "
            "(AssertionError / 'slice ... divisible by the tile size' otherwise)"
        ),
        kind="lowering",
    ),
    _operand_transfer_128b("a"),
    _operand_transfer_128b("b"),
    ak.Constraint(
        "no_clamped_steps",
        ("tile_k", "max_concurrent_steps"),
        lambda c, env: c["max_concurrent_steps"] <= env["k"] // c["tile_k"],
        _says(
            "max_concurrent_steps={max_concurrent_steps} must not exceed the k steps "
            "k/tile_k={k_iters}: the pipeline silently clamps it, so the config would compile "
            "to the same kernel as max_concurrent_steps={k_iters}"
        ),
        kind="policy",
    ),
    ak.Constraint(
        "epi_tile_m_rows",
        ("tile_m", "epi_tile_m"),
        lambda c, env: _epi_m(c) % WGMMA_ROWS == 0,
        _says(
            "epi_tile_m={epi_tile_m} must be a multiple of 64, the accumulator's WGMMA row "
            "slab (epilogue pieces of 8, 16 or 32 rows fail layout inference)"
        ),
        kind="lowering",
    ),
    _epilogue_divides("m"),
    _epilogue_divides("n"),
    ak.Constraint(
        "epi_swizzle",
        ("tile_n", "epi_tile_n"),
        lambda c, env: _epi_n(c) * ak.dtype_bytes(env.dtype) % MIN_SWIZZLE_BYTES == 0,
        _says(
            "an output row of epi_tile_n={epi_n} x {itemsize} B must be a multiple of 32 bytes: "
            "the output staging buffer is swizzled by 32, 64 or 128 bytes ('Swizzle 16 is not "
            "supported')"
        ),
        kind="lowering",
    ),
    ak.Constraint(
        "out_transfer_128b",
        ("tile_m", "tile_n", "epi_tile_m", "epi_tile_n"),
        lambda c, env: ak.is_aligned_transfer(epilogue_tiles(c), env.dtype),
        _says(
            "each output store (epi_tile_m x epi_tile_n = {epi_m} x {epi_n} x {itemsize} B) "
            "must move a multiple of 128 bytes"
        ),
        kind="lowering",
    ),
    ak.Constraint(
        "epi_canonical",
        ("tile_m", "tile_n", "epi_tile_m", "epi_tile_n"),
        lambda c, env: c["epi_tile_m"] != c["tile_m"] and c["epi_tile_n"] != c["tile_n"],
        _says(
            "an epilogue tile equal to the warpgroup tile is spelled None (epi_tile_m="
            "{epi_tile_m}, tile_m={tile_m}, epi_tile_n={epi_tile_n}, tile_n={tile_n}): both "
            "spellings compile to the same kernel"
        ),
        kind="policy",
    ),
    sc.smem_fits(
        "smem_within_limit",
        SMEM_READS,
        lambda c, env: smem_bytes(c, env.dtype, k=env["k"]),
        lambda c: BLOCK_THREADS,
        _says(
            "shared memory {smem} B (steps x (cta_tile_m x tile_k + tile_k x cta_tile_n) x "
            "{itemsize} B, plus the output staging buffer and barriers) must fit the "
            "{budget} B a block may use (after the profiler's share when tracing)"
        ),
    ),
    ak.Constraint(
        "interpret_no_cluster",
        ("cluster_dimension",),
        lambda c, env: not env.interpret or c["cluster_dimension"] is None,
        "GPU interpret mode cannot run 2-block clusters (no cluster barrier in the interpreter): "
        "cluster_dimension must be None when tuning in interpret mode",
        kind="interpret",
    ),
    ak.Constraint(
        "interpret_two_tiles",
        GRID_READS[:4],
        lambda c, env: not env.interpret or _tiles(c, env) >= 2,
        _says(
            "GPU interpret mode crashes XLA's CPU compiler (SIGFPE, a remainder by zero folded "
            "in stablehlo's FoldRemOpPattern) when the whole output is one cluster tile: "
            "m_iters x n_iters = {m_iters} x {n_iters} must be at least 2 when tuning in "
            "interpret mode (benchmarks/interpret_crash_sweep.py); the GPU runs such configs"
        ),
        kind="interpret",
    ),
    ak.Constraint(
        "grid_tile_width_in_range",
        GRID_READS,
        lambda c, env: c["grid_tile_width"] <= _minor_iters(c, env),
        _says(
            "grid_tile_width={grid_tile_width} must not exceed the output tiles along "
            "grid_minor_dim={grid_minor_dim} (m_iters={m_iters}, n_iters={n_iters}): any wider "
            "strip walks the tiles in the same order as one exactly that wide"
        ),
        kind="policy",
    ),
)

# RULE_KINDS: derived from the constraints (each carries its kind); kept for the tests and docs.
SPACE, RULE_KINDS = sc.space(PARAMS, CONSTRAINTS)


# ---------------------------------------------------------------------------------------------
# Building and running.


def _tuning_config(config: Mapping[str, Any]) -> Any:
    """Upstream's ``TuningConfig`` for a config (enums from their names)."""
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    def dim(name: str | None) -> Any:
        return None if name is None else hm.MatmulDimension[name]

    epi_m, epi_n = epilogue_tiles(config)
    return hm.TuningConfig(
        tile_m=config["tile_m"],
        tile_n=config["tile_n"],
        tile_k=config["tile_k"],
        max_concurrent_steps=config["max_concurrent_steps"],
        epi_tile_n=epi_n,
        epi_tile_m=epi_m,
        grid_minor_dim=dim(config["grid_minor_dim"]),
        grid_tile_width=config["grid_tile_width"],
        wg_dimension=dim(config["wg_dimension"]),
        cluster_dimension=dim(config["cluster_dimension"]),
    )


def build(problem: ak.Problem, config: ak.Config, options: ak.BuildOptions) -> Callable[..., Any]:
    """``fn(a, b) -> a @ b`` running the kernel with ``config``.

    Upstream's ``matmul()`` asks the default device for its SM count, which a machine without
    a GPU cannot answer; this is the same launch (one persistent block, or 2-block cluster, per
    SM) with the count taken from ``options.num_sms`` when given (the lowering oracle passes
    the current device's), else from the GPU, else from the device profile.
    """
    import jax
    import jax.experimental.pallas.mosaic_gpu as plgpu
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    tuning = _tuning_config(config)
    cluster_size = 1 + (tuning.cluster_dimension is not None)
    num_sms = ak.launch_num_sms(options)
    clusters = num_sms // cluster_size
    if options.interpret:
        # Each interpreted block costs seconds even when idle; blocks past the number of
        # output tiles would idle, and fewer blocks compute the same result.
        m_iters, n_iters = (
            sc.dim(problem, "m") // cluster_tile(config, "m"),
            sc.dim(problem, "n") // cluster_tile(config, "n"),
        )
        clusters = max(1, min(clusters, m_iters * n_iters))
    params: dict[str, Any] = {"lowering_semantics": plgpu.LoweringSemantics.Warpgroup}
    params.update(ak.profile_params(options))
    launch: dict[str, Any] = {}
    if options.interpret:
        launch["interpret"] = ak.interpret_params()
    call = plgpu.kernel(
        functools.partial(hm.kernel, config=tuning),
        out_type=jax.ShapeDtypeStruct(
            (sc.dim(problem, "m"), sc.dim(problem, "n")), jnp.dtype(problem.dtype)
        ),
        grid=(clusters,),
        grid_names=("cluster_grid",),
        cluster=(cluster_size,),
        cluster_names=("cluster",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(**params),
        **launch,
    )

    def hopper_matmul(a: Any, b: Any) -> Any:
        return call(a, b, None)

    return hopper_matmul


def make_inputs(problem: ak.Problem, key: Any) -> tuple[Any, Any]:
    """A ~ N(0, 1), B ~ N(0, 1/k): entries of A @ B are ~ N(0, 1)."""
    import jax
    import jax.numpy as jnp

    m, n, k = sc.dims(problem, ("m", "n", "k"))
    key_a, key_b = jax.random.split(key)
    dtype = jnp.dtype(problem.dtype)
    a = jax.random.normal(key_a, (m, k), jnp.float32).astype(dtype)
    b = (jax.random.normal(key_b, (k, n), jnp.float32) * k**-0.5).astype(dtype)
    return a, b


def reference(problem: ak.Problem) -> Callable[..., Any]:
    """A @ B at float32 precision: every product exact, the sums in float32.

    The product of two bfloat16 or float16 numbers is exact in float32, so 16-bit inputs are
    multiplied as they are, with float32 accumulation, on the tensor cores (a reference runs
    for every config under the GPU's lock: on the H200 a 4096^3 config's inputs and reference
    took 16 ms with a float32 GEMM, 9.4 ms since); float32 inputs at ``Precision.HIGHEST``
    (no TF32).
    """

    def matmul_f32(a: Any, b: Any) -> Any:
        import jax
        import jax.numpy as jnp

        exact = jnp.dtype(a.dtype).itemsize <= 2 and jnp.dtype(b.dtype).itemsize <= 2
        return jnp.dot(a, b, preferred_element_type=jnp.float32,
                       precision=None if exact else jax.lax.Precision.HIGHEST)

    return matmul_f32


def flops(problem: ak.Problem) -> int:
    m, n, k = sc.dims(problem, ("m", "n", "k"))
    return 2 * m * n * k


def bytes_moved(problem: ak.Problem) -> int:
    """A and B read once, C written once."""
    m, n, k = sc.dims(problem, ("m", "n", "k"))
    return (m * k + k * n + m * n) * problem.dtype_bytes


def baseline(problem: ak.Problem) -> Callable[..., Any]:
    """XLA's ``a @ b`` (cuBLAS on the H200)."""

    def xla_matmul(a: Any, b: Any) -> Any:
        return a @ b

    return xla_matmul


# ---------------------------------------------------------------------------------------------
# An analytic cost model (issue 17): the ranked sampler's prior, cold or warm.


# The device whose measurements set the constants below (autotune/replay/data), and what it reaches
# (PLATFORM.md): bf16 flops per clock per SM at cuBLAS's measured 797 of its 989 dense TFLOP/s,
# and a copy's 4.3 of its 4.8 TB/s. Another device is taken to reach the same shares of its
# own datasheet peak and bandwidth (Hopper.for_device).
FITTED_ON = "h200"
FITTED_MMA_FLOPS = 3050.0
FITTED_HBM_BYTES_S = 4.3e12


def _fitted_clock_hz() -> float:
    return (ak.PROFILES[FITTED_ON].sm_clock_mhz or 0.0) * 1e6


# The loads' latencies under load (clocks), fitted on each device's own ground truth
# (docs/ranked_sampler.md, "Latencies per device"): those of :data:`FITTED_ON` are
# :class:`Hopper`'s defaults; on the H100 SXM, with 70% of its bandwidth for the same SMs,
# the loads wait about twice as long (fitted on its 5 recorded shapes: benchmarks/RESULTS.md §7).
FITTED_LATENCIES: dict[str, dict[str, float]] = {
    FITTED_ON: {"l2_latency": 1200.0, "dram_latency": 3000.0},
    "h100-sxm": {"l2_latency": 2500.0, "dram_latency": 7000.0},
}


def _bytes_per_sm_clock(device: ak.DeviceFacts) -> float | None:
    if not (device.mem_bandwidth_gbs and device.sm_clock_mhz):
        return None
    return device.mem_bandwidth_gbs * 1e9 / (device.num_sms * device.sm_clock_mhz * 1e6)


def fitted_latencies(device: ak.DeviceFacts) -> dict[str, float]:
    """The latencies fitted on the device of :data:`FITTED_LATENCIES` whose memory bandwidth
    per SM and clock is nearest ``device``'s (by ratio): a device's own where it has a fit, a
    guess elsewhere (the fitted device's when ``device``'s bandwidth or clock is unknown)."""
    own = _bytes_per_sm_clock(device)
    fits = {key: rate for key in FITTED_LATENCIES
            if (rate := _bytes_per_sm_clock(ak.PROFILES[key])) is not None}
    nearest = FITTED_ON if own is None else min(fits, key=lambda key: abs(math.log(own / fits[key])))
    return dict(FITTED_LATENCIES[nearest])


@dataclasses.dataclass(frozen=True)
class Hopper:
    """What :func:`estimate_seconds` knows of a Hopper device and its SMs. The device's own
    facts (SMs, clock, peak, bandwidth) come from :mod:`autotune.devices`
    (:meth:`for_device`); the rest are latencies of the right order, set once by looking at
    the ranking over ``autotune/replay/data`` (docs/ranked_sampler.md says which). ``Hopper()``
    is the device the constants were fitted on (:data:`FITTED_ON`).

    Attributes:
      num_sms: SMs.
      clock_hz: the SM clock's maximum.
      mma_flops: bf16 tensor-core flops per clock per SM, at the share of the datasheet's peak
        measured on the fitted device (:data:`FITTED_MMA_FLOPS` there), not the datasheet's 4096.
      smem_bytes: shared-memory bytes read per clock per SM.
      l2_bytes: bytes per clock one SM can load from L2.
      hbm_bytes_s: device memory bandwidth, at the share of the datasheet's measured on the
        fitted device (:data:`FITTED_HBM_BYTES_S` there).
      l2_latency, dram_latency: clocks from a TMA load's issue to its data (hit in L2; from
        device memory under load).
      wg_step: clocks one consumer warpgroup spends per k-step besides its MMA (waiting on the
        stage's barrier, issuing, ``wgmma_wait``, releasing the stage).
      cluster_sync: clocks a 2-block cluster adds per k-step (both blocks release a shared stage).
      epilogue_piece: clocks per epilogue piece (registers to shared memory, fence, TMA store).
      accumulator_registers: float32 accumulator registers a consumer thread holds before
        spilling (232 per thread for a consumer warpgroup, less about 40 for everything else).
      soft: the exponent of the soft maximum that combines costs which overlap imperfectly.
      calibration: a last factor, so that the estimate is in seconds: uncalibrated, it was 12-29%
        above the measured time of the configs within 5% of each recorded shape's best (median
        15%), and the ranked sampler trusts its scale a little.
      l2_cache: the device's L2 size (bytes); ``l2_share``: the share of it that keeps an
        operand's panels between the waves that use them (:func:`operand_traffic`): half, the
        30 MiB of the H200's 60 MiB that the model was fitted with (docs/ranked_sampler.md,
        "The grid order").
      grid_width, grid_edge: the grid order beyond its traffic. Of the variants that differ
        only in it and move the same bytes, those whose strips are about ``grid_width`` tiles
        wide measured fastest (docs/ranked_sampler.md, "The grid order"), so each
        tile of width away adds ``grid_edge``: 0.33% at most, inside the ranked sampler's twin
        margin (ESTIMATE_TWIN), so that it decides which variant goes first and no more.
      stage_transfer: what else holds a pipeline stage's slot besides the load's latency and
        the stage's consumption: ``"none"`` (the default), or the transfer of the stage's bytes
        at ``l2_bytes`` per clock, as loaded (``"loaded"``: a multicast operand halved) or in
        full (``"full"``). The variants rank the live measurements of deep pipelines better and
        two recorded shapes worse (benchmarks/RESULTS.md §7); they are here
        to be measured (``benchmarks/cost_model_check.py --constants``), not the default.
    """

    num_sms: int = ak.PROFILES[FITTED_ON].num_sms
    clock_hz: float = _fitted_clock_hz()
    mma_flops: float = FITTED_MMA_FLOPS
    smem_bytes: float = 128.0
    l2_bytes: float = 64.0
    hbm_bytes_s: float = FITTED_HBM_BYTES_S
    l2_latency: float = FITTED_LATENCIES[FITTED_ON]["l2_latency"]
    dram_latency: float = FITTED_LATENCIES[FITTED_ON]["dram_latency"]
    wg_step: float = 350.0
    cluster_sync: float = 100.0
    epilogue_piece: float = 60.0
    accumulator_registers: float = 192.0
    soft: float = 4.0
    calibration: float = 0.85
    l2_cache: float = float(ak.PROFILES[FITTED_ON].l2_bytes)
    l2_share: float = 0.5
    grid_width: int = 5
    grid_edge: float = 0.0003
    stage_transfer: str = "none"

    def __post_init__(self) -> None:
        if self.stage_transfer not in STAGE_TRANSFERS:
            raise ValueError(f"Hopper.stage_transfer must be one of {STAGE_TRANSFERS}, "
                             f"got {self.stage_transfer!r}")

    @classmethod
    def for_device(cls, device: ak.DeviceFacts, **constants: Any) -> Hopper:
        """The model of ``device``: its SMs, clock, bf16 peak per SM and clock, and
        bandwidth, scaled from the fitted device's (the same share of each datasheet figure);
        a fact either device lacks keeps the fitted device's value. ``constants`` replace any
        field. ``Hopper.for_device(profile("h200")) == Hopper()``."""
        base, fitted = cls(), ak.PROFILES[FITTED_ON]
        clock_hz = device.sm_clock_mhz * 1e6 if device.sm_clock_mhz else base.clock_hz
        facts: dict[str, Any] = {"num_sms": device.num_sms, "clock_hz": clock_hz,
                                 "l2_cache": float(device.l2_bytes), **fitted_latencies(device)}
        if device.peak_bf16_tflops and fitted.peak_bf16_tflops:
            per_sm_clock = (device.peak_bf16_tflops / (device.num_sms * clock_hz)) / (
                fitted.peak_bf16_tflops / (fitted.num_sms * base.clock_hz))
            facts["mma_flops"] = base.mma_flops * per_sm_clock
        if device.mem_bandwidth_gbs and fitted.mem_bandwidth_gbs:
            facts["hbm_bytes_s"] = base.hbm_bytes_s * (device.mem_bandwidth_gbs / fitted.mem_bandwidth_gbs)
        facts.update(constants)
        return dataclasses.replace(base, **facts)


STAGE_TRANSFERS = ("none", "loaded", "full")


@functools.lru_cache(maxsize=32)
def _model_of(device: ak.DeviceFacts, constants: tuple[tuple[str, Any], ...] = ()) -> Hopper:
    return Hopper.for_device(device, **dict(constants))


def cost_model(**constants: Any) -> Callable[[ak.Problem, Mapping[str, Any]], float]:
    """:func:`estimate_seconds` on the current device with some of :class:`Hopper`'s
    constants replaced (a ``Kernel``'s ``cost_model``), e.g.
    ``cost_model(stage_transfer="loaded", l2_latency=2000)``.

    Raises:
      ValueError: a name that is not a field of :class:`Hopper`, or a bad value.
    """
    fields = {f.name for f in dataclasses.fields(Hopper)}
    unknown = sorted(set(constants) - fields)
    if unknown:
        raise ValueError(f"unknown Hopper constant(s) {unknown}; the constants are {sorted(fields)}")
    frozen = tuple(sorted(constants.items()))
    _model_of(ak.current_device(), frozen)  # a bad value fails here, not at the first estimate

    def estimate(problem: ak.Problem, config: Mapping[str, Any]) -> float:
        return estimate_seconds(problem, config, _model_of(ak.current_device(), frozen))

    return estimate


def grid_variants(space: Any, configs: Iterable[Mapping[str, Any]]) -> list[ak.Config]:
    """Every valid variant of ``configs`` in the grid order (``grid_minor_dim``,
    ``grid_tile_width``) in ``space`` (a bound space of this kernel): what
    ``benchmarks/ground_truth.py --grid`` measures."""
    minor, width = (space.domains[space.names.index(n)]
                    for n in ("grid_minor_dim", "grid_tile_width"))
    found = {ak.Config(c, grid_minor_dim=d, grid_tile_width=w)
             for c in configs for d in minor for w in width}
    return sorted((c for c in found if space.is_valid(c)), key=ak.Config.digest)


def snake_order(m_iters: int, n_iters: int, minor_dim: str,
                width: int) -> tuple[np.ndarray, np.ndarray]:
    """The output tiles (row, column) in the order the persistent grid takes them: Pallas'
    ``planar_snake`` (strips ``width`` tiles wide along ``minor_dim``, walked along the other
    dim, every other strip backwards)."""
    import numpy as np  # here: `autotune best` reads this module without numpy

    lin = np.arange(m_iters * n_iters)
    major_size, minor_size = (n_iters, m_iters) if minor_dim == "M" else (m_iters, n_iters)
    strip = lin // (width * major_size)
    wide = np.minimum(width, minor_size - strip * width)
    rest = lin - strip * width * major_size
    minor, major = strip * width + rest % wide, rest // wide
    major = np.where(strip % 2 == 1, major_size - 1 - major, major)
    return (minor, major) if minor_dim == "M" else (major, minor)


@functools.lru_cache(maxsize=8192)
def operand_traffic(m_iters: int, n_iters: int, minor_dim: str, width: int, wave: int,
                    a_panel: float, b_panel: float, cache: float) -> float:
    """Bytes of the operands read from device memory when ``wave`` blocks at a time take the
    output tiles in the grid's order (:func:`snake_order`). Each tile reads a panel of A (its
    rows, all of k: ``a_panel`` bytes) and one of B. The blocks of a wave share what they read
    at once, so a wave reads each of its panels once; a panel read by an earlier wave is still
    in the L2 when the waves since have read at most ``cache`` bytes. Strips as wide as a wave
    along the dim of the operand that does not fit re-read it at every wave (2048x14336x4096 on
    the H100: +25% for strips one tile wide along M, +3% along N)."""
    import numpy as np

    rows, cols = snake_order(m_iters, n_iters, minor_dim, width)
    panels = m_iters + n_iters
    waves = (len(rows) + wave - 1) // wave
    t = np.arange(len(rows)) // wave
    read = np.zeros((panels, waves), dtype=bool)  # the waves that read each panel
    read[rows, t] = True
    read[m_iters + cols, t] = True
    size = np.where(np.arange(panels) < m_iters, a_panel, b_panel)
    since = np.concatenate([[0.0], np.cumsum(size @ read)])  # bytes the waves before w read
    panel, when = np.nonzero(read)  # by panel, then wave
    first = np.ones(len(panel), dtype=bool)
    first[1:] = panel[1:] != panel[:-1]
    before = np.roll(when, 1)
    miss = first | (since[when + 1] - since[before + 1] > cache)
    return float(size[panel[miss]].sum())


def _soft_max(p: float, *costs: float) -> float:
    """Near the largest of ``costs``, more so the more they are alike (overlap is never
    perfect)."""
    top = max(costs)
    return top * sum((c / top) ** p for c in costs) ** (1.0 / p)


def estimate_seconds(problem: ak.Problem, config: Mapping[str, Any], device: Hopper | None = None) -> float:
    """An estimate of one call's run time, for ranking configs before compiling any (Triton's
    ``perf_model``, TVM's cost model): only the order it puts configs in matters.

    Per k-step of a block, the slowest of the tensor cores, the shared-memory reads of the
    WGMMAs, a consumer warpgroup's fixed cost per step and the loads from L2, unless too few
    stages are in flight to cover the loads' latency; per output tile, the pipeline's fill and
    the epilogue; tiles in waves over the persistent grid; the whole bounded below by device
    memory traffic (the operands' as the grid order reads them: :func:`operand_traffic`) and L2
    traffic. Accumulators past the register file spill, which costs several times
    over. Over the H200 ground truth of ``autotune/replay/data`` (7 shapes) it ranks configs with a
    Spearman correlation of 0.95-0.97 (docs/ranked_sampler.md). ``device`` defaults to the
    current device's model (:meth:`Hopper.for_device` of
    :func:`autotune.devices.current_device`).
    """
    d = device if device is not None else _model_of(ak.current_device())
    m, n, k = sc.dims(problem, ("m", "n", "k"))
    itemsize = problem.dtype_bytes
    tile_m, tile_n, tile_k = config["tile_m"], config["tile_n"], config["tile_k"]
    steps = config["max_concurrent_steps"]
    cta_m, cta_n = cta_tiles(config)
    cluster = config["cluster_dimension"]
    blocks = 2 if cluster else 1
    cl_m, cl_n = cluster_tiles(config)
    tiles = (m // cl_m) * (n // cl_n)
    clusters = d.num_sms // blocks
    waves = math.ceil(tiles / clusters)
    active = min(tiles, clusters) * blocks
    k_steps = k // tile_k
    # One k-step of a block, in clocks: both consumer warpgroups' MMAs.
    mma = 2 * cta_m * cta_n * tile_k / d.mma_flops
    wgmmas = 2 * (tile_m // WGMMA_ROWS) * (tile_k // 16)  # m64nNk16 instructions, both warpgroups
    smem = wgmmas * (WGMMA_ROWS * 16 + tile_n * 16) * itemsize / d.smem_bytes
    issue = mma / 2 + d.wg_step
    # The operand a cluster shares is multicast: each block loads half of it.
    loaded = (cta_m * (0.5 if cluster == "N" else 1.0) + cta_n * (0.5 if cluster == "M" else 1.0)) * tile_k * itemsize
    step = _soft_max(d.soft, mma, smem, issue, loaded / d.l2_bytes) + (d.cluster_sync if cluster else 0.0)
    spill = 1.0 + 8.0 * max(0.0, tile_m * tile_n / 128 - d.accumulator_registers) / d.accumulator_registers
    epi_m, epi_n = epilogue_tiles(config)
    pieces = (tile_m // epi_m) * (tile_n // epi_n)
    write, store = cta_m * cta_n * itemsize / d.smem_bytes, cta_m * cta_n * itemsize / d.l2_bytes
    # Two output slots overlap a piece's store with the next piece's write.
    epilogue = pieces * d.epilogue_piece + (max(write, store) if pieces > 1 else write + store)

    transfer = {"none": 0.0, "loaded": loaded,
                "full": (cta_m + cta_n) * tile_k * itemsize}[d.stage_transfer] / d.l2_bytes

    def tile_clocks(latency: float) -> float:
        # Stages in flight cover the latency (and, in a variant, the stage's own transfer).
        pipelined = max(step, (latency + transfer + step) / steps)
        return latency + k_steps * pipelined * spill + epilogue

    operands = operand_traffic(m // cl_m, n // cl_n, config["grid_minor_dim"],
                               config["grid_tile_width"], clusters, cl_m * k * itemsize,
                               cl_n * k * itemsize, d.l2_cache * d.l2_share)
    dram = (operands + m * n * itemsize) / d.hbm_bytes_s
    # Loads wait on device memory rather than L2 as far as the kernel is memory-bound.
    streamed = min(1.0, dram / (waves * tile_clocks(d.l2_latency) / d.clock_hz))
    blocks_s = waves * tile_clocks(d.l2_latency + (d.dram_latency - d.l2_latency) * streamed) / d.clock_hz
    l2 = tiles * blocks * k_steps * loaded / (active * d.l2_bytes * d.clock_hz)
    grid = 1.0 + d.grid_edge * abs(config["grid_tile_width"] - d.grid_width)
    return d.calibration * grid * _soft_max(d.soft, blocks_s, dram, l2)


# Known-good on the H200 at 4096^3 bf16 (PLATFORM.md, "The peer to beat"): tune-jax's
# exhaustive 648-config sweep found this best (171.5 us, 801 TFLOP/s, XLA 170.8 us). Its
# epilogue (64x64, TuningConfig's default) is spelled canonically: epi_tile_m equal to
# tile_m is None. The tuner proposes it first (repaired to the nearest valid config where a
# problem's shape rules it out), then searches.
KNOWN_GOOD = ak.Config(
    tile_m=64,
    tile_n=256,
    tile_k=128,
    max_concurrent_steps=2,
    epi_tile_m=None,
    epi_tile_n=64,
    grid_minor_dim="N",
    grid_tile_width=4,
    wg_dimension="M",
    cluster_dimension=None,
)


def default_config(problem: ak.Problem) -> ak.Config:
    """``KNOWN_GOOD`` where it is valid, else the valid config nearest to it."""
    return SPACE.bind(problem).closest_valid(KNOWN_GOOD)


def shape_of(a: Any, b: Any, *rest: Any) -> dict[str, int]:
    """The problem shape of a call: ``a`` is (m, k), ``b`` is (k, n)."""
    return {"m": int(a.shape[0]), "k": int(a.shape[1]), "n": int(b.shape[1])}


KERNEL = sc.kernel(
    "hopper_matmul",
    globals(),
    shape_keys=("m", "n", "k"),
    dtypes=SUPPORTED_DTYPES,
    baseline_name="xla",
    interpret_ok=True,
    interpret_note="Runs in GPU interpret mode (256^3 bf16 takes a few seconds on a CPU).",
    cost_model=estimate_seconds,
    description=(
        "JAX's warp-specialized Hopper matmul (hopper_matmul_mgpu): two consumer warpgroups, "
        "TMA pipeline, optional 2-block clusters, tiled epilogue"
    ),
)

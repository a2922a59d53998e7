"""Hopper matmul: JAX's warp-specialized Pallas Mosaic GPU matmul (``hopper_matmul_mgpu``).

DRAFT
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from autotune.kernel import BuildOptions, Kernel
from autotune.problem import Config, Problem, dtype_bits
from autotune.space import (
    Aligned,
    Choice,
    Constraint,
    Env,
    PowerOfTwo,
    Space,
    threads,
    transfer_bytes,
)

__all__ = ["KERNEL", "SPACE", "smem_bytes"]

# Threads of one block: two consumer warpgroups and one producer (TMA) warpgroup.
BLOCK_THREADS = threads(warpgroups=3)
MBARRIER_BYTES = 8
SMEM_ALIGNMENT = 1024


def _align(n: int, to: int = SMEM_ALIGNMENT) -> int:
    return -(-n // to) * to


def _cta_tiles(c: Mapping[str, Any]) -> tuple[int, int]:
    """The block's output tile: two consumer warpgroups stacked along ``wg_dimension``."""
    cta_m = c["tile_m"] * (2 if c["wg_dimension"] == "M" else 1)
    cta_n = c["tile_n"] * (2 if c["wg_dimension"] == "N" else 1)
    return cta_m, cta_n


def _cluster_tiles(c: Mapping[str, Any]) -> tuple[int, int]:
    """The cluster's output tile: two blocks stacked along ``cluster_dimension``."""
    cta_m, cta_n = _cta_tiles(c)
    return (
        cta_m * (2 if c["cluster_dimension"] == "M" else 1),
        cta_n * (2 if c["cluster_dimension"] == "N" else 1),
    )


def _epi(c: Mapping[str, Any]) -> tuple[int, int]:
    return (c["epi_tile_m"] or c["tile_m"], c["epi_tile_n"] or c["tile_n"])


def smem_bytes(c: Mapping[str, Any], dtype: str, k: int | None = None) -> int:
    """Shared memory one block allocates, as Pallas Mosaic GPU counts it."""
    itemsize = dtype_bits(dtype) // 8
    cta_m, cta_n = _cta_tiles(c)
    steps = c["max_concurrent_steps"]
    if k is not None:
        steps = min(steps, k // c["tile_k"])
    a_bytes = steps * cta_m * c["tile_k"] * itemsize
    b_bytes = steps * c["tile_k"] * cta_n * itemsize
    epi_m, epi_n = _epi(c)
    slots = min(2, (c["tile_m"] * c["tile_n"]) // (epi_m * epi_n))
    out_bytes = 2 * slots * epi_m * epi_n * itemsize
    barriers = 2 * steps * MBARRIER_BYTES
    return _align(a_bytes) + _align(b_bytes) + _align(out_bytes) + barriers


def _tuning_config(config: Mapping[str, Any]) -> Any:
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    dim = {"M": hm.MatmulDimension.M, "N": hm.MatmulDimension.N, None: None}
    return hm.TuningConfig(
        tile_m=config["tile_m"],
        tile_n=config["tile_n"],
        tile_k=config["tile_k"],
        max_concurrent_steps=config["max_concurrent_steps"],
        epi_tile_n=config["epi_tile_n"] or config["tile_n"],
        epi_tile_m=config["epi_tile_m"] or config["tile_m"],
        grid_minor_dim=dim[config["grid_minor_dim"]],
        grid_tile_width=config["grid_tile_width"],
        wg_dimension=dim[config["wg_dimension"]],
        cluster_dimension=dim[config["cluster_dimension"]],
    )


def build(problem: Problem, config: Config, options: BuildOptions) -> Callable[..., Any]:
    import jax
    import jax.experimental.pallas.mosaic_gpu as plgpu
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    from autotune import _jax_compat

    tuning = _tuning_config(config)
    m, n = problem["m"], problem["n"]
    num_sms = options.num_sms if options.num_sms is not None else hm.get_num_sms()
    cluster_size = 1 + (tuning.cluster_dimension is not None)
    params: dict[str, Any] = {"lowering_semantics": plgpu.LoweringSemantics.Warpgroup}
    if options.profile_space:
        params.update(
            profile_space=options.profile_space,
            profile_dir=options.profile_dir or "",
            profile_trace_scope=(
                plgpu.TraceScope.WARP
                if options.trace_scope == "warp"
                else plgpu.TraceScope.WARPGROUP
            ),
        )
    extra: dict[str, Any] = {}
    if options.interpret:
        extra["interpret"] = _jax_compat.interpret_params()
    call = plgpu.kernel(
        functools.partial(hm.kernel, config=tuning),
        out_type=jax.ShapeDtypeStruct((m, n), jnp.dtype(problem.dtype)),
        grid=(num_sms // cluster_size,),
        grid_names=("cluster_grid",),
        cluster=(cluster_size,),
        cluster_names=("cluster",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(**params),
        **extra,
    )

    def matmul(a: Any, b: Any) -> Any:
        return call(a, b, None)

    return matmul


def make_inputs(problem: Problem, key: Any) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    m, n, k = problem["m"], problem["n"], problem["k"]
    ka, kb = jax.random.split(key)
    dtype = jnp.dtype(problem.dtype)
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
    b = (jax.random.normal(kb, (k, n), jnp.float32) / (k**0.5)).astype(dtype)
    return a, b


def reference(problem: Problem) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    def ref(a: Any, b: Any) -> Any:
        return jnp.dot(
            a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )

    return ref


def baseline(problem: Problem) -> Callable[..., Any]:
    def xla_matmul(a: Any, b: Any) -> Any:
        return a @ b

    return xla_matmul


PARAMS = (
    Aligned("tile_m", unit=64, low=64, high=256),
    Choice("tile_n", (16, 32, 64, 96, 128, 192, 256), ordered=True),
    Choice("wg_dimension", ("M", "N")),
    Choice("cluster_dimension", (None, "M", "N")),
    PowerOfTwo("tile_k", low=16, high=512),
    Aligned("max_concurrent_steps", unit=1, low=1, high=8),
    Choice("epi_tile_m", (None, 8, 16, 32, 64, 128), ordered=False),
    Choice("epi_tile_n", (None, 8, 16, 32, 64, 128), ordered=False),
    Choice("grid_minor_dim", ("M", "N")),
    Aligned("grid_tile_width", unit=1, low=1, high=16),
)

SPACE = Space(PARAMS, ())

KERNEL = Kernel(
    name="hopper_matmul",
    space=SPACE,
    shape_keys=("m", "n", "k"),
    dtypes=("bfloat16", "float16"),
    build=build,
    make_inputs=make_inputs,
    reference=reference,
    flops=lambda p: 2 * p["m"] * p["n"] * p["k"],
    bytes_moved=lambda p: (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"]) * p.dtype_bytes,
    baseline=baseline,
)

"""A user's kernel whose space is deliberately incomplete: it forgets Mosaic GPU's 128-byte rule.

``y = x`` over a ``(rows, cols)`` array, copied through shared memory in ``(block_rows,
block_cols)`` tiles: one TMA copy in, one out, per block. The space lets ``block_cols`` be any
multiple of 8 elements, so a float32 tile of 1 x 8 or 2 x 8 (32 or 64 bytes) is proposed, and
Mosaic GPU refuses it ("Only copies transferring a number of bytes divisible by the warpgroup
size", seeds 002/003). The missing rule is
``is_aligned_transfer((c["block_rows"], c["block_cols"]), env.dtype)``.

Written as a user would, with the public API only; imported by worker processes as
``tests.user_kernel_missing_rule:KERNEL``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import autotune
from autotune import Aligned, BuildOptions, Kernel, PowerOfTwo, Problem, Space

__all__ = ["KERNEL", "MISSING_RULE_READS"]

MISSING_RULE_READS = ("block_rows", "block_cols")

SPACE = Space(
    params=(
        PowerOfTwo("block_rows", low=1, high=16),
        # Forgot the 128-byte rule: unit=8 elements instead of per_128_bytes or a Constraint.
        Aligned("block_cols", unit=8, low=8, high=lambda env: min(env["cols"], 256), divides="cols"),
    ),
    constraints=(
        autotune.Constraint(
            "rows_tile",
            ("block_rows",),
            lambda c, env: env["rows"] % c["block_rows"] == 0,
            "block_rows must divide rows",
        ),
    ),
)


def build(problem: Problem, config: Mapping[str, Any], options: BuildOptions) -> Callable[..., Any]:
    import jax
    import jax.experimental.pallas.mosaic_gpu as plgpu
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    rows, cols = int(problem["rows"]), int(problem["cols"])
    br, bc = config["block_rows"], config["block_cols"]
    dtype = jnp.dtype(problem.dtype)

    def body(x_gmem: Any, y_gmem: Any, buf: Any, bar: Any) -> None:
        tile = (pl.ds(lax.axis_index("r") * br, br), pl.ds(lax.axis_index("c") * bc, bc))
        plgpu.copy_gmem_to_smem(x_gmem.at[tile], buf, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        plgpu.copy_smem_to_gmem(buf, y_gmem.at[tile])
        plgpu.wait_smem_to_gmem(0)

    extra: dict[str, Any] = {}
    if options.interpret:
        extra["interpret"] = autotune.interpret_params()
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((rows, cols), dtype),
        grid=(rows // br, cols // bc),
        grid_names=("r", "c"),
        scratch_types=[plgpu.SMEM((br, bc), dtype), plgpu.Barrier(num_barriers=1)],
        **extra,
    )


def make_inputs(problem: Problem, key: Any) -> tuple[Any]:
    import jax

    shape = (int(problem["rows"]), int(problem["cols"]))
    return (jax.random.normal(key, shape).astype(problem.dtype),)


KERNEL = Kernel(
    name="staged_copy",
    space=SPACE,
    shape_keys=("rows", "cols"),
    dtypes=("float32", "bfloat16"),
    build=build,
    make_inputs=make_inputs,
    reference=lambda problem: lambda x: x,
    bytes_moved=lambda p: 2 * int(p["rows"]) * int(p["cols"]) * p.dtype_bytes,
    description="y = x through shared memory tiles; its space forgets the 128-byte rule",
)

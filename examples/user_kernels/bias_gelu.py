"""A user's Pallas Mosaic GPU kernel, declared for autotune: ``y = gelu(x + bias)``.

A fused bias + GELU epilogue over ``x`` of shape ``(rows, cols)`` and ``bias`` of shape
``(cols,)``, written with ``plgpu.kernel`` and ``plgpu.emit_pipeline``. It lives outside the
autotune package and uses only its public API (``import autotune``); see
``docs/user_kernels.md``. From the repository root::

    autotune check examples.user_kernels.bias_gelu:KERNEL --allow-import \\
        --shape rows=256,cols=1024 --dtype float32
    autotune tune examples/user_kernels/bias_gelu.toml --allow-import
    autotune best examples.user_kernels.bias_gelu:KERNEL --shape rows=64,cols=512 --dtype float32

The kernel
----------
* A grid of ``(cols / block_cols, row_splits)`` blocks of one warpgroup (128 threads). Block
  ``(j, s)`` owns column strip ``j`` and the ``s``-th of ``row_splits`` equal bands of rows.
* ``emit_pipeline`` streams the band's ``(block_rows, block_cols)`` tiles of ``x`` and the
  strip's bias row into shared memory, ``max_concurrent_steps`` tiles in flight.
* Each step computes row by row in float32 registers (a row of ``block_cols`` elements spread
  over the warpgroup's 128 threads) into one of ``store_slots`` output buffers, and copies it
  to ``y`` with its own TMA store; a buffer is reused once its previous store has read it out.
  (The pipeline's own output specs would do the stores, but their predicated copies do not run
  in GPU interpret mode in jax 0.10.2; this way the kernel tunes on a CPU as well.)

The rules, and why (the oracle -- ``autotune check``, CUDA lowering on the CPU -- agrees):

* ``block_cols`` is a multiple of 128 (``threads(warpgroups=1)``): a row in registers spreads
  over a warpgroup's 128 threads ("must have a number of elements that is a multiple of 128");
  at most 256: a TMA copy moves at most 256 elements along each dimension.
* ``block_rows`` at most 256, same TMA limit.
* ``transfer_128b``: every copy (a tile, the bias row) moves a whole multiple of 128 bytes
  (implied by the multiple of 128 elements; stated with the building block anyway).
* ``rows_tile``: ``block_rows * row_splits`` divides ``rows`` (else rows would be skipped).
* ``smem_within_budget``: :func:`smem_bytes` within ``env.smem_budget(block_threads=128)``,
  which leaves room for the profiler's buffer when the best configs are traced.
* ``steps_within_tiles`` (policy): no more pipeline slots than the band has tiles (the
  pipeline would shrink the extra slots away: two configs, one kernel).

At run time, :func:`bias_gelu` (``@autotune.tuned(KERNEL)``) runs with the best stored config
for each call's shape (on a machine without a GPU, in GPU interpret mode).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import autotune
from autotune import (
    MBARRIER_BYTES,
    WARPGROUP_SIZE,
    Aligned,
    BuildOptions,
    Choice,
    Constraint,
    Env,
    Kernel,
    PowerOfTwo,
    Problem,
    Space,
    is_aligned_transfer,
    smem_aligned,
    threads,
    transfer_bytes,
)

__all__ = ["KERNEL", "SPACE", "smem_bytes", "bias_gelu"]

TMA_BOX_ELEMS = 256  # a TMA copy moves at most this many elements along each dimension
BLOCK_THREADS = threads(warpgroups=1)


def _tile_rows(c: Mapping[str, Any], env: Env) -> int:
    """Tiles in one block's band of rows."""
    return env["rows"] // (c["block_rows"] * c["row_splits"])


def smem_bytes(c: Mapping[str, Any], env: Env) -> int:
    """Shared memory of one block, as Mosaic GPU counts it: the pipeline's x tiles and bias
    rows, the output buffers (each allocation 1 KiB-aligned), and a barrier per step."""
    tile = transfer_bytes((c["block_rows"], c["block_cols"]), env.dtype)
    bias = transfer_bytes((1, c["block_cols"]), env.dtype)
    steps = c["max_concurrent_steps"]
    return (
        smem_aligned(steps * tile) + smem_aligned(steps * bias)
        + smem_aligned(c["store_slots"] * tile) + steps * MBARRIER_BYTES
    )


SPACE = Space(
    params=(
        Aligned(
            "block_cols", unit=WARPGROUP_SIZE, low=WARPGROUP_SIZE, high=TMA_BOX_ELEMS,
            divides="cols",
        ),
        PowerOfTwo("block_rows", low=1, high=TMA_BOX_ELEMS),
        PowerOfTwo("row_splits", low=1, high=8),
        Aligned("max_concurrent_steps", unit=1, low=1, high=4),
        Choice("store_slots", (1, 2), ordered=True),
    ),
    constraints=(
        Constraint(
            "rows_tile",
            ("block_rows", "row_splits"),
            lambda c, env: env["rows"] % (c["block_rows"] * c["row_splits"]) == 0,
            lambda c, env: (
                f"block_rows x row_splits = {c['block_rows']} x {c['row_splits']} must divide "
                f"rows={env['rows']}"
            ),
        ),
        Constraint(
            "transfer_128b",
            ("block_cols", "block_rows"),
            lambda c, env: (
                is_aligned_transfer((c["block_rows"], c["block_cols"]), env.dtype)
                and is_aligned_transfer((1, c["block_cols"]), env.dtype)
            ),
            "every copy (an x tile, the bias row) moves a whole multiple of 128 bytes",
        ),
        Constraint(
            "steps_within_tiles",
            ("block_rows", "row_splits", "max_concurrent_steps"),
            lambda c, env: c["max_concurrent_steps"] <= _tile_rows(c, env),
            "policy: more pipeline slots than tiles in a band only stay idle",
        ),
        Constraint(
            "smem_within_budget",
            ("block_cols", "block_rows", "max_concurrent_steps", "store_slots"),
            lambda c, env: smem_bytes(c, env) <= env.smem_budget(block_threads=BLOCK_THREADS),
            lambda c, env: (
                f"shared memory {smem_bytes(c, env)} bytes exceeds the "
                f"{env.smem_budget(block_threads=BLOCK_THREADS)}-byte budget"
            ),
        ),
    ),
)


def _kernel_kwargs(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """``out_type``/``scratch_types``, or ``out_shape``/``scratch_shapes`` where only those exist."""
    names = inspect.signature(fn).parameters
    renames = {"out_type": "out_shape", "scratch_types": "scratch_shapes"}
    return {(k if k in names else renames.get(k, k)): v for k, v in kwargs.items()}


def build(problem: Problem, config: Mapping[str, Any], options: BuildOptions) -> Callable[..., Any]:
    """The kernel for one problem and config: ``fn(x, bias) -> y``."""
    import jax
    import jax.experimental.pallas.mosaic_gpu as plgpu
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    rows, cols = int(problem["rows"]), int(problem["cols"])
    bm, bn = config["block_rows"], config["block_cols"]
    splits, slots = config["row_splits"], config["store_slots"]
    if rows % (bm * splits) or cols % bn:
        raise ValueError(f"tiles {bm}x{bn} with {splits} row splits must cover {rows}x{cols}")
    tiles = rows // (bm * splits)
    dtype = jnp.dtype(problem.dtype)
    block_spec = getattr(plgpu, "BlockSpec", pl.BlockSpec)

    def body(x_gmem: Any, b_gmem: Any, y_gmem: Any, y_smem: Any) -> None:
        j = lax.axis_index("col")
        band = lax.axis_index("band")

        def step(indices: Any, x_smem: Any, b_smem: Any) -> None:
            (i,) = indices
            out = y_smem.at[lax.rem(i, slots)]
            # That buffer's previous store (slots steps ago) must have read it out.
            plgpu.wait_smem_to_gmem(slots - 1, wait_read_only=True)
            bias = b_smem[0].astype(jnp.float32)

            def row(r: Any, carry: Any) -> Any:
                x = x_smem[r].astype(jnp.float32)
                out[r] = jax.nn.gelu(x + bias, approximate=True).astype(dtype)
                return carry

            lax.fori_loop(0, bm, row, None)
            plgpu.commit_smem()  # our stores, visible to the TMA engine
            tile = pl.ds((band * tiles + i) * bm, bm)
            plgpu.copy_smem_to_gmem(out, y_gmem.at[tile, pl.ds(j * bn, bn)])

        plgpu.emit_pipeline(
            step,
            grid=(tiles,),
            in_specs=[
                block_spec((bm, bn), lambda i: (band * tiles + i, j)),
                block_spec((1, bn), lambda i: (0, j)),
            ],
            max_concurrent_steps=config["max_concurrent_steps"],
        )(x_gmem, b_gmem)
        plgpu.wait_smem_to_gmem(0)

    extra: dict[str, Any] = {}
    if options.interpret:
        extra["interpret"] = autotune.interpret_params()
    call = plgpu.kernel(
        body,
        grid=(cols // bn, splits),
        grid_names=("col", "band"),
        compiler_params=plgpu.CompilerParams(**autotune.profile_params(options)),
        **_kernel_kwargs(
            plgpu.kernel,
            out_type=jax.ShapeDtypeStruct((rows, cols), dtype),
            scratch_types=[plgpu.SMEM((slots, bm, bn), dtype)],
        ),
        **extra,
    )

    def bias_gelu(x: Any, bias: Any) -> Any:
        return call(x, bias.reshape(1, cols))

    return bias_gelu


def make_inputs(problem: Problem, key: Any) -> tuple[Any, Any]:
    """Fresh random ``x`` and ``bias`` (never zeros) in the problem's dtype."""
    import jax
    import jax.numpy as jnp

    kx, kb = jax.random.split(key)
    rows, cols = int(problem["rows"]), int(problem["cols"])
    x = jax.random.normal(kx, (rows, cols), jnp.float32).astype(problem.dtype)
    bias = jax.random.normal(kb, (cols,), jnp.float32).astype(problem.dtype)
    return x, bias


def reference(problem: Problem) -> Callable[..., Any]:
    """The right answer, in float32."""
    import jax
    import jax.numpy as jnp

    def ref(x: Any, bias: Any) -> Any:
        return jax.nn.gelu(x.astype(jnp.float32) + bias.astype(jnp.float32), approximate=True)

    return ref


def baseline(problem: Problem) -> Callable[..., Any]:
    """What XLA fuses from the same expression: the thing to beat."""
    import jax
    import jax.numpy as jnp

    def xla_bias_gelu(x: Any, bias: Any) -> Any:
        y = jax.nn.gelu(x.astype(jnp.float32) + bias.astype(jnp.float32), approximate=True)
        return y.astype(x.dtype)

    return xla_bias_gelu


def default_config(problem: Problem) -> Mapping[str, Any]:
    """A reasonable start: 128 columns, 16-row tiles, 2 steps in flight, 2 output buffers."""
    proposal = {
        "block_cols": 128, "block_rows": 16, "row_splits": 1,
        "max_concurrent_steps": 2, "store_slots": 2,
    }
    return SPACE.bind(problem).closest_valid(proposal)


KERNEL = Kernel(
    name="bias_gelu",
    space=SPACE,
    shape_keys=("rows", "cols"),
    dtypes=("float32", "bfloat16", "float16"),
    build=build,
    make_inputs=make_inputs,
    reference=reference,
    # Per element: the add, and tanh-GELU's ~8 operations.
    flops=lambda p: 9 * int(p["rows"]) * int(p["cols"]),
    bytes_moved=lambda p: (2 * int(p["rows"]) + 1) * int(p["cols"]) * p.dtype_bytes,
    baseline=baseline,
    baseline_name="xla",
    default_config=default_config,
    shape_of=lambda x, bias: {"rows": int(x.shape[0]), "cols": int(x.shape[1])},
    description="y = gelu(x + bias) (Pallas Mosaic GPU, emit_pipeline): a user's kernel",
)


@functools.cache
def _jitted(problem: Problem, config: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    import jax

    # Without a GPU, run in GPU interpret mode (slow: for tests and small shapes).
    options = BuildOptions(interpret=jax.default_backend() == "cpu")
    return jax.jit(build(problem, dict(config), options))


@autotune.tuned(KERNEL)
def bias_gelu(x: Any, bias: Any, *, config: Mapping[str, Any] | None = None) -> Any:
    """``gelu(x + bias)`` with the best stored config for the call's shape (run-time lookup:
    the problem's best tuned config, else a near problem's, else :func:`default_config`)."""
    problem = KERNEL.problem({"rows": int(x.shape[0]), "cols": int(x.shape[1])}, str(x.dtype))
    config = config or default_config(problem)
    return _jitted(problem, tuple(sorted(config.items())))(x, bias)

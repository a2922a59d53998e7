"""A user's raw Mosaic GPU kernel (no Pallas), declared for autotune: ``z = x + y``.

Two 1-D arrays of ``n`` elements, added by a kernel built directly with
``jax.experimental.mosaic.gpu.as_gpu_kernel``. It lives outside the autotune package and uses
only its public API (``import autotune``); see ``docs/user_kernels.md``. From the repository
root::

    autotune check examples.user_kernels.raw_mosaic_add:KERNEL --allow-import \\
        --shape n=1048576 --dtype bfloat16                 # on any machine: CUDA lowering
    autotune tune examples/user_kernels/raw_mosaic_add.toml --allow-import   # on a GPU

No GPU interpret mode: the interpreter runs Pallas kernels (jaxprs), and this is MLIR built by
hand, so ``interpret_ok=False``. On a CPU, ``autotune check`` cross-lowers its configs for
CUDA (every rule below that Mosaic GPU enforces is checked there), and a job lists it as
skipped instead of measuring it; correctness against the reference and timing need a GPU.

The kernel
----------
* A grid of ``n / tile_elems`` blocks of ``block_threads`` threads; block ``b`` owns tile
  ``b``. Thread 0 issues two TMA copies (the ``x`` and ``y`` tiles, gmem -> smem), each with
  its own barrier; every thread waits, adds ``vector_bytes``-wide vectors in float32 (thread
  ``t`` takes vectors ``t, t + block_threads, ...``) into the ``x`` buffer, fences, syncs the
  block, and thread 0 copies the sum back (smem -> gmem).
* Traceable (``options.profile_space``): regions ``load``, ``compute``, ``store``.

Rules (the oracle -- ``autotune check`` -- agrees):

* ``block_threads``: whole warps, 32 to 1024 (``threads(warps=1)`` .. ``threads(warpgroups=8)``:
  CUDA's limit); ``tile_elems``: a power of two from 128 bytes (``per_128_bytes``) to 128 KiB.
* ``tile_divides_n``: no tail (it would be skipped).
* ``transfer_128b``: each copy moves a whole multiple of 128 bytes (implied by the domain).
* ``smem_within_budget``: two tiles and two barriers within ``env.smem_budget(...)``.
* ``no_idle_threads`` (policy): every thread gets at least one vector.
* ``trace_scope_threads``: traced, the block is a whole number of traced units
  (``env.trace_unit``), or Mosaic GPU raises "Block size is not a multiple of 128".
* ``trace_regions_fit`` (problem rule): tracing needs room for 4 ranges per unit.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from autotune import (
    MBARRIER_BYTES,
    Aligned,
    BuildOptions,
    Choice,
    Constraint,
    Env,
    Kernel,
    PowerOfTwo,
    Problem,
    Space,
    elems_per_bytes,
    is_aligned_transfer,
    per_128_bytes,
    threads,
    transfer_bytes,
)

__all__ = ["KERNEL", "SPACE", "smem_bytes"]

MAX_TILE_BYTES = 128 * 1024
TRACE_REGIONS = 4  # Mosaic GPU's own "Init", then load, compute, store


def _vector_elems(c: Mapping[str, Any], env: Env) -> int:
    return elems_per_bytes(c["vector_bytes"], env.dtype)


def smem_bytes(c: Mapping[str, Any], env: Env) -> int:
    """Shared memory of one block: the x and y tiles and their two barriers."""
    return 2 * transfer_bytes((c["tile_elems"],), env.dtype) + 2 * MBARRIER_BYTES


SPACE = Space(
    params=(
        Aligned(
            "block_threads", unit=threads(warps=1), low=threads(warps=1),
            high=threads(warpgroups=8),
        ),
        PowerOfTwo(
            "tile_elems",
            low=per_128_bytes,
            high=lambda env: min(env["n"], elems_per_bytes(MAX_TILE_BYTES, env.dtype)),
        ),
        Choice("vector_bytes", (4, 8, 16), ordered=True),
    ),
    constraints=(
        Constraint(
            "trace_regions_fit",
            (),
            lambda c, env: env.profile_space == 0 or env.profile_space > TRACE_REGIONS,
            f"tracing needs profile_space > {TRACE_REGIONS} for the kernel's regions",
        ),
        Constraint(
            "trace_scope_threads",
            ("block_threads",),
            lambda c, env: env.profile_space == 0 or c["block_threads"] % env.trace_unit == 0,
            lambda c, env: (
                f"traced at {env.trace_scope} scope, block_threads={c['block_threads']} must "
                f"be a multiple of {env.trace_unit}"
            ),
        ),
        Constraint(
            "tile_divides_n",
            ("tile_elems",),
            lambda c, env: env["n"] % c["tile_elems"] == 0,
            lambda c, env: f"tile_elems={c['tile_elems']} must divide n={env['n']}",
        ),
        Constraint(
            "transfer_128b",
            ("tile_elems",),
            lambda c, env: is_aligned_transfer((c["tile_elems"],), env.dtype),
            "each copy moves a whole multiple of 128 bytes",
        ),
        Constraint(
            "smem_within_budget",
            ("block_threads", "tile_elems"),
            lambda c, env: smem_bytes(c, env) <= env.smem_budget(block_threads=c["block_threads"]),
            lambda c, env: (
                f"shared memory {smem_bytes(c, env)} bytes exceeds the "
                f"{env.smem_budget(block_threads=c['block_threads'])}-byte budget"
            ),
        ),
        Constraint(
            "no_idle_threads",
            ("block_threads", "tile_elems", "vector_bytes"),
            lambda c, env: c["block_threads"] * _vector_elems(c, env) <= c["tile_elems"],
            "policy: every thread gets at least one vector of the tile",
        ),
    ),
)


@contextlib.contextmanager
def _ir_context() -> Iterator[None]:
    """An MLIR context with Mosaic GPU's dialect, which ``as_gpu_kernel`` expects its caller
    to have entered (as JAX's own Mosaic GPU examples and tests do)."""
    from jax._src.interpreters import mlir
    from jax._src.lib import mosaic_gpu_dialect
    from jaxlib.mlir import ir

    ctx = mlir.make_ir_context()
    if mosaic_gpu_dialect is not None:
        mosaic_gpu_dialect.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        yield


def _profiler_spec(options: BuildOptions) -> Any:
    if not options.profile_space:
        return None
    from jax.experimental.mosaic.gpu import profiler
    from jax.experimental.mosaic.gpu import utils as mu

    scope = {"warp": mu.ThreadSubset.WARP, "warpgroup": mu.ThreadSubset.WARPGROUP}
    kwargs: dict[str, Any] = {"trace_scope": scope[options.trace_scope]}
    if options.profile_dir:
        kwargs["dump_path"] = options.profile_dir
    return profiler.ProfilerSpec(options.profile_space * 4, **kwargs)


def build(problem: Problem, config: Mapping[str, Any], options: BuildOptions) -> Callable[..., Any]:
    """The kernel for one problem and config: ``fn(x, y) -> x + y``."""
    import jax
    import jax.experimental.mosaic.gpu as mgpu
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import utils as mu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, gpu, nvvm, vector

    if options.interpret:
        raise NotImplementedError(
            "raw_mosaic_add is a raw Mosaic GPU kernel: GPU interpret mode runs only Pallas kernels"
        )
    n, tile = int(problem["n"]), config["tile_elems"]
    nthreads = config["block_threads"]
    dtype = jnp.dtype(problem.dtype)
    vec = config["vector_bytes"] // dtype.itemsize
    if n % tile or config["vector_bytes"] % dtype.itemsize or tile % vec:
        raise ValueError(f"tile_elems={tile} must divide n={n}, vectors whole elements")
    per_thread = -(-(tile // vec) // nthreads)  # vectors per thread, the last round partial
    exact = (tile // vec) % nthreads == 0
    copy_kwargs: dict[str, Any] = {}
    if "oob_mode" in inspect.signature(mgpu.LaunchContext.async_copy).parameters:
        from jax.experimental.mosaic.gpu.launch_context import OOBFillMode

        copy_kwargs["oob_mode"] = OOBFillMode.PROMISE_IN_BOUNDS  # tiles never leave the array

    def body(ctx: Any, x_gmem: Any, y_gmem: Any, z_gmem: Any, scratch: Any) -> None:
        buf, bars = scratch
        index, f32 = ir.IndexType.get(), ir.F32Type.get()
        elt = mu.dtype_to_ir_type(dtype)
        reg, reg32 = ir.VectorType.get((vec,), elt), ir.VectorType.get((vec,), f32)

        def idx(v: int) -> Any:
            return mu.c(v, index)

        tid = arith.index_cast(index, mu.thread_idx())
        leader = arith.cmpi(arith.CmpIPredicate.eq, tid, idx(0))
        part = mu.ds(arith.muli(gpu.block_id(gpu.Dimension.x), idx(tile)), tile)

        def region(name: str) -> Any:
            return ctx.named_region(name) if options.profile_space else contextlib.nullcontext()

        with region("load"):
            with mu.when(leader):
                for k, src in enumerate((x_gmem, y_gmem)):
                    ctx.async_copy(
                        src_ref=src, dst_ref=mu.memref_slice(buf, k), gmem_slice=part,
                        barrier=bars[k], arrive=True, predicate=None, **copy_kwargs,
                    )
            bars[0].wait()
            bars[1].wait()
        with region("compute"):
            xs, ys = mu.memref_slice(buf, 0), mu.memref_slice(buf, 1)

            @mu.fori(idx(per_thread), None)
            def _(k: Any, carry: Any) -> Any:
                v = arith.addi(arith.muli(k, idx(nthreads)), tid)

                def add() -> None:
                    at = [arith.muli(v, idx(vec))]
                    x, y = vector.load(reg, xs, at), vector.load(reg, ys, at)
                    if dtype != jnp.float32:
                        x, y = arith.extf(reg32, x), arith.extf(reg32, y)
                    z = arith.addf(x, y)
                    vector.store(z if dtype == jnp.float32 else arith.truncf(reg, z), xs, at)

                if exact:
                    add()
                else:
                    with mu.when(arith.cmpi(arith.CmpIPredicate.ult, v, idx(tile // vec))):
                        add()
                return carry

            # Every thread's stores, visible to the TMA engine, before thread 0 copies out.
            nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)
            gpu.barrier()
        with region("store"), mu.when(leader):
            ctx.async_copy(
                src_ref=xs, dst_ref=z_gmem, gmem_slice=part, arrive=True, predicate=None,
                **copy_kwargs,
            )
            nvvm.cp_async_bulk_wait_group(0)

    shape = jax.ShapeDtypeStruct((n,), dtype)
    with _ir_context():
        kernel = mgpu.as_gpu_kernel(
            body,
            grid=(n // tile, 1, 1),
            block=(nthreads, 1, 1),
            in_shape=(shape, shape),
            out_shape=shape,
            smem_scratch_shape=(
                jax.ShapeDtypeStruct((2, tile), dtype),
                mgpu.TMABarrier(num_barriers=2),
            ),
            prof_spec=_profiler_spec(options),
            module_name="raw_mosaic_add",
        )

    def add(x: Any, y: Any) -> Any:
        return kernel(x, y)

    return add


def make_inputs(problem: Problem, key: Any) -> tuple[Any, Any]:
    """Fresh random ``x`` and ``y`` (never zeros)."""
    import jax
    import jax.numpy as jnp

    kx, ky = jax.random.split(key)
    n = int(problem["n"])
    return (
        jax.random.normal(kx, (n,), jnp.float32).astype(problem.dtype),
        jax.random.normal(ky, (n,), jnp.float32).astype(problem.dtype),
    )


def reference(problem: Problem) -> Callable[..., Any]:
    import jax.numpy as jnp

    return lambda x, y: x.astype(jnp.float32) + y.astype(jnp.float32)


def baseline(problem: Problem) -> Callable[..., Any]:
    return lambda x, y: x + y


def default_config(problem: Problem) -> Mapping[str, Any]:
    """Two warpgroups, 16 KiB tiles, 16-byte vectors (the nearest valid config if needed)."""
    proposal = {
        "block_threads": threads(warpgroups=2),
        "tile_elems": 16 * 1024 // problem.dtype_bytes,
        "vector_bytes": 16,
    }
    return SPACE.bind(problem).closest_valid(proposal)


KERNEL = Kernel(
    name="raw_mosaic_add",
    space=SPACE,
    shape_keys=("n",),
    dtypes=("float32", "bfloat16", "float16"),
    build=build,
    make_inputs=make_inputs,
    reference=reference,
    flops=lambda p: int(p["n"]),
    bytes_moved=lambda p: 3 * int(p["n"]) * p.dtype_bytes,
    baseline=baseline,
    baseline_name="xla",
    default_config=default_config,
    interpret_ok=False,
    interpret_note="a raw Mosaic GPU kernel; `autotune check` lowers it on a CPU, tune it on a GPU",
    shape_of=lambda x, y: {"n": int(x.shape[0])},
    description="z = x + y (raw Mosaic GPU, one TMA tile per block): a user's kernel",
)

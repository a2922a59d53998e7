"""``y = x * scale + bias`` over a 1-D array: a raw Mosaic GPU kernel (no Pallas), tuned by
its CUDA block size, transfer size and pipeline depth.

The kernel (``mosaic.gpu.as_gpu_kernel``, Lane semantics)
---------------------------------------------------------
* Inputs ``x`` (``n`` elements) and ``params = [scale, bias]`` (float32); output like ``x``.
* Persistent grid of ``min(num_sms * blocks_per_sm, n / tile_elems)`` blocks of
  ``block_threads`` threads, ``block=(block_threads, 1, 1)``. Block ``b`` owns tiles ``b, b +
  grid, ...`` of ``tile_elems`` elements.
* Per block a ``slots``-deep in-place pipeline: thread 0 issues each tile's gmem -> smem bulk
  copy (``ctx.async_copy``, an mbarrier per slot); all threads wait on the slot's barrier,
  update it in place with ``vector_bytes``-wide shared-memory accesses (thread ``t`` takes
  vectors ``t, t + block_threads, ...``; float32 math), fence, sync the block, and thread 0
  copies the slot back smem -> gmem and refills a slot whose store has read it out
  (``refill_lag`` 0: the slot just stored, waiting for its read; 1: the previous one).
* Only per-thread code and block-wide barriers (``bar.sync 0``), no warpgroup collectives, so
  any whole number of warps runs; the oracle agrees (see the sweep below).
* Tracing: ``options.profile_space`` builds a ``profiler.ProfilerSpec`` (``trace_scope``
  ``"warp"`` or ``"warpgroup"``, ``profile_space * 4`` entries per traced unit, as Pallas
  sizes it) written to ``options.profile_dir``; regions ``load``/``compute``/``store`` of each
  block's first tile only, so a persistent loop cannot overrun the unchecked buffer. The
  profiler allocates one trace per warp or warpgroup and raises "Block size is not a multiple
  of {scope_size}" otherwise (seed 000): the ``trace_scope_threads`` rule reads
  ``env.trace_unit`` and makes that impossible.
* No GPU interpret mode: it interprets Pallas kernels (jaxprs), and this kernel is MLIR built
  directly, so ``interpret_ok=False``; correctness is checked on the GPU against the reference.

Rules (kinds as in ``softmax``: lowering / build / policy)
---------------------------------------------------------
* ``block_threads``: a multiple of 32 up to 1024 -- domain: whole warps is policy (partial
  warps lower too), 1024 is CUDA's launch limit (cross-lowering does not check it).
* ``tile_elems``: a power of two, from 128 bytes to 64 KiB -- domain, policy: raw
  ``cp.async.bulk`` needs only 16 bytes (seeds 002/003 are Pallas' checks); kept so every
  transfer is a whole multiple of 128 bytes, as the project requires.
* ``slots`` 1-8 (policy; Mosaic GPU refuses more than 32 barriers), ``vector_bytes`` 4/8/16
  (policy; 2 and 32 lower where they hold whole elements), ``blocks_per_sm`` 1/2/4 (policy).
* ``trace_scope_threads``: when tracing, ``block_threads % env.trace_unit == 0`` -- lowering
  (seed 000).
* ``tile_divides_n``: ``n % tile_elems == 0`` -- build (a tail would be skipped).
* ``transfer_128b``: ``tile_elems * itemsize % 128 == 0`` -- policy (implied by the domain).
* ``smem_within_budget``: ``slots * tile_elems * itemsize + 8 * slots`` within
  ``env.smem_budget(block_threads=...)`` (profiler share taken off) -- lowering; exact
  untraced, 8 bytes on the safe side traced.
* ``refill_needs_free_slot``: ``refill_lag < slots`` -- build (deadlock otherwise).
* ``no_idle_threads``: ``block_threads * vector elements <= tile_elems`` -- policy.
* ``no_idle_slots``: ``slots <= n / tile_elems`` -- policy.
* ``blocks_fit_sm``: ``blocks_per_sm`` blocks fit one SM's shared memory (the device's
  ``smem_per_sm``, 228 KiB on Hopper; 1 KiB reserved per block) and 2048 threads -- policy (more only queue).
* ``trace_regions_fit`` (problem rule): tracing needs ``profile_space >= 5`` for the 4 ranges
  (Mosaic GPU's own ``Init`` and the three above) -- policy.

Oracle sweep (jax 0.10.2 on CPU, ``lower_for_cuda``, 2026-12-02)
----------------------------------------------------------------
A raw grid wider than the space -- block_threads 16, 32, 48, 64, 96, 100, 128, 160, 192,
256, 384, 512, 640, 768, 1024, 1056; tile_elems 16, 32, 48, 64, 128, 256, 1024, 4096, 16384,
32768, 65536, 131072; slots 1, 2, 3, 4, 6, 8, 33; refill_lag 0/1; vector_bytes 2, 4, 8, 16,
32; blocks_per_sm 1, 2, 4, 8; tracing off / warp / warpgroup -- 800 random configs on each of
n=2**24 bf16, 2**20 f32, 3*2**16 f16 and 1000 f32: 3,200 configs, 963 lowered, 2,237 failed.
Failures: 462 seed 000 ("Block size is not a multiple of 32/128", tracing only), 344 shared
memory, 133 "Only up to 32 barriers per group supported" (33 slots), and build refusals:
1,011 tile not dividing n (all of n=1000), 157 refill deadlock, 130 vector not whole
elements. The space accepted 96 and all 96 lowered. Of the 2,271 configs it rejects, 867
lowered, every one breaking only policy or domain bounds (vector_bytes 2/32, blocks_per_sm
8, tiles under 128 bytes or not powers of two, idle threads, blocks not fitting an SM, and
block_threads off whole warps -- 86 of 215 such configs lowered untraced, so partial warps
lower -- or above 1024, which lowers on the CPU and fails only at launch). 23 configs broke
only ``trace_scope_threads``: all 23 failed with seed 000's error. Shared memory: the model
equals Mosaic GPU's count untraced; traced it is 8 bytes over (``profiler_smem_bytes``'
alignment allowance), so the rule is exact to within 8 bytes, on the safe side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import autotune.kernels as ak
from search_spaces import scaffolding as sc

__all__ = ["KERNEL", "SPACE", "DTYPES", "RULE_KINDS", "smem_bytes", "copy_shapes"]

DTYPES = ("float32", "bfloat16", "float16")

MAX_BLOCK_THREADS = 1024  # CUDA
MAX_TILE_BYTES = 64 * 1024
# Of an SM's shared memory (the device's ``smem_per_sm``), CUDA reserves 1 KiB per resident block.
SMEM_RESERVED_PER_BLOCK = 1024
SM_MAX_THREADS = 2048
TRACE_REGIONS = 4  # Mosaic GPU's own "Init", then load, compute, store (first tile only)

# The kinds of the tunables' domain rules (a constraint carries its own kind).
_DOMAIN_KINDS: dict[str, str] = {
    "slots_domain": "policy+lowering",  # <= 8: policy; Mosaic GPU takes at most 32 barriers
    "refill_lag_domain": "build",
    "vector_bytes_domain": "policy+build",  # 2 and 32 bytes lower (when whole elements)
    "blocks_per_sm_domain": "policy",
    # multiple of 32: policy (partial warps lower too); <= 1024: CUDA's launch limit, which
    # cross-lowering does not check (1056 threads lower on the CPU).
    "block_threads_domain": "policy+launch",
    "tile_elems_domain": "policy",
}


def _vector_elems(config: Mapping[str, Any], dtype: str) -> int:
    return config["vector_bytes"] // ak.dtype_bytes(dtype)


def copy_shapes(config: Mapping[str, Any], problem: ak.Problem) -> list[tuple[int, ...]]:
    """Shape of every copy the kernel issues (each load and its store move one tile)."""
    return [(config["tile_elems"],)]


def smem_bytes(config: Mapping[str, Any], problem: ak.Problem) -> int:
    """Shared memory one block allocates, as Mosaic GPU counts it (the profiler's share apart)."""
    slots = config["slots"]
    return slots * ak.transfer_bytes((config["tile_elems"],), problem.dtype) + slots * ak.MBARRIER_BYTES


# ---------------------------------------------------------------------------------------------
# The space.

PARAMS = (
    ak.Aligned("block_threads", unit=ak.WARP_SIZE, low=ak.WARP_SIZE, high=MAX_BLOCK_THREADS),
    ak.PowerOfTwo(
        "tile_elems",
        low=lambda env: ak.TRANSFER_ALIGN_BYTES // ak.dtype_bytes(env.dtype),
        high=lambda env: min(env["n"], MAX_TILE_BYTES // ak.dtype_bytes(env.dtype)),
    ),
    ak.Aligned("slots", unit=1, low=1, high=8),
    ak.Choice("refill_lag", (0, 1), ordered=True),
    ak.Choice("vector_bytes", (4, 8, 16), ordered=True),
    ak.Choice("blocks_per_sm", (1, 2, 4), ordered=True),
)


def _sm_fits(c: Mapping[str, Any], env: ak.Env) -> bool:
    per_block = smem_bytes(c, env.problem) + SMEM_RESERVED_PER_BLOCK
    return (
        c["blocks_per_sm"] * per_block <= env.device.smem_per_sm
        and c["blocks_per_sm"] * c["block_threads"] <= SM_MAX_THREADS
    )


CONSTRAINTS = (
    sc.trace_regions_fit(TRACE_REGIONS, "block"),
    ak.Constraint(
        "trace_scope_threads",
        ("block_threads",),
        lambda c, env: env.profile_space == 0 or c["block_threads"] % env.trace_unit == 0,
        lambda c, env: (
            f"block_threads={c['block_threads']} is not a multiple of {env.trace_unit}: "
            f"tracing at {env.trace_scope} scope keeps one trace per {env.trace_unit} threads, "
            f"and Mosaic GPU raises 'Block size is not a multiple of {env.trace_unit}' (seed "
            f"000); use a multiple of {env.trace_unit}"
        ),
        kind="lowering",
    ),
    sc.tile_divides("tile_divides_n", "tile_elems", "n"),
    sc.copies_128b(
        ("tile_elems",),
        copy_shapes,
        lambda c, env: (
            f"a tile of {c['tile_elems']} {env.dtype} moves "
            f"{ak.transfer_bytes((c['tile_elems'],), env.dtype)} bytes, not a whole multiple of 128"
        ),
        kind="policy",
    ),
    ak.Constraint(
        "no_idle_threads",
        ("block_threads", "tile_elems", "vector_bytes"),
        lambda c, env: c["block_threads"] * _vector_elems(c, env.dtype) <= c["tile_elems"],
        lambda c, env: (
            f"block_threads={c['block_threads']} threads x "
            f"{_vector_elems(c, env.dtype)} elements per vector exceed tile_elems="
            f"{c['tile_elems']} (policy: some threads would have nothing to do)"
        ),
        kind="policy",
    ),
    ak.Constraint(
        "no_idle_slots",
        ("tile_elems", "slots"),
        lambda c, env: c["slots"] <= env["n"] // c["tile_elems"],
        lambda c, env: (
            f"slots={c['slots']} exceed the n/tile_elems={env['n'] // c['tile_elems']} tiles "
            "(policy: extra slots stay idle)"
        ),
        kind="policy",
    ),
    sc.smem_fits(
        "smem_within_budget",
        ("block_threads", "tile_elems", "slots"),
        lambda c, env: smem_bytes(c, env.problem),
        lambda c: c["block_threads"],
        lambda c, env: (
            f"shared memory {smem_bytes(c, env.problem)} bytes (slots x tile_elems x itemsize "
            f"+ barriers) exceeds the "
            f"{env.smem_budget(block_threads=c['block_threads'])}-byte budget"
        ),
    ),
    sc.refill_needs_free_slot("slots"),
    ak.Constraint(
        "blocks_fit_sm",
        ("block_threads", "tile_elems", "slots", "blocks_per_sm"),
        _sm_fits,
        lambda c, env: (
            f"blocks_per_sm={c['blocks_per_sm']} blocks of {c['block_threads']} threads and "
            f"{smem_bytes(c, env.problem)} + {SMEM_RESERVED_PER_BLOCK} bytes of shared memory "
            f"do not fit one SM ({env.device.smem_per_sm} bytes, {SM_MAX_THREADS} threads; policy: "
            "the extra blocks would only queue)"
        ),
        kind="policy",
    ),
)
# Every rule's kind: the tunables' domains here, each constraint's its own.
SPACE, RULE_KINDS = sc.space(PARAMS, CONSTRAINTS, _DOMAIN_KINDS)


# ---------------------------------------------------------------------------------------------
# The kernel.


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A config resolved against a problem; refuses only what would hang or skip elements."""

    n: int
    itemsize: int
    block_threads: int
    tile_elems: int
    slots: int
    refill_lag: int
    vector_bytes: int
    blocks_per_sm: int
    num_sms: int

    def __post_init__(self) -> None:
        if self.n % self.tile_elems:
            sc.refuse("tile_divides_n", f"{self.tile_elems=} must divide {self.n=}")
        sc.check_refill(self.refill_lag, self.slots, "slots")
        if self.vector_bytes % self.itemsize or self.tile_elems % self.vector_elems:
            sc.refuse("vector_bytes_domain", f"{self.vector_bytes=} must hold whole elements and "
                      f"divide the tile ({self.tile_elems=} elements of {self.itemsize} bytes)")

    @property
    def vector_elems(self) -> int:
        return self.vector_bytes // self.itemsize

    @property
    def tiles(self) -> int:
        return self.n // self.tile_elems

    @property
    def grid(self) -> int:
        return max(1, min(self.num_sms * self.blocks_per_sm, self.tiles))

    @property
    def vectors_per_thread(self) -> int:
        return -(-(self.tile_elems // self.vector_elems) // self.block_threads)


def _profiler_spec(options: ak.BuildOptions) -> Any:
    if not options.profile_space:
        return None
    from jax.experimental.mosaic.gpu import profiler
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    scope = {"warp": mgpu_utils.ThreadSubset.WARP, "warpgroup": mgpu_utils.ThreadSubset.WARPGROUP}
    if options.trace_scope not in scope:
        raise ValueError(f"trace_scope must be 'warp' or 'warpgroup', got {options.trace_scope!r}")
    kwargs: dict[str, Any] = {"trace_scope": scope[options.trace_scope]}
    if options.profile_dir:
        kwargs["dump_path"] = options.profile_dir
    # Pallas' sizing: each region is 2 events of 2 entries (profile_space regions, roughly).
    return profiler.ProfilerSpec(options.profile_space * 4, **kwargs)


def build(problem: ak.Problem, config: ak.Config, options: ak.BuildOptions) -> Callable[..., Any]:
    import jax
    import jax.experimental.mosaic.gpu as mgpu
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import utils as mu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, gpu, memref, nvvm, vector

    if options.interpret:
        raise NotImplementedError(
            "mosaic_scale is a raw Mosaic GPU kernel: GPU interpret mode runs only Pallas kernels"
        )
    plan = sc.plan(
        _Plan,
        config,
        n=sc.dim(problem, "n"),
        itemsize=ak.dtype_bytes(problem.dtype),
        num_sms=ak.launch_num_sms(options),
    )
    dtype = jnp.dtype(problem.dtype)
    tile, slots, lag, grid = plan.tile_elems, plan.slots, plan.refill_lag, plan.grid
    vec, threads_, tile_vectors = plan.vector_elems, plan.block_threads, tile // plan.vector_elems
    exact = tile_vectors % threads_ == 0
    prof_spec = _profiler_spec(options)
    oob_kwargs: dict[str, Any] = {}
    if "oob_mode" in inspect.signature(mgpu.LaunchContext.async_copy).parameters:
        from jax.experimental.mosaic.gpu.launch_context import OOBFillMode

        # Tiles never leave the array: no clamp, and a plain bulk copy of any length.
        oob_kwargs["oob_mode"] = OOBFillMode.PROMISE_IN_BOUNDS

    def body(ctx: Any, x_gmem: Any, p_gmem: Any, y_gmem: Any, scratch: Any) -> None:
        buf, bars = scratch
        index, f32 = ir.IndexType.get(), ir.F32Type.get()
        elt = mu.dtype_to_ir_type(dtype)

        def idx(v: int) -> Any:
            return mu.c(v, index)

        block = gpu.block_id(gpu.Dimension.x)
        tid = arith.index_cast(index, mu.thread_idx())
        is_leader = arith.cmpi(arith.CmpIPredicate.eq, tid, idx(0))
        # This block's tiles: block, block + grid, ...
        count = arith.divui(arith.subi(idx(plan.tiles + grid - 1), block), idx(grid))
        scale = vector.broadcast(ir.VectorType.get((vec,), f32), memref.load(p_gmem, [idx(0)]))
        bias = vector.broadcast(ir.VectorType.get((vec,), f32), memref.load(p_gmem, [idx(1)]))

        def tile_slice(i: Any) -> Any:
            start = arith.muli(arith.addi(block, arith.muli(i, idx(grid))), idx(tile))
            return mu.ds(start, tile)

        def fetch(i: Any, slot: Any) -> None:  # by the leader thread only
            ctx.async_copy(
                src_ref=x_gmem,
                dst_ref=mu.memref_slice(buf, slot),
                gmem_slice=tile_slice(i),
                barrier=bars[slot],
                arrive=True,
                predicate=None,
                **oob_kwargs,
            )

        def update(ref: Any) -> None:
            """y = x * scale + bias over one tile in shared memory, thread-strided vectors."""
            reg = ir.VectorType.get((vec,), elt)
            reg32 = ir.VectorType.get((vec,), f32)

            @mu.fori(idx(plan.vectors_per_thread), None)
            def _(k: Any, carry: Any) -> Any:
                v = arith.addi(arith.muli(k, idx(threads_)), tid)

                def one() -> None:
                    offset = arith.muli(v, idx(vec))
                    x = vector.load(reg, ref, [offset])
                    xf = x if dtype == jnp.float32 else arith.extf(reg32, x)
                    y = arith.addf(arith.mulf(xf, scale), bias)
                    vector.store(y if dtype == jnp.float32 else arith.truncf(reg, y), ref, [offset])

                if exact:
                    one()
                else:
                    with mu.when(arith.cmpi(arith.CmpIPredicate.ult, v, idx(tile_vectors))):
                        one()
                return carry

        def step(i: Any, traced: bool) -> None:
            slot = arith.remui(i, idx(slots))
            ref = mu.memref_slice(buf, slot)
            with region("load", traced):
                bars[slot].wait()
            with region("compute", traced):
                update(ref)
                # Our stores, visible to the TMA engine, from every thread, before the copy.
                nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)
                gpu.barrier()
            with region("store", traced), mu.when(is_leader):
                ctx.async_copy(
                    src_ref=ref,
                    dst_ref=y_gmem,
                    gmem_slice=tile_slice(i),
                    arrive=True,
                    predicate=None,
                    **oob_kwargs,
                )
                done = arith.subi(i, idx(lag))  # the step whose slot is refilled now
                later = arith.cmpi(arith.CmpIPredicate.slt, arith.addi(done, idx(slots)), count)
                ready = arith.cmpi(arith.CmpIPredicate.sge, done, idx(0))
                with mu.when(arith.andi(ready, later)):
                    nvvm.cp_async_bulk_wait_group(lag, read=True)
                    fetch(arith.addi(done, idx(slots)), arith.remui(done, idx(slots)))

        def region(name: str, traced: bool) -> Any:
            return ctx.named_region(name) if traced else contextlib.nullcontext()

        for first in range(slots):
            with mu.when(
                arith.andi(is_leader, arith.cmpi(arith.CmpIPredicate.ult, idx(first), count))
            ):
                fetch(idx(first), idx(first))
        start = idx(0)
        if prof_spec is not None:
            # Trace only the first tile: 4 ranges (with Init) per traced unit, whatever the loop.
            with mu.when(arith.cmpi(arith.CmpIPredicate.ugt, count, idx(0))):
                step(idx(0), traced=True)
            start = idx(1)

        n_rest = arith.subi(count, arith.minui(start, count))

        @mu.fori(n_rest, None)
        def _(k: Any, carry: Any) -> Any:
            step(arith.addi(k, start), traced=False)
            return carry

        with mu.when(is_leader):
            nvvm.cp_async_bulk_wait_group(0)

    with ak.mosaic_gpu_ir_context():
        kernel = mgpu.as_gpu_kernel(
            body,
            grid=(grid, 1, 1),
            block=(plan.block_threads, 1, 1),
            in_shape=(
                jax.ShapeDtypeStruct((plan.n,), dtype),
                jax.ShapeDtypeStruct((2,), jnp.float32),
            ),
            out_shape=jax.ShapeDtypeStruct((plan.n,), dtype),
            smem_scratch_shape=(
                jax.ShapeDtypeStruct((slots, tile), dtype),
                mgpu.TMABarrier(num_barriers=slots),
            ),
            prof_spec=prof_spec,
            module_name="mosaic_scale",
        )

    def scale_bias(x: Any, params: Any) -> Any:
        return kernel(x, params)

    return scale_bias


# ---------------------------------------------------------------------------------------------
# Inputs, reference, baseline, defaults.


def make_inputs(problem: ak.Problem, key: Any) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    kx, kp = jax.random.split(key)
    x = jax.random.normal(kx, (sc.dim(problem, "n"),), jnp.float32).astype(jnp.dtype(problem.dtype))
    # scale in [0.5, 2), bias in [-1, 1): never zero, never trivial.
    u = jax.random.uniform(kp, (2,), jnp.float32)
    params = jnp.stack([0.5 + 1.5 * u[0], 2.0 * u[1] - 1.0])
    return x, params


def reference(problem: ak.Problem) -> Callable[..., Any]:
    import jax.numpy as jnp

    def ref(x: Any, params: Any) -> Any:
        return x.astype(jnp.float32) * params[0] + params[1]

    return ref


def baseline(problem: ak.Problem) -> Callable[..., Any]:
    import jax.numpy as jnp

    def xla_scale_bias(x: Any, params: Any) -> Any:
        return (x.astype(jnp.float32) * params[0] + params[1]).astype(x.dtype)

    return xla_scale_bias


def default_config(problem: ak.Problem) -> Mapping[str, Any]:
    """Whole warpgroups, 16 KiB tiles, 4 slots, 16-byte vectors, 2 blocks per SM."""
    proposal = {
        "block_threads": 256,
        "tile_elems": 16 * 1024 // ak.dtype_bytes(problem.dtype),
        "slots": 4,
        "refill_lag": 1,
        "vector_bytes": 16,
        "blocks_per_sm": 2,
    }
    return sc.closest_valid(KERNEL, problem, proposal)


def shape_of(x: Any, *rest: Any) -> dict[str, int]:
    """The problem shape of a call: ``x`` is (n,); ``params`` (scale, bias) does not count."""
    return {"n": int(x.shape[0])}


KERNEL = sc.kernel(
    "mosaic_scale",
    globals(),
    shape_keys=("n",),
    dtypes=DTYPES,
    flops=lambda p: 2 * sc.dim(p, "n"),
    bytes_moved=lambda p: 2 * sc.dim(p, "n") * p.dtype_bytes + 8,
    baseline_name="xla",
    interpret_ok=False,
    interpret_note=(
        "raw Mosaic GPU kernel (MLIR built directly): GPU interpret mode runs only Pallas "
        "kernels; check it on a GPU"
    ),
    description=(
        "y = x*scale + bias (raw Mosaic GPU): persistent in-place TMA pipeline; tunes block "
        "threads, tile size, slots, vector width, blocks per SM"
    ),
)

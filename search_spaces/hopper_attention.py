"""Hopper attention: JAX's FlashAttention-3 style Pallas Mosaic GPU forward kernel.

``softmax(q k^T) v`` per head (no softmax scale, as upstream), q: ``(batch, seq_q, heads_q,
head_dim)``, k and v: ``(batch, seq_kv, heads_kv, head_dim)`` with ``heads_q`` a multiple of
``heads_kv`` (grouped-query attention), optionally causal (query i sees keys 0..i). Wraps
``attention_mgpu._attention_forward``: each block runs two compute warpgroups on
``block_q`` query rows each and one producer warpgroup streaming ``block_kv``-row K and V tiles
through ``max_concurrent_steps`` shared-memory slots.

Tunables are the forward fields of upstream's ``TuningConfig``, under the same names.

Rule kinds (``RULE_KINDS``):
  lowering     a config breaking it fails to lower (the kernel's own check or Mosaic GPU's).
  policy       a config breaking it lowers, but compiles to the same kernel as a config the
               space keeps (upstream clamps or ignores the value).
  problem      the problem itself is unsupported (dtype, head_dim, heads); no config can help.
  correctness  the problem lowers but the kernel would compute something else.

Oracle sweep (``autotune.evaluation.lowering.lower_for_cuda``, jax 0.10.2 on CPU), recorded to justify
the rules:
  1,160 configs over 18 problems (batch 1..4, seq 64..8192, heads_q 4..16 with heads_kv 4..16,
  head_dim 32..512, causal or not; block_q and block_kv 64..512, 2..8 stages, schedule barrier
  on/off; float16, bfloat16, float32). 97 lowered, 1,063 failed:
     561 "kv_seq_len=... must be a multiple of block_kv" (kernel)  -> kv_divisible
     344 "exceeds available shared memory: smem_bytes=..."         -> smem_within_limit
     140 "q_seq_len=... must be a multiple of block_q * 2" (kernel) -> q_divisible
      12 "Mixed input dtypes ... lhs=bfloat16, rhs=float16"        -> float16_inputs
       2 "N must be a multiple of 8 and <= 256" (block_kv 320, 384) -> qk_wgmma_n
       2 "head_dim=... must be divisible by 64" (kernel)           -> head_dim_multiple_of_64
       1 "num_q_heads=... must be divisible by num_kv_heads" (kernel) -> heads_grouped
       1 "Only f16 and bf16 are supported" (float32)               -> float16_inputs
  Every failed config breaks a rule; all 89 configs the rules accept lowered; the 850 rejected
  only by lowering/problem rules all failed. Rejected but lowering: the 7 with
  use_schedule_barrier=False (policy: the same kernel as True, as are clamped stage counts;
  the tests compare the lowered modules), and causal with seq_q > seq_kv (correctness). block_q up to 512 lowers (kept). ``smem_bytes`` equals Mosaic
  GPU's count on all 441 configs measured, e.g. 64/128, 2 stages, head_dim 128 = 165,976 B;
  64/256, 3 stages, head_dim 128 = 428,152 B (too much: PLATFORM.md's 3-stage winner had
  head_dim 64).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import autotune.kernels as ak
from search_spaces import scaffolding as sc

__all__ = ["KERNEL", "SPACE", "RULE_KINDS", "KNOWN_GOOD", "BLOCK_THREADS", "default_config",
           "smem_bytes"]

# Two compute warpgroups and one producer warpgroup.
BLOCK_THREADS = ak.threads(warpgroups=3)
COMPUTE_WGS = 2
# Pallas reserves this much shared memory for the softmax's cross-warp reductions
# (``CompilerParams.reduction_scratch_bytes``' default).
REDUCTION_SCRATCH_BYTES = 128 * 4 * 4
# The kernel stages Q, K, V and O in float16 shared memory whatever the input dtype.
SMEM_ITEMSIZE = 2
# WGMMA's largest N (q @ k^T has N = block_kv).
WGMMA_MAX_N = 256
# Upstream's TuningConfig refuses fewer stages.
MIN_STEPS = 2


def smem_bytes(c: Mapping[str, Any], head_dim: int, *, seq_kv: int | None = None) -> int:
    """Shared memory one block allocates, as Pallas Mosaic GPU counts it.

    Q/O scratch ``2 x block_q x head_dim``, K and V ring buffers ``steps x block_kv x head_dim``
    each (float16, each rounded up to 1024 bytes), the reductions' scratch, and the mbarriers:
    K and V loaded and consumed per slot, one per compute warpgroup for Q, one schedule
    barrier. Matches the ``smem_bytes=`` of Mosaic GPU's errors on every config of the sweep.
    Given ``seq_kv``, upstream's clamp of the slots to ``seq_kv // block_kv`` is applied.
    """
    steps = c["max_concurrent_steps"]
    if seq_kv is not None:
        steps = min(steps, seq_kv // c["block_kv"])
    qo = ak.smem_aligned(COMPUTE_WGS * c["block_q"] * head_dim * SMEM_ITEMSIZE)
    kv = 2 * ak.smem_aligned(steps * c["block_kv"] * head_dim * SMEM_ITEMSIZE)
    barriers = (4 * steps + COMPUTE_WGS + 1) * ak.MBARRIER_BYTES
    return qo + kv + REDUCTION_SCRATCH_BYTES + barriers


# ---------------------------------------------------------------------------------------------
# The space.

PARAMS = (
    ak.Aligned("block_q", unit=64, low=64, high=512),
    ak.Aligned("block_kv", unit=64, low=64, high=512),
    ak.Aligned("max_concurrent_steps", unit=1, low=MIN_STEPS, high=8),
    ak.Bool("use_schedule_barrier"),
)


def _derived(c: Mapping[str, Any], env: ak.Env) -> dict[str, Any]:
    """The config, the problem, and the sizes the rules speak of (those computable from ``c``)."""
    values: dict[str, Any] = dict(env.problem.dims)
    values.update(c, dtype=env.dtype)
    values["budget"] = env.smem_budget(block_threads=BLOCK_THREADS)
    if "block_kv" in c:
        values["kv_steps"] = env["seq_kv"] // c["block_kv"]
    if "block_q" in c:
        values["q_rows"] = COMPUTE_WGS * c["block_q"]
    if all(k in c for k in ("block_q", "block_kv", "max_concurrent_steps")):
        values["smem"] = smem_bytes(c, env["head_dim"], seq_kv=env["seq_kv"])
    return values


# A rule's reason: a template ``autotune spaces`` shows as is, and that a violation's message
# fills in with the config's values and the sizes derived from them.
_says = sc.reasons(_derived)


def _transfer_128b(tiles: str, block: str, copies: str) -> ak.Constraint:
    """``q_transfer_128b``/``kv_transfer_128b``: each copy of a ``block`` x head_dim float16
    tile moves a whole multiple of 128 bytes."""
    return ak.Constraint(
        f"{tiles}_transfer_128b",
        (block,),
        lambda c, env: ak.is_aligned_transfer((c[block], env["head_dim"]), "float16"),
        _says(
            f"{copies} ({block}={{{block}}} x head_dim={{head_dim}} x 2 B) must move a "
            "multiple of 128 bytes (transfers split over a 128-thread warpgroup)"
        ),
        kind="lowering",
    )


CONSTRAINTS = (
    ak.Constraint(
        "float16_inputs",
        (),
        lambda c, env: env.dtype == "float16",
        _says(
            "inputs must be float16 (here {dtype}): attention_mgpu's forward kernel stages Q, "
            "K, V and O in float16 shared memory whatever the input dtype, so other inputs fail "
            "to lower ('Mixed input dtypes', JAX 0.10.2 and 0.11.2); pass float16 (cast "
            "bfloat16 inputs)"
        ),
        kind="problem",
    ),
    ak.Constraint(
        "head_dim_multiple_of_64",
        (),
        lambda c, env: env["head_dim"] % 64 == 0,
        _says("head_dim={head_dim} must be a multiple of 64; the kernel checks it"),
        kind="problem",
    ),
    ak.Constraint(
        "heads_grouped",
        (),
        lambda c, env: env["heads_q"] % env["heads_kv"] == 0,
        _says(
            "heads_q={heads_q} must be a multiple of heads_kv={heads_kv} (grouped-query "
            "attention); the kernel checks it"
        ),
        kind="problem",
    ),
    ak.Constraint(
        "causal_seq_q_within_seq_kv",
        (),
        lambda c, env: not env.get("causal", False) or env["seq_q"] <= env["seq_kv"],
        _says(
            "causal attention needs seq_q={seq_q} <= seq_kv={seq_kv}: the kernel aligns query i "
            "with key i, so later query blocks would read K/V past seq_kv"
        ),
        kind="correctness",
    ),
    ak.Constraint(
        "q_divisible",
        ("block_q",),
        lambda c, env: env["seq_q"] % (COMPUTE_WGS * c["block_q"]) == 0,
        _says(
            "seq_q={seq_q} must be divisible by 2 x block_q={q_rows} (two compute warpgroups "
            "of block_q={block_q} rows per block); the kernel checks it"
        ),
        kind="lowering",
    ),
    sc.divisible("kv_divisible", "seq_kv", "block_kv", _says),
    ak.Constraint(
        "qk_wgmma_n",
        ("block_kv",),
        lambda c, env: c["block_kv"] <= WGMMA_MAX_N,
        _says(
            "block_kv={block_kv} must be at most 256: it is the N dimension of the q @ k^T "
            "WGMMA ('N must be a multiple of 8 and <= 256')"
        ),
        kind="lowering",
    ),
    _transfer_128b("q", "block_q", "the Q and O copies"),
    _transfer_128b("kv", "block_kv", "the K and V copies"),
    ak.Constraint(
        "no_clamped_steps",
        ("block_kv", "max_concurrent_steps"),
        lambda c, env: c["max_concurrent_steps"] <= max(MIN_STEPS, env["seq_kv"] // c["block_kv"]),
        _says(
            "max_concurrent_steps={max_concurrent_steps} must not exceed the KV steps "
            "seq_kv/block_kv={kv_steps} (or be 2, the least upstream accepts): upstream silently "
            "clamps it to the KV steps, so the config would compile to the same kernel as a "
            "smaller one"
        ),
        kind="policy",
    ),
    sc.smem_fits(
        "smem_within_limit",
        ("block_q", "block_kv", "max_concurrent_steps"),
        lambda c, env: smem_bytes(c, env["head_dim"], seq_kv=env["seq_kv"]),
        lambda c: BLOCK_THREADS,
        _says(
            "shared memory {smem} B (2 x block_q x head_dim + 2 x steps x block_kv x head_dim "
            "float16, plus reduction scratch and barriers) must fit the {budget} B a block may "
            "use (after the profiler's share when tracing)"
        ),
    ),
    ak.Constraint(
        "schedule_barrier_always_on",
        ("use_schedule_barrier",),
        lambda c, env: bool(c["use_schedule_barrier"]),
        _says(
            "use_schedule_barrier=False compiles to the same kernel as True: "
            "_attention_forward always runs its schedule barrier (only the pipeline-emitter "
            "variant reads the flag)"
        ),
        kind="policy",
    ),
)

# RULE_KINDS: derived from the constraints (each carries its kind); kept for the tests and docs.
SPACE, RULE_KINDS = sc.space(PARAMS, CONSTRAINTS)


# ---------------------------------------------------------------------------------------------
# Building.


def build(problem: ak.Problem, config: ak.Config, options: ak.BuildOptions) -> Callable[..., Any]:
    """``fn(q, k, v) -> out`` running upstream's forward kernel with ``config``.

    Calls the unjitted ``_attention_forward`` (through :func:`autotune.kernels.attention_forward`,
    which readies ``attention_mgpu`` for cross-lowering and tracing for the call only), not the
    jitted ``attention``, so that a profiled and an unprofiled build of one config never share
    a trace cache entry.
    """
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    tuning = am.TuningConfig(
        block_q=config["block_q"],
        block_kv=config["block_kv"],
        max_concurrent_steps=config["max_concurrent_steps"],
        use_schedule_barrier=config["use_schedule_barrier"],
        causal=bool(problem["causal"]),
    )
    extra = ak.profile_params(options)

    def hopper_attention(q: Any, k: Any, v: Any) -> Any:
        if not options.interpret:
            return ak.attention_forward(q, k, v, tuning, compiler_params=extra)
        # Fails on JAX 0.10.2 ("Higher-order primitive run_state"): see interpret_note.
        with ak.force_interpret():
            return ak.attention_forward(q, k, v, tuning, compiler_params=extra)

    return hopper_attention


SHAPE_KEYS = ("batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim")


def make_inputs(problem: ak.Problem, key: Any) -> tuple[Any, Any, Any]:
    """q, k, v ~ N(0, 1) (upstream's benchmark inputs): outputs are O(1) averages of v rows."""
    import jax
    import jax.numpy as jnp

    b, sq, skv, hq, hkv, d = sc.dims(problem, SHAPE_KEYS)
    dtype = jnp.dtype(problem.dtype)
    key_q, key_k, key_v = jax.random.split(key, 3)
    q = jax.random.normal(key_q, (b, sq, hq, d), jnp.float32).astype(dtype)
    k = jax.random.normal(key_k, (b, skv, hkv, d), jnp.float32).astype(dtype)
    v = jax.random.normal(key_v, (b, skv, hkv, d), jnp.float32).astype(dtype)
    return q, k, v


# The reference's float32 logits cost batch x seq_q x heads_q x seq_kv x 4 bytes at once: 4 GiB
# at B1 S8192 H16, an allocation that failed for lack of memory in a job on an H100
# (benchmarks/RESULTS.md §19). Above this, query rows are taken a chunk at a time.
REFERENCE_LOGITS_BYTES = 512 * 2**20


def reference_chunk(problem: ak.Problem) -> int:
    """The query rows the reference takes at a time: all of them where their float32 logits fit
    :data:`REFERENCE_LOGITS_BYTES`, else the largest divisor of ``seq_q`` that does (at least 1)."""
    b, sq, skv, hq, _, _ = sc.dims(problem, SHAPE_KEYS)
    per_row, budget = b * skv * hq * 4, REFERENCE_LOGITS_BYTES
    return max((c for c in range(1, sq + 1) if sq % c == 0 and c * per_row <= budget), default=1)


def reference(problem: ak.Problem) -> Callable[..., Any]:
    """Upstream's ``attention_reference``: the same attention in float32; where its logits
    would pass :data:`REFERENCE_LOGITS_BYTES`, the same math over :func:`reference_chunk` query
    rows at a time, one chunk after another (a row of the output depends on its query row
    alone; causal rows keep their place in the mask)."""
    causal = bool(problem["causal"])
    chunk = reference_chunk(problem)
    if chunk < sc.dims(problem, ("seq_q",))[0]:
        return lambda q, k, v: chunked_reference(q, k, v, causal=causal, chunk=chunk)

    def attention_f32(q: Any, k: Any, v: Any) -> Any:
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am

        return am.attention_reference(q, k, v, causal=causal)

    return attention_f32


def chunked_reference(q: Any, k: Any, v: Any, *, causal: bool, chunk: int) -> Any:
    """Upstream's ``attention_reference`` math (float32, grouped heads, no scale), ``chunk``
    query rows at a time under ``jax.lax.map``: at most one chunk's logits live at once."""
    import jax
    import jax.numpy as jnp

    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)

    def rows(args: tuple[Any, Any]) -> Any:
        first, qc = args
        qc = qc.astype(jnp.float32).reshape(b, chunk, hkv, hq // hkv, d)
        logits = jnp.einsum("bqHhc,bkHc->bqHhk", qc, k)
        if causal:
            mask = (first + jnp.arange(chunk))[:, None] >= jnp.arange(skv)[None, :]
            logits = jnp.where(jnp.broadcast_to(mask[:, None, None, :], logits.shape), logits,
                               -jnp.inf)
        m = logits.max(axis=-1, keepdims=True)
        unnormalized = jnp.exp(logits - m)
        weights = unnormalized / unnormalized.sum(axis=-1, keepdims=True)
        return jnp.einsum("bqHhk,bkHc->bqHhc", weights, v).reshape(b, chunk, hq, d)

    n = sq // chunk
    starts = jnp.arange(n, dtype=jnp.int32) * chunk
    out = jax.lax.map(rows, (starts, q.reshape(b, n, chunk, hq, d).swapaxes(0, 1)))
    return out.swapaxes(0, 1).reshape(b, sq, hq, d)


def baseline(problem: ak.Problem) -> Callable[..., Any]:
    """cuDNN's fused attention through ``jax.nn.dot_product_attention`` (scale 1, as the kernel)."""
    causal = bool(problem["causal"])

    def cudnn_attention(q: Any, k: Any, v: Any) -> Any:
        import jax

        return jax.nn.dot_product_attention(
            q, k, v, scale=1.0, is_causal=causal, implementation="cudnn"
        )

    return cudnn_attention


def flops(problem: ak.Problem) -> int:
    """Two matmuls of ``seq_q x seq_kv x head_dim`` per head; causal does about half."""
    b, sq, skv, hq, _, d = sc.dims(problem, SHAPE_KEYS)
    total = 4 * b * hq * sq * skv * d
    return total // 2 if problem["causal"] else total


def bytes_moved(problem: ak.Problem) -> int:
    """q, k, v read once, out written once."""
    itemsize = problem.dtype_bytes
    b, sq, skv, hq, hkv, d = sc.dims(problem, SHAPE_KEYS)
    q, kv = b * sq * hq * d, b * skv * hkv * d
    return (2 * q + 2 * kv) * itemsize


# Upstream's benchmark default, and fast on the H200 (PLATFORM.md: 64/128, 2 steps).
KNOWN_GOOD = ak.Config(block_q=64, block_kv=128, max_concurrent_steps=2, use_schedule_barrier=True)


def default_config(problem: ak.Problem) -> ak.Config:
    """``KNOWN_GOOD`` where it is valid, else the valid config nearest to it."""
    return SPACE.bind(problem).closest_valid(KNOWN_GOOD)


def shape_of(q: Any, k: Any, v: Any, *rest: Any) -> dict[str, Any]:
    """The problem shape of a call: q is (batch, seq_q, heads_q, head_dim), k and v are
    (batch, seq_kv, heads_kv, head_dim). Causality is not in the arrays: a bool passed after
    them is ``causal`` (``attention(q, k, v, True)``), otherwise it is False."""
    batch, seq_q, heads_q, head_dim = (int(d) for d in q.shape)
    shape: dict[str, Any] = {
        "batch": batch, "seq_q": seq_q, "seq_kv": int(k.shape[1]), "heads_q": heads_q,
        "heads_kv": int(k.shape[2]), "head_dim": head_dim,
    }
    if rest and isinstance(rest[0], bool):
        shape["causal"] = rest[0]
    return shape


KERNEL = sc.kernel(
    "hopper_attention",
    globals(),
    shape_keys=SHAPE_KEYS,
    dtypes=("float16",),
    baseline_name="cudnn",
    shape_defaults={"causal": False},
    interpret_ok=False,
    interpret_note=(
        "attention_mgpu does not run in GPU interpret mode on JAX 0.10.2: the interpreter lacks "
        "the higher-order primitive run_state its PV matmul uses; tune it on the GPU"
    ),
    description=(
        "JAX's FlashAttention-3 style Hopper forward attention (attention_mgpu), float16, "
        "optional causal masking and grouped-query heads"
    ),
)

"""Hopper attention: JAX's FlashAttention-3 style Pallas Mosaic GPU forward kernel.

DRAFT
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from autotune.kernel import BuildOptions, Kernel
from autotune.problem import Config, Problem
from autotune.space import Aligned, Bool, Constraint, Env, Space, threads

__all__ = ["KERNEL", "SPACE", "smem_bytes"]

BLOCK_THREADS = threads(warpgroups=3)


def smem_bytes(c: Mapping[str, Any], head_dim: int) -> int:
    return 0


# -- building -------------------------------------------------------------------------------


class _CudaRuntimeStandIn:
    """What ``attention_mgpu`` asks of ``jax._src.lib.cuda_versions`` when there is no CUDA.

    Only used to cross-lower on a machine without a GPU: the kernel reads the CUDA runtime
    version to refuse causal masking on 12.8.0-12.9.0 (a ptxas bug); the H200 runs CUDA 13.
    """

    @staticmethod
    def cuda_runtime_get_version() -> int:
        return 13000


# Extra CompilerParams fields (profiling) for the kernel traced in this context.
_EXTRA_PARAMS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "hopper_attention_extra_params", default=None
)


class _PlgpuWithExtraParams:
    """``plgpu`` as ``attention_mgpu`` sees it: ``kernel`` adds this context's extra params.

    ``_attention_forward`` builds its own ``CompilerParams(approx_math=True)``; tracing needs
    ``profile_space``/``profile_dir`` added, and nothing else changes.
    """

    def __init__(self, plgpu: Any) -> None:
        self._plgpu = plgpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plgpu, name)

    def kernel(self, *args: Any, compiler_params: Any = None, **kwargs: Any) -> Any:
        extra = _EXTRA_PARAMS.get()
        if extra:
            base = compiler_params or self._plgpu.CompilerParams()
            compiler_params = dataclasses.replace(base, **extra)
        return self._plgpu.kernel(*args, compiler_params=compiler_params, **kwargs)


def _attention_module() -> Any:
    """``attention_mgpu``, made ready to cross-lower (idempotent, thread-safe)."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    if am.cuda_versions is None:
        am.cuda_versions = _CudaRuntimeStandIn()
    if not isinstance(am.plgpu, _PlgpuWithExtraParams):
        am.plgpu = _PlgpuWithExtraParams(am.plgpu)
    return am


@contextlib.contextmanager
def _extra_params(extra: dict[str, Any] | None) -> Iterator[None]:
    token = _EXTRA_PARAMS.set(extra)
    try:
        yield
    finally:
        _EXTRA_PARAMS.reset(token)


def build(problem: Problem, config: Config, options: BuildOptions) -> Callable[..., Any]:
    import jax.experimental.pallas.mosaic_gpu as plgpu

    from autotune import _jax_compat

    am = _attention_module()
    tuning = am.TuningConfig(
        block_q=config["block_q"],
        block_kv=config["block_kv"],
        max_concurrent_steps=config["max_concurrent_steps"],
        use_schedule_barrier=config["use_schedule_barrier"],
        causal=bool(problem["causal"]),
    )
    extra: dict[str, Any] | None = None
    if options.profile_space:
        extra = {
            "profile_space": options.profile_space,
            "profile_dir": options.profile_dir or "",
            "profile_trace_scope": (
                plgpu.TraceScope.WARP if options.trace_scope == "warp" else plgpu.TraceScope.WARPGROUP
            ),
        }

    def attention(q: Any, k: Any, v: Any) -> Any:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_extra_params(extra))
            if options.interpret:
                stack.enter_context(_jax_compat.force_interpret())
            return am._attention_forward(q, k, v, tuning)

    return attention


def make_inputs(problem: Problem, key: Any) -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    b, sq, skv = problem["batch"], problem["seq_q"], problem["seq_kv"]
    hq, hkv, d = problem["heads_q"], problem["heads_kv"], problem["head_dim"]
    dtype = jnp.dtype(problem.dtype)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (b, sq, hq, d), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, skv, hkv, d), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (b, skv, hkv, d), jnp.float32).astype(dtype)
    return q, k, v


def reference(problem: Problem) -> Callable[..., Any]:
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    causal = bool(problem["causal"])

    def ref(q: Any, k: Any, v: Any) -> Any:
        return am.attention_reference(q, k, v, causal=causal)

    return ref


def baseline(problem: Problem) -> Callable[..., Any]:
    causal = bool(problem["causal"])

    def cudnn_attention(q: Any, k: Any, v: Any) -> Any:
        import jax

        return jax.nn.dot_product_attention(
            q, k, v, scale=1.0, is_causal=causal, implementation="cudnn"
        )

    return cudnn_attention


PARAMS = (
    Aligned("block_q", unit=64, low=64, high=512),
    Aligned("block_kv", unit=64, low=64, high=512),
    Aligned("max_concurrent_steps", unit=1, low=2, high=8),
    Bool("use_schedule_barrier"),
)

SPACE = Space(PARAMS, ())

KERNEL = Kernel(
    name="hopper_attention",
    space=SPACE,
    shape_keys=("batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim"),
    dtypes=("float16",),
    build=build,
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    baseline_name="cudnn",
    shape_defaults={"causal": False},
    interpret_ok=False,
)

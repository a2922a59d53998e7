"""The JAX adapter: the few places where JAX 0.10.2 (CPU machines, CI) and 0.11.2 (the H200)
differ, and every use of a JAX private name (``jax._src``, a module's underscore names, a
module attribute set from outside).

Importing this module does not import jax, and nothing here changes a JAX module at import:
each function that needs jax imports it when called (call those only from code that already
needs jax: building, lowering, evaluating kernels). :func:`installed_versions` never imports
it, so the query side may use it. The kernels reach these through the public
:mod:`autotune.kernels`.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "interpret_params",
    "force_interpret",
    "reset_interpret_state",
    "cache_interpret_thread_compiles",
    "jax_versions",
    "profile_params",
    "cupti_session",
    "autotune_folder_of_compiles",
    "patched_attention_mgpu",
    "attention_forward",
    "mosaic_gpu_ir_context",
]


def _params_module() -> Any:
    # 0.11.2 re-exports InterpretGPUParams from plgpu; 0.10.2 has it only in the private module.
    from jax._src.pallas.mosaic_gpu.interpret import params

    return params


def interpret_params(**kwargs: Any) -> Any:
    """A fresh ``InterpretGPUParams`` (GPU interpret mode: Mosaic GPU kernels on the CPU).

    Also makes the interpreter compile each warpgroup's program once per run, not once per
    grid block (:func:`cache_interpret_thread_compiles`).
    """
    cache_interpret_thread_compiles()
    try:
        import jax.experimental.pallas.mosaic_gpu as plgpu

        # only jax>=0.11.2 re-exports it (the ignore is unused there)
        cls = plgpu.InterpretGPUParams  # type: ignore[attr-defined, unused-ignore]
    except AttributeError:
        cls = _params_module().InterpretGPUParams
    return cls(**kwargs)


@contextlib.contextmanager
def force_interpret(params: Any = None) -> Iterator[None]:
    """Runs every Pallas Mosaic GPU kernel traced inside in GPU interpret mode."""
    cache_interpret_thread_compiles()
    with _params_module().force_gpu_interpret_mode(params or interpret_params()):
        yield


def reset_interpret_state() -> None:
    """Needed after an exception inside an interpreted kernel, before interpreting again."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc

    reset = getattr(ipc, "reset_gpu_interpret_mode_state", None)
    if reset is not None:
        reset()


# The interpreter's per-thread programs, compiled: (jaxpr, argument types) -> executable.
_THREAD_PROGRAMS: collections.OrderedDict[tuple[Any, ...], tuple[Any, Any]] = (
    collections.OrderedDict())
_THREAD_PROGRAMS_KEPT = 64
_THREAD_PROGRAMS_LOCK = threading.Lock()


def cache_interpret_thread_compiles() -> bool:
    """Makes GPU interpret mode compile each thread's program once, not at every call.

    The interpreter (``jax._src.pallas.mosaic.interpret.thread_map._run_jaxpr``, jax 0.10.2)
    runs each warpgroup's program of each grid block by tracing, lowering and compiling it
    again: a 256x128x64 matmul config with 8 blocks compiled the same 3 programs 24 times,
    19.4 s of its 19.5 s run; kept compiled, the run took 4.8 s (docs/measurement.md,
    "Interpret mode"). Here the executable is kept per (program, argument types), the newest
    :data:`_THREAD_PROGRAMS_KEPT`. Idempotent; returns False (and changes nothing) where the
    installed jax has no such function.
    """
    try:
        from jax._src.pallas.mosaic.interpret import thread_map
    except ImportError:
        return False
    run = getattr(thread_map, "_run_jaxpr", None)
    if run is None:
        return False
    if getattr(run, "_autotune_cached", False):
        return True

    def _run_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> None:
        import jax
        from jax._src import core as jax_core

        key = (id(jaxpr), *(_arg_type(x) for x in (*consts, *args)))
        with _THREAD_PROGRAMS_LOCK:  # the threads of one call compile the same program
            kept = _THREAD_PROGRAMS.get(key)
            if kept is None or kept[0] is not jaxpr:
                def _run(jaxpr: Any, consts: Any, *args: Any) -> None:
                    jax_core.eval_jaxpr(jaxpr, consts, *args)

                traced = jax.jit(_run, static_argnums=(0,)).trace(jaxpr, consts, *args)
                kept = (jaxpr, traced.lower().compile())  # jaxpr held: its id stays its own
                _THREAD_PROGRAMS[key] = kept
                while len(_THREAD_PROGRAMS) > _THREAD_PROGRAMS_KEPT:
                    _THREAD_PROGRAMS.popitem(last=False)
            else:
                _THREAD_PROGRAMS.move_to_end(key)
        kept[1](consts, *args)

    _run_jaxpr._autotune_cached = True  # type: ignore[attr-defined]
    thread_map._run_jaxpr = _run_jaxpr
    return True


def _arg_type(x: Any) -> tuple[Any, ...]:
    return (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__)),
            bool(getattr(x, "weak_type", False)))


def jax_versions() -> dict[str, str]:
    """Versions of jax and jaxlib in this process."""
    import jax
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", "")}


def profile_params(options: Any) -> dict[str, Any]:
    """``plgpu.CompilerParams`` keywords for in-kernel tracing as ``options`` asks (a
    :class:`~autotune.space.kernel.BuildOptions`); empty when it does not ask for a trace."""
    if not options.profile_space:
        return {}
    import jax.experimental.pallas.mosaic_gpu as plgpu

    scope = plgpu.TraceScope.WARP if options.trace_scope == "warp" else plgpu.TraceScope.WARPGROUP
    return {
        "profile_space": options.profile_space,
        "profile_dir": options.profile_dir or "",
        "profile_trace_scope": scope,
    }


# Whether a CUPTI session detaches CUPTI from the process as it ends (``cuptiFinalize``), as
# Mosaic GPU's ``profiler.measure`` does; its ``Cupti(finalize=False)`` does not. A worker times
# session after session all its life: staying attached spares attaching again each time.
CUPTI_DETACH = False


def cupti_session(run: Any, *, detach: bool | None = None) -> list[tuple[str, float]]:
    """Every kernel launch of ``run()`` (waited for) as ``(name, ms)``, in launch order.

    What Mosaic GPU's ``profiler.measure`` does around its loop (same extension calls, in
    jax 0.10.2 and 0.11.2), without its warm-up call and its fixed arguments: cold timing
    (:mod:`autotune.evaluation.cold_timing`) launches an L2 flush between the timed calls. CUPTI takes one
    subscriber per process; the session unsubscribes when it ends, and detaches CUPTI from the
    process where ``detach`` (default :data:`CUPTI_DETACH`) says so.
    """
    import jax
    from jax._src.lib import mosaic_gpu as mosaic_gpu_lib

    # A private name of jaxlib's, not re-exported: read from the module's namespace.
    ext = vars(mosaic_gpu_lib)["_mosaic_gpu_ext"]
    ext._cupti_init()
    try:
        jax.block_until_ready(run())  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in jax
    finally:
        timings = ext._cupti_get_timings(CUPTI_DETACH if detach is None else detach)
    return [(str(name), float(ms)) for name, ms in (timings or [])]


def autotune_folder_of_compiles() -> str:
    """The folder XLA's per-fusion autotune cache uses in this process's next compile ("" for
    none): what ``XLA_FLAGS`` says, unless JAX's persistent compilation cache is on, where JAX
    writes its own ``<cache>/xla_gpu_per_fusion_autotune_cache_dir`` into the compile options
    (``jax_persistent_cache_enable_xla_caches``, jax 0.10.2 and 0.11.2).
    """
    from jax._src import compiler

    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    return str(options.executable_build_options.debug_options.xla_gpu_per_fusion_autotune_cache_dir)


def default_backend_is_gpu() -> bool:
    """Whether jax's default backend is a GPU, where Mosaic GPU kernels run natively (else
    they lower for CUDA only, or run in GPU interpret mode)."""
    import jax

    return jax.default_backend() in ("gpu", "cuda")


def installed_versions() -> dict[str, str]:
    """The installed jax and jaxlib versions, from package metadata (jax is not imported); a
    package that is not installed is left out."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    out = []
    for name in ("jax", "jaxlib"):
        try:
            out.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            pass
    return tuple(out)


# -- JAX's attention_mgpu, cross-lowered and traced -------------------------------------------


class _CudaRuntimeStandIn:
    """What ``attention_mgpu`` asks of ``jax._src.lib.cuda_versions``, on a machine without CUDA.

    The kernel reads the CUDA runtime version only to refuse causal masking on 12.8.0-12.9.0
    (a ptxas bug); cross-lowering targets the H200's CUDA 13.
    """

    @staticmethod
    def cuda_runtime_get_version() -> int:
        return 13000


# CompilerParams fields (profiling) to add to the kernels attention_mgpu builds in this context.
_ATTENTION_PARAMS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "autotune_attention_params", default=None
)


class _PlgpuWithExtraParams:
    """``plgpu`` as ``attention_mgpu`` sees it in :func:`patched_attention_mgpu`: ``kernel``
    merges this context's extra ``CompilerParams`` fields.

    ``_attention_forward`` builds its own ``CompilerParams(approx_math=True)``; the tracing pass
    needs ``profile_space``/``profile_dir`` added to it. In a context without extra fields (a
    thread that did not ask) nothing changes.
    """

    def __init__(self, plgpu: Any) -> None:
        self._plgpu = plgpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plgpu, name)

    def kernel(self, *args: Any, compiler_params: Any = None, **kwargs: Any) -> Any:
        extra = _ATTENTION_PARAMS.get()
        if extra:
            base = compiler_params or self._plgpu.CompilerParams()
            compiler_params = dataclasses.replace(base, **extra)
        return self._plgpu.kernel(*args, compiler_params=compiler_params, **kwargs)


# The attention_mgpu attributes patched_attention_mgpu replaced, while any scope is open.
_ATTENTION_LOCK = threading.Lock()
_ATTENTION_SCOPES = 0
_ATTENTION_SAVED: dict[str, Any] = {}


@contextlib.contextmanager
def patched_attention_mgpu(compiler_params: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """``jax.experimental.pallas.ops.gpu.attention_mgpu``, ready to cross-lower and trace,
    within the block only (yields the module).

    Inside, where jax found no CUDA runtime (``cuda_versions`` is None: a machine without a
    GPU), the module sees a stand-in reporting CUDA 13, and every kernel it builds in this
    context gets ``compiler_params`` added to its ``CompilerParams`` (the tracing pass's
    profiler fields). Scopes may overlap (threads): the first to open installs both, the last
    to close puts the module's own attributes back, so no scope sees them half applied and
    nothing stays patched after the last one. Trace the kernel inside the block; lowering
    after it needs nothing of the patch.
    """
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    am: Any = attention_mgpu  # its attributes are the private ones this adapter swaps
    global _ATTENTION_SCOPES
    with _ATTENTION_LOCK:
        if _ATTENTION_SCOPES == 0:
            _ATTENTION_SAVED.update(cuda_versions=am.cuda_versions, plgpu=am.plgpu)
            if am.cuda_versions is None:
                am.cuda_versions = _CudaRuntimeStandIn()
            am.plgpu = _PlgpuWithExtraParams(am.plgpu)
        _ATTENTION_SCOPES += 1
    token = _ATTENTION_PARAMS.set(dict(compiler_params) if compiler_params else None)
    try:
        yield am
    finally:
        _ATTENTION_PARAMS.reset(token)
        with _ATTENTION_LOCK:
            _ATTENTION_SCOPES -= 1
            if _ATTENTION_SCOPES == 0:
                am.cuda_versions = _ATTENTION_SAVED.pop("cuda_versions")
                am.plgpu = _ATTENTION_SAVED.pop("plgpu")


def attention_forward(q: Any, k: Any, v: Any, config: Any, *,
                      compiler_params: Mapping[str, Any] | None = None) -> Any:
    """``attention_mgpu``'s forward kernel, unjitted (``_attention_forward``), on ``q, k, v``
    with ``config`` (its ``TuningConfig``), traced in :func:`patched_attention_mgpu`.

    Unjitted, so that a profiled and an unprofiled build of one config never share a trace
    cache entry.
    """
    with patched_attention_mgpu(compiler_params) as am:
        return am._attention_forward(q, k, v, config)


@contextlib.contextmanager
def mosaic_gpu_ir_context() -> Iterator[None]:
    """An MLIR context with Mosaic GPU's dialect registered, as ``mosaic.gpu.as_gpu_kernel``
    expects its caller to have entered (a raw Mosaic GPU kernel builds inside it)."""
    from jax._src import lib as jax_lib
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    mosaic_gpu_dialect: Any = getattr(jax_lib, "mosaic_gpu_dialect", None)
    ctx = mlir.make_ir_context()
    if mosaic_gpu_dialect is not None:
        mosaic_gpu_dialect.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        yield

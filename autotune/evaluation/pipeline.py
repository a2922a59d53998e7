"""The JAX pipeline: compile a config, check it against the reference, time it.

Compiling and running are separate steps (:func:`compile_config`, :func:`run_compiled`) so the
engine can compile later configs on the host's cores while the GPU times earlier ones. The GPU
and interpret evaluators (:class:`GpuEvaluator`, :class:`InterpretEvaluator`) bind these steps
to one device, under the contract of :mod:`autotune.evaluation.contract` (which also says how a
failure becomes an outcome). jax is imported only inside functions.

Why one piece (over 400 lines): compile, check, baseline, trace and the two evaluators share
the per-problem caches (inputs, references, specs) and the order of the stages; split further,
each part would reach into the others' state.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import os
import platform
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.evaluation.contract import (
    Compiled,
    EvaluationError,
    Evaluator,
    Stage,
    StageHook,
    failure_result,
    ignore_stage,
    with_rule_hint,
    wrong_result,
)
from autotune.evaluation.timing import (
    device_still_works,
    program_input_sets,
    time_program,
    time_runs,
)
from autotune.space.kernel import DEFAULT_TOLERANCE, BuildOptions, Kernel
from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

__all__ = [
    "relative_error",
    "compile_config",
    "lower_config_for_cuda",
    "run_compiled",
    "measure_baseline",
    "trace_config",
    "gpu_device_info",
    "interpret_device_info",
    "GpuEvaluator",
    "InterpretEvaluator",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Pure helpers: picking the kernel's own launches, comparing outputs.


def relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` over all output arrays together; ``inf`` if not comparable.

    Any non-finite element of ``out``, or a structure or shape that differs from ``ref``, gives
    ``inf`` (so NaN never passes a tolerance). Computed on the arrays' device in at least
    float32 (float64 when the arrays are). When ``ref`` is all zeros the absolute norm is used.
    """
    import jax

    outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
    if len(outs) != len(refs) or any(
        tuple(o.shape) != tuple(r.shape) for o, r in zip(outs, refs, strict=True)
    ):
        return math.inf
    diff_sq = ref_sq = 0.0
    for o, r in zip(outs, refs, strict=True):
        d, n, finite = (float(x) for x in _error_terms(o, r))
        if not finite:
            return math.inf
        diff_sq += d
        ref_sq += n
    if not math.isfinite(diff_sq):
        return math.inf
    return math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else math.sqrt(diff_sq)


def _error_terms(out: Any, ref: Any) -> tuple[Any, Any, Any]:
    compiled = _ERROR_TERMS_AOT.get(_error_key(out, ref))
    if compiled is not None:
        try:
            return compiled(out, ref)  # type: ignore[no-any-return]
        except (TypeError, ValueError):  # placed or laid out otherwise than compiled for
            pass
    terms: tuple[Any, Any, Any] = _error_terms_jit()(out, ref)
    return terms


def _error_key(out: Any, ref: Any) -> tuple[Any, ...]:
    return (tuple(out.shape), str(out.dtype), tuple(ref.shape), str(ref.dtype))


# Compiled ahead (prepare_error_terms) for the reference's output shapes, so that a worker's
# first check of a problem does not compile under the GPU's lock (0.23 s each on the H200).
_ERROR_TERMS_AOT: dict[tuple[Any, ...], Any] = {}
_ERROR_TERMS: Any = None


def prepare_error_terms(out_info: Any, dtype: str) -> None:
    """Compiles the output check against a reference shaped as ``out_info`` (ShapeDtypeStructs)
    for outputs of the reference's dtype or ``dtype`` (the problem's: a bfloat16 kernel is
    checked against a float32 reference).

    An output of another shape or dtype is checked all the same, by the jitted function.
    """
    import jax

    for leaf in jax.tree.leaves(out_info):
        ref = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        for out in {ref, jax.ShapeDtypeStruct(leaf.shape, dtype)}:
            key = _error_key(out, ref)
            if key not in _ERROR_TERMS_AOT:
                _ERROR_TERMS_AOT[key] = _error_terms_jit().lower(out, ref).compile(NO_AUTOTUNE)


def _error_terms_jit() -> Any:
    global _ERROR_TERMS
    if _ERROR_TERMS is None:
        import jax
        import jax.numpy as jnp

        @jax.jit
        def terms(out: Any, ref: Any) -> tuple[Any, Any, Any]:
            dtype = jnp.promote_types(jnp.promote_types(out.dtype, ref.dtype), jnp.float32)
            o, r = out.astype(dtype), ref.astype(dtype)
            return jnp.sum(jnp.square(o - r)), jnp.sum(jnp.square(r)), jnp.all(jnp.isfinite(o))

        _ERROR_TERMS = terms
    return _ERROR_TERMS


def tolerance_for(kernel: Kernel, dtype: str) -> float:
    """The kernel's bound on ``||out - ref|| / ||ref||`` for inputs of ``dtype``."""
    if dtype in kernel.tolerance:
        return float(kernel.tolerance[dtype])
    return float(DEFAULT_TOLERANCE.get(dtype, 2e-2))


# ---------------------------------------------------------------------------------------------
# Compile, run, time.

# XLA compile options for programs whose speed does not matter (inputs, references, checks):
# no autotuning, which would run kernels on the GPU while compiling.
NO_AUTOTUNE: dict[str, Any] = {"xla_gpu_autotune_level": 0}
# The baselines an evaluator keeps compiled, the newest problems' (a scheduled job has all its
# problems in flight; the confirmation round times each problem's baseline again).
KEPT_BASELINES = 32


def compile_config(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    options: BuildOptions | None = None,
    *,
    specs: Sequence[Any] | None = None,
    on_stage: StageHook | None = None,
) -> Compiled | TrialResult:
    """Builds, lowers and compiles (AOT) one config; a failure is returned as a TrialResult.

    ``jax.jit(fn).trace(*specs).lower().compile()``, timed as ``compile_s``. Thread-safe: the
    engine calls it from several compile threads. ``specs`` are the inputs'
    ``ShapeDtypeStruct`` (computed from ``kernel.make_inputs`` when not given).
    """
    import jax

    from autotune.evaluation.lowering import again_after_races, input_specs

    options = options or BuildOptions()
    on_stage = on_stage or ignore_stage
    stage = Stage.BUILD
    start = time.perf_counter()
    try:
        on_stage(stage)
        fn = kernel.build(problem, config, options)
        stage = Stage.LOWER
        on_stage(stage)
        if specs is None:
            specs = input_specs(kernel, problem)
        lowered = again_after_races(lambda: jax.jit(fn).trace(*specs).lower())
        stage = Stage.COMPILE
        on_stage(stage)
        executable = again_after_races(lowered.compile)
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        failed = failure_result(
            e, stage, compile_s=time.perf_counter() - start, interpret=options.interpret
        )
        return with_rule_hint(failed, kernel, problem, config)
    return Compiled(kernel, problem, config, executable, time.perf_counter() - start, options)


def lower_config_for_cuda(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    *,
    specs: Sequence[Any] | None = None,
    on_stage: StageHook | None = None,
) -> TrialResult | None:
    """Builds and lowers one config for CUDA, as on the GPU, without one; None if it lowers.

    Interpret mode runs this before interpreting a config: the interpreter is not the validity
    oracle (it runs copies Mosaic GPU refuses, and lacks what some valid configs use), CUDA
    lowering is. A failure is ``invalid`` with JAX's error and the missing rule.
    """
    from autotune.devices import current_device
    from autotune.evaluation.lowering import input_specs, lower_built_for_cuda

    on_stage = on_stage or ignore_stage
    stage = Stage.BUILD
    start = time.perf_counter()
    try:
        on_stage(stage)
        fn = kernel.build(problem, config, BuildOptions(num_sms=current_device().num_sms))
        stage = Stage.LOWER
        if specs is None:
            specs = input_specs(kernel, problem)
        lower_built_for_cuda(fn, specs)
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        failed = failure_result(e, stage, compile_s=time.perf_counter() - start)
        failed = dataclasses.replace(
            failed, error=f"{failed.error} (lowering for CUDA, as on the GPU)"
        )
        return with_rule_hint(failed, kernel, problem, config)
    return None


def run_compiled(
    compiled: Compiled,
    inputs: Sequence[Any],
    *,
    expected: Any,
    tolerance: float,
    iterations: int,
    timing: str,
    on_stage: StageHook | None = None,
    cache: str = "warm",
    flush: Any = None,
) -> TrialResult:
    """Runs a compiled config once, checks it against ``expected``, then times it.

    ``cache`` is the cache policy (:mod:`autotune.space.outcomes`); ``cold`` with CUPTI needs
    ``flush``, an :class:`autotune.evaluation.cold_timing.L2Flush`.

    ``timing`` is ``"cupti"`` (GPU time of the kernel's own launches, see
    :func:`select_kernel_time`) or ``"wallclock"`` (host time around ``block_until_ready``;
    interpret mode). The warm-up call is never timed. The output of the first call and of the
    last timed one are both checked. ``iterations=0`` (interpret mode, whose times are not GPU
    timings) runs the config once: that checked run is its only sample, timed by wall clock.
    Not thread-safe: one call at a time per device.
    """
    import jax

    on_stage = on_stage or ignore_stage
    fn = compiled.executable
    stage = Stage.RUN
    rel: float | None = None
    try:
        on_stage(stage)
        started = time.perf_counter()
        out = jax.block_until_ready(fn(*inputs))
        once_us = (time.perf_counter() - started) * 1e6
        stage = Stage.CHECK
        on_stage(stage)
        rel = relative_error(out, expected)
        del out
        if not rel <= tolerance:
            return wrong_result(rel, tolerance, compiled.compile_s)
        if iterations == 0:
            return TrialResult.timed([once_us], compile_s=compiled.compile_s, rel_error=rel,
                                     timing="wallclock", cache=cache)
        stage = Stage.TIME
        on_stage(stage)
        samples, last = time_runs(fn, inputs, iterations, timing, cache=cache, flush=flush)
        stage = Stage.CHECK
        rel = max(rel, relative_error(last, expected))
        if not rel <= tolerance:
            return wrong_result(rel, tolerance, compiled.compile_s, when=" in a timed iteration")
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        device_ok = device_still_works() if timing == "cupti" else True
        if compiled.options.interpret:
            from autotune import _jax_compat

            _jax_compat.reset_interpret_state()
        return failure_result(e, stage, compile_s=compiled.compile_s, device_ok=device_ok)
    return TrialResult.timed(
        samples, compile_s=compiled.compile_s, rel_error=rel, timing=timing, cache=cache
    )


def measure_baseline(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    iterations: int,
    timing: str,
    expected: Any = None,
    tolerance: float | None = None,
    cache: str = "warm",
    flush: Any = None,
    compiled: Any = None,
    lowered: Any = None,
    on_compiled: Callable[[Any], None] | None = None,
) -> TrialResult:
    """Compiles and times a baseline (XLA, cuDNN) the way configs are timed.

    With CUPTI every launch counts (``aggregate=True``): the baseline *is* XLA's kernels.
    ``rel_error`` against ``expected`` is recorded when given; beyond ``tolerance`` (the
    kernel's, as its configs are held to) the baseline is a WRONG_RESULT, not timed: a
    baseline that computes something else is never compared or served. ``compiled``:
    an executable of ``fn`` compiled before (not compiled again); ``lowered``: ``fn`` lowered
    before (compiled here, with XLA's autotuning); ``on_compiled`` receives the executable
    compiled here, for re-use.
    """
    import jax

    stage = Stage.LOWER
    start = time.perf_counter()
    compile_s = None
    try:
        if compiled is None:
            if lowered is None:
                lowered = jax.jit(fn).trace(*inputs).lower()
            stage = Stage.COMPILE
            executable = lowered.compile()
            compile_s = time.perf_counter() - start
            if on_compiled is not None:
                on_compiled(executable)
        else:
            executable = compiled
        stage = Stage.RUN
        out = jax.block_until_ready(executable(*inputs))
        rel = relative_error(out, expected) if expected is not None else None
        if rel is not None and tolerance is not None and not rel <= tolerance:
            return wrong_result(rel, tolerance, compile_s, when=" of the baseline")
        stage = Stage.TIME
        samples, _ = time_runs(
            executable, inputs, iterations, timing, aggregate=True, cache=cache, flush=flush
        )
    except Exception as e:  # noqa: BLE001
        device_ok = device_still_works() if timing == "cupti" else True
        return failure_result(e, stage, compile_s=compile_s, device_ok=device_ok)
    return TrialResult.timed(
        samples, compile_s=compile_s, rel_error=rel, timing=timing, cache=cache
    )


def trace_config(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    out_dir: str | os.PathLike[str],
    *,
    profile_space: int,
    inputs: Sequence[Any],
    interpret: bool = False,
    clock_ghz: float | None = None,
    compiled: Compiled | TrialResult | None = None,
) -> dict[str, tuple[float, int]]:
    """Runs one config built with the in-kernel profiler; per-region ``(median, count)``.

    Builds with ``BuildOptions(profile_space=..., profile_dir=out_dir)`` (:func:`_compile_traced`;
    or takes ``compiled``, its result made ahead), runs once, waits for the trace files, and
    parses the files this run added (:mod:`autotune.evaluation.tracing`).

    Raises:
      EvaluationError: the config does not build, compile or run with the profiler on.
    """
    import jax

    from autotune.evaluation.tracing import parse_trace_files

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.json"))
    if compiled is None:
        compiled = _compile_traced(kernel, problem, config, out, profile_space=profile_space,
                                  interpret=interpret)
    if isinstance(compiled, TrialResult):
        raise EvaluationError(
            f"Tracing {config} of {problem}: {compiled.outcome}: {compiled.error}"
        )
    try:
        jax.block_until_ready(compiled.executable(*inputs))
        jax.effects_barrier()  # the trace is written by a host callback
    except Exception as e:
        raise EvaluationError(f"Tracing {config} of {problem} failed to run: {e}") from e
    return parse_trace_files(sorted(set(out.glob("*.json")) - before), clock_ghz=clock_ghz)


def _compile_traced(
    kernel: Kernel,
    problem: Problem,
    config: Config,
    out_dir: str | os.PathLike[str],
    *,
    profile_space: int,
    interpret: bool = False,
) -> Compiled | TrialResult:
    """``config`` compiled with the in-kernel profiler writing its traces to ``out_dir``."""
    options = BuildOptions(interpret=interpret, profile_space=profile_space,
                           profile_dir=str(Path(out_dir)))
    return compile_config(kernel, problem, config, options)


# ---------------------------------------------------------------------------------------------
# Devices.


def gpu_device_info(index: int = 0) -> DeviceInfo:
    """The GPU this process times on: name, compute capability, CUDA driver version, and its
    facts read from the CUDA driver (:func:`autotune.devices.read_device`).

    Raises:
      EvaluationError: jax sees no GPU.
    """
    import jax

    try:
        device = jax.devices("gpu")[index]
    except RuntimeError as e:
        raise EvaluationError(
            f"No GPU visible to jax ({e}); --device interpret (device=\"interpret\" in "
            "autotune.tune) runs the kernels on the CPU in GPU interpret mode."
        ) from e
    driver = ""
    try:
        from jax._src.lib import cuda_versions

        get = getattr(cuda_versions, "cuda_driver_get_version", None)
        if get is not None:
            version = int(get())
            driver = f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # noqa: BLE001 - the driver version is informative only
        pass
    from autotune.devices import read_device

    ordinal = getattr(device, "local_hardware_id", index)
    return DeviceInfo(
        name=str(getattr(device, "device_kind", "gpu")),
        kind=DeviceKind.GPU,
        compute_capability=str(getattr(device, "compute_capability", "") or ""),
        driver=driver,
        facts=read_device(int(ordinal if isinstance(ordinal, int) else index)),
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def interpret_device_info() -> DeviceInfo:
    """Interpret mode runs kernels numerically on the CPU; its rows say so, and carry the facts
    of the device it stands in for (:func:`autotune.devices.current_device`: the profile)."""
    from autotune.devices import current_device

    return DeviceInfo(name=f"cpu-interpret ({_cpu_model()})", kind=DeviceKind.INTERPRET,
                      facts=current_device())


# ---------------------------------------------------------------------------------------------
# Evaluators.


class _JaxEvaluator(Evaluator):
    """Shared by the GPU and interpret evaluators: real kernels through jax."""

    interpret = False

    def __init__(self, iterations: int, cache: str = "warm") -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, but got {iterations}.")
        self.iterations = iterations
        self.cache = cache
        self._l2_flush: Any = None
        self._flush_lock = threading.Lock()
        # Per problem, the newest KEPT_BASELINES: the baseline lowered ahead (prepare) until it
        # is compiled under the GPU's lock, then its executable (the confirmation round times
        # the baseline again; XLA's autotuning makes its compile slow).
        self._baseline_lowered: dict[tuple[str, Problem], Any] = {}
        self._baseline_executables: collections.OrderedDict[tuple[str, Problem], Any] = (
            collections.OrderedDict()
        )
        self.healthy = True
        self._lock = threading.Lock()
        self._specs: dict[tuple[str, Problem], tuple[Any, ...]] = {}
        self._references: dict[tuple[str, Problem], Any] = {}
        self._makers: dict[tuple[str, Problem], Any] = {}
        self._prepare_lock = threading.Lock()
        # Traced programs compiled ahead (prepare_trace), until trace() takes them.
        self._traced: dict[tuple[Any, ...], Compiled | TrialResult] = {}
        self._preparer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prepare")
        # The input maker compiles here while _prepare compiles the reference and the check.
        self._maker_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="prepare-inputs")
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))

    # Subclasses: where arrays live, and what cannot run.
    def _device_context(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _refuse(self, kernel: Kernel) -> TrialResult | None:
        return None

    def _options(self) -> BuildOptions:
        return BuildOptions(interpret=self.interpret)

    def _input_specs(self, kernel: Kernel, problem: Problem) -> tuple[Any, ...]:
        from autotune.evaluation.lowering import input_specs

        key = (kernel.name, problem)
        with self._lock:
            if key not in self._specs:
                try:
                    self._specs[key] = input_specs(kernel, problem)
                except Exception as e:
                    raise EvaluationError(
                        f"{kernel.name}.make_inputs fails for {problem}: {e}"
                    ) from e
            return self._specs[key]

    def _prepare(self, kernel: Kernel, problem: Problem) -> None:
        """Compiles the problem's input maker and reference ahead of time, once per worker
        (and the evaluator's L2 flush, once).

        Called from the compile stage, outside the GPU lock: XLA compiling them is host work,
        and several workers of one GPU would otherwise take turns for it under the lock (seen
        on the H200: 8 workers' first configs finished ~9 s apart). Compiled without XLA's
        autotuning (:data:`NO_AUTOTUNE`): autotuning runs kernels on the GPU, which outside the
        lock would run beside another worker's timed kernels, and a reference needs to be
        right, not fast. The check of outputs against the reference is compiled here too.
        Kernels whose ``make_inputs`` or reference cannot be traced are left to run eagerly.
        The input maker compiles on a thread of its own meanwhile (XLA compiles without the
        GIL), so a problem's first trial waits for the longer of the two, not for both.
        """
        import jax

        key = (kernel.name, problem)
        with self._prepare_lock:
            if key in self._makers:
                return
            specs = self._input_specs(kernel, problem)
            maker = self._maker_thread.submit(self._compile_maker, kernel, problem)
            try:
                reference = jax.jit(kernel.reference(problem)).lower(*specs)
                self._references[key] = reference.compile(NO_AUTOTUNE)
                prepare_error_terms(reference.out_info, problem.dtype)
            except Exception:  # noqa: BLE001 - _expected reports a reference that really fails
                self._references.pop(key, None)
            finally:
                self._makers[key] = maker.result()
        self._flush()  # the L2 flush's programs too (0.1 s), once per evaluator

    def _compile_maker(self, kernel: Kernel, problem: Problem) -> Any:
        """The problem's input maker compiled (None: not traceable; inputs are made eagerly)."""
        import jax
        import numpy as np

        try:
            with self._device_context():
                maker = jax.jit(lambda seed: tuple(kernel.make_inputs(problem, jax.random.key(seed))))
                return maker.lower(np.int32(0)).compile(NO_AUTOTUNE)
        except Exception:  # noqa: BLE001 - not traceable: inputs are made eagerly instead
            return None

    def _fresh_inputs(self, kernel: Kernel, problem: Problem) -> tuple[Any, ...]:
        """New random inputs for every config (never zeros, never reused)."""
        import jax
        import numpy as np

        seed = self._rng.getrandbits(31)
        try:
            maker = self._makers.get((kernel.name, problem))
            if maker is not None:
                return tuple(maker(np.int32(seed)))
            return tuple(kernel.make_inputs(problem, jax.random.key(seed)))
        except Exception as e:
            raise EvaluationError(f"{kernel.name}.make_inputs fails for {problem}: {e}") from e

    def _expected(self, kernel: Kernel, problem: Problem, inputs: Sequence[Any]) -> Any:
        import jax

        key = (kernel.name, problem)
        try:
            if key not in self._references:
                self._references[key] = jax.jit(kernel.reference(problem))
            return jax.block_until_ready(self._references[key](*inputs))
        except Exception as e:
            raise EvaluationError(f"{kernel.name}.reference fails for {problem}: {e}") from e

    def compile(
        self, kernel: Kernel, problem: Problem, config: Config, *, on_stage: StageHook | None = None
    ) -> Compiled | TrialResult:
        refused = self._refuse(kernel)
        if refused is not None:
            return refused
        specs = self._input_specs(kernel, problem)
        # A problem's first config compiles while its inputs, reference and check are
        # prepared on another thread (both are host work), so the first trial waits for the
        # longer of the two, not for both.
        prepared = (None if (kernel.name, problem) in self._makers
                    else self._preparer.submit(self._prepare_here, kernel, problem))
        try:
            with self._device_context():
                return compile_config(
                    kernel, problem, config, self._options(), specs=specs, on_stage=on_stage
                )
        finally:
            if prepared is not None:
                prepared.result()

    def _prepare_here(self, kernel: Kernel, problem: Problem) -> None:
        with self._device_context():
            self._prepare(kernel, problem)

    def _flush(self) -> Any:
        """The L2 flush of cold CUPTI timing (made once per evaluator, off the GPU's lock: in a
        worker by :meth:`warm_host`, else by a problem's :meth:`_prepare`), else None."""
        if self.cache != "cold" or self.timing != "cupti":
            return None
        with self._flush_lock:
            if self._l2_flush is None:
                from autotune.evaluation.cold_timing import L2Flush

                self._l2_flush = L2Flush()
            return self._l2_flush

    def warm_host(self) -> None:
        self._flush()  # compiled off the GPU's lock; warm_device puts its buffer on the GPU

    def warm_device(self) -> None:
        flush = self._flush()
        if flush is not None:
            from autotune import _jax_compat

            with self._device_context():
                flush.calibrate(_jax_compat.cupti_session)

    def run(self, compiled: Compiled, *, on_stage: StageHook | None = None) -> TrialResult:
        kernel, problem = compiled.kernel, compiled.problem
        with self._device_context():
            inputs = self._fresh_inputs(kernel, problem)
            expected = self._expected(kernel, problem, inputs)
            result = run_compiled(
                compiled,
                inputs,
                expected=expected,
                tolerance=tolerance_for(kernel, problem.dtype),
                # Interpret mode: one run, the check (its wall-clock times are not GPU timings).
                iterations=0 if self.interpret else self.iterations,
                timing=self.timing,
                on_stage=on_stage,
                cache=self.cache,
                flush=self._flush(),
            )
        if result.outcome is Outcome.CRASHED:
            self.healthy = False
        return result

    def _keep_baseline(self, key: tuple[str, Problem], executable: Any) -> None:
        with self._lock:
            self._baseline_lowered.pop(key, None)
            self._baseline_executables[key] = executable
            while len(self._baseline_executables) > KEPT_BASELINES:
                self._baseline_executables.popitem(last=False)

    def prepare(
        self, kernel: Kernel, problem: Problem, *, on_stage: StageHook | None = None
    ) -> None:
        """The host work of a problem's baseline ahead of the GPU's lock: its inputs, reference
        and check compiled (:meth:`_prepare`), and the baseline traced and lowered.

        Only the baseline's compile (XLA's autotuning runs kernels) and its timing are left for
        :meth:`baseline`, under the lock. A failure here is left for :meth:`baseline` to report.
        """
        import jax

        hook = on_stage or ignore_stage
        self._prepare_here(kernel, problem)
        key = (kernel.name, problem)
        with self._lock:
            if (kernel.baseline is None or key in self._baseline_executables
                    or key in self._baseline_lowered):
                return
        hook(Stage.LOWER)
        try:
            specs = self._input_specs(kernel, problem)
            with self._device_context():
                lowered = jax.jit(kernel.baseline(problem)).trace(*specs).lower()
        except Exception:  # noqa: BLE001 - baseline() lowers it again and reports the failure
            log.debug("The baseline of %s did not lower ahead.", problem, exc_info=True)
            return
        with self._lock:
            self._baseline_lowered[key] = lowered

    def retime(self, compiled: Compiled, *, iterations: int, program: bool = False) -> TrialResult:
        with self._device_context():
            if program:
                sets = self._program_sets(compiled.kernel, compiled.problem)
                return self._time_program(compiled.executable, sets, iterations,
                                          compile_s=compiled.compile_s)
            inputs = self._fresh_inputs(compiled.kernel, compiled.problem)
            try:
                samples, _ = time_runs(compiled.executable, inputs, iterations, self.timing,
                                   cache=self.cache, flush=self._flush())
            except Exception as e:  # noqa: BLE001 - a failure is a value, as in run()
                device_ok = device_still_works() if self.timing == "cupti" else True
                result = failure_result(e, Stage.TIME, compile_s=compiled.compile_s, device_ok=device_ok)
                if result.outcome is Outcome.CRASHED:
                    self.healthy = False
                return result
        return TrialResult.timed(samples, compile_s=compiled.compile_s, rel_error=None,
                                 timing=self.timing, cache=self.cache)

    def _program_sets(self, kernel: Kernel, problem: Problem) -> list[tuple[Any, ...]]:
        """Fresh input sets for a program check: one warm, enough to outgrow the L2 cold
        (:func:`autotune.evaluation.timing.program_input_sets`)."""
        import jax

        from autotune.evaluation.cold_timing import l2_cache_bytes

        first = self._fresh_inputs(kernel, problem)
        set_bytes = sum(int(getattr(x, "nbytes", 0)) for x in first) or 1
        n = program_input_sets(self.cache, set_bytes, l2_cache_bytes(jax.devices()[0])[0])
        return [first] + [self._fresh_inputs(kernel, problem) for _ in range(n - 1)]

    def _time_program(self, executable: Any, sets: Sequence[Sequence[Any]], calls: int, *,
                      compile_s: float | None) -> TrialResult:
        try:
            samples = time_program(executable, sets, calls)
        except Exception as e:  # noqa: BLE001 - a failure is a value, as in run()
            result = failure_result(e, Stage.TIME, compile_s=compile_s,
                                    device_ok=device_still_works())
            if result.outcome is Outcome.CRASHED:
                self.healthy = False
            return result
        return TrialResult.timed(samples, compile_s=compile_s, rel_error=None,
                                 timing=PROGRAM_METHOD, cache=self.cache)

    def baseline(
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None,
        program: bool = False, check: bool = True,
    ) -> TrialResult:
        if kernel.baseline is None:
            raise EvaluationError(f"Kernel {kernel.name!r} declares no baseline to time.")
        key = (kernel.name, problem)
        if program:
            return self._baseline_program(kernel, problem, iterations or self.iterations)
        with self._device_context():
            inputs = self._fresh_inputs(kernel, problem)
            expected = self._expected(kernel, problem, inputs) if check else None
            try:
                fn = kernel.baseline(problem)
            except Exception as e:
                raise EvaluationError(f"{kernel.name}.baseline fails for {problem}: {e}") from e
            result = measure_baseline(
                fn, inputs, iterations=iterations or self.iterations, timing=self.timing,
                expected=expected, tolerance=tolerance_for(kernel, problem.dtype) if check
                else None, cache=self.cache, flush=self._flush(),
                compiled=self._baseline_executables.get(key),
                lowered=self._baseline_lowered.get(key),
                on_compiled=lambda exe: self._keep_baseline(key, exe),
            )
        if result.outcome is Outcome.CRASHED:
            self.healthy = False
        return result

    def _baseline_program(self, kernel: Kernel, problem: Problem, calls: int) -> TrialResult:
        """The baseline timed as a program calls it: its executable kept from its timing (or
        compiled here, and kept), then :meth:`_time_program`."""
        with self._device_context():
            sets = self._program_sets(kernel, problem)
            try:
                executable, compile_s = self._baseline_executable(kernel, problem, sets[0])
            except Exception as e:  # noqa: BLE001 - a failure is a value
                return failure_result(e, Stage.COMPILE, compile_s=None, device_ok=True)
            return self._time_program(executable, sets, calls, compile_s=compile_s)

    def _baseline_executable(self, kernel: Kernel, problem: Problem,
                             inputs: Sequence[Any]) -> tuple[Any, float | None]:
        """The baseline's executable kept from its timing, else compiled here (from its
        lowering made ahead, if any) and kept; with its compile seconds (None: kept)."""
        import jax

        assert kernel.baseline is not None
        key = (kernel.name, problem)
        executable = self._baseline_executables.get(key)
        if executable is not None:
            return executable, None
        start = time.perf_counter()
        lowered = self._baseline_lowered.get(key)
        if lowered is None:
            lowered = jax.jit(kernel.baseline(problem)).trace(*inputs).lower()
        executable = lowered.compile()
        self._keep_baseline(key, executable)
        return executable, time.perf_counter() - start

    def retime_round(
        self, kernel: Kernel, problem: Problem, programs: Sequence[Compiled | None], *,
        iterations: int,
    ) -> list[TrialResult]:
        """Under the cold policy with CUPTI, the round's programs interleaved call by call in
        one CUPTI session (:func:`~autotune.evaluation.cold_timing.time_cold_interleaved`: the
        L2 flushed before every call, each call a few hundred microseconds from the others');
        otherwise one after another (:meth:`Evaluator.retime_round`). A failure of the session
        fails every program of the round: the engine then times the round one program at a
        time, which tells whose failure it was."""
        if self.cache != "cold" or self.timing != "cupti" or self.interpret:
            return super().retime_round(kernel, problem, programs, iterations=iterations)
        from autotune.evaluation.cold_timing import time_cold_interleaved
        from autotune.evaluation.timing import select_kernel_time

        stage = Stage.COMPILE
        compile_s: list[float | None] = []
        with self._device_context():
            try:
                inputs = [self._fresh_inputs(kernel, problem) for _ in programs]
                fns = []
                for p, args in zip(programs, inputs, strict=True):
                    if p is None:
                        exe, seconds = self._baseline_executable(kernel, problem, args)
                    else:
                        exe, seconds = p.executable, p.compile_s
                    fns.append(exe)
                    compile_s.append(seconds)
                stage = Stage.TIME
                samples = time_cold_interleaved(
                    fns, inputs, iterations, self._flush(),
                    aggregate=[p is None for p in programs], select=select_kernel_time)
            except Exception as e:  # noqa: BLE001 - a failure is a value, as in run()
                device_ok = device_still_works() if stage is Stage.TIME else True
                failed = failure_result(e, stage, compile_s=None, device_ok=device_ok)
                if failed.outcome is Outcome.CRASHED:
                    self.healthy = False
                return [failed] * len(programs)
        return [TrialResult.timed(s, compile_s=c, rel_error=None, timing=self.timing,
                                  cache=self.cache) for s, c in zip(samples, compile_s, strict=True)]

    @staticmethod
    def _trace_key(kernel: Kernel, problem: Problem, config: Config,
                   out_dir: str | os.PathLike[str], profile_space: int) -> tuple[Any, ...]:
        return (kernel.name, problem, config.digest(), str(Path(out_dir)), profile_space)

    def prepare_trace(
        self,
        kernel: Kernel,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        *,
        profile_space: int,
    ) -> None:
        """Compiles the traced program ahead (a Mosaic GPU compile: about a second of the
        GPU's lock per trace on the H200 when it was compiled in :meth:`trace`)."""
        if self._refuse(kernel) is not None:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)  # where the profiler will write
        with self._device_context():
            compiled = _compile_traced(kernel, problem, config, out_dir,
                                      profile_space=profile_space, interpret=self.interpret)
        with self._lock:
            self._traced[self._trace_key(kernel, problem, config, out_dir, profile_space)] = compiled

    def trace(
        self,
        kernel: Kernel,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        *,
        profile_space: int,
        clock_ghz: float | None = None,
    ) -> dict[str, tuple[float, int]]:
        refused = self._refuse(kernel)
        if refused is not None:
            raise EvaluationError(refused.error)
        with self._lock:
            ahead = self._traced.pop(
                self._trace_key(kernel, problem, config, out_dir, profile_space), None)
        with self._device_context():
            inputs = self._fresh_inputs(kernel, problem)
            return trace_config(
                kernel,
                problem,
                config,
                out_dir,
                profile_space=profile_space,
                inputs=inputs,
                interpret=self.interpret,
                clock_ghz=clock_ghz,
                compiled=ahead,
            )


class GpuEvaluator(_JaxEvaluator):
    """Times on the first visible GPU with CUPTI (``profiler.measure``), warm-up excluded."""

    timing = "cupti"

    def __init__(self, iterations: int = 20, cache: str = "cold") -> None:
        super().__init__(iterations, cache)
        self._info: DeviceInfo | None = None

    def device_info(self) -> DeviceInfo:
        if self._info is None:
            self._info = gpu_device_info()
        return self._info

    def warm_host(self) -> None:
        # Pallas' Mosaic GPU modules: 0.25-0.4 s of a fresh worker's first build on the H200.
        import jax.experimental.pallas.mosaic_gpu  # noqa: F401

        super().warm_host()

    def trace(self, *args: Any, clock_ghz: float | None = None, **kwargs: Any) -> dict[str, tuple[float, int]]:
        # Trace timestamps count SM cycles: convert with the clock the SMs run at under load.
        return super().trace(*args, clock_ghz=clock_ghz or sm_clock_ghz(), **kwargs)


def sm_clock_ghz() -> float | None:
    """The GPU's maximum SM clock in GHz (the CUDA driver's, :func:`autotune.devices.read_device`;
    else nvidia-smi's), or None if it cannot be read.

    Kernels under load run at the boost clock (1.98 GHz seen on the H200), so this converts
    in-kernel trace cycles to microseconds; the figure is stored beside the regions' times.
    """
    import subprocess

    from autotune.devices import read_device

    facts = read_device()
    if facts is not None and facts.sm_clock_mhz:
        return facts.sm_clock_mhz / 1000.0

    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits", "-i", index],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout.strip()
        return float(out.splitlines()[0]) / 1000.0 if out else None
    except (OSError, ValueError, subprocess.TimeoutExpired, IndexError):
        return None


class InterpretEvaluator(_JaxEvaluator):
    """Runs kernels in GPU interpret mode on the CPU; wall-clock timing (not GPU-comparable).

    Each config is first lowered for CUDA (:func:`lower_config_for_cuda`), so a config the GPU
    would refuse is ``invalid`` here too, never measured as if it were fine. Each config then
    runs once, checked against the reference, and that run's wall-clock time is its one sample
    (``iterations`` is for re-timing and baselines only): interpret-mode times rank nothing on
    a GPU, and a run takes seconds (section "Interpret mode" of docs/measurement.md).
    """

    timing = "wallclock"
    interpret = True

    def __init__(self, iterations: int = 3, cache: str = "warm") -> None:
        from autotune.space.outcomes import resolve_cache_policy

        super().__init__(iterations, resolve_cache_policy(cache, DeviceKind.INTERPRET).value)

    def device_info(self) -> DeviceInfo:
        return interpret_device_info()

    def _device_context(self) -> Any:
        import jax

        return jax.default_device(jax.devices("cpu")[0])

    def compile(
        self, kernel: Kernel, problem: Problem, config: Config, *, on_stage: StageHook | None = None
    ) -> Compiled | TrialResult:
        if self._refuse(kernel) is None:
            invalid = lower_config_for_cuda(
                kernel, problem, config, specs=self._input_specs(kernel, problem),
                on_stage=on_stage,
            )
            if invalid is not None:
                return invalid
        return super().compile(kernel, problem, config, on_stage=on_stage)

    def _refuse(self, kernel: Kernel) -> TrialResult | None:
        if kernel.interpret_ok:
            return None
        note = f": {kernel.interpret_note}" if kernel.interpret_note else ""
        return TrialResult.failed(
            Outcome.COMPILE_ERROR,
            f"[build] Kernel {kernel.name!r} does not run in GPU interpret mode{note}. "
            "Tune it on a GPU (mode 'gpu').",
        )



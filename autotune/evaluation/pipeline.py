"""Measuring one config: compile it, check it against the reference, time it.

Compiling and running are separate steps (:func:`compile_config`, :func:`run_compiled`) so the
engine can compile later configs on the host's cores while the GPU times earlier ones.

Every way a config can fail comes back as a :class:`~autotune.evaluation.trial.TrialResult` value whose
outcome :func:`classify_error` chose from the *stage* that failed, never from an error message
(PLATFORM.md: messages change between JAX versions):

    build, lower   -> INVALID        the kernel refused the config while tracing or lowering
                                     (lower, in interpret mode: COMPILE_ERROR; but interpret
                                     mode first lowers each config for CUDA, as on the GPU,
                                     and a failure there is INVALID)
    compile        -> COMPILE_ERROR  XLA / Mosaic GPU / ptxas failed
    run, check, time -> COMPILE_ERROR  it compiled but launching or running failed, or
                       CRASHED        ... and the device is unusable afterwards (an illegal
                                      address poisons the process: the worker is replaced)
    output off the reference -> WRONG_RESULT (NaN and inf never pass)

Failures that are not the config's (a module missing, the reference or the input maker broken)
raise :class:`EvaluationError` instead, so they are not stored as a property of the config.

An ``invalid`` trial means the kernel's space is missing a rule: its error ends with the rule
that would exclude the config (:func:`autotune.evaluation.checking.suggest_rule`), as advice.

Evaluators (:class:`GpuEvaluator`, :class:`InterpretEvaluator`, :class:`FakeEvaluator`) bind
these steps to one device. jax is imported only inside functions.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import logging
import math
import os
import platform
import random
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.space.kernel import DEFAULT_TOLERANCE, BuildOptions, Kernel
from autotune.space.problem import Config, Problem
from autotune.evaluation.trial import DeviceInfo, Outcome, TrialResult

__all__ = [
    "Stage",
    "EvaluationError",
    "classify_error",
    "Compiled",
    "StageHook",
    "select_kernel_time",
    "relative_error",
    "compile_config",
    "lower_config_for_cuda",
    "run_compiled",
    "measure_baseline",
    "trace_config",
    "gpu_device_info",
    "interpret_device_info",
    "Evaluator",
    "GpuEvaluator",
    "InterpretEvaluator",
    "FakeBehaviour",
    "FakeEvaluator",
    "make_evaluator",
]

log = logging.getLogger(__name__)


class EvaluationError(AutotuneError, RuntimeError):
    """An evaluation failed for a reason that is not the config's.

    A missing module, a kernel whose ``make_inputs`` or ``reference`` fails, a kernel without a
    baseline: every config would fail the same way, so nothing is stored against the config.
    """


class Stage(enum.StrEnum):
    """Where in measuring a config something happened."""

    BUILD = "build"  # kernel.build(problem, config, options)
    LOWER = "lower"  # jax.jit(fn).trace(...).lower(): Pallas / Mosaic GPU lowering
    COMPILE = "compile"  # .compile(): XLA, Mosaic GPU's LLVM and ptxas
    RUN = "run"  # the first call: launch and execute
    CHECK = "check"  # output against the reference
    TIME = "time"  # the timed iterations


COMPILE_STAGES = frozenset({Stage.BUILD, Stage.LOWER, Stage.COMPILE})

StageHook = Callable[[Stage], None]


def classify_error(
    error: BaseException, stage: Stage | str, *, device_ok: bool = True, interpret: bool = False
) -> Outcome:
    """The outcome of a config whose evaluation raised ``error`` during ``stage``.

    The one place where failures become outcomes. Decided by stage, device health and mode,
    never by message text:

    * ``build`` / ``lower``: ``INVALID`` - the kernel (its own ``ValueError`` or
      ``NotImplementedError``, Mosaic GPU's alignment and shared-memory checks) refused the
      config before any code was generated; the space should not have proposed it. In GPU
      interpret mode (``interpret=True``) a ``lower`` failure is ``COMPILE_ERROR`` instead: the
      interpreter lacks some of what valid kernels use (clusters, ``run_state``), and it is not
      the validity oracle (lowering for CUDA is).
    * ``compile``: ``COMPILE_ERROR``.
    * ``run`` / ``check`` / ``time``: ``CRASHED`` when the device no longer works afterwards
      (``device_ok=False``: e.g. an illegal address poisons the CUDA context), else
      ``COMPILE_ERROR`` (it compiled but could not be launched or run).

    Raises:
      EvaluationError: ``error`` is an ``ImportError``: the environment is broken, not the
        config.
    """
    stage = Stage(stage)
    if isinstance(error, ImportError):
        raise EvaluationError(
            f"A module is missing ({error}); install it (e.g. absl-py for Pallas Mosaic GPU) "
            "before tuning: this is not a property of the config."
        ) from error
    if not device_ok:
        return Outcome.CRASHED
    if stage is Stage.BUILD or (stage is Stage.LOWER and not interpret):
        return Outcome.INVALID
    return Outcome.COMPILE_ERROR


def _describe(error: BaseException, stage: Stage) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return f"[{stage}] {text}"


def _failure(
    error: BaseException,
    stage: Stage,
    *,
    compile_s: float | None,
    device_ok: bool = True,
    interpret: bool = False,
) -> TrialResult:
    outcome = classify_error(error, stage, device_ok=device_ok, interpret=interpret)
    message = _describe(error, stage)
    if outcome is Outcome.CRASHED:
        message += " (the device failed afterwards; the process must be replaced)"
    elif interpret and stage is Stage.LOWER:
        message += " (GPU interpret mode: the interpreter may lack what this config uses)"
    return TrialResult.failed(outcome, message, compile_s=compile_s)


def _with_rule_hint(
    result: TrialResult, kernel: Kernel, problem: Problem, config: Config
) -> TrialResult:
    """An ``invalid`` trial's error plus the rule the space is missing (advice only: the
    outcome never depends on it)."""
    if result.outcome is not Outcome.INVALID:
        return result
    try:
        from autotune.evaluation.checking import suggest_rule

        hint = suggest_rule(result.error, config, kernel.bind(problem))
    except Exception:  # noqa: BLE001 - advice must never fail a trial
        log.debug("no rule hint for %s", config, exc_info=True)
        hint = ""
    if not hint:
        hint = "`autotune check` on this problem names the rule the space is missing"
    return dataclasses.replace(result, error=f"{result.error}\nmissing rule? {hint}")


# ---------------------------------------------------------------------------------------------
# Pure helpers: picking the kernel's own launches, comparing outputs.

# A Mosaic GPU kernel is launched under its host function's name plus "_kernel":
# "<kernel_name>_mosaic_gpu_kernel" (Pallas names it after the kernel body or pallas_call name).
MOSAIC_KERNEL_PATTERN = r"_mosaic_gpu"
# XLA's own launches around a custom call: fusions, copies, layout changes, fills.
XLA_GLUE_PATTERN = (
    r"(?i)(fusion|copy|transpose|convert|broadcast|memset|memcpy|concatenate|slice|pad|iota|"
    r"bitcast|reshape|select|scatter|gather|reduce|rng|dynamic_update|zeros|fill)"
)


def select_kernel_time(
    iter_timings: Sequence[Any],
    *,
    kernel_pattern: str = MOSAIC_KERNEL_PATTERN,
    glue_names: Collection[str] = (),
) -> list[float]:
    """Per-iteration time in µs of the tuned kernel's own launches, from CUPTI timings.

    ``iter_timings`` is what ``profiler.measure(f, aggregate=False, iterations=N)`` returns:
    per iteration a list of ``(kernel_name, ms)`` (for N == 1, that list alone).

    The rule:

    1. Launches whose name matches ``kernel_pattern`` are the kernel's own (Mosaic GPU names
       them ``<name>_mosaic_gpu_kernel``); their times are summed per iteration, so a kernel
       made of several Mosaic GPU calls counts all of them, and XLA's glue (input casts,
       layout copies, the zero fill of a scratch buffer) counts for nothing.
    2. When no launch matches (a kernel that is not Mosaic GPU, or a later JAX naming its
       launches differently), every launch counts except XLA glue: names matching
       :data:`XLA_GLUE_PATTERN` (fusions, copies, transposes, converts, fills) and names in
       ``glue_names`` (the launches seen when running the glue alone).

    Raises:
      ValueError: no iteration, iterations with different kernels, or nothing left to time.
    """
    if not iter_timings:
        raise ValueError("CUPTI recorded no iteration.")
    if (
        isinstance(iter_timings[0], tuple)
        and iter_timings[0]
        and isinstance(iter_timings[0][0], str)
    ):
        iter_timings = [iter_timings]  # measure() returns one iteration's list unnested
    first = [name for name, _ in iter_timings[0]]
    own = re.compile(kernel_pattern)
    glue = re.compile(XLA_GLUE_PATTERN)
    if any(own.search(name) for name in first):

        def keep(name: str) -> bool:
            return bool(own.search(name))

    else:

        def keep(name: str) -> bool:
            return name not in glue_names and not glue.search(name)

    samples = []
    for i, launches in enumerate(iter_timings):
        names = [name for name, _ in launches]
        if names != first:
            raise ValueError(f"CUPTI iteration {i} launched {names}, iteration 0 {first}.")
        kept = [float(ms) for name, ms in launches if keep(name)]
        if not kept:
            raise ValueError(
                f"No launch of the tuned kernel among {first}: expected a name matching "
                f"{kernel_pattern!r} or one that is not XLA glue."
            )
        samples.append(sum(kept) * 1000.0)
    return samples


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
    return _error_terms_jit()(out, ref)


_ERROR_TERMS: Any = None


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


@dataclasses.dataclass
class Compiled:
    """A config compiled ahead of time, ready to run on the device it was compiled for."""

    kernel: Kernel
    problem: Problem
    config: Config
    executable: Any  # jax.stages.Compiled (or a FakeBehaviour)
    compile_s: float
    options: BuildOptions = dataclasses.field(default_factory=BuildOptions)


def _noop(stage: Stage) -> None:
    pass


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

    from autotune.evaluation.lowering import input_specs

    options = options or BuildOptions()
    on_stage = on_stage or _noop
    stage = Stage.BUILD
    start = time.perf_counter()
    try:
        on_stage(stage)
        fn = kernel.build(problem, config, options)
        stage = Stage.LOWER
        on_stage(stage)
        if specs is None:
            specs = input_specs(kernel, problem)
        lowered = jax.jit(fn).trace(*specs).lower()
        stage = Stage.COMPILE
        on_stage(stage)
        executable = lowered.compile()
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        failed = _failure(
            e, stage, compile_s=time.perf_counter() - start, interpret=options.interpret
        )
        return _with_rule_hint(failed, kernel, problem, config)
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
    import jax

    from autotune.evaluation.lowering import H200_NUM_SMS, input_specs

    on_stage = on_stage or _noop
    stage = Stage.BUILD
    start = time.perf_counter()
    try:
        on_stage(stage)
        fn = kernel.build(problem, config, BuildOptions(num_sms=H200_NUM_SMS))
        stage = Stage.LOWER
        if specs is None:
            specs = input_specs(kernel, problem)
        jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        failed = _failure(e, stage, compile_s=time.perf_counter() - start)
        failed = dataclasses.replace(
            failed, error=f"{failed.error} (lowering for CUDA, as on the GPU)"
        )
        return _with_rule_hint(failed, kernel, problem, config)
    return None


def _device_ok() -> bool:
    """Whether the default device still runs a trivial computation (False once poisoned)."""
    try:
        import jax
        import jax.numpy as jnp

        jax.block_until_ready(jnp.ones((8,), jnp.float32) + 1)
        return True
    except Exception:  # noqa: BLE001
        return False


def _time_wallclock(fn: Any, inputs: Sequence[Any], iterations: int) -> tuple[list[float], Any]:
    import jax

    out = jax.block_until_ready(fn(*inputs))  # warm-up, excluded
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*inputs))
        samples.append((time.perf_counter() - start) * 1e6)
    return samples, out


def _time_cupti(
    fn: Any, inputs: Sequence[Any], iterations: int, *, aggregate: bool
) -> tuple[list[float], Any]:
    """GPU time per iteration in µs via CUPTI (``measure`` runs one warm-up call itself)."""
    from jax.experimental.mosaic.gpu import profiler

    measure: Any = profiler.measure  # its overloads want literal arguments
    out, timings = measure(fn, aggregate=aggregate, iterations=iterations)(*inputs)
    if timings is None:
        raise RuntimeError("CUPTI recorded no kernel launch.")
    if aggregate:
        values = timings if isinstance(timings, list) else [timings]
        return [float(ms) * 1000.0 for ms in values], out
    return select_kernel_time(timings), out


def _time(
    fn: Any,
    inputs: Sequence[Any],
    iterations: int,
    timing: str,
    *,
    aggregate: bool = False,
    cache: str = "warm",
    flush: Any = None,
) -> tuple[list[float], Any]:
    if timing == "cupti" and cache == "cold":
        # The L2 flushed before every iteration (autotune.evaluation.cold_timing): a failure here is the
        # method's, not the config's, so it is not retried as a stray launch would be.
        from autotune.evaluation.cold_timing import time_cold

        return time_cold(fn, inputs, iterations, flush, aggregate=aggregate,
                         select=select_kernel_time)
    if timing == "cupti":
        try:
            return _time_cupti(fn, inputs, iterations, aggregate=aggregate)
        except Exception:  # noqa: BLE001
            # A launch by another thread (an XLA autotuning compile) can land inside the
            # measured window and break measure()'s per-iteration split: try once more.
            if not _device_ok():
                raise
            log.debug("CUPTI measurement failed; retrying once.", exc_info=True)
            return _time_cupti(fn, inputs, iterations, aggregate=aggregate)
    return _time_wallclock(fn, inputs, iterations)


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

    ``cache`` is the cache policy (:mod:`autotune.evaluation.trial`); ``cold`` with CUPTI needs
    ``flush``, an :class:`autotune.evaluation.cold_timing.L2Flush`.

    ``timing`` is ``"cupti"`` (GPU time of the kernel's own launches, see
    :func:`select_kernel_time`) or ``"wallclock"`` (host time around ``block_until_ready``;
    interpret mode). The warm-up call is never timed. The output of the first call and of the
    last timed one are both checked. Not thread-safe: one call at a time per device.
    """
    import jax

    on_stage = on_stage or _noop
    fn = compiled.executable
    stage = Stage.RUN
    rel: float | None = None
    try:
        on_stage(stage)
        out = jax.block_until_ready(fn(*inputs))
        stage = Stage.CHECK
        on_stage(stage)
        rel = relative_error(out, expected)
        del out
        if not rel <= tolerance:
            return _wrong(rel, tolerance, compiled.compile_s)
        stage = Stage.TIME
        on_stage(stage)
        samples, last = _time(fn, inputs, iterations, timing, cache=cache, flush=flush)
        stage = Stage.CHECK
        rel = max(rel, relative_error(last, expected))
        if not rel <= tolerance:
            return _wrong(rel, tolerance, compiled.compile_s, when=" in a timed iteration")
    except Exception as e:  # noqa: BLE001 - every config failure becomes a value
        device_ok = _device_ok() if timing == "cupti" else True
        if compiled.options.interpret:
            from autotune import _jax_compat

            _jax_compat.reset_interpret_state()
        return _failure(e, stage, compile_s=compiled.compile_s, device_ok=device_ok)
    return TrialResult.timed(
        samples, compile_s=compiled.compile_s, rel_error=rel, timing=timing, cache=cache
    )


def _wrong(rel: float, tolerance: float, compile_s: float | None, when: str = "") -> TrialResult:
    what = "non-finite or mis-shaped output" if math.isinf(rel) else f"relative error {rel:.3g}"
    return TrialResult(
        outcome=Outcome.WRONG_RESULT,
        compile_s=compile_s,
        rel_error=rel,
        error=f"[check] {what}{when} exceeds the tolerance {tolerance:g} (||out-ref||/||ref||).",
    )


def measure_baseline(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    iterations: int,
    timing: str,
    expected: Any = None,
    cache: str = "warm",
    flush: Any = None,
    compiled: Any = None,
    on_compiled: Callable[[Any], None] | None = None,
) -> TrialResult:
    """Compiles and times a baseline (XLA, cuDNN) the way configs are timed.

    With CUPTI every launch counts (``aggregate=True``): the baseline *is* XLA's kernels.
    ``rel_error`` against ``expected`` is recorded when given, for information. ``compiled``:
    an executable of ``fn`` compiled before (not compiled again); ``on_compiled`` receives the
    executable compiled here, for re-use.
    """
    import jax

    stage = Stage.LOWER
    start = time.perf_counter()
    compile_s = None
    try:
        if compiled is None:
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
        stage = Stage.TIME
        samples, _ = _time(
            executable, inputs, iterations, timing, aggregate=True, cache=cache, flush=flush
        )
    except Exception as e:  # noqa: BLE001
        device_ok = _device_ok() if timing == "cupti" else True
        return _failure(e, stage, compile_s=compile_s, device_ok=device_ok)
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
) -> dict[str, tuple[float, int]]:
    """Runs one config built with the in-kernel profiler; per-region ``(median, count)``.

    Builds with ``BuildOptions(profile_space=..., profile_dir=out_dir)``, runs once, waits for
    the trace files, and parses the files this run added (:mod:`autotune.evaluation.tracing`).

    Raises:
      EvaluationError: the config does not build, compile or run with the profiler on.
    """
    import jax

    from autotune.evaluation.tracing import parse_trace_files

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.json"))
    options = BuildOptions(interpret=interpret, profile_space=profile_space, profile_dir=str(out))
    compiled = compile_config(kernel, problem, config, options)
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


# ---------------------------------------------------------------------------------------------
# Devices.


def gpu_device_info(index: int = 0) -> DeviceInfo:
    """The GPU this process times on: name, compute capability, CUDA driver version.

    Raises:
      EvaluationError: jax sees no GPU.
    """
    import jax

    try:
        device = jax.devices("gpu")[index]
    except RuntimeError as e:
        raise EvaluationError(f"No GPU visible to jax ({e}); use interpret mode on a CPU.") from e
    driver = ""
    try:
        from jax._src.lib import cuda_versions

        get = getattr(cuda_versions, "cuda_driver_get_version", None)
        if get is not None:
            version = int(get())
            driver = f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # noqa: BLE001 - the driver version is informative only
        pass
    return DeviceInfo(
        name=str(getattr(device, "device_kind", "gpu")),
        kind="gpu",
        compute_capability=str(getattr(device, "compute_capability", "") or ""),
        driver=driver,
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
    """Interpret mode runs kernels numerically on the CPU; its rows say so."""
    return DeviceInfo(name=f"cpu-interpret ({_cpu_model()})", kind="interpret")


# ---------------------------------------------------------------------------------------------
# Evaluators.


class Evaluator(abc.ABC):
    """Compiles, checks and times configs on one device.

    Contract: :meth:`compile` is thread-safe (the engine calls it from several compile
    threads); :meth:`run`, :meth:`baseline` and :meth:`trace` use the device and are called
    from one thread, one at a time. A failure caused by the config is returned as a
    :class:`TrialResult`; other failures raise :class:`EvaluationError`. After a run that left
    the device unusable, :attr:`healthy` is False and the process must be replaced.
    """

    timing: str = ""
    iterations: int = 1
    healthy: bool = True
    cache: str = "warm"  # the cache policy of every timing (autotune.evaluation.trial.CachePolicy)

    @abc.abstractmethod
    def device_info(self) -> DeviceInfo: ...

    @abc.abstractmethod
    def compile(
        self, kernel: Kernel, problem: Problem, config: Config, *, on_stage: StageHook | None = None
    ) -> Compiled | TrialResult: ...

    @abc.abstractmethod
    def run(self, compiled: Compiled, *, on_stage: StageHook | None = None) -> TrialResult: ...

    @abc.abstractmethod
    def baseline(
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None
    ) -> TrialResult: ...

    @abc.abstractmethod
    def retime(self, compiled: Compiled, *, iterations: int) -> TrialResult:
        """Times a config compiled and checked before again, on fresh inputs (the
        confirmation round): no check, ``iterations`` timed runs in this evaluator's policy."""

    @abc.abstractmethod
    def trace(
        self,
        kernel: Kernel,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        *,
        profile_space: int,
    ) -> dict[str, tuple[float, int]]: ...

    def evaluate(self, kernel: Kernel, problem: Problem, config: Config) -> TrialResult:
        """Compile then run, in sequence (no pipelining)."""
        compiled = self.compile(kernel, problem, config)
        if isinstance(compiled, TrialResult):
            return compiled
        return self.run(compiled)


class _JaxEvaluator(Evaluator):
    """Shared by the GPU and interpret evaluators: real kernels through jax."""

    interpret = False

    def __init__(self, iterations: int, cache: str = "warm") -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, but got {iterations}.")
        self.iterations = iterations
        self.cache = cache
        self._l2_flush: Any = None
        self._baseline_executables: dict[tuple[str, Problem], Any] = {}
        self.healthy = True
        self._lock = threading.Lock()
        self._specs: dict[tuple[str, Problem], tuple[Any, ...]] = {}
        self._references: dict[tuple[str, Problem], Any] = {}
        self._makers: dict[tuple[str, Problem], Any] = {}
        self._prepare_lock = threading.Lock()
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
        """Compiles the problem's input maker and reference ahead of time, once per worker.

        Called from the compile stage, outside the GPU lock: XLA compiling them is host work,
        and several workers of one GPU would otherwise take turns for it under the lock (seen
        on the H200: 8 workers' first configs finished ~9 s apart). Kernels whose
        ``make_inputs`` or reference cannot be traced are left to run eagerly.
        """
        import jax
        import numpy as np

        key = (kernel.name, problem)
        with self._prepare_lock:
            if key in self._makers:
                return
            specs = self._input_specs(kernel, problem)
            try:
                maker = jax.jit(lambda seed: tuple(kernel.make_inputs(problem, jax.random.key(seed))))
                self._makers[key] = maker.lower(np.int32(0)).compile()
            except Exception:  # noqa: BLE001 - not traceable: inputs are made eagerly instead
                self._makers[key] = None
            try:
                self._references[key] = jax.jit(kernel.reference(problem)).lower(*specs).compile()
            except Exception:  # noqa: BLE001 - _expected reports a reference that really fails
                self._references.pop(key, None)

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
        with self._device_context():
            self._prepare(kernel, problem)
            return compile_config(
                kernel, problem, config, self._options(), specs=specs, on_stage=on_stage
            )

    def _flush(self) -> Any:
        """The L2 flush of cold CUPTI timing (made once per evaluator), else None."""
        if self.cache != "cold" or self.timing != "cupti":
            return None
        if self._l2_flush is None:
            from autotune.evaluation.cold_timing import L2Flush

            self._l2_flush = L2Flush()
        return self._l2_flush

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
                iterations=self.iterations,
                timing=self.timing,
                on_stage=on_stage,
                cache=self.cache,
                flush=self._flush(),
            )
        if result.outcome is Outcome.CRASHED:
            self.healthy = False
        return result

    def _keep_baseline(self, key: tuple[str, Problem], executable: Any) -> None:
        self._baseline_executables.clear()  # one problem's at a time
        self._baseline_executables[key] = executable

    def retime(self, compiled: Compiled, *, iterations: int) -> TrialResult:
        with self._device_context():
            inputs = self._fresh_inputs(compiled.kernel, compiled.problem)
            try:
                samples, _ = _time(compiled.executable, inputs, iterations, self.timing,
                                   cache=self.cache, flush=self._flush())
            except Exception as e:  # noqa: BLE001 - a failure is a value, as in run()
                device_ok = _device_ok() if self.timing == "cupti" else True
                result = _failure(e, Stage.TIME, compile_s=compiled.compile_s, device_ok=device_ok)
                if result.outcome is Outcome.CRASHED:
                    self.healthy = False
                return result
        return TrialResult.timed(samples, compile_s=compiled.compile_s, rel_error=None,
                                 timing=self.timing, cache=self.cache)

    def baseline(
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None
    ) -> TrialResult:
        if kernel.baseline is None:
            raise EvaluationError(f"Kernel {kernel.name!r} declares no baseline to time.")
        key = (kernel.name, problem)
        with self._device_context():
            inputs = self._fresh_inputs(kernel, problem)
            expected = self._expected(kernel, problem, inputs)
            try:
                fn = kernel.baseline(problem)
            except Exception as e:
                raise EvaluationError(f"{kernel.name}.baseline fails for {problem}: {e}") from e
            result = measure_baseline(
                fn, inputs, iterations=iterations or self.iterations, timing=self.timing,
                expected=expected, cache=self.cache, flush=self._flush(),
                compiled=self._baseline_executables.get(key),
                # Kept for the confirmation round, which times the baseline again (XLA's
                # autotuning makes its compile slow); one problem's at a time.
                on_compiled=lambda exe: self._keep_baseline(key, exe),
            )
        if result.outcome is Outcome.CRASHED:
            self.healthy = False
        return result

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

    def trace(self, *args: Any, clock_ghz: float | None = None, **kwargs: Any) -> dict[str, tuple[float, int]]:
        # Trace timestamps count SM cycles: convert with the clock the SMs run at under load.
        return super().trace(*args, clock_ghz=clock_ghz or sm_clock_ghz(), **kwargs)


def sm_clock_ghz() -> float | None:
    """The GPU's maximum SM clock in GHz (nvidia-smi), or None if it cannot be read.

    Kernels under load run at the boost clock (1.98 GHz seen on the H200), so this converts
    in-kernel trace cycles to microseconds; the figure is stored beside the regions' times.
    """
    import subprocess

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
    would refuse is ``invalid`` here too, never measured as if it were fine.
    """

    timing = "wallclock"
    interpret = True

    def __init__(self, iterations: int = 3, cache: str = "warm") -> None:
        from autotune.evaluation.trial import resolve_cache_policy

        super().__init__(iterations, resolve_cache_policy(cache, "interpret").value)

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


# ---------------------------------------------------------------------------------------------
# The fake evaluator: behaviour chosen per config, for testing the engine without a GPU.

FAKE_MODES = ("ok", "sleep", "raise", "wrong", "segfault", "abort", "hang", "wedge", "poison")


@dataclasses.dataclass(frozen=True)
class FakeBehaviour:
    """What the fake evaluator does with one config.

    ``mode``: ``ok`` (time ``cost_us``), ``sleep`` (sleep ``sleep_s`` at ``stage``, then ok),
    ``raise`` (raise ``ValueError`` at ``stage``, classified like a real failure there),
    ``wrong`` (a wrong result), ``segfault`` / ``abort`` (kill the process with SIGSEGV /
    SIGABRT at ``stage``), ``hang`` (never return from ``stage``), ``wedge`` (never return and
    never release the GIL, like a C call stuck while holding it: the process stops answering),
    ``poison`` (the run fails and leaves the device unusable, like an illegal address). ``compile_s`` and ``run_s`` are
    the time compiling and running take.

    Timing: ``cost_us`` is the config's true time (``cold_us`` under the ``cold`` policy, when
    given); ``search_us``, when given, is what its search trial measures instead (a lucky or
    unlucky moment, which the confirmation round, timing ``cost_us``, sees through); ``noise``
    is the relative standard deviation of every sample (deterministic: seeded by the config).
    In a config (:meth:`from_config`), times may be strings (``"100.3"``: config values are
    never fractional numbers) and ``noise`` is in per mille.
    """

    mode: str = "ok"
    stage: Stage = Stage.RUN
    cost_us: float = 100.0
    compile_s: float = 0.0
    run_s: float = 0.0
    sleep_s: float = 0.0
    search_us: float | None = None
    cold_us: float | None = None
    noise: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in FAKE_MODES:
            raise ValueError(f"Fake mode {self.mode!r} is not one of {FAKE_MODES}.")
        object.__setattr__(self, "stage", Stage(self.stage))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FakeBehaviour:
        """Reads ``mode``, ``stage``, ``cost_us``, ``compile_ms``, ``run_ms``, ``sleep_ms``."""
        return cls(
            mode=str(config.get("mode", "ok")),
            stage=Stage(config.get("stage", "run")),
            cost_us=float(config.get("cost_us", 100)),
            compile_s=float(config.get("compile_ms", 0)) / 1000,
            run_s=float(config.get("run_ms", 0)) / 1000,
            sleep_s=float(config.get("sleep_ms", 0)) / 1000,
            search_us=None if config.get("search_us") is None else float(config["search_us"]),
            cold_us=None if config.get("cold_us") is None else float(config["cold_us"]),
            noise=float(config.get("noise", 0)) / 1000,  # per mille: config values are not floats
        )

    def true_us(self, cache: str) -> float:
        """The time this config takes under ``cache`` policy."""
        return self.cold_us if cache == "cold" and self.cold_us is not None else self.cost_us


class _FakeKernelError(ValueError):
    """What a fake config raises in mode ``raise``."""


class FakeEvaluator(Evaluator):
    """Returns, sleeps, raises, crashes or hangs as each config's :class:`FakeBehaviour` says.

    ``rule`` maps a config to its behaviour (by default :meth:`FakeBehaviour.from_config`: the
    behaviour is data in the config). Never imports jax.
    """

    timing = "fake"

    def __init__(
        self,
        iterations: int = 3,
        *,
        rule: Callable[[Config], FakeBehaviour] = FakeBehaviour.from_config,
        cache: str = "warm",
    ) -> None:
        from autotune.evaluation.trial import resolve_cache_policy

        self.iterations = iterations
        self.rule = rule
        self.cache = resolve_cache_policy(cache, "fake").value
        self.healthy = True
        self._draws = 0

    def _samples(self, key: str, center_us: float, noise: float, iterations: int) -> list[float]:
        if not noise:
            return [center_us * (1 + 0.001 * i) for i in range(iterations)]
        self._draws += 1
        rng = random.Random(f"{key}:{self._draws}")
        return [center_us * max(0.05, 1 + noise * max(-3.0, min(3.0, rng.gauss(0, 1))))
                for _ in range(iterations)]

    def device_info(self) -> DeviceInfo:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return DeviceInfo(name=f"fake-gpu (CUDA_VISIBLE_DEVICES={visible})", kind="fake")

    def _act(self, b: FakeBehaviour, stage: Stage) -> None:
        if b.stage is not stage:
            return
        if b.mode == "sleep":
            time.sleep(b.sleep_s)
        elif b.mode == "raise":
            raise _FakeKernelError(f"fake failure at {stage}")
        elif b.mode == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)  # the signal is delivered asynchronously
        elif b.mode == "abort":
            os.abort()
        elif b.mode == "hang":
            while True:
                time.sleep(3600)
        elif b.mode == "wedge":
            sys.setswitchinterval(1e6)  # no other thread gets the GIL again
            while True:
                pass

    def compile(
        self, kernel: Kernel, problem: Problem, config: Config, *, on_stage: StageHook | None = None
    ) -> Compiled | TrialResult:
        on_stage = on_stage or _noop
        b = self.rule(config)
        start = time.perf_counter()
        stage = Stage.BUILD
        try:
            for stage in (Stage.BUILD, Stage.LOWER, Stage.COMPILE):
                on_stage(stage)
                if stage is Stage.COMPILE:
                    time.sleep(b.compile_s)
                self._act(b, stage)
        except _FakeKernelError as e:
            return _failure(e, stage, compile_s=time.perf_counter() - start)
        return Compiled(kernel, problem, config, b, time.perf_counter() - start)

    def run(self, compiled: Compiled, *, on_stage: StageHook | None = None) -> TrialResult:
        on_stage = on_stage or _noop
        b: FakeBehaviour = compiled.executable
        stage = Stage.RUN
        try:
            on_stage(stage)
            time.sleep(b.run_s)
            self._act(b, Stage.RUN)
            if b.mode == "poison" and b.stage is Stage.RUN:
                self.healthy = False
                raise RuntimeError("fake CUDA_ERROR_ILLEGAL_ADDRESS")
            stage = Stage.CHECK
            on_stage(stage)
            self._act(b, Stage.CHECK)
            if b.mode == "wrong":
                return _wrong(0.5, 0.02, compiled.compile_s)
            stage = Stage.TIME
            on_stage(stage)
            self._act(b, Stage.TIME)
        except (_FakeKernelError, RuntimeError) as e:
            return _failure(e, stage, compile_s=compiled.compile_s, device_ok=self.healthy)
        center = b.search_us if b.search_us is not None else b.true_us(self.cache)
        samples = self._samples(compiled.config.digest(), center, b.noise, self.iterations)
        return TrialResult.timed(
            samples, compile_s=compiled.compile_s, rel_error=0.0, timing="fake", cache=self.cache
        )

    def retime(self, compiled: Compiled, *, iterations: int) -> TrialResult:
        b: FakeBehaviour = compiled.executable
        self._act(b, Stage.TIME)
        samples = self._samples(compiled.config.digest(), b.true_us(self.cache), b.noise,
                                iterations)
        return TrialResult.timed(samples, compile_s=compiled.compile_s, rel_error=None,
                                 timing="fake", cache=self.cache)

    def baseline(
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None
    ) -> TrialResult:
        """``baseline_us`` of the problem's shape (``baseline_cold_us`` when cold), with the
        shape's ``baseline_noise`` (relative standard deviation in per mille: shape values are
        whole numbers), default 100 µs, no noise."""
        dims = problem.dims
        cost = float(dims.get("baseline_us", 100))
        if self.cache == "cold" and "baseline_cold_us" in dims:
            cost = float(dims["baseline_cold_us"])
        noise = float(dims.get("baseline_noise", 0)) / 1000 if "baseline_noise" in dims else 0.0
        n = iterations or self.iterations
        samples = self._samples("baseline", cost, noise, n) if noise else [cost] * n
        return TrialResult.timed(
            samples, compile_s=0.0, rel_error=0.0, timing="fake", cache=self.cache
        )

    def trace(
        self,
        kernel: Kernel,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        *,
        profile_space: int,
    ) -> dict[str, tuple[float, int]]:
        """Writes a synthetic trace (two warpgroups on two SMs) and parses it."""
        from autotune.evaluation.tracing import parse_trace_files

        b = self.rule(config)
        self._act(b, b.stage)  # a config that crashes or hangs does so when traced too
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        events = []
        for pid, tid in ((1, 1), (2, 2)):
            events += [
                {"name": "kernel", "ph": "B", "ts": 0.0, "pid": pid, "tid": tid},
                {"name": "body", "ph": "B", "ts": 1.0, "pid": pid, "tid": tid},
                {"name": "body", "ph": "E", "ts": 1.0 + b.cost_us, "pid": pid, "tid": tid},
                {"name": "kernel", "ph": "E", "ts": 2.0 + b.cost_us, "pid": pid, "tid": tid},
            ]
        path = out / f"fake-{time.time_ns()}-trace.json"
        path.write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": events}))
        return parse_trace_files([path])


def make_evaluator(
    mode: str, *, iterations: int | None = None, cache: str | None = None
) -> Evaluator:
    """The evaluator for an engine mode: ``"gpu"``, ``"interpret"`` or ``"fake"``.

    ``cache``: the cache policy (:func:`autotune.evaluation.trial.resolve_cache_policy`; None: cold
    on a GPU, warm otherwise).
    """
    from autotune.evaluation.trial import resolve_cache_policy

    if mode == "gpu":
        return GpuEvaluator(iterations or 20, resolve_cache_policy(cache, "gpu").value)
    if mode == "interpret":
        return InterpretEvaluator(iterations or 3, resolve_cache_policy(cache, "interpret").value)
    if mode == "fake":
        return FakeEvaluator(iterations or 3, cache=resolve_cache_policy(cache, "fake").value)
    raise ValueError(f"Evaluator mode must be 'gpu', 'interpret' or 'fake', but got {mode!r}.")

"""The evaluator contract: what measuring a config means, whatever the device.

The stages of measuring a config (:class:`Stage`), the one place where a failure becomes an
outcome (:func:`classify_error`), a compiled config (:class:`Compiled`) and the abstract
:class:`Evaluator` the engine drives; :func:`make_evaluator` picks the evaluator for an engine
mode (the JAX pipeline, :mod:`autotune.evaluation.pipeline`, or the fake one,
:mod:`autotune.evaluation.fake`). No jax here.

Every way a config can fail comes back as a :class:`~autotune.space.outcomes.TrialResult` value whose
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
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import math
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.space.kernel import BuildOptions, Kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

__all__ = [
    "Stage",
    "EvaluationError",
    "classify_error",
    "Compiled",
    "StageHook",
    "Evaluator",
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


def failure_result(
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


def with_rule_hint(
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


@dataclasses.dataclass
class Compiled:
    """A config compiled ahead of time, ready to run on the device it was compiled for."""

    kernel: Kernel
    problem: Problem
    config: Config
    executable: Any  # jax.stages.Compiled (or a FakeBehaviour)
    compile_s: float
    options: BuildOptions = dataclasses.field(default_factory=BuildOptions)


def ignore_stage(stage: Stage) -> None:
    pass


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
    cache: str = "warm"  # the cache policy of every timing (autotune.space.outcomes.CachePolicy)

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
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None,
        program: bool = False, check: bool = True,
    ) -> TrialResult:
        """Times the problem's baseline (``program``: as :meth:`retime` does). ``check``: its
        output is checked against the kernel's reference within the kernel's tolerance (a
        WRONG_RESULT beyond it, as a config's); a re-time (a confirmation round, which times
        only a baseline stored after its check) passes False and spends no reference."""

    def prepare(
        self, kernel: Kernel, problem: Problem, *, on_stage: StageHook | None = None
    ) -> None:
        """Host work for a problem's :meth:`baseline`, done ahead of it and outside the GPU's
        lock (the engine calls it from a compile thread). Thread-safe; never raises for the
        baseline's own failure, which :meth:`baseline` reports. Default: nothing."""
        return None

    def prepare_trace(
        self,
        kernel: Kernel,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        *,
        profile_space: int,
    ) -> None:
        """Host work for :meth:`trace` with the same arguments (compiling the config with the
        in-kernel profiler on), done ahead of it and outside the GPU's lock (the engine calls it
        from a compile thread). Thread-safe; never raises: :meth:`trace` reports a failure.
        Default: nothing."""
        return None

    def warm_host(self) -> None:
        """Host work a worker's first config or first timing would wait for (importing the
        kernel language's modules, compiling the L2 flush), done ahead: a worker calls it on a
        compile thread as it starts, before its first config, then :meth:`warm_device`.
        Thread-safe. A failure here is met again, and reported, by the first config. Default:
        nothing."""
        return None

    def warm_device(self) -> None:
        """Pays once, ahead, what this evaluator's first timing would on the device (CUPTI's
        start, the L2 flush's buffer and its launches learnt). A worker calls it under the
        GPU's lock after :meth:`warm_host`, while its first config compiles; a failure here is
        met again, and reported, by the first trial. Default: nothing."""
        return None

    @abc.abstractmethod
    def retime(self, compiled: Compiled, *, iterations: int, program: bool = False) -> TrialResult:
        """Times a config compiled and checked before again, on fresh inputs (the
        confirmation round): no check, ``iterations`` timed runs in this evaluator's policy.

        ``program``: timed as a program calls it instead (the program check): per block of
        ``iterations`` calls back to back, the host clock's time per call
        (:func:`autotune.evaluation.timing.time_program`; timing
        :data:`~autotune.space.outcomes.PROGRAM_METHOD`), on input sets rotated under the cold
        policy."""

    def retime_round(
        self, kernel: Kernel, problem: Problem, programs: Sequence[Compiled | None], *,
        iterations: int,
    ) -> list[TrialResult]:
        """One confirmation round: each of ``programs`` (None: the problem's baseline) timed
        again for ``iterations`` runs, as :meth:`retime` and :meth:`baseline` time them; one
        result per program, in order. Default: one after another. An evaluator whose policy
        allows it times them interleaved call by call instead, so that a clock that moves
        within the round moves them all (:class:`~autotune.evaluation.pipeline.GpuEvaluator`
        under the cold policy: :func:`~autotune.evaluation.cold_timing.time_cold_interleaved`).
        """
        return [self.baseline(kernel, problem, iterations=iterations, check=False) if p is None
                else self.retime(p, iterations=iterations) for p in programs]

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


def make_evaluator(
    mode: str, *, iterations: int | None = None, cache: str | None = None
) -> Evaluator:
    """The evaluator for an engine mode: ``"gpu"``, ``"interpret"`` or ``"fake"``.

    ``cache``: the cache policy (:func:`autotune.space.outcomes.resolve_cache_policy`; None: cold
    on a GPU, warm otherwise).
    """
    from autotune.evaluation.fake import FakeEvaluator
    from autotune.evaluation.pipeline import GpuEvaluator, InterpretEvaluator
    from autotune.space.outcomes import resolve_cache_policy

    if mode == DeviceKind.GPU:
        return GpuEvaluator(iterations or 20, resolve_cache_policy(cache, DeviceKind.GPU).value)
    if mode == DeviceKind.INTERPRET:
        return InterpretEvaluator(iterations or 3, resolve_cache_policy(cache, DeviceKind.INTERPRET).value)
    if mode == DeviceKind.FAKE:
        return FakeEvaluator(iterations or 3, cache=resolve_cache_policy(cache, DeviceKind.FAKE).value)
    raise ValueError(f"Evaluator mode must be 'gpu', 'interpret' or 'fake', but got {mode!r}.")


def wrong_result(rel: float, tolerance: float, compile_s: float | None, when: str = "") -> TrialResult:
    what = "non-finite or mis-shaped output" if math.isinf(rel) else f"relative error {rel:.3g}"
    return TrialResult(
        outcome=Outcome.WRONG_RESULT,
        compile_s=compile_s,
        rel_error=rel,
        error=f"[check] {what}{when} exceeds the tolerance {tolerance:g} (||out-ref||/||ref||).",
    )

"""The replay runner: an :class:`~autotune.evaluation.contract.Evaluator` that answers a config
with its recorded time instead of measuring it (Kernel Tuner's simulation runner, beside the
real one).

It serves one recorded problem (:func:`autotune.replay.ground_truth.load_ground_truth`): a
recorded config "compiles" to its record, a config that failed when recorded fails with the
recorded outcome, a config never recorded is ``invalid`` (the replay's space holds only
recorded configs, so a search never asks for one). ``noise`` multiplies each run's time by a
seeded log-normal factor of that relative standard deviation, as run-to-run noise does on the
GPU; :meth:`true_us` is the recorded time itself. No jax.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Mapping
from typing import Any

from autotune.evaluation.contract import Compiled, EvaluationError, Evaluator, StageHook
from autotune.replay.ground_truth import recorded_us
from autotune.space.kernel import Kernel, get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

__all__ = ["ReplayEvaluator"]

TIMING = "replay"
# The recorded times are CUPTI's kernel times: a replay has no program check to give.
NO_PROGRAM_VIEW = "[replay] the recorded times hold no program check (times as a program calls it)"


class ReplayEvaluator(Evaluator):
    """Recorded times of one ground-truth problem, behind the evaluator interface.

    Contract as :class:`Evaluator`'s; :meth:`run` draws the noise from one seeded stream, so a
    replay that runs the same configs in the same order sees the same times.
    """

    timing = TIMING

    def __init__(self, recorded: Mapping[str, Any], *, noise: float = 0.0, seed: int = 0,
                 unrecorded: Callable[[Config], float | None] | None = None) -> None:
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"noise is a relative standard deviation in [0, 1), but got {noise=}.")
        self.kernel = get_kernel(recorded["kernel"])
        self.problem = self.kernel.problem(recorded["shape"], recorded["dtype"])
        self.device = str(recorded.get("device", ""))
        self.noise = noise
        self._records = {Config(r["config"]).digest(): r for r in recorded["results"]}
        # The time of a config never recorded (the replay's --family mode), else it is invalid.
        self._unrecorded = unrecorded
        self._baseline = recorded.get("baseline") or {}
        name = f"{recorded['kernel']} {self.problem.shape_text} {self.problem.dtype}"
        self._rng = random.Random(f"noise:{seed}:{name}")

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(name=f"replay ({self.device})", kind=DeviceKind.FAKE)

    def _record(self, config: Config) -> Mapping[str, Any] | None:
        record = self._records.get(config.digest())
        if record is None and self._unrecorded is not None:
            t = self._unrecorded(config)
            record = ({"config": dict(config), "status": "ok", "median_us": t} if t is not None
                      else {"config": dict(config), "status": "wrong_result"})
        return record

    def true_us(self, config: Config) -> float | None:
        """The recorded time of ``config`` (None: it failed, or was never recorded)."""
        record = self._record(config)
        return recorded_us(record) if record is not None and record["status"] == "ok" else None

    def seen_us(self, true_us: float) -> float:
        """``true_us`` as one noisy measurement sees it (the next draw of the noise stream)."""
        return true_us * math.exp(self.noise * self._rng.gauss(0.0, 1.0)) if self.noise else true_us

    def compile(self, kernel: Kernel, problem: Problem, config: Config, *,
                on_stage: StageHook | None = None) -> Compiled | TrialResult:
        if problem != self.problem:
            raise EvaluationError(f"This replay serves {self.problem}, not {problem}.")
        record = self._record(config)
        if record is None:
            return TrialResult.failed(Outcome.INVALID, "[replay] config not in the ground truth")
        if record["status"] != "ok" or not record.get("median_us"):
            outcome = Outcome(record["status"]) if record["status"] != "ok" else Outcome.WRONG_RESULT
            return TrialResult.failed(outcome, record.get("error", "") or "[replay] failed when recorded",
                                      compile_s=record.get("compile_s"))
        return Compiled(kernel, problem, config, executable=record,
                        compile_s=float(record.get("compile_s") or 0.0))

    def run(self, compiled: Compiled, *, on_stage: StageHook | None = None) -> TrialResult:
        return TrialResult.timed([self.seen_us(recorded_us(compiled.executable))],
                                 compile_s=compiled.compile_s, rel_error=None, timing=TIMING,
                                 cache=self.cache)

    def baseline(self, kernel: Kernel, problem: Problem, *, iterations: int | None = None,
                 program: bool = False, check: bool = True) -> TrialResult:
        if program:
            return TrialResult.failed(Outcome.COMPILE_ERROR, NO_PROGRAM_VIEW)
        if "median_us" not in self._baseline:
            return TrialResult.failed(Outcome.COMPILE_ERROR, "[replay] no baseline recorded")
        return TrialResult.timed([float(self._baseline["median_us"])], compile_s=None,
                                 rel_error=None, timing=TIMING, cache=self.cache)

    def retime(self, compiled: Compiled, *, iterations: int, program: bool = False) -> TrialResult:
        """``iterations`` noisy measurements of the recorded time (the confirmation round); no
        program check (the recorded times are CUPTI's)."""
        if program:
            return TrialResult.failed(Outcome.COMPILE_ERROR, NO_PROGRAM_VIEW,
                                      compile_s=compiled.compile_s)
        true = recorded_us(compiled.executable)
        return TrialResult.timed([self.seen_us(true) for _ in range(max(1, iterations))],
                                 compile_s=compiled.compile_s, rel_error=None, timing=TIMING,
                                 cache=self.cache)

    def trace(self, kernel: Kernel, problem: Problem, config: Config,
              out_dir: str | os.PathLike[str], *, profile_space: int) -> dict[str, tuple[float, int]]:
        raise EvaluationError("The ground truth records times, not traces: a replay cannot trace "
                              f"{config}; trace it on a GPU (autotune trace).")

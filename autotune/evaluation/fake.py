"""The fake evaluator: behaviour chosen per config, for testing the engine without a GPU.

Returns, sleeps, raises, crashes or hangs as each config says (:class:`FakeBehaviour`), so
the engine's fault handling and the tuner's bookkeeping are tested without jax. Never imports
jax.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune._paths import write_output
from autotune.evaluation.contract import (
    Compiled,
    Evaluator,
    Stage,
    StageHook,
    failure_result,
    ignore_stage,
    wrong_result,
)
from autotune.evaluation.timing import PROGRAM_BLOCKS
from autotune.space.kernel import Kernel
from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, DeviceKind, TrialResult
from autotune.space.problem import Config, Problem

__all__ = ["FakeBehaviour", "FakeEvaluator"]


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
    is the relative standard deviation of every sample (deterministic: seeded by the config);
    ``call_us`` is what a call costs beyond its kernel time, which only a program check sees
    (:meth:`FakeEvaluator.retime` with ``program``).
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
    call_us: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in FAKE_MODES:
            raise ValueError(f"Fake mode {self.mode!r} is not one of {FAKE_MODES}.")
        object.__setattr__(self, "stage", Stage(self.stage))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FakeBehaviour:
        """Reads ``mode``, ``stage``, ``cost_us``, ``compile_ms``, ``run_ms``, ``sleep_ms``,
        ``search_us``, ``cold_us``, ``noise`` and ``call_us``."""
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
            call_us=float(config.get("call_us", 0)),
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
        from autotune.space.outcomes import resolve_cache_policy

        self.iterations = iterations
        self.rule = rule
        self.cache = resolve_cache_policy(cache, DeviceKind.FAKE).value
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
        return DeviceInfo(name=f"fake-gpu (CUDA_VISIBLE_DEVICES={visible})", kind=DeviceKind.FAKE)

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
        on_stage = on_stage or ignore_stage
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
            return failure_result(e, stage, compile_s=time.perf_counter() - start)
        return Compiled(kernel, problem, config, b, time.perf_counter() - start)

    def run(self, compiled: Compiled, *, on_stage: StageHook | None = None) -> TrialResult:
        on_stage = on_stage or ignore_stage
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
                return wrong_result(0.5, 0.02, compiled.compile_s)
            stage = Stage.TIME
            on_stage(stage)
            self._act(b, Stage.TIME)
        except (_FakeKernelError, RuntimeError) as e:
            return failure_result(e, stage, compile_s=compiled.compile_s, device_ok=self.healthy)
        center = b.search_us if b.search_us is not None else b.true_us(self.cache)
        samples = self._samples(compiled.config.digest(), center, b.noise, self.iterations)
        return TrialResult.timed(
            samples, compile_s=compiled.compile_s, rel_error=0.0, timing="fake", cache=self.cache
        )

    def retime(self, compiled: Compiled, *, iterations: int, program: bool = False) -> TrialResult:
        """``iterations`` samples of the config's true time; ``program``: three blocks of its
        true time plus ``call_us`` (what a program's loop pays per call)."""
        b: FakeBehaviour = compiled.executable
        self._act(b, Stage.TIME)
        if program:
            samples = self._samples(compiled.config.digest() + "/program",
                                    b.true_us(self.cache) + b.call_us, b.noise, PROGRAM_BLOCKS)
            return TrialResult.timed(samples, compile_s=compiled.compile_s, rel_error=None,
                                     timing=PROGRAM_METHOD, cache=self.cache)
        samples = self._samples(compiled.config.digest(), b.true_us(self.cache), b.noise,
                                iterations)
        return TrialResult.timed(samples, compile_s=compiled.compile_s, rel_error=None,
                                 timing="fake", cache=self.cache)

    def baseline(
        self, kernel: Kernel, problem: Problem, *, iterations: int | None = None,
        program: bool = False, check: bool = True,
    ) -> TrialResult:
        """``baseline_us`` of the problem's shape (``baseline_cold_us`` when cold), with the
        shape's ``baseline_noise`` (relative standard deviation in per mille: shape values are
        whole numbers), default 100 µs, no noise; ``program``: three blocks of that plus the
        shape's ``baseline_call_us`` (default 0). ``baseline_wrong`` (1): its output is off the
        reference, a WRONG_RESULT where ``check``ed."""
        dims = problem.dims
        if check and dims.get("baseline_wrong"):
            return wrong_result(0.5, 0.02, 0.0, when=" of the baseline")
        cost = float(dims.get("baseline_us", 100))
        if self.cache == "cold" and "baseline_cold_us" in dims:
            cost = float(dims["baseline_cold_us"])
        noise = float(dims.get("baseline_noise", 0)) / 1000 if "baseline_noise" in dims else 0.0
        n = iterations or self.iterations
        timing = "fake"
        if program:
            cost += float(dims.get("baseline_call_us", 0))
            n, timing = PROGRAM_BLOCKS, PROGRAM_METHOD
        samples = self._samples("baseline", cost, noise, n) if noise else [cost] * n
        return TrialResult.timed(
            samples, compile_s=0.0, rel_error=0.0 if check else None, timing=timing,
            cache=self.cache,
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
        write_output(path, json.dumps({"displayTimeUnit": "ns", "traceEvents": events}))
        return parse_trace_files([path])

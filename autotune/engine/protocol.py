"""What the tuning side needs from an engine: :class:`EngineLike`.

:class:`autotune.engine.dispatcher.Engine` is the engine; tests drive the runner with small
in-process fakes, so the runner asks for this protocol rather than the class. Only the
methods every engine has are in it. The runner also uses, when an engine has them (it looks
them up with ``getattr``):

* ``cache_policy`` (str, default "warm") and ``gpus`` (the GPU indices the engine uses);
* ``submit_baseline(kernel_name, problem) -> Future[TrialResult]`` and
  ``submit_trace(kernel_name, problem, config, out_dir, profile_space) -> Future``, so that
  baselines and traces interleave with trials;
* ``confirm(...)`` (see :meth:`autotune.engine.dispatcher.Engine.confirm`): an engine without
  it gets no confirmation round;
* ``in_flight`` and ``kill_workers`` (the CLI's interrupt handling);
* ``warm_problems()`` (see :meth:`autotune.engine.dispatcher.Engine.warm_problems`): the
  problems the engine's next free worker has worked on, which the scheduler asks first.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Protocol

from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem

__all__ = ["EngineLike"]


class EngineLike(Protocol):
    """Measures configs of a kernel on one device: trials, baselines and traces."""

    def device_info(self) -> DeviceInfo: ...

    def submit(self, kernel_name: str, problem: Problem, config: Config) -> Future[TrialResult]: ...

    def baseline(self, kernel_name: str, problem: Problem) -> TrialResult: ...

    def trace(
        self, kernel_name: str, problem: Problem, config: Config, out_dir: str, profile_space: int
    ) -> Mapping[str, tuple[float, int]]: ...

    @property
    def parallelism(self) -> int: ...

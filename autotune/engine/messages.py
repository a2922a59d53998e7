"""The engine's pipe messages: what the engine and a worker process send each other.

Every message is a frozen dataclass (pickled over the socket pair), read by field, never by
position. The engine sends a worker its :class:`WorkerSpec` first, then :class:`RunTask` and
finally :class:`Stop`; a worker answers with :class:`Ready` (or :class:`Fatal`), then
:class:`Heartbeat`, :class:`StageReached`, :class:`Result` and :class:`Failed` per task, and
:class:`Retire` when its device failed. No jax here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.errors import AutotuneError
from autotune.space.outcomes import DeviceInfo
from autotune.space.problem import Config, Problem

__all__ = [
    "EngineError",
    "WorkerSpec",
    "TaskMsg",
    "RunTask",
    "Stop",
    "Ready",
    "Fatal",
    "Retire",
    "Heartbeat",
    "StageReached",
    "Result",
    "Failed",
    "ToWorker",
    "FromWorker",
]


class EngineError(AutotuneError, RuntimeError):
    """The engine cannot do what was asked: workers do not start, it is closed, a trace failed."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """How a worker process is set up: the first thing the engine sends it."""

    mode: str
    iterations: int | None
    compile_threads: int
    allow_import: bool
    log_level: int
    lock_path: str | None = None  # the GPU's lock file, shared by the workers of that GPU
    cache: str = "warm"  # the cache policy of every timing (autotune.space.outcomes)
    keep_compiled: int = 5  # executables of its fastest configs a worker keeps for re-timing
    compilation_cache: str | None = None  # JAX's persistent compilation cache: its folder
    engine_pid: int | None = None  # the engine's process, which the worker dies with


@dataclasses.dataclass(frozen=True)
class TaskMsg:
    """One task for a worker."""

    id: int
    # "trial" | "baseline" | "trace" | "retime" (config None: the baseline) | "round" (a
    # confirmation round's programs, extra["programs"], None for the baseline; config None)
    kind: str
    kernel_name: str
    problem: Problem
    config: Config | None
    extra: dict[str, Any]


# -- engine -> worker ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunTask:
    """Run ``task`` (compile it in a compile thread, or queue it for the device)."""

    task: TaskMsg


@dataclasses.dataclass(frozen=True)
class Stop:
    """Finish what is queued, then exit."""


# -- worker -> engine ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ready:
    """The worker's evaluator is up on ``device``; ``pid`` is the worker's process id."""

    device: DeviceInfo
    pid: int


@dataclasses.dataclass(frozen=True)
class Fatal:
    """The worker could not start (``error``: the exception, in one line; its traceback is in
    the worker's log); it exits."""

    error: str


@dataclasses.dataclass(frozen=True)
class Retire:
    """The device failed after a run; the worker exits and must be replaced."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """The worker is alive (sent every heartbeat period by its own thread)."""

    t: float


@dataclasses.dataclass(frozen=True)
class StageReached:
    """Task ``task_id`` reached ``stage`` at wall-clock time ``t``."""

    task_id: int
    stage: str
    t: float


@dataclasses.dataclass(frozen=True)
class Result:
    """Task ``task_id`` ended with ``result`` (a TrialResult, or a trace's regions) at ``t``."""

    task_id: int
    result: Any
    t: float


@dataclasses.dataclass(frozen=True)
class Failed:
    """Task ``task_id`` raised ``error`` (not the config's failure: the caller's) at ``t``."""

    task_id: int
    error: BaseException
    traceback: str
    t: float


ToWorker = RunTask | Stop
FromWorker = Ready | Fatal | Retire | Heartbeat | StageReached | Result | Failed

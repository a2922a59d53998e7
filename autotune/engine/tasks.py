"""The engine's tasks: the queue of submitted work, handing tasks to idle workers, the
messages that move a task through its stages, its time limits, and resolving its future once.

:class:`_TaskQueue` is a part of :class:`~.dispatcher.Engine` (its base class): the methods
run on the engine's dispatcher thread, over the engine's own state and lock."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import time
from typing import TYPE_CHECKING, Any

from autotune.engine.messages import (
    EngineError,
    Failed,
    Fatal,
    FromWorker,
    Heartbeat,
    Ready,
    Result,
    Retire,
    RunTask,
    StageReached,
    TaskMsg,
)
from autotune.space.outcomes import DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

if TYPE_CHECKING:
    from autotune.engine.workers import _WorkerHandle

log = logging.getLogger("autotune.engine.dispatcher")

# Stages (see autotune.evaluation.contract.Stage) in which a config's own code is executing. "device" is
# the engine's own: the worker holds its GPU's lock and makes the inputs and the reference.
# "prepare": a baseline's host work ahead of the GPU's lock (Evaluator.prepare), up to "prepared".
_COMPILE_STAGES = frozenset({"build", "lower", "compile", "prepare"})
_RUN_STAGES = frozenset({"device", "run", "check", "time"})
_ACTIVE_STAGES = _COMPILE_STAGES | _RUN_STAGES

# Floors of the default time limits, by mode: (compile_s, run_s). The limit is the floor or 10x
# the slowest stage seen so far, whichever is larger. Interpret-mode runs are slow (PLATFORM.md:
# a 256^3 matmul takes 3.6 s per call), so its run floor is high.
_TIMEOUT_FLOORS = {DeviceKind.GPU: (60.0, 30.0), DeviceKind.INTERPRET: (120.0, 600.0),
                   DeviceKind.FAKE: (30.0, 30.0)}
_TIMEOUT_FACTOR = 10.0

# A worker whose heartbeat is older than this when a stage overruns may be stuck in a thread
# that holds the GIL; then the overrunning config is not blamed but re-run alone.
_HEARTBEAT_STALE_S = 2.0



def default_timeout_s(slowest_seen_s: float | None, *, floor_s: float) -> float:
    """The time limit of a stage when none is given: ``max(floor_s, 10 x slowest seen)``."""
    return max(floor_s, _TIMEOUT_FACTOR * (slowest_seen_s or 0.0))


def _gpu_load(workers: list[_WorkerHandle]) -> collections.Counter[int | None]:
    """Tasks in flight per GPU, over ``workers``."""
    load: collections.Counter[int | None] = collections.Counter()
    for w in workers:
        load[w.gpu] += len(w.tasks)
    return load


def _open_workers(workers: list[_WorkerHandle], capacity: int) -> list[_WorkerHandle]:
    """The workers with room for another task (none running a crash suspect alone)."""
    return [w for w in workers if not w.isolating and len(w.tasks) < capacity]


def _next_in_line(w: _WorkerHandle, gpu_load: collections.Counter[int | None]) -> tuple[int, int]:
    """The order in which open workers take tasks: the least loaded worker first, then the one
    on the least loaded GPU, so no worker idles while work waits."""
    return len(w.tasks), gpu_load[w.gpu]


@dataclasses.dataclass(eq=False)
class _Task:
    msg: TaskMsg
    future: concurrent.futures.Future
    isolate: bool = False
    slot: int | None = None  # only this worker slot may take it (warm-ups)
    done: bool = False
    stage: str = "queued"
    compile_t0: float | None = None  # monotonic, when building began
    compiled_t: float | None = None
    run_t0: float | None = None  # when its worker got the GPU (not when it began waiting)

    @property
    def id(self) -> int:
        return self.msg.id

    def reset(self) -> None:
        self.stage = "queued"
        self.compile_t0 = self.compiled_t = self.run_t0 = None


class _TaskQueue:
    """The task half of :class:`~.dispatcher.Engine`."""

    @property
    def _capacity(self) -> int:
        """Tasks a worker holds when full: a config per compile thread plus one compiled and
        waiting for (or using) its GPU."""
        return self.compile_threads + 1

    def _submit(
        self,
        kind: str,
        kernel_name: str,
        problem: Problem,
        config: Config | None,
        extra: dict[str, Any],
        *,
        urgent: bool = False,
        slot: int | None = None,
    ) -> concurrent.futures.Future:
        if not isinstance(problem, Problem):
            raise TypeError(
                f"problem must be an autotune.Problem, but got {type(problem).__name__}."
            )
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closing:
                raise EngineError("The engine is closed; create a new one to submit more work.")
            if self._broken:
                raise EngineError(self._broken)
            task = _Task(
                TaskMsg(next(self._ids), kind, kernel_name, problem, config, extra),
                future,
                slot=slot,
            )
            future.task_id = task.id  # type: ignore[attr-defined]
            if urgent:
                self._pending.appendleft(task)
            else:
                self._pending.append(task)
            self._submitted += 1
        self._wake()
        return future

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # already woken: the pipe is full

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    closing, cancel, kill = self._closing, self._cancel_pending, self._kill_running
                if cancel:
                    self._cancel_queued()
                if closing and (kill or not self._has_work()):
                    break
                live = [w for w in self._workers.values() if w is not None]
                waitables: list[Any] = [self._wake_r]
                for w in live:
                    waitables.append(w.conn)
                    if w.sentinel is not None:
                        waitables.append(w.sentinel)
                ready = multiprocessing.connection.wait(waitables, timeout=0.1)
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                for w in live:
                    if w.conn in ready or (w.sentinel is not None and w.sentinel in ready):
                        self._drain(w)
                self._reap()
                self._check_timeouts()
                self._respawn()
                self._dispatch()
        except Exception as e:  # noqa: BLE001 - never leave futures hanging
            log.exception("The engine's dispatcher failed.")
            with self._lock:
                self._broken = f"The engine's dispatcher failed: {e!r}"
            self._fail_all(EngineError(f"The engine's dispatcher failed: {e!r}"))
        finally:
            self._stop_workers()

    def _has_work(self) -> bool:
        with self._lock:
            queued = bool(self._pending or self._isolation)
        return queued or any(w is not None and w.tasks for w in self._workers.values())

    def _cancel_queued(self) -> None:
        with self._lock:
            tasks = list(self._pending) + list(self._isolation)
            self._pending.clear()
            self._isolation.clear()
        for task in tasks:
            if not task.future.cancel():
                self._resolve(task, exc=EngineError("The engine closed before this task ran."))
            else:
                task.done = True

    def _drain(self, w: _WorkerHandle) -> None:
        while True:
            try:
                if not w.conn.poll():
                    return
                msg = w.conn.recv()
            except (EOFError, OSError):
                w.eof = True
                return
            self._on_message(w, msg)

    def _on_message(self, w: _WorkerHandle, msg: FromWorker) -> None:
        now = time.monotonic()
        if isinstance(msg, Heartbeat):
            w.last_hb = now
        elif isinstance(msg, Ready):
            w.state, w.device, w.pid, w.last_hb = "ready", msg.device, msg.pid, now
            self._startup_failures = 0
            self._ready_event.set()
        elif isinstance(msg, Fatal):
            w.fatal = msg.error
        elif isinstance(msg, Retire):
            w.state = "retiring"
            log.info("Worker %d retires: %s", w.slot, msg.reason)
        elif isinstance(msg, StageReached):
            task = w.tasks.get(msg.task_id)
            if task is None:
                return
            stage = msg.stage
            if stage in ("build", "prepare"):
                task.compile_t0 = now
            elif stage in ("compiled", "prepared"):
                task.compiled_t = now
                if task.compile_t0 is not None:
                    self._slowest_compile_s = max(self._slowest_compile_s, now - task.compile_t0)
            elif stage == "device" or (stage == "run" and task.run_t0 is None):
                task.run_t0 = now  # the run limit counts from here: lock waits are not hangs
            task.stage = stage
            self._event(task, w, stage, msg.t)
        elif isinstance(msg, (Result, Failed)):
            task = w.tasks.pop(msg.task_id, None)
            if task is None:
                return
            self._event(task, w, "done", msg.t)
            if task.run_t0 is not None:
                self._slowest_run_s = max(self._slowest_run_s, now - task.run_t0)
            elif task.compile_t0 is not None and task.compiled_t is None:
                self._slowest_compile_s = max(self._slowest_compile_s, now - task.compile_t0)
            with self._lock:
                self._by_worker[w.slot] += 1
            if isinstance(msg, Result):
                result = msg.result
                if (
                    task.msg.kind in ("trial", "retime", "baseline")
                    and isinstance(result, TrialResult)
                    and result.ok
                ):
                    digest = None if task.msg.config is None else task.msg.config.digest()
                    with self._lock:
                        self._timed_on[(task.msg.problem, digest)] = w.slot
                self._resolve(task, result=result)
            else:
                exc = msg.error
                if isinstance(exc, BaseException) and msg.traceback:
                    log.debug("Task %d failed in worker %d:\n%s", task.id, w.slot, msg.traceback)
                self._resolve(task, exc=exc)

    def _resolve(
        self, task: _Task, *, result: Any = None, exc: BaseException | None = None
    ) -> None:
        """Resolves a task's future, once; a cancelled future is left as it is."""
        if task.done:
            return
        task.done = True
        with self._lock:
            self._resolved += 1
        future = task.future
        if future.done():
            return
        try:
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled meanwhile

    def _requeue(self, tasks: list[_Task], *, isolate: bool) -> None:
        with self._lock:
            for task in sorted(tasks, key=lambda t: t.id, reverse=True):
                if task.done:
                    continue
                task.reset()
                if isolate or task.isolate:
                    if not task.isolate:
                        self._isolated_reruns += 1
                    task.isolate = True
                    self._isolation.appendleft(task)
                else:
                    self._pending.appendleft(task)

    def _limit_s(self, task: _Task, stage: str) -> float:
        floor_compile, floor_run = _TIMEOUT_FLOORS[self.mode]
        compile_limit = self.compile_timeout_s or default_timeout_s(
            self._slowest_compile_s, floor_s=floor_compile
        )
        run_limit = self.trial_timeout_s or default_timeout_s(
            self._slowest_run_s, floor_s=floor_run
        )
        if stage in _COMPILE_STAGES:
            return compile_limit
        if task.msg.kind == "retime":
            # Times the program again with more iterations (and compiles a baseline anew).
            return compile_limit + run_limit * max(1.0, task.msg.extra["iterations"] / 20)
        if task.msg.kind != "trial":
            return compile_limit + run_limit  # a baseline or trace compiles in its run
        return run_limit

    def _overdue(self, task: _Task, now: float) -> tuple[float, float] | None:
        """(elapsed, limit) when the task's current stage is past its limit."""
        if task.stage in _COMPILE_STAGES and task.compile_t0 is not None:
            elapsed, limit = now - task.compile_t0, self._limit_s(task, task.stage)
        elif task.stage in _RUN_STAGES and task.run_t0 is not None:
            elapsed, limit = now - task.run_t0, self._limit_s(task, task.stage)
        else:
            return None
        return (elapsed, limit) if elapsed > limit else None

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for w in list(self._workers.values()):
            if w is None:
                continue
            if w.state == "starting" and now - w.started > self.startup_timeout_s:
                w.fatal = w.fatal or f"no sign of life {self.startup_timeout_s:.0f} s after start"
                self._kill(w)
                continue
            if w.state != "ready":
                continue
            over = {t.id: o for t in w.tasks.values() if (o := self._overdue(t, now))}
            if not over:
                continue
            active = [t for t in w.tasks.values() if t.stage in _ACTIVE_STAGES]
            alive = now - w.last_hb < _HEARTBEAT_STALE_S
            self._kill(w, dump_stacks=True)
            with self._lock:
                self._timeouts += 1
            tasks = list(w.tasks.values())
            w.tasks.clear()
            if alive or len(active) == 1:
                blamed = [t for t in tasks if t.id in over]
                suspects: list[_Task] = []
            else:
                blamed, suspects = [], active
            tail = self._stderr_tail(w)
            for task in blamed:
                elapsed, limit = over[task.id]
                self._resolve(
                    task,
                    result=TrialResult.failed(
                        Outcome.TIMEOUT,
                        f"[{task.stage}] no result {elapsed:.1f} s after the "
                        f"{'compile began' if task.stage in _COMPILE_STAGES else 'run got the GPU'} "
                        f"(limit {limit:.1f} s); worker {w.slot} (gpu {w.gpu}, pid {w.pid}) "
                        f"was killed and replaced.\n--- worker stderr tail ---\n{tail}",
                        compile_s=self._compile_s(task),
                    ),
                )
            self._requeue(suspects, isolate=True)
            self._requeue(
                [t for t in tasks if t not in blamed and t not in suspects], isolate=False
            )

    def _compile_s(self, task: _Task) -> float | None:
        if task.compile_t0 is not None and task.compiled_t is not None:
            return task.compiled_t - task.compile_t0
        return None

    def _dispatch(self) -> None:
        ready = [w for w in self._workers.values() if w is not None and w.state == "ready"]
        if not ready:
            return
        capacity = self._capacity
        sends: list[tuple[_WorkerHandle, _Task]] = []
        with self._lock:
            # Suspects of a crash run alone, on a worker with nothing else in flight; other work
            # waits meanwhile so that a worker drains and takes them.
            for w in ready:
                if not self._isolation:
                    break
                if not w.tasks:
                    task = self._pop_live(self._isolation)
                    if task is not None:
                        task.isolate = True
                        w.tasks[task.id] = task
                        sends.append((w, task))
            if not self._isolation:
                gpu_load = _gpu_load(ready)
                skipped: list[_Task] = []  # pinned to a worker that is full or not ready
                while self._pending:
                    open_ = _open_workers(ready, capacity)
                    if not open_:
                        break
                    task = self._pop_live(self._pending)
                    if task is None:
                        break
                    if task.slot is not None:
                        open_ = [w for w in open_ if w.slot == task.slot]
                        if not open_:
                            skipped.append(task)
                            continue
                    # Next in line; of those, one that has worked on the problem (its first-use
                    # costs paid).
                    problem = task.msg.problem
                    w = min(open_, key=lambda w: (*_next_in_line(w, gpu_load),
                                                  problem not in w.problems, w.slot))
                    gpu_load[w.gpu] += 1
                    w.tasks[task.id] = task
                    w.problems.add(problem)
                    sends.append((w, task))
                self._pending.extendleft(reversed(skipped))
        for w, task in sends:
            task.stage = "sent"
            try:
                w.conn.send(RunTask(task.msg))
            except (OSError, EOFError, BrokenPipeError):
                w.eof = True  # reaped on the next pass; the task is re-run

    @staticmethod
    def _pop_live(tasks: collections.deque[_Task]) -> _Task | None:
        while tasks:
            task = tasks.popleft()
            if not task.done and not task.future.cancelled():
                return task
            task.done = True
        return None

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            tasks = list(self._pending) + list(self._isolation)
            self._pending.clear()
            self._isolation.clear()
        for w in self._workers.values():
            if w is not None:
                tasks += list(w.tasks.values())
                w.tasks.clear()
        for task in tasks:
            self._resolve(task, exc=exc)

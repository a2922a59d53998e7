"""The engine's tasks: the queue of submitted work, handing tasks to idle workers, the
messages that move a task through its stages, its time limits, and resolving its future once.

:class:`TaskQueue` is an object the :class:`~.dispatcher.Engine` owns, beside its
:class:`~.workers.WorkerPool`: it holds every task not yet resolved (queued, or in a worker's
``tasks``), the counts and the timeline, and is told by the engine's dispatcher thread what the
workers said and which of them died or overran. It shares the engine's lock."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING, Any

from autotune.engine.messages import (
    EngineError,
    Failed,
    Result,
    RunTask,
    StageReached,
    TaskMsg,
)
from autotune.space.outcomes import DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

if TYPE_CHECKING:
    from autotune.engine.workers import WorkerHandle

log = logging.getLogger("autotune.engine.dispatcher")

# Stages (see autotune.evaluation.contract.Stage) in which a config's own code is executing. "device" is
# the engine's own: the worker holds its GPU's lock and makes the inputs and the reference.
# "prepare": a baseline's host work ahead of the GPU's lock (Evaluator.prepare), up to "prepared".
COMPILE_STAGES = frozenset({"build", "lower", "compile", "prepare"})
RUN_STAGES = frozenset({"device", "run", "check", "time"})
ACTIVE_STAGES = COMPILE_STAGES | RUN_STAGES

# Floors of the default time limits, by mode: (compile_s, run_s). The limit is the floor or 10x
# the slowest stage seen so far, whichever is larger. Interpret-mode runs are slow (PLATFORM.md:
# a 256^3 matmul takes 3.6 s per call), so its run floor is high.
TIMEOUT_FLOORS = {DeviceKind.GPU: (60.0, 30.0), DeviceKind.INTERPRET: (120.0, 600.0),
                  DeviceKind.FAKE: (30.0, 30.0)}
TIMEOUT_FACTOR = 10.0

# A worker whose heartbeat is older than this when a stage overruns may be stuck in a thread
# that holds the GIL; then the overrunning config is not blamed but re-run alone.
HEARTBEAT_STALE_S = 2.0


def default_timeout_s(slowest_seen_s: float | None, *, floor_s: float) -> float:
    """The time limit of a stage when none is given: ``max(floor_s, 10 x slowest seen)``."""
    return max(floor_s, TIMEOUT_FACTOR * (slowest_seen_s or 0.0))


def timed_key(problem: Problem, config: Config | None) -> tuple[Problem, str | None]:
    """The key of :attr:`TaskQueue.timed_on`: the problem and the config's digest (None: the
    baseline)."""
    return problem, None if config is None else config.digest()


def gpu_load(workers: list[WorkerHandle]) -> collections.Counter[int | None]:
    """Tasks in flight per GPU, over ``workers``."""
    load: collections.Counter[int | None] = collections.Counter()
    for w in workers:
        load[w.gpu] += len(w.tasks)
    return load


def open_workers(workers: list[WorkerHandle], capacity: int) -> list[WorkerHandle]:
    """The workers with room for another task (none running a crash suspect alone)."""
    return [w for w in workers if not w.isolating and len(w.tasks) < capacity]


def next_in_line(w: WorkerHandle, load: collections.Counter[int | None]) -> tuple[int, int]:
    """The order in which open workers take tasks: the least loaded worker first, then the one
    on the least loaded GPU, so no worker idles while work waits."""
    return len(w.tasks), load[w.gpu]


@dataclasses.dataclass(frozen=True)
class StageEvent:
    """One step of one task, as the worker saw it: ``t`` is wall-clock (``time.time()``)."""

    task_id: int
    worker: int  # index of the worker slot (workers_per_gpu of them per GPU)
    gpu: int | None
    # build, lower, compile, compiled (waiting for the GPU), device (the GPU's lock acquired:
    # inputs and reference), run, check, time, done (sent before the lock is released)
    stage: str
    t: float
    kind: str = "trial"  # the task's kind: trial, baseline, trace, retime, round
    problem: Problem | None = None


def device_busy_s(timeline: Iterable[StageEvent], tasks: Container[int] | None = None) -> float:
    """Seconds the GPUs were busy in ``timeline`` (``Engine.timeline()``): per GPU, the union of
    the tasks' spans from ``device`` (the worker got the GPU's lock) to ``done``, summed over
    the GPUs; only the tasks whose ids are in ``tasks`` when it is given."""
    spans: dict[int | None, list[tuple[float, float]]] = {}
    got: dict[int, float] = {}
    for e in timeline:
        if tasks is not None and e.task_id not in tasks:
            continue
        if e.stage == "device":
            got[e.task_id] = e.t
        elif e.stage == "done" and e.task_id in got:
            spans.setdefault(e.gpu, []).append((got.pop(e.task_id), e.t))
    total = 0.0
    for intervals in spans.values():
        end = float("-inf")
        for a, b in sorted(intervals):
            if b > end:
                total += b - max(a, end)
                end = b
    return total


@dataclasses.dataclass(eq=False)
class Task:
    """One submitted piece of work and its future, as it moves through its stages."""

    msg: TaskMsg
    future: concurrent.futures.Future[Any]
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

    @property
    def compile_s(self) -> float | None:
        """How long its compile took, once it has compiled."""
        if self.compile_t0 is not None and self.compiled_t is not None:
            return self.compiled_t - self.compile_t0
        return None

    def reset(self) -> None:
        self.stage = "queued"
        self.compile_t0 = self.compiled_t = self.run_t0 = None


class TaskQueue:
    """Every task of an engine from submission to its resolved future.

    Args:
      lock: the engine's lock (shared with its :class:`~.workers.WorkerPool`); every attribute
        that another thread reads is changed under it.
      mode: the engine's device kind, for the time limits' floors.
      capacity: tasks a worker holds when full: a config per compile thread plus one compiled
        and waiting for (or using) its GPU.
      trial_timeout_s, compile_timeout_s: the limits given to the engine (None: derived).

    Its methods other than :meth:`submit`, :meth:`close` and :meth:`wake` run on the engine's
    dispatcher thread. A self-pipe (:attr:`wake_fd`) wakes that thread when work arrives.
    """

    def __init__(
        self,
        lock: threading.Lock,
        *,
        mode: str,
        capacity: int,
        trial_timeout_s: float | None,
        compile_timeout_s: float | None,
    ) -> None:
        self.lock = lock
        self.mode = mode
        self.capacity = capacity
        self.trial_timeout_s = trial_timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.pending: collections.deque[Task] = collections.deque()
        self.isolation: collections.deque[Task] = collections.deque()  # crash suspects
        self._ids = itertools.count()
        self.closing = False
        self.cancel_pending = False
        self.kill_running = False
        self.broken: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.slowest_compile_s = 0.0
        self.slowest_run_s = 0.0
        # (problem, config digest or None for the baseline) -> the worker slot that timed it
        # last: the confirmation round times it there again, with the executable it kept.
        self.timed_on: dict[tuple[Problem, str | None], int] = {}
        self.timeline: list[StageEvent] = []
        self.submitted = 0
        self.resolved = 0
        self.by_worker: collections.Counter[int] = collections.Counter()
        self.crashes = 0
        self.timeouts = 0
        self.isolated_reruns = 0

    # -- from any thread ------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        kernel_name: str,
        problem: Problem,
        config: Config | None,
        extra: dict[str, Any],
        *,
        urgent: bool = False,
        slot: int | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Queues a task (``urgent``: ahead of the others; ``slot``: for that worker only)."""
        if not isinstance(problem, Problem):
            raise TypeError(
                f"problem must be an autotune.Problem, but got {type(problem).__name__}."
            )
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self.lock:
            if self.closing:
                raise EngineError("The engine is closed; create a new one to submit more work.")
            if self.broken:
                raise EngineError(self.broken)
            task = Task(
                TaskMsg(next(self._ids), kind, kernel_name, problem, config, extra),
                future,
                slot=slot,
            )
            future.task_id = task.id  # type: ignore[attr-defined]
            if urgent:
                self.pending.appendleft(task)
            else:
                self.pending.append(task)
            self.submitted += 1
        self.wake()
        return future

    def close(self, *, cancel_pending: bool, kill_running: bool) -> None:
        """Takes no more work; ``cancel_pending``: drops what has not started; ``kill_running``:
        the workers are to be killed, failing what they hold."""
        with self.lock:
            self.closing = True
            self.cancel_pending = self.cancel_pending or cancel_pending or kill_running
            self.kill_running = self.kill_running or kill_running

    @property
    def wake_fd(self) -> int:
        """Readable once :meth:`wake` was called (and until :meth:`clear_wake`)."""
        return self._wake_r

    def wake(self) -> None:
        with self.lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # already woken: the pipe is full

    def clear_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass

    def close_wake(self) -> None:
        """Closes the wake pipe, once the dispatcher thread has ended."""
        with self.lock:
            if self._wake_w >= 0:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    # -- on the dispatcher thread ---------------------------------------------------------------

    def mark_broken(self, message: str) -> None:
        """No more work is taken; :meth:`submit` raises ``message``."""
        with self.lock:
            self.broken = message

    def has_work(self, workers: list[WorkerHandle]) -> bool:
        """Anything queued, or held by one of ``workers``."""
        with self.lock:
            queued = bool(self.pending or self.isolation)
        return queued or any(w.tasks for w in workers)

    def cancel_queued(self) -> None:
        with self.lock:
            tasks = list(self.pending) + list(self.isolation)
            self.pending.clear()
            self.isolation.clear()
        for task in tasks:
            if not task.future.cancel():
                self.resolve(task, exc=EngineError("The engine closed before this task ran."))
            else:
                task.done = True

    def on_message(self, w: WorkerHandle, msg: StageReached | Result | Failed) -> None:
        """A task's stage or its end, as worker ``w`` sent it."""
        now = time.monotonic()
        if isinstance(msg, StageReached):
            task = w.tasks.get(msg.task_id)
            if task is None:
                return
            stage = msg.stage
            if stage in ("build", "prepare"):
                task.compile_t0 = now
            elif stage in ("compiled", "prepared"):
                task.compiled_t = now
                if task.compile_t0 is not None:
                    self.slowest_compile_s = max(self.slowest_compile_s, now - task.compile_t0)
            elif stage == "device" or (stage == "run" and task.run_t0 is None):
                task.run_t0 = now  # the run limit counts from here: lock waits are not hangs
            task.stage = stage
            self.event(task, w, stage, msg.t)
            return
        done = w.tasks.pop(msg.task_id, None)
        if done is None:
            return
        self.event(done, w, "done", msg.t)
        if done.run_t0 is not None:
            self.slowest_run_s = max(self.slowest_run_s, now - done.run_t0)
        elif done.compile_t0 is not None and done.compiled_t is None:
            self.slowest_compile_s = max(self.slowest_compile_s, now - done.compile_t0)
        with self.lock:
            self.by_worker[w.slot] += 1
        if isinstance(msg, Result):
            result = msg.result
            if (
                done.msg.kind in ("trial", "retime", "baseline")
                and isinstance(result, TrialResult)
                and result.ok
            ):
                with self.lock:
                    self.timed_on[timed_key(done.msg.problem, done.msg.config)] = w.slot
            elif done.msg.kind == "round" and isinstance(result, list):
                with self.lock:  # the round's worker keeps what it compiled for it
                    for config, timed in zip(done.msg.extra["programs"], result, strict=True):
                        if isinstance(timed, TrialResult) and timed.ok:
                            self.timed_on[timed_key(done.msg.problem, config)] = w.slot
            self.resolve(done, result=result)
        else:
            exc = msg.error
            if isinstance(exc, BaseException) and msg.traceback:
                log.debug("Task %d failed in worker %d:\n%s", done.id, w.slot, msg.traceback)
            self.resolve(done, exc=exc)

    def event(self, task: Task, w: WorkerHandle, stage: str, t: float) -> None:
        with self.lock:
            if len(self.timeline) < 1_000_000:
                self.timeline.append(StageEvent(task.id, w.slot, w.gpu, stage, t,
                                                task.msg.kind, task.msg.problem))

    def resolve(
        self, task: Task, *, result: Any = None, exc: BaseException | None = None
    ) -> None:
        """Resolves a task's future, once; a cancelled future is left as it is."""
        if task.done:
            return
        task.done = True
        with self.lock:
            self.resolved += 1
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

    def requeue(self, tasks: list[Task], *, isolate: bool) -> None:
        """Queues ``tasks`` again, first in line (``isolate``: each to run alone)."""
        with self.lock:
            for task in sorted(tasks, key=lambda t: t.id, reverse=True):
                if task.done:
                    continue
                task.reset()
                if isolate or task.isolate:
                    if not task.isolate:
                        self.isolated_reruns += 1
                    task.isolate = True
                    self.isolation.appendleft(task)
                else:
                    self.pending.appendleft(task)

    def limit_s(self, task: Task, stage: str) -> float:
        """The time limit of ``task`` in ``stage``."""
        floor_compile, floor_run = TIMEOUT_FLOORS[DeviceKind(self.mode)]
        compile_limit = self.compile_timeout_s or default_timeout_s(
            self.slowest_compile_s, floor_s=floor_compile
        )
        run_limit = self.trial_timeout_s or default_timeout_s(
            self.slowest_run_s, floor_s=floor_run
        )
        if stage in COMPILE_STAGES:
            # A confirmation round compiles those of its programs its worker did not keep.
            return compile_limit * (len(task.msg.extra["programs"]) if task.msg.kind == "round"
                                    else 1)
        if task.msg.kind == "retime":
            # Times the program again with more iterations (and compiles a baseline anew).
            return compile_limit + run_limit * max(1.0, float(task.msg.extra["iterations"]) / 20)
        if task.msg.kind == "round":
            # Several programs, each timed as a retime is (a baseline compiled anew).
            n = len(task.msg.extra["programs"])
            return compile_limit + run_limit * n * max(
                1.0, float(task.msg.extra["iterations"]) / 20)
        if task.msg.kind != "trial":
            return compile_limit + run_limit  # a baseline or trace compiles in its run
        return run_limit

    def overdue(self, task: Task, now: float) -> tuple[float, float] | None:
        """(elapsed, limit) when the task's current stage is past its limit."""
        if task.stage in COMPILE_STAGES and task.compile_t0 is not None:
            elapsed, limit = now - task.compile_t0, self.limit_s(task, task.stage)
        elif task.stage in RUN_STAGES and task.run_t0 is not None:
            elapsed, limit = now - task.run_t0, self.limit_s(task, task.stage)
        else:
            return None
        return (elapsed, limit) if elapsed > limit else None

    def blame_timeout(
        self,
        w: WorkerHandle,
        over: dict[int, tuple[float, float]],
        active: list[Task],
        *,
        alive: bool,
        tail: str,
    ) -> None:
        """Worker ``w`` was killed for the overdue tasks ``over`` (id -> (elapsed, limit)):
        with its heartbeat ``alive`` (or one task executing) those are ``TIMEOUT``; else the
        ``active`` ones are re-run alone. The others are queued again."""
        with self.lock:
            self.timeouts += 1
        tasks = list(w.tasks.values())
        w.tasks.clear()
        if alive or len(active) == 1:
            blamed = [t for t in tasks if t.id in over]
            suspects: list[Task] = []
        else:
            blamed, suspects = [], active
        for task in blamed:
            elapsed, limit = over[task.id]
            self.resolve(
                task,
                result=TrialResult.failed(
                    Outcome.TIMEOUT,
                    f"[{task.stage}] no result {elapsed:.1f} s after the "
                    f"{'compile began' if task.stage in COMPILE_STAGES else 'run got the GPU'} "
                    f"(limit {limit:.1f} s); worker {w.slot} (gpu {w.gpu}, pid {w.pid}) "
                    f"was killed and replaced.\n--- worker stderr tail ---\n{tail}",
                    compile_s=task.compile_s,
                ),
            )
        self.requeue(suspects, isolate=True)
        self.requeue([t for t in tasks if t not in blamed and t not in suspects], isolate=False)

    def blame_crash(self, w: WorkerHandle, tasks: list[Task], *, how: str, tail: str) -> None:
        """Worker ``w`` died unasked (``how``) holding ``tasks``: the one executing is
        ``CRASHED``; several executing are re-run alone; the rest are queued again."""
        with self.lock:
            self.crashes += 1
        active = [t for t in tasks if t.stage in ACTIVE_STAGES]
        log.warning("Worker %d (gpu %s, pid %s) died: %s; its log: %s", w.slot, w.gpu, w.pid,
                    how, w.log_path)
        if len(active) == 1:
            (task,) = active
            self.resolve(
                task,
                result=dataclasses.replace(TrialResult.failed(
                    Outcome.CRASHED,
                    f"[{task.stage}] worker {w.slot} (gpu {w.gpu}, pid {w.pid}) {how} while "
                    f"this config was the only one executing (last stage: {task.stage}; "
                    f"worker log {w.log_path})."
                    f"\n--- worker stderr tail ---\n{tail}",
                    compile_s=task.compile_s,
                ), log_path=w.log_path),
            )
            self.requeue([t for t in tasks if t is not task], isolate=False)
        else:
            self.requeue(active, isolate=True)
            self.requeue([t for t in tasks if t not in active], isolate=False)

    def dispatch(self, ready: list[WorkerHandle]) -> None:
        """Hands queued tasks to the ``ready`` workers with room, and sends them."""
        if not ready:
            return
        capacity = self.capacity
        sends: list[tuple[WorkerHandle, Task]] = []
        with self.lock:
            # Suspects of a crash run alone, on a worker with nothing else in flight; other work
            # waits meanwhile so that a worker drains and takes them.
            for w in ready:
                if not self.isolation:
                    break
                if not w.tasks:
                    task = self.pop_live(self.isolation)
                    if task is not None:
                        task.isolate = True
                        w.tasks[task.id] = task
                        sends.append((w, task))
            if not self.isolation:
                load = gpu_load(ready)
                skipped: list[Task] = []  # pinned to a worker that is full or not ready
                while self.pending:
                    open_ = open_workers(ready, capacity)
                    if not open_:
                        break
                    popped = self.pop_live(self.pending)
                    if popped is None:
                        break
                    if popped.slot is not None:
                        open_ = [w for w in open_ if w.slot == popped.slot]
                        if not open_:
                            skipped.append(popped)
                            continue
                    # Next in line; of those, one that has worked on the problem (its first-use
                    # costs paid).
                    problem = popped.msg.problem
                    w = min(open_, key=lambda w: (*next_in_line(w, load),
                                                  problem not in w.problems, w.slot))
                    load[w.gpu] += 1
                    w.tasks[popped.id] = popped
                    w.problems.add(problem)
                    sends.append((w, popped))
                self.pending.extendleft(reversed(skipped))
        for w, task in sends:
            task.stage = "sent"
            try:
                w.conn.send(RunTask(task.msg))
            except (OSError, EOFError, BrokenPipeError):
                w.eof = True  # reaped on the next pass; the task is re-run

    @staticmethod
    def pop_live(tasks: collections.deque[Task]) -> Task | None:
        """The first task of ``tasks`` neither resolved nor cancelled (the others dropped)."""
        while tasks:
            task = tasks.popleft()
            if not task.done and not task.future.cancelled():
                return task
            task.done = True
        return None

    def fail_all(self, exc: BaseException, workers: list[WorkerHandle]) -> None:
        """Fails every queued task and every task ``workers`` hold with ``exc``."""
        with self.lock:
            tasks = list(self.pending) + list(self.isolation)
            self.pending.clear()
            self.isolation.clear()
        for w in workers:
            tasks += list(w.tasks.values())
            w.tasks.clear()
        for task in tasks:
            self.resolve(task, exc=exc)

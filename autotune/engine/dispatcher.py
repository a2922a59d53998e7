"""The engine: keeps every GPU busy and survives kernels that crash or hang.

Why one piece (over 400 lines): the dispatcher thread owns every task's state (stages, time
limits, crash attribution, isolated re-runs) and every worker handle; split, each part would
need the others' locks. The worker process is :mod:`.worker`, the pipe messages
:mod:`.messages`, the default layout :mod:`.layout`.

Kernels run in *worker processes*, ``workers_per_gpu`` of them per GPU, each a fresh interpreter
(fork + exec, as multiprocessing's ``spawn`` does: no process is ever forked after importing
jax). A worker compiles its own configs in its compile threads, in parallel with the other
workers, and times them on its main thread; the workers of one GPU take turns on it through a
per-GPU lock, so exactly one config per GPU is checked and timed at a time::

    Engine (this process)                 worker k of GPU g (CUDA_VISIBLE_DEVICES=<g>)
      submit() -> Future  ──task──▶  compile thread(s): build, lower, compile ─┐ compiled
      dispatcher thread   ◀─stage──                                           ▼
      (timeouts, crashes) ◀─result─  main thread: flock(gpu-g.lock); inputs, reference, run,
                                     check, time; unlock        (one worker of GPU g at a time)

Processes, not only threads. On the H200 host (hopper_matmul 4096^3 bf16, 32 random valid
configs) sequential evaluation ran 60.9 configs/min; one worker with 8 compile threads ran
143.4 configs/min (2.36x), and each compile took 2-4.7 s instead of 0.6-2 s alone: Mosaic GPU's
lowering is Python and holds the GIL, so threads in one process serialize on it. Worker
processes have a GIL each. A compiled executable cannot leave the process that compiled it (and
a persistent compilation cache would make the timing process redo the GIL-bound tracing and
lowering to find the cache key), so each worker times what it compiled itself, and the workers
of one GPU serialize their device work with ``fcntl.flock`` on a lock file per GPU in the
engine's log directory: the kernel releases the lock when a worker dies, however it dies, so a
crashed or killed worker never leaves its GPU locked. Everything a worker does on the device
happens under the lock: fresh inputs, the reference, the check run and the CUPTI-timed
iterations (and baselines and traces), so no other worker's launches overlap a timing. The
cost is a CUDA context per worker (hundreds of MB of GPU memory each; workers start with
``XLA_PYTHON_CLIENT_PREALLOCATE=false``) and, for a worker's first config of a problem, the
reference's compile under the lock (the throughput benchmark warms every worker up first).
``workers_per_gpu=1`` is the earlier engine: one worker per GPU, its compile threads pipelined
with its timing. The default is in :func:`autotune.engine.layout._default_layout`.

Isolation. A worker that dies (segfault, abort, an illegal address that leaves the CUDA context
unusable) or stops answering is replaced by a fresh one, and only the config that caused it is
blamed; the other workers, of its GPU or others, carry on:

* one config was executing (compiling or running) in it when it died: it is ``CRASHED`` (exit
  signal, last stage and the tail of the worker's stderr in ``error``);
* several were executing: each is re-run alone in a fresh worker, so the culprit is found
  exactly; configs sent but not yet started, or compiled and waiting, are re-run normally;
* a stage past its time limit while the worker's heartbeat still arrives: that config is
  ``TIMEOUT`` (its neighbours were demonstrably alive); with a silent heartbeat (a thread
  holding the GIL), the executing configs are re-run alone as after a crash.

A config's run limit counts from when its worker got the GPU (the ``device`` stage), never
from when it began waiting for the lock: queueing behind other workers is not hanging.

A future resolves exactly once. Failures that are not a config's (a kernel name that does not
resolve, a broken reference) resolve its future with an exception instead.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.engine.layout import _cpu_count, _default_layout, gpu_memory_mib
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
    Stop,
    TaskMsg,
    WorkerSpec,
)
from autotune.engine.worker import _BOOT
from autotune.evaluation.trial import DEVICE_KINDS, DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem

__all__ = ["Engine", "EngineError", "StageEvent", "EngineStats", "default_timeout_s"]

log = logging.getLogger(__name__)

MODES = DEVICE_KINDS

# Stages (see autotune.evaluation.contract.Stage) in which a config's own code is executing. "device" is
# the engine's own: the worker holds its GPU's lock and makes the inputs and the reference.
_COMPILE_STAGES = frozenset({"build", "lower", "compile"})
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
_STARTUP_TIMEOUT_S = 300.0
_MAX_STARTUP_FAILURES = 3
_STDERR_TAIL_CHARS = 2000


def default_timeout_s(slowest_seen_s: float | None, *, floor_s: float) -> float:
    """The time limit of a stage when none is given: ``max(floor_s, 10 x slowest seen)``."""
    return max(floor_s, _TIMEOUT_FACTOR * (slowest_seen_s or 0.0))


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
    kind: str = "trial"  # the task's kind: trial, baseline, trace, retime
    problem: Problem | None = None


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Counts since the engine started."""

    submitted: int
    resolved: int
    by_worker: dict[int, int]  # worker slot -> tasks it resolved
    worker_starts: int
    crashes: int  # worker deaths not asked for
    timeouts: int  # workers killed for a stage past its limit
    isolated_reruns: int  # configs re-run alone to find a culprit


# ---------------------------------------------------------------------------------------------
# The worker process.


# ---------------------------------------------------------------------------------------------
# The engine side.


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


@dataclasses.dataclass(eq=False)
class _WorkerHandle:
    slot: int
    gpu: int | None
    process: Any
    conn: multiprocessing.connection.Connection
    log_path: str
    started: float
    sentinel: int | None = None  # a pidfd: readable once the process has exited
    state: str = "starting"  # starting | ready | retiring | killed
    eof: bool = False  # its pipe closed: it is gone, or going
    last_hb: float = 0.0
    pid: int | None = None
    device: DeviceInfo | None = None
    fatal: str = ""
    tasks: dict[int, _Task] = dataclasses.field(default_factory=dict)

    @property
    def isolating(self) -> bool:
        return any(t.isolate for t in self.tasks.values())


class Engine:
    """Evaluates configs in worker processes: pipelined, isolated, over one or several GPUs.

    Args:
      mode: ``"gpu"`` (CUPTI timing), ``"interpret"`` (GPU interpret mode on the CPU,
        wall-clock timing) or ``"fake"`` (:class:`~autotune.evaluation.fake.FakeEvaluator`, for
        tests).
      gpus: GPU ids (``CUDA_VISIBLE_DEVICES`` set in their workers before jax is imported);
        ``None``: the workers see what this process sees, and share it as one GPU.
      workers_per_gpu: worker processes per GPU. They compile in parallel (a GIL each) and take
        turns on the GPU, one config checked and timed at a time. Default: ``min(8, cores //
        (2 x GPUs))``, at least 1 (1 in fake mode); ``1`` is one worker whose compile threads
        are pipelined with its timing. See :func:`autotune.engine.layout._default_layout`.
      compile_threads: compile threads per worker (default: with one worker per GPU, the cores
        shared out among the GPUs, at most 8; with several, 1 or 2).
      trial_timeout_s: limit on a config's run (run, check, time); ``None`` derives it as
        ``max(floor, 10 x the slowest run seen)``.
      compile_timeout_s: likewise for building, lowering and compiling.
      allow_import: let kernel names be import paths (``"package.module:NAME"``).
      iterations: timed iterations per config (default 20 on a GPU, 3 otherwise).
      log_dir: where workers write their stdout/stderr (default: a temporary directory removed
        on :meth:`close`).
      cache: the cache policy of every timing, ``"cold"`` or ``"warm"``
        (:mod:`autotune.evaluation.trial`); None: cold on a GPU, warm otherwise. It is the engine's
        (:attr:`cache_policy`), so a job runs on an engine made with the policy it asks for.
      keep_compiled: executables of its fastest configs each worker keeps, per problem, so
        that :meth:`confirm` times them again without compiling them again.
      compilation_cache: a folder for JAX's persistent compilation cache, shared by the
        workers (:func:`autotune.engine.worker.use_compilation_cache`); None: off.

    Thread-safe: :meth:`submit` may be called from any thread; futures are resolved (and
    their callbacks run) on the engine's dispatcher thread, so a callback must not block.
    """

    def __init__(
        self,
        mode: str = "gpu",
        *,
        gpus: Sequence[int] | None = None,
        workers_per_gpu: int | None = None,
        compile_threads: int | None = None,
        trial_timeout_s: float | None = None,
        compile_timeout_s: float | None = None,
        allow_import: bool = False,
        iterations: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = _STARTUP_TIMEOUT_S,
        cache: str | None = None,
        keep_compiled: int = 5,
        compilation_cache: str | os.PathLike[str] | None = None,
    ) -> None:
        from autotune.evaluation.trial import resolve_cache_policy

        if mode not in MODES:
            raise ValueError(f"Engine mode must be one of {MODES}, but got {mode!r}.")
        self.cache_policy = resolve_cache_policy(cache, mode).value
        if gpus is not None:
            gpus = list(gpus)
            if (
                not gpus
                or len(set(gpus)) != len(gpus)
                or any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in gpus)
            ):
                raise ValueError(
                    f"gpus must be distinct non-negative GPU ids such as [0, 1], but got {gpus!r}."
                )
        for name, value in (
            ("trial_timeout_s", trial_timeout_s),
            ("compile_timeout_s", compile_timeout_s),
        ):
            if value is not None and not value > 0:
                raise ValueError(
                    f"{name} must be positive (or None to derive it), but got {value}."
                )
        if iterations is not None and iterations < 1:
            raise ValueError(f"iterations must be >= 1, but got {iterations}.")
        if workers_per_gpu is not None and (
            not isinstance(workers_per_gpu, int)
            or isinstance(workers_per_gpu, bool)
            or workers_per_gpu < 1
        ):
            raise ValueError(f"workers_per_gpu must be >= 1, but got {workers_per_gpu!r}.")
        if compile_threads is not None and compile_threads < 1:
            raise ValueError(f"compile_threads must be >= 1, but got {compile_threads}.")
        devices: list[int | None] = list(gpus) if gpus is not None else [None]
        memory = None
        if mode == DeviceKind.GPU and workers_per_gpu is None:
            sizes = [gpu_memory_mib(g) for g in devices]
            memory = min((m for m in sizes if m), default=None)
        workers_per_gpu, compile_threads = _default_layout(
            mode, len(devices), _cpu_count(), workers_per_gpu, compile_threads, memory
        )
        # Worker slots, GPU-major: slot i runs on devices[i // workers_per_gpu].
        slots = [gpu for gpu in devices for _ in range(workers_per_gpu)]

        self.mode = mode
        self.gpus = None if gpus is None else tuple(gpus)
        self.workers_per_gpu = workers_per_gpu
        self.compile_threads = compile_threads
        self.trial_timeout_s = trial_timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.allow_import = allow_import
        self.iterations = iterations
        self.keep_compiled = max(0, int(keep_compiled))
        self.compilation_cache = None if compilation_cache is None else str(compilation_cache)
        # (problem, config digest or None for the baseline) -> the worker slot that timed it
        # last: the confirmation round times it there again, with the executable it kept.
        self._timed_on: dict[tuple[Problem, str | None], int] = {}
        self.startup_timeout_s = startup_timeout_s
        self._own_log_dir = log_dir is None
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="autotune-engine-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)

        self._lock = threading.Lock()
        self._pending: collections.deque[_Task] = collections.deque()
        self._isolation: collections.deque[_Task] = collections.deque()
        self._ids = itertools.count()
        self._closing = False
        self._cancel_pending = False
        self._kill_running = False
        self._broken: str | None = None
        self._ready_event = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

        self._slots = slots
        self._lock_paths = {
            gpu: str(self._log_dir / f"gpu-{'visible' if gpu is None else gpu}.lock")
            for gpu in devices
        }
        self._workers: dict[int, _WorkerHandle | None] = {i: None for i in range(len(slots))}
        self._incarnation = itertools.count()
        self._startup_failures = 0
        self._slowest_compile_s = 0.0
        self._slowest_run_s = 0.0
        self._timeline: list[StageEvent] = []
        self._submitted = 0
        self._resolved = 0
        self._by_worker: collections.Counter[int] = collections.Counter()
        self._worker_starts = 0
        self._crashes = 0
        self._timeouts = 0
        self._isolated_reruns = 0

        for slot in self._workers:
            self._workers[slot] = self._spawn(slot)
        self._thread = threading.Thread(target=self._loop, name="autotune-engine", daemon=True)
        self._thread.start()

    # -- public API ---------------------------------------------------------------------------

    def submit(
        self, kernel_name: str, problem: Problem, config: Config
    ) -> concurrent.futures.Future[TrialResult]:
        """Queues one config; the future resolves to its :class:`TrialResult`.

        The future fails (``exception()``) only for errors that are not the config's: an
        unknown kernel name, a broken reference, a closed or broken engine. Cancelling a
        future that has not started running drops the config.
        """
        if not isinstance(config, Config):
            config = Config(config)
        return self._submit("trial", kernel_name, problem, config, {})

    def baseline(self, kernel_name: str, problem: Problem) -> TrialResult:
        """Times the kernel's baseline (XLA, cuDNN) on a worker, the way configs are timed."""
        return self.submit_baseline(kernel_name, problem).result()

    def submit_baseline(
        self, kernel_name: str, problem: Problem
    ) -> concurrent.futures.Future[TrialResult]:
        """:meth:`baseline` without waiting: queued ahead of the configs, so it is measured by
        the next worker free while the others go on compiling."""
        return self._submit("baseline", kernel_name, problem, None, {}, urgent=True)

    def retime(
        self,
        kernel_name: str,
        problem: Problem,
        config: Config | None,
        *,
        iterations: int,
        median_us: float | None = None,
    ) -> TrialResult:
        """Times ``config`` (None: the baseline) again, on the worker that timed it last, with
        the executable it kept (compiled again where it did not keep one); not checked again.

        ``median_us``: what the search measured, so the worker keeps the executable among its
        fastest.
        """
        if config is not None and not isinstance(config, Config):
            config = Config(config)
        digest = None if config is None else config.digest()
        with self._lock:
            slot = self._timed_on.get((problem, digest))
        extra = {"iterations": int(iterations), "median_us": median_us}
        return self._submit("retime", kernel_name, problem, config, extra, urgent=True,
                            slot=slot).result()

    def confirm(
        self,
        kernel_name: str,
        problem: Problem,
        configs: Sequence[Config],
        *,
        rounds: int,
        iterations: int,
        baseline: bool = True,
        medians_us: Sequence[float | None] | None = None,
    ) -> list[list[TrialResult]]:
        """The confirmation round's timings: per round, one :class:`TrialResult` per program
        (``configs`` in order, then the baseline when ``baseline``).

        Programs are timed one after another in the order of
        :func:`autotune.evaluation.trial.round_order` (A B C base, then B C base A, ...), each for
        ``iterations`` runs in the engine's cache policy, on the worker that timed it before
        (:meth:`retime`). A program whose timing fails is not timed in later rounds; its
        later entries repeat the failure.
        """
        from autotune.evaluation.trial import round_order

        programs: list[Config | None] = [Config(c) for c in configs]
        if baseline:
            programs.append(None)
        # All on one GPU (the fastest config's): a program timed on another is compiled again
        # on a worker of that GPU, which keeps it for the later rounds.
        with self._lock:
            first = self._timed_on.get((problem, programs[0].digest() if programs[0] else None))
            if first is not None and len(set(self._slots)) > 1:
                gpu = self._slots[first]
                here = [s for s, g in enumerate(self._slots) if g == gpu]
                for n, program in enumerate(programs):
                    key = (problem, None if program is None else program.digest())
                    slot = self._timed_on.get(key)
                    if slot is None or self._slots[slot] != gpu:
                        self._timed_on[key] = here[n % len(here)]
        medians = list(medians_us or [None] * len(configs)) + [None]
        table: list[list[TrialResult | None]] = [[None] * len(programs) for _ in range(rounds)]
        failed: dict[int, TrialResult] = {}
        for r, order in enumerate(round_order(len(programs), rounds)):
            for i in order:
                if i in failed:
                    table[r][i] = failed[i]
                    continue
                result = self.retime(kernel_name, problem, programs[i], iterations=iterations,
                                     median_us=medians[i])
                if not result.ok:
                    failed[i] = result
                table[r][i] = result
        return [[t for t in row if t is not None] for row in table]

    def trace(
        self,
        kernel_name: str,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        profile_space: int,
    ) -> dict[str, tuple[float, int]]:
        """Runs one config with the in-kernel profiler; per-region ``(median, count)``.

        Raises:
          EngineError: the traced run crashed, timed out or failed.
        """
        result = self.submit_trace(kernel_name, problem, config, out_dir, profile_space).result()
        if isinstance(result, TrialResult):
            raise EngineError(
                f"Tracing {config} of {problem} ended {result.outcome}: {result.error}"
            )
        return result

    def submit_trace(
        self,
        kernel_name: str,
        problem: Problem,
        config: Config,
        out_dir: str | os.PathLike[str],
        profile_space: int,
    ) -> concurrent.futures.Future[Any]:
        """:meth:`trace` without waiting. The future resolves to the per-region times, or to a
        :class:`TrialResult` when the traced run failed (:meth:`trace` raises for that)."""
        if not isinstance(config, Config):
            config = Config(config)
        extra = {"out_dir": str(out_dir), "profile_space": int(profile_space)}
        return self._submit("trace", kernel_name, problem, config, extra, urgent=True)

    def device_info(self, timeout_s: float | None = None) -> DeviceInfo:
        """The device of the first worker to start (waits for it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            for w in list(self._workers.values()):
                if w is not None and w.device is not None:
                    return w.device
            if self._broken:
                raise EngineError(self._broken)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise EngineError("No worker became ready in time.")
            self._ready_event.wait(0.1 if remaining is None else min(0.1, remaining))

    def device_infos(self) -> dict[int | None, DeviceInfo]:
        """GPU id (None for a single unpinned worker) -> device, for the workers started."""
        self.device_info()
        return {w.gpu: w.device for w in list(self._workers.values()) if w and w.device}

    @property
    def workers(self) -> int:
        """Worker processes (slots): ``workers_per_gpu`` per GPU."""
        return len(self._slots)

    @property
    def parallelism(self) -> int:
        """Configs worth keeping in flight: per worker, one per compile thread plus one
        compiled and waiting for (or using) the GPU; over all workers of all GPUs.

        A job runner that keeps this many submitted keeps every GPU and compile thread busy;
        more only waits in the engine's queue.
        """
        return len(self._slots) * (self.compile_threads + 1)

    def warm_up(self, kernel_name: str, problem: Problem, config: Config) -> list[TrialResult]:
        """Evaluates ``config`` once on every worker; their results, by worker slot.

        Each worker pays its first-use costs (jax's and Mosaic GPU's first compile, the
        reference's compile, CUPTI's start) here rather than in a measured config; the reference
        compiles under the GPU's lock, so unwarmed workers would take turns for it. A warm-up
        that has to be re-run alone after a crash may run on another worker.
        """
        if not isinstance(config, Config):
            config = Config(config)
        futures = [
            self._submit("trial", kernel_name, problem, config, {}, slot=slot)
            for slot in range(len(self._slots))
        ]
        return [f.result() for f in futures]

    def timeline(self) -> list[StageEvent]:
        """Every stage event so far, in arrival order (for pipelining and load reports)."""
        with self._lock:
            return list(self._timeline)

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                submitted=self._submitted,
                resolved=self._resolved,
                by_worker=dict(self._by_worker),
                worker_starts=self._worker_starts,
                crashes=self._crashes,
                timeouts=self._timeouts,
                isolated_reruns=self._isolated_reruns,
            )

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not finished (queued, compiling or running). Takes no lock: a
        signal handler may read it."""
        queued = len(self._pending) + len(self._isolation)
        return queued + sum(len(w.tasks) for w in list(self._workers.values()) if w is not None)

    @property
    def log_dir(self) -> Path:
        """Where the workers write their stdout and stderr."""
        return self._log_dir

    def kill_workers(self) -> None:
        """SIGKILLs every worker's process group at once, for a process about to end (a second
        Ctrl-C). Takes no lock: a signal handler may call it."""
        for w in list(self._workers.values()):
            if w is not None:
                with contextlib.suppress(OSError):
                    os.killpg(w.process.pid, signal.SIGKILL)

    def close(self, *, cancel_pending: bool = False, kill_running: bool = False) -> None:
        """Finishes the work submitted (or cancels what has not started), then stops workers.
        ``kill_running``: kills the workers at once instead, failing what they were doing (an
        interrupted job: its runner re-runs those configs later)."""
        with self._lock:
            self._closing = True
            self._cancel_pending = self._cancel_pending or cancel_pending or kill_running
            self._kill_running = self._kill_running or kill_running
        self._wake()
        self._thread.join()
        with self._lock:
            if self._wake_w >= 0:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1
        if self._own_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)
        else:
            for path in set(self._lock_paths.values()):  # the workers are gone
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._thread.is_alive():
            return
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(cancel_pending=exc_type is not None, kill_running=interrupted)

    # -- submission ---------------------------------------------------------------------------

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

    # -- workers ------------------------------------------------------------------------------

    def _spawn(self, slot: int) -> _WorkerHandle:
        gpu = self._slots[slot]
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if self.mode == DeviceKind.GPU:
            # The tuner process may use the same GPU: a worker must not grab 75% of it.
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if self.mode == DeviceKind.INTERPRET:
            env.setdefault("JAX_PLATFORMS", "cpu")
        env.setdefault("PYTHONFAULTHANDLER", "1")
        n = next(self._incarnation)
        log_path = str(self._log_dir / f"worker-{slot}-{n}.log")
        spec = WorkerSpec(
            mode=self.mode,
            iterations=self.iterations,
            compile_threads=self.compile_threads,
            allow_import=self.allow_import,
            log_level=logging.getLogger().getEffectiveLevel(),
            lock_path=self._lock_paths[gpu],
            cache=self.cache_policy,
            keep_compiled=self.keep_compiled,
            compilation_cache=self.compilation_cache,
        )
        ours, theirs = socket.socketpair()
        try:
            with open(log_path, "ab") as log_file:
                process = subprocess.Popen(
                    [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # its own process group: killed with its children
                )
        finally:
            theirs.close()
        conn = multiprocessing.connection.Connection(ours.detach())
        conn.send(spec)
        try:
            sentinel: int | None = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            sentinel = None  # polled instead
        with self._lock:
            self._worker_starts += 1
        log.debug("Started worker %d (gpu %s, pid %s).", slot, gpu, process.pid)
        return _WorkerHandle(
            slot=slot,
            gpu=gpu,
            process=process,
            conn=conn,
            log_path=log_path,
            started=time.monotonic(),
            pid=process.pid,
            sentinel=sentinel,
        )

    def _kill(self, w: _WorkerHandle, *, dump_stacks: bool = False) -> None:
        w.state = "killed"
        if w.process.poll() is not None:
            return
        if dump_stacks:
            try:
                w.process.send_signal(signal.SIGUSR1)  # faulthandler: where each thread is
                time.sleep(0.3)
            except OSError:
                pass
        try:
            os.killpg(w.process.pid, signal.SIGKILL)  # the worker leads its own group
        except OSError:
            try:
                w.process.kill()
            except OSError:
                pass

    def _stderr_tail(self, w: _WorkerHandle) -> str:
        try:
            with open(w.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 8 * _STDERR_TAIL_CHARS))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return text[-_STDERR_TAIL_CHARS:].strip()

    # -- the dispatcher -----------------------------------------------------------------------

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

    def _event(self, task: _Task, w: _WorkerHandle, stage: str, t: float) -> None:
        with self._lock:
            if len(self._timeline) < 1_000_000:
                self._timeline.append(StageEvent(task.id, w.slot, w.gpu, stage, t,
                                                 task.msg.kind, task.msg.problem))

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
            if stage == "build":
                task.compile_t0 = now
            elif stage == "compiled":
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

    def _reap(self) -> None:
        """Handles workers that exited, or whose pipe closed."""
        for slot, w in list(self._workers.items()):
            if w is None:
                continue
            if w.process.poll() is None and not w.eof:
                continue
            self._drain(w)  # results sent just before dying still count
            try:
                w.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill(w)
                w.process.wait(timeout=5)
            self._on_death(w)
            self._close_handle(w)
            self._workers[slot] = None

    def _close_handle(self, w: _WorkerHandle) -> None:
        try:
            w.conn.close()
        except OSError:
            pass
        if w.sentinel is not None:
            try:
                os.close(w.sentinel)
            except OSError:
                pass
            w.sentinel = None

    def _on_death(self, w: _WorkerHandle) -> None:
        code = w.process.returncode
        tasks = sorted(w.tasks.values(), key=lambda t: t.id)
        w.tasks.clear()
        if w.state == "killed":
            if w.fatal:  # killed during startup
                self._startup_failed(w, w.fatal)
            return  # blame was decided when it was killed
        if w.state == "starting" or w.fatal or (w.device is None and not tasks):
            self._startup_failed(w, w.fatal or f"exit code {code}")
            self._requeue(tasks, isolate=False)
            return
        if w.state == "retiring":
            self._requeue(tasks, isolate=False)
            return
        with self._lock:
            self._crashes += 1
        active = [t for t in tasks if t.stage in _ACTIVE_STAGES]
        how = _describe_exit(code)
        tail = self._stderr_tail(w)
        log.warning("Worker %d (gpu %s, pid %s) died: %s; its log: %s", w.slot, w.gpu, w.pid,
                    how, w.log_path)
        if len(active) == 1:
            (task,) = active
            self._resolve(
                task,
                result=dataclasses.replace(TrialResult.failed(
                    Outcome.CRASHED,
                    f"[{task.stage}] worker {w.slot} (gpu {w.gpu}, pid {w.pid}) {how} while "
                    f"this config was the only one executing (last stage: {task.stage}; "
                    f"worker log {w.log_path})."
                    f"\n--- worker stderr tail ---\n{tail}",
                    compile_s=self._compile_s(task),
                ), log_path=w.log_path),
            )
            self._requeue([t for t in tasks if t is not task], isolate=False)
        else:
            self._requeue(active, isolate=True)
            self._requeue([t for t in tasks if t not in active], isolate=False)

    def _startup_failed(self, w: _WorkerHandle, why: str) -> None:
        self._startup_failures += 1
        tail = self._stderr_tail(w)
        log.warning("Worker %d failed to start (%s).", w.slot, why)
        if self._startup_failures >= _MAX_STARTUP_FAILURES:
            message = (
                f"Engine workers (mode {self.mode!r}) failed to start {self._startup_failures} "
                f"times in a row; last: {why.strip()}\n--- worker stderr tail ---\n{tail}"
            )
            with self._lock:
                self._broken = message
            self._fail_all(EngineError(message))
            self._ready_event.set()

    def _respawn(self) -> None:
        if self._broken:
            return
        with self._lock:
            closing = self._closing
        if closing and not self._has_work():
            return
        for slot, w in self._workers.items():
            if w is None:
                self._workers[slot] = self._spawn(slot)

    def _dispatch(self) -> None:
        ready = [w for w in self._workers.values() if w is not None and w.state == "ready"]
        if not ready:
            return
        capacity = self.compile_threads + 1  # one compiled config waiting while one is timed
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
                # The least loaded worker first (then the least loaded GPU), so no worker idles
                # while work waits. A worker is full with a config per compile thread plus one
                # compiled and waiting for (or using) its GPU.
                gpu_load: collections.Counter[int | None] = collections.Counter()
                for w in ready:
                    gpu_load[w.gpu] += len(w.tasks)
                skipped: list[_Task] = []  # pinned to a worker that is full or not ready
                while self._pending:
                    open_ = [w for w in ready if not w.isolating and len(w.tasks) < capacity]
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
                    w = min(open_, key=lambda w: (len(w.tasks), gpu_load[w.gpu], w.slot))
                    gpu_load[w.gpu] += 1
                    w.tasks[task.id] = task
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

    def _stop_workers(self) -> None:
        workers = [w for w in self._workers.values() if w is not None]
        with self._lock:
            kill = self._kill_running
        for w in workers:
            if kill:
                self._kill(w)
                continue
            try:
                w.conn.send(Stop())
            except (OSError, EOFError):
                pass
        deadline = time.monotonic() + 5
        for w in workers:
            try:
                w.process.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(w)
                w.process.wait(timeout=5)
            self._close_handle(w)
        for slot in self._workers:
            self._workers[slot] = None
        self._fail_all(EngineError("The engine stopped before this task ran."))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died with {name}"
    return f"exited with code {code}"

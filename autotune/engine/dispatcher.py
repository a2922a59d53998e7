"""The engine: keeps every GPU busy and survives kernels that crash or hang.

This module is the :class:`Engine`: its constructor, its public API (submit, baseline,
retime, confirm, trace, warm-up, stats, close) and its dispatcher thread, which ties together
the two objects the engine owns: a :class:`~.tasks.TaskQueue` (the queue, handing tasks to
workers, stages, time limits, blame, resolving futures) and a :class:`~.workers.WorkerPool`
(starting, killing, reaping and respawning worker processes). Both share the engine's lock.
Over 400 lines because the public methods and the constructor's arguments are documented
here, where users read them.
The worker process is :mod:`.worker`, the pipe messages :mod:`.messages`, the default layout
:mod:`.layout`.

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
with its timing. The default is in :func:`autotune.engine.layout.default_layout`.

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
import logging
import math
import multiprocessing.connection
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.engine.layout import cpu_count, default_layout, gpu_memory_mib
from autotune.engine.messages import (
    EngineError,
    Failed,
    FromWorker,
    Result,
    StageReached,
    WorkerSpec,
)
from autotune.engine.tasks import (
    ACTIVE_STAGES,
    HEARTBEAT_STALE_S,
    StageEvent,
    TaskQueue,
    default_timeout_s,
    gpu_load,
    next_in_line,
    open_workers,
    timed_key,
)
from autotune.engine.workers import STARTUP_TIMEOUT_S, WorkerHandle, WorkerPool, describe_exit
from autotune.space.outcomes import DEVICE_KINDS, DeviceInfo, DeviceKind, TrialResult
from autotune.space.problem import Config, Problem

__all__ = ["Engine", "EngineError", "StageEvent", "EngineStats", "default_timeout_s"]

log = logging.getLogger(__name__)

MODES = DEVICE_KINDS


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
        are pipelined with its timing. See :func:`autotune.engine.layout.default_layout`.
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
        (:mod:`autotune.space.outcomes`); None: cold on a GPU, warm otherwise. It is the engine's
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
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        cache: str | None = None,
        keep_compiled: int = 5,
        compilation_cache: str | os.PathLike[str] | None = None,
    ) -> None:
        from autotune.space.outcomes import resolve_cache_policy

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
        workers_per_gpu, compile_threads = default_layout(
            mode, len(devices), cpu_count(), workers_per_gpu, compile_threads, memory
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
        self.startup_timeout_s = startup_timeout_s
        self._own_log_dir = log_dir is None
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="autotune-engine-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)

        # One lock for the engine, its task queue and its worker pool.
        self._lock = threading.Lock()
        self._tasks = TaskQueue(
            self._lock, mode=mode, capacity=compile_threads + 1,
            trial_timeout_s=trial_timeout_s, compile_timeout_s=compile_timeout_s,
        )
        spec = WorkerSpec(
            mode=mode,
            iterations=iterations,
            compile_threads=compile_threads,
            allow_import=allow_import,
            log_level=logging.getLogger().getEffectiveLevel(),
            cache=self.cache_policy,
            keep_compiled=self.keep_compiled,
            compilation_cache=self.compilation_cache,
        )
        self._pool = WorkerPool(self._lock, slots=slots, spec=spec, log_dir=self._log_dir,
                                startup_timeout_s=startup_timeout_s)
        # Every worker is started from the dispatcher thread, so that the kernel kills the
        # workers when it ends: the engine closed, or its process killed
        # (autotune.engine.worker._die_with_the_engine).
        started: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(started,),
                                        name="autotune-engine", daemon=True)
        self._thread.start()
        failure = started.get()
        if failure is not None:
            self._thread.join()
            raise failure

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
        return self._tasks.submit("trial", kernel_name, problem, config, {})

    def baseline(self, kernel_name: str, problem: Problem) -> TrialResult:
        """Times the kernel's baseline (XLA, cuDNN) on a worker, the way configs are timed."""
        return self.submit_baseline(kernel_name, problem).result()

    def submit_baseline(
        self, kernel_name: str, problem: Problem
    ) -> concurrent.futures.Future[TrialResult]:
        """:meth:`baseline` without waiting: queued ahead of the configs, so it is measured by
        the next worker free while the others go on compiling."""
        return self._tasks.submit("baseline", kernel_name, problem, None, {}, urgent=True)

    def retime(
        self,
        kernel_name: str,
        problem: Problem,
        config: Config | None,
        *,
        iterations: int,
        median_us: float | None = None,
        program: bool = False,
        worker: int | None = None,
    ) -> TrialResult:
        """Times ``config`` (None: the baseline) again, on the worker that timed it last, with
        the executable it kept (compiled again where it did not keep one); not checked again.

        ``median_us``: what the search measured, so the worker keeps the executable among its
        fastest. ``program``: timed as a program calls it, ``iterations`` calls a block (the
        program check: :meth:`autotune.evaluation.contract.Evaluator.retime`). ``worker``: on
        that worker slot instead (``0 .. workers - 1``; compiled there if it kept none), e.g.
        to compare the workers (``benchmarks/timing_study.py --engine``).
        """
        if config is not None and not isinstance(config, Config):
            config = Config(config)
        n_slots = len(self._pool.slots)
        if worker is not None and (isinstance(worker, bool) or not isinstance(worker, int)
                                   or not 0 <= worker < n_slots):
            raise ValueError(f"worker must be a worker slot, 0 to {n_slots - 1}, but got "
                             f"{worker!r}.")
        with self._lock:
            slot = worker if worker is not None else self._tasks.timed_on.get(
                timed_key(problem, config))
        extra = {"iterations": int(iterations), "median_us": median_us, "program": bool(program)}
        result: TrialResult = self._tasks.submit(
            "retime", kernel_name, problem, config, extra, urgent=True, slot=slot).result()
        return result

    def confirm(
        self,
        kernel_name: str,
        problem: Problem,
        configs: Sequence[Config],
        *,
        rounds: int,
        iterations: int | Sequence[int],
        baseline: bool = True,
        medians_us: Sequence[float | None] | None = None,
        first_round: int = 0,
        program: bool = False,
        interleaved: bool = False,
    ) -> list[list[TrialResult]]:
        """The confirmation round's timings: per round, one :class:`TrialResult` per program
        (``configs`` in order, then the baseline when ``baseline``). ``iterations``: timed
        runs per program and round, one count for all or one per program (the baseline last).
        ``first_round``: the index of the first round timed here, so that rounds added later
        go on with the rotation. ``program``: each program timed as a program calls it
        (:meth:`retime`), ``iterations`` calls a block.

        Programs are timed one after another in the order of
        :func:`autotune.space.outcomes.round_order` (A B C base, then B C base A, ...), each for
        ``iterations`` runs in the engine's cache policy, on the worker that timed it before
        (:meth:`retime`). A program whose timing fails is not timed in later rounds; its
        later entries repeat the failure.

        ``interleaved`` (not with ``program``): a round is one task instead, on the worker that
        timed most of its programs (:meth:`_round_worker`), which times them together
        (:meth:`autotune.evaluation.contract.Evaluator.retime_round`; under the cold policy
        call by call in one CUPTI session), each for the mean of their ``iterations``. A round
        that fails so is timed again one program at a time, which tells whose failure it was.
        """
        if interleaved and program:
            raise ValueError("confirm() times a round interleaved or as a program calls it, "
                             "not both: pass interleaved=False with program=True.")
        from autotune.space.outcomes import round_order

        programs: list[Config | None] = [Config(c) for c in configs]
        if baseline:
            programs.append(None)
        # All on one GPU (the fastest config's): a program timed on another is compiled again
        # on a worker of that GPU, which keeps it for the later rounds.
        with self._lock:
            home = self._round_worker(problem, programs) if interleaved else None
            first = self._tasks.timed_on.get(timed_key(problem, programs[0]))
            if first is not None and len(set(self._pool.slots)) > 1:
                gpu = self._pool.slots[first]
                here = [s for s, g in enumerate(self._pool.slots) if g == gpu]
                for n, timed in enumerate(programs):
                    key = timed_key(problem, timed)
                    slot = self._tasks.timed_on.get(key)
                    if slot is None or self._pool.slots[slot] != gpu:
                        self._tasks.timed_on[key] = here[n % len(here)]
        medians = list(medians_us or [None] * len(configs)) + [None]
        counts = ([int(iterations)] * len(programs) if isinstance(iterations, int)
                  else [int(n) for n in iterations])
        if len(counts) != len(programs):
            raise ValueError(f"confirm() needs one iteration count per program ({len(programs)}), "
                             f"but got {len(counts)}.")
        table: list[list[TrialResult | None]] = [[None] * len(programs) for _ in range(rounds)]
        failed: dict[int, TrialResult] = {}
        for r, order in enumerate(round_order(len(programs), first_round + rounds)[first_round:]):
            together = [i for i in order if i not in failed]
            if interleaved and together:
                got = self._interleaved_round(kernel_name, problem,
                                              [programs[i] for i in together],
                                              [counts[i] for i in together], home)
                if got is not None:
                    for i, result in zip(together, got, strict=True):
                        table[r][i] = result
                    for i in order:
                        if i in failed:
                            table[r][i] = failed[i]
                    continue
            for i in order:
                if i in failed:
                    table[r][i] = failed[i]
                    continue
                result = self.retime(kernel_name, problem, programs[i], iterations=counts[i],
                                     median_us=medians[i], program=program)
                if not result.ok:
                    failed[i] = result
                table[r][i] = result
        return [[t for t in row if t is not None] for row in table]

    def _round_worker(self, problem: Problem, programs: list[Config | None]) -> int | None:
        """The worker slot an interleaved round runs on: of the workers that timed the round's
        programs last (on the fastest config's GPU), the one that timed most of them, so that
        it compiles the fewest again; ties go to the fastest config's (None: any worker)."""
        slots = [self._tasks.timed_on.get(timed_key(problem, p)) for p in programs]
        gpu = None if slots[0] is None else self._pool.slots[slots[0]]
        counted = collections.Counter(s for s in slots if s is not None
                                      and (gpu is None or self._pool.slots[s] == gpu))
        if not counted:
            return None
        return max(counted, key=lambda s: (counted[s], s == slots[0]))

    def _interleaved_round(
        self, kernel_name: str, problem: Problem, programs: list[Config | None],
        counts: list[int], slot: int | None,
    ) -> list[TrialResult] | None:
        """One round of :meth:`confirm` as one task (``interleaved``), on worker ``slot``;
        its results in order, or None where one failed (the round is then timed one program
        at a time)."""
        extra = {"programs": programs, "iterations": math.ceil(sum(counts) / len(counts))}
        got = self._tasks.submit("round", kernel_name, problem, None, extra, urgent=True,
                                 slot=slot).result()
        if not isinstance(got, list) or not all(r.ok for r in got):
            bad = got if isinstance(got, TrialResult) else next(r for r in got if not r.ok)
            log.warning("%s: an interleaved confirmation round ended %s (%s); timing it one "
                        "program at a time.", problem, bad.outcome.value, bad.error)
            return None
        return got

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
        regions: dict[str, tuple[float, int]] = result
        return regions

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
        return self._tasks.submit("trace", kernel_name, problem, config, extra, urgent=True)

    def device_info(self, timeout_s: float | None = None) -> DeviceInfo:
        """The device of the first worker to start (waits for it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            for w in self._pool.live():
                if w.device is not None:
                    return w.device
            if self._tasks.broken:
                raise EngineError(self._tasks.broken)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise EngineError("No worker became ready in time.")
            self._pool.ready_event.wait(0.1 if remaining is None else min(0.1, remaining))

    def device_infos(self) -> dict[int | None, DeviceInfo]:
        """GPU id (None for a single unpinned worker) -> device, for the workers started."""
        self.device_info()
        return {w.gpu: w.device for w in self._pool.live() if w.device}

    @property
    def workers(self) -> int:
        """Worker processes (slots): ``workers_per_gpu`` per GPU."""
        return len(self._pool.slots)

    @property
    def parallelism(self) -> int:
        """Configs worth keeping in flight: per worker, one per compile thread plus one
        compiled and waiting for (or using) the GPU; over all workers of all GPUs.

        A job runner that keeps this many submitted keeps every GPU and compile thread busy;
        more only waits in the engine's queue.
        """
        return len(self._pool.slots) * self._tasks.capacity

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
            self._tasks.submit("trial", kernel_name, problem, config, {}, slot=slot)
            for slot in range(len(self._pool.slots))
        ]
        return [f.result() for f in futures]

    def timeline(self) -> list[StageEvent]:
        """Every stage event so far, in arrival order (for pipelining and load reports)."""
        with self._lock:
            return list(self._tasks.timeline)

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                submitted=self._tasks.submitted,
                resolved=self._tasks.resolved,
                by_worker=dict(self._tasks.by_worker),
                worker_starts=self._pool.worker_starts,
                crashes=self._tasks.crashes,
                timeouts=self._tasks.timeouts,
                isolated_reruns=self._tasks.isolated_reruns,
            )

    def warm_problems(self) -> frozenset[Problem]:
        """The problems that the workers next in line for a config have worked on.

        The next config submitted goes to the least loaded worker with room (then the one on
        the least loaded GPU), preferring among those one that has worked on its problem. A job
        runner that asks one of these problems next spares that worker a problem's first-use
        costs: its first compile of the problem (about a second more than the next ones on the
        H200) and loading the inputs' and reference's programs under the GPU's lock. Empty when
        no worker has room after the configs already queued.
        """
        capacity = self._tasks.capacity
        with self._lock:
            ready = self._pool.ready()
            open_ = open_workers(ready, capacity)
            room = sum(capacity - len(w.tasks) for w in open_)
            if room <= len(self._tasks.pending) + len(self._tasks.isolation):
                return frozenset()
            load = gpu_load(ready)
            first = min(next_in_line(w, load) for w in open_)
            return frozenset(p for w in open_ if next_in_line(w, load) == first
                             for p in w.problems)

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not finished (queued, compiling or running). Takes no lock: a
        signal handler may read it."""
        queued = len(self._tasks.pending) + len(self._tasks.isolation)
        return queued + sum(len(w.tasks) for w in list(self._pool.handles.values()) if w is not None)

    @property
    def log_dir(self) -> Path:
        """Where the workers write their stdout and stderr."""
        return self._log_dir

    def kill_workers(self) -> None:
        """SIGKILLs every worker's process group at once, for a process about to end (a second
        Ctrl-C). Takes no lock: a signal handler may call it."""
        self._pool.kill_all()

    def close(self, *, cancel_pending: bool = False, kill_running: bool = False) -> None:
        """Finishes the work submitted (or cancels what has not started), then stops workers.
        ``kill_running``: kills the workers at once instead, failing what they were doing (an
        interrupted job: its runner re-runs those configs later)."""
        self._tasks.close(cancel_pending=cancel_pending, kill_running=kill_running)
        self._tasks.wake()
        self._thread.join()
        self._tasks.close_wake()
        if self._own_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)
        else:
            for path in set(self._pool.lock_paths.values()):  # the workers are gone
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._thread.is_alive():
            return
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(cancel_pending=exc_type is not None, kill_running=interrupted)

    # -- the dispatcher thread -------------------------------------------------------------------

    def _run(self, started: queue.SimpleQueue[BaseException | None]) -> None:
        """The dispatcher thread: starts the workers (a failure goes to ``Engine()``'s caller),
        then dispatches until the engine closes."""
        try:
            self._pool.start()
        except BaseException as e:  # noqa: BLE001 - raised again in the engine's constructor
            started.put(e)
            return
        started.put(None)
        self._loop()

    def _loop(self) -> None:
        tasks, pool = self._tasks, self._pool
        try:
            while True:
                with self._lock:
                    closing, cancel, kill = tasks.closing, tasks.cancel_pending, tasks.kill_running
                if cancel:
                    tasks.cancel_queued()
                if closing and (kill or not tasks.has_work(pool.live())):
                    break
                live = pool.live()
                waitables: list[Any] = [tasks.wake_fd]
                for w in live:
                    waitables.append(w.conn)
                    if w.sentinel is not None:
                        waitables.append(w.sentinel)
                ready = multiprocessing.connection.wait(waitables, timeout=0.1)
                if tasks.wake_fd in ready:
                    tasks.clear_wake()
                for w in live:
                    if w.conn in ready or (w.sentinel is not None and w.sentinel in ready):
                        self._drain(w)
                self._reap()
                self._check_timeouts()
                self._respawn()
                tasks.dispatch(pool.ready())
        except Exception as e:  # noqa: BLE001 - never leave futures hanging
            log.exception("The engine's dispatcher failed.")
            tasks.mark_broken(f"The engine's dispatcher failed: {e!r}")
            tasks.fail_all(EngineError(f"The engine's dispatcher failed: {e!r}"), pool.live())
        finally:
            with self._lock:
                kill = tasks.kill_running
            pool.stop(kill=kill)
            tasks.fail_all(EngineError("The engine stopped before this task ran."), [])

    def _drain(self, w: WorkerHandle) -> None:
        """Takes every message ``w`` has sent: its own to the pool, its tasks' to the queue."""
        while True:
            try:
                if not w.conn.poll():
                    return
                msg: FromWorker = w.conn.recv()
            except (EOFError, OSError):
                w.eof = True
                return
            if isinstance(msg, (StageReached, Result, Failed)):
                self._tasks.on_message(w, msg)
            else:
                self._pool.on_message(w, msg)

    def _reap(self) -> None:
        """Handles workers that exited, or whose pipe closed."""
        for w in self._pool.exited():
            self._drain(w)  # results sent just before dying still count
            self._pool.wait_exit(w)
            self._on_death(w)
            self._pool.remove(w)

    def _on_death(self, w: WorkerHandle) -> None:
        tasks = sorted(w.tasks.values(), key=lambda t: t.id)
        w.tasks.clear()
        if w.state == "killed":
            if w.fatal:  # killed during startup
                self._startup_failed(w, w.fatal)
            return  # blame was decided when it was killed
        code = w.process.returncode
        if w.state == "starting" or w.fatal or (w.device is None and not tasks):
            self._startup_failed(w, w.fatal or f"exit code {code}")
            self._tasks.requeue(tasks, isolate=False)
            return
        if w.state == "retiring":
            self._tasks.requeue(tasks, isolate=False)
            return
        self._tasks.blame_crash(w, tasks, how=describe_exit(code), tail=self._pool.stderr_tail(w))

    def _startup_failed(self, w: WorkerHandle, why: str) -> None:
        """A worker did not start; after a few in a row, the engine is broken."""
        message = self._pool.startup_failed(w, why)
        if message is not None:
            self._tasks.mark_broken(message)
            self._tasks.fail_all(EngineError(message), self._pool.live())
            self._pool.ready_event.set()

    def _check_timeouts(self) -> None:
        """Kills the workers silent since their start, and those with a stage past its limit
        (then blames, or re-runs, what they held)."""
        now = time.monotonic()
        self._pool.kill_stalled_startups(now)
        for w in self._pool.ready():
            over = {t.id: o for t in w.tasks.values() if (o := self._tasks.overdue(t, now))}
            if not over:
                continue
            active = [t for t in w.tasks.values() if t.stage in ACTIVE_STAGES]
            alive = now - w.last_hb < HEARTBEAT_STALE_S
            self._pool.kill(w, dump_stacks=True)
            self._tasks.blame_timeout(w, over, active, alive=alive, tail=self._pool.stderr_tail(w))

    def _respawn(self) -> None:
        if self._tasks.broken:
            return
        with self._lock:
            closing = self._tasks.closing
        if closing and not self._tasks.has_work(self._pool.live()):
            return
        self._pool.respawn()

"""A worker process: compiles configs in its compile threads, times them on its main thread.

A worker is a fresh interpreter started by the engine (:mod:`.dispatcher`) with
:data:`BOOT`; it reads its :class:`~.messages.WorkerSpec`, answers with typed messages
(:mod:`.messages`) and holds its GPU's lock (``flock`` on a file shared by the workers of one
GPU) around everything it does on the device.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import faulthandler
import fcntl
import logging
import multiprocessing.connection
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Any

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
from autotune.space.problem import Config, Problem

log = logging.getLogger(__name__)

# A worker's heartbeat period; the engine calls a worker silent after _HEARTBEAT_STALE_S.
_HEARTBEAT_S = 0.5
# The exit code of a worker that retires (its device failed after a run).
_RETIRE_EXIT_CODE = 3
# The problems whose fastest executables a worker keeps for re-timing (the newest ones). An
# executable holds only the kernel's code on the GPU, so keeping every problem of a scheduled
# job costs little; recompiling the confirmation round's configs costs 1-2 s each.
KEPT_PROBLEMS = 32
# Queued for a worker's main thread by _Worker._warm_host (on a compile thread).
_WARM_DEVICE: Any = ("warm the device up",)
# How long a program check waits for the compile threads' Python work to pause
# (_HostGate.quiet) before it times anyway.
QUIET_WAIT_S = 30.0
# Python's GIL switch interval in a worker (Python's default: 5 ms). The thread that holds the
# GPU's lock lets go of the GIL at every wait on the device (a block_until_ready, a CUPTI
# flush) and must win it back from a compile thread tracing in Python, which keeps it for up
# to the interval each time. On the H200 a batch job's mean lock time per config went from
# 101-104 ms to 88 ms at 0.5 ms (benchmarks/RESULTS.md §10; 2 ms did worse).
SWITCH_INTERVAL_S = 0.0005


# A worker is a fresh interpreter (fork + exec, like multiprocessing's "spawn") started with
# subprocess rather than multiprocessing: its environment (CUDA_VISIBLE_DEVICES) is set before
# Python starts, the caller's __main__ is not re-imported (a job script without a main guard,
# or one that touches the GPU at import, would otherwise run again in every worker), and its
# stdout/stderr go to a log file from the first byte, so even an interpreter crash leaves a
# tail to report.
BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from autotune.engine.worker import _worker_entry; _worker_entry(int(sys.argv[2]))"
)


def use_compilation_cache(folder: str) -> None:
    """Turns on JAX's persistent compilation cache in ``folder``, before anything compiles.

    JAX keeps only compiles slower than ``jax_persistent_cache_min_compile_time_secs`` (1 s by
    default): the baselines' autotuned XLA programs and the slowest configs, not the
    references (compiled without autotuning) or most configs (under a second). Workers and
    processes may share the folder: an entry is never rewritten once there, and JAX reads a
    torn one (another process still writing it) as a miss, compiling instead with a warning.
    """
    import jax

    from autotune.evaluation.xla_autotune import keep_flagged_folder

    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_enable_compilation_cache", True)
    keep_flagged_folder(folder)  # a user's XLA autotune folder, over JAX's own in the cache


def _worker_entry(fd: int) -> None:
    """Entry point of a worker process; ``fd`` is its end of the socket pair to the engine."""
    os.set_inheritable(fd, False)  # ptxas and other children must not keep the pipe open
    # The engine owns a worker's life: a Ctrl-C or a scheduler's SIGTERM sent to every process
    # of the job must not kill a worker mid-config (its config would be stored as crashed);
    # the engine kills it when the tuner stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    conn = multiprocessing.connection.Connection(fd)
    _die_with_the_engine()
    spec: WorkerSpec = conn.recv()
    if spec.engine_pid is not None and os.getppid() != spec.engine_pid:
        os._exit(0)  # the engine was gone before the kernel was told to kill this worker with it
    # On a crash, the crashing thread's Python stack (the tail the engine reports); on SIGUSR1
    # (sent before a timed-out worker is killed) every thread's, to show where it hung.
    faulthandler.enable(file=sys.stderr, all_threads=False)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    logging.basicConfig(
        level=spec.log_level, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    _Worker(conn, spec).serve()


# prctl(2)'s option asking the kernel to send a signal when the process's parent ends.
_PR_SET_PDEATHSIG = 1


def _die_with_the_engine() -> None:
    """On Linux, asks the kernel to SIGKILL this worker when the engine's thread that started it
    ends (the engine's process killed, or the engine closed). A worker whose engine is gone
    otherwise exits when its pipe closes, which a worker wedged in a call that holds the GIL
    never sees: it would spin on, holding the GPU and its lock, so that every later job on that
    GPU waits for it. Elsewhere (or without prctl) the pipe alone tells."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the pipe alone tells
        log.debug("prctl(PR_SET_PDEATHSIG) is not available.", exc_info=True)


def _program_check(task: TaskMsg) -> bool:
    """Whether ``task`` is a program check: a re-time on the host's clock (``program``)."""
    return task.kind == "retime" and bool(task.extra.get("program", False))


class _HostGate:
    """Pauses a worker's compile threads' Python work while a host-bound loop is timed.

    A program check (:meth:`autotune.evaluation.contract.Evaluator.retime` with ``program``)
    times calls on the host's clock. A compile thread that traces or lowers a config in Python
    meanwhile takes the GIL for up to the switch interval at every call the loop makes. A compile
    thread :meth:`enter` s before its Python stages (build, lower; a baseline's host work) and
    :meth:`leave` s when its compile reaches XLA (which runs without the GIL); :meth:`quiet`
    lets no thread enter, and waits until none is inside, up to ``timeout_s``.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._quiet = False

    def enter(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._quiet)
            self._inside += 1

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def held(self) -> Any:
        """:meth:`enter` … :meth:`leave` around host work in Python."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    @contextlib.contextmanager
    def quiet(self, timeout_s: float) -> Any:
        with self._cond:
            self._quiet = True
            if not self._cond.wait_for(lambda: self._inside == 0, timeout=timeout_s):
                log.warning("A compile thread's Python work went on past %.0f s; timing the "
                            "program check beside it.", timeout_s)
        try:
            yield
        finally:
            with self._cond:
                self._quiet = False
                self._cond.notify_all()


class _Worker:
    def __init__(self, conn: multiprocessing.connection.Connection, spec: WorkerSpec) -> None:
        self.conn = conn
        self.spec = spec
        self._send_lock = threading.Lock()
        self._kernels: dict[str, Any] = {}
        self._kernel_lock = threading.Lock()
        self._ready: queue.Queue[Any] = queue.Queue()  # (task, compiled), _WARM_DEVICE, None
        self._lock_fd: int | None = None
        # The compiled executables of the fastest configs this worker timed, per problem (the
        # newest KEPT_PROBLEMS problems: a scheduled job has all its problems in flight), for the
        # confirmation round to time again without compiling.
        self._kept: collections.OrderedDict[Problem, dict[str, tuple[float, Any]]] = (
            collections.OrderedDict()
        )
        # Executables compiled for a confirmation round that _kept does not hold, per problem
        # (the newest KEPT_PROBLEMS), for the problem's later rounds.
        self._round_kept: collections.OrderedDict[Problem, dict[str, Any]] = (
            collections.OrderedDict()
        )
        self._kept_lock = threading.Lock()
        self._gate = _HostGate()

    def send(self, msg: FromWorker) -> None:
        with self._send_lock:
            try:
                self.conn.send(msg)
            except (OSError, EOFError):
                os._exit(0)  # the engine is gone

    def serve(self) -> None:
        from autotune.evaluation.contract import make_evaluator

        try:
            if self.spec.lock_path is not None:
                # Its own open file description (flock locks belong to those), not inherited by
                # ptxas or other children, so it dies with this process.
                self._lock_fd = os.open(
                    self.spec.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
            if self.spec.compilation_cache is not None:
                use_compilation_cache(self.spec.compilation_cache)
            self.evaluator = make_evaluator(
                self.spec.mode, iterations=self.spec.iterations, cache=self.spec.cache
            )
            info = self.evaluator.device_info()
        except Exception as e:  # noqa: BLE001 - reported to the engine, which gives up
            # The traceback goes to this worker's log (its stderr); the engine gets one line.
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            self.send(Fatal(" ".join(f"{type(e).__name__}: {e}".split())))
            os._exit(2)
        self.pool = concurrent.futures.ThreadPoolExecutor(
            self.spec.compile_threads, thread_name_prefix="compile"
        )
        self.send(Ready(info, os.getpid()))
        self.pool.submit(self._warm_host)  # before the first config, which queues behind it
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._receive, name="receive", daemon=True).start()
        while True:
            item = self._ready.get()
            if item is None:
                break
            if item is _WARM_DEVICE:
                self._warm_device()
                continue
            self._measure(*item)
            if not self.evaluator.healthy:
                self.send(Retire("the device failed after a run; replacing the process"))
                sys.stderr.flush()
                os._exit(_RETIRE_EXIT_CODE)
        self.pool.shutdown(wait=False, cancel_futures=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _warm_host(self) -> None:
        """The evaluator's once-per-process host work, on a compile thread as the worker
        starts (imports in the order the first config would make them); then its device part,
        queued for the main thread, which does it under the GPU's lock while the first config
        compiles."""
        try:
            self.evaluator.warm_host()
        except Exception:  # noqa: BLE001 - the first config meets it again and reports it
            log.debug("Warming the host up failed.", exc_info=True)
        self._ready.put(_WARM_DEVICE)

    def _warm_device(self) -> None:
        """The evaluator's once-per-process device costs, under the GPU's lock (on the H200
        they took 0.1-0.25 s of a worker's first trial)."""
        try:
            with self._device():
                self.evaluator.warm_device()
        except Exception:  # noqa: BLE001 - the first trial meets it again and reports it
            log.debug("Warming the device up failed.", exc_info=True)

    def _heartbeat(self) -> None:
        while True:
            self.send(Heartbeat(time.time()))
            time.sleep(_HEARTBEAT_S)

    def _receive(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (OSError, EOFError):
                os._exit(0)  # the engine is gone
            if isinstance(msg, Stop):
                self._ready.put(None)
                return
            assert isinstance(msg, RunTask), msg
            task = msg.task
            if task.kind == "trial" or (task.kind == "retime" and task.config is not None):
                self.pool.submit(self._compile, task)
            elif task.kind == "round":
                self.pool.submit(self._prepare_round, task)
            else:  # a baseline, its re-time, a trace: their host work first, then the GPU
                self.pool.submit(self._prepare, task)

    def _hook(self, task: TaskMsg) -> Any:
        def on_stage(stage: Any) -> None:
            self.send(StageReached(task.id, str(stage), time.time()))

        return on_stage

    @contextlib.contextmanager
    def _python_stages(self, task: TaskMsg) -> Any:
        """A compile's stage hook that holds the host gate (:class:`_HostGate`) from its
        build stage until its compile stage (XLA, without the GIL) or its end."""
        send = self._hook(task)
        inside = [False]

        def on_stage(stage: Any) -> None:
            send(stage)  # first: the timeline shows a stage before the gate moves
            if str(stage) == "build" and not inside[0]:
                self._gate.enter()
                inside[0] = True
            elif str(stage) == "compile" and inside[0]:
                self._gate.leave()
                inside[0] = False

        try:
            yield on_stage
        finally:
            if inside[0]:
                self._gate.leave()

    def _kernel(self, name: str) -> Any:
        from autotune.space.kernel import get_kernel

        with self._kernel_lock:
            if name not in self._kernels:
                self._kernels[name] = get_kernel(name, allow_import=self.spec.allow_import)
            return self._kernels[name]

    def _error(self, task: TaskMsg, e: BaseException) -> None:
        exc: BaseException = e
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001
            exc = EngineError(f"{type(e).__name__}: {e}")
        self.send(Failed(task.id, exc, traceback.format_exc(), time.time()))

    def _compile(self, task: TaskMsg) -> None:
        from autotune.evaluation.contract import Compiled

        assert task.config is not None
        if task.kind == "retime":
            kept = self._kept_executable(task.problem, task.config)
            if kept is not None:
                self.send(StageReached(task.id, "compiled", time.time()))
                self._ready.put((task, kept))
                return
        try:
            kernel = self._kernel(task.kernel_name)
            with self._python_stages(task) as on_stage:
                compiled = self.evaluator.compile(kernel, task.problem, task.config,
                                                  on_stage=on_stage)
        except Exception as e:  # noqa: BLE001 - not the config's failure: the caller's
            self._error(task, e)
            return
        if isinstance(compiled, Compiled):
            self.send(StageReached(task.id, "compiled", time.time()))
            self._ready.put((task, compiled))
        else:
            self.send(Result(task.id, compiled, time.time()))

    def _prepare(self, task: TaskMsg) -> None:
        """A problem's host work (inputs, reference, check; a baseline's lowering; a trace's
        compile) on a compile thread, outside the GPU's lock; the baseline's compile and timing
        (or the trace's run) follow under the lock."""
        self.send(StageReached(task.id, "prepare", time.time()))
        try:
            kernel = self._kernel(task.kernel_name)
            with self._gate.held():
                self.evaluator.prepare(kernel, task.problem, on_stage=self._hook(task))
                if task.kind == "trace":
                    assert task.config is not None
                    self.evaluator.prepare_trace(kernel, task.problem, task.config,
                                                 task.extra["out_dir"],
                                                 profile_space=task.extra["profile_space"])
        except Exception:  # noqa: BLE001 - the run under the lock meets it again and reports it
            log.debug("Preparing task %d failed.", task.id, exc_info=True)
        self.send(StageReached(task.id, "prepared", time.time()))
        self._ready.put((task, None))

    def _prepare_round(self, task: TaskMsg) -> None:
        """A confirmation round's host work (:meth:`autotune.engine.dispatcher.Engine.confirm`
        with ``interleaved``): each config's executable, kept or compiled here (a compile that
        fails is that config's result), and the baseline's host work; the round is timed under
        the GPU's lock."""
        from autotune.evaluation.contract import Compiled

        self.send(StageReached(task.id, "prepare", time.time()))
        programs: list[Any] = []
        try:
            kernel = self._kernel(task.kernel_name)
            for config in task.extra["programs"]:
                if config is None:
                    with self._gate.held():
                        self.evaluator.prepare(kernel, task.problem)
                    programs.append(None)
                    continue
                found = self._kept_executable(task.problem, config)
                if found is None:
                    with self._python_stages(task) as on_stage:
                        found = self.evaluator.compile(kernel, task.problem, config,
                                                       on_stage=on_stage)
                    if isinstance(found, Compiled):
                        self._keep_for_rounds(task.problem, found)
                programs.append(found)
        except Exception as e:  # noqa: BLE001 - not a config's failure: the caller's
            self._error(task, e)
            return
        self.send(StageReached(task.id, "prepared", time.time()))
        self._ready.put((task, programs))

    def _keep_for_rounds(self, problem: Problem, compiled: Any) -> None:
        """Keeps an executable compiled for a confirmation round for the problem's later
        rounds (beside the fastest configs :meth:`_keep` keeps)."""
        with self._kept_lock:
            kept = self._round_kept.setdefault(problem, {})
            self._round_kept.move_to_end(problem)
            while len(self._round_kept) > KEPT_PROBLEMS:
                self._round_kept.popitem(last=False)
            kept[compiled.config.digest()] = compiled

    def _time_round(self, task: TaskMsg, programs: list[Any]) -> list[Any]:
        """The round's results, in order: the programs that compiled timed together
        (:meth:`autotune.evaluation.contract.Evaluator.retime_round`), the failed compiles'
        own results."""
        from autotune.space.outcomes import TrialResult

        timed = [i for i, p in enumerate(programs) if not isinstance(p, TrialResult)]
        results: list[Any] = list(programs)
        if timed:
            got = self.evaluator.retime_round(
                self._kernel(task.kernel_name), task.problem, [programs[i] for i in timed],
                iterations=int(task.extra["iterations"]))
            for i, result in zip(timed, got, strict=True):
                results[i] = result
        return results

    @contextlib.contextmanager
    def _device(self) -> Any:
        """Holds the GPU's lock: no other worker of this GPU uses it meanwhile.

        ``flock`` blocks without the GIL (the heartbeat keeps going) and is released by the
        kernel when this process dies, however it dies.
        """
        if self._lock_fd is None:
            yield
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _measure(self, task: TaskMsg, compiled: Any) -> None:
        # The result (and its "done" time) is sent before the lock is released, so the device
        # spans of a GPU's configs in the timeline never overlap. A program check times the
        # host's clock: it waits for this worker's compile threads' Python work to pause
        # (_HostGate) before it takes the GPU's lock, so the GPU's other workers time meanwhile
        # (holding the lock, it kept them waiting for a whole trace's or config's lowering).
        program = _program_check(task)
        with self._gate.quiet(QUIET_WAIT_S) if program else contextlib.nullcontext():
            with self._device():
                self.send(StageReached(task.id, "device", time.time()))
                self._measure_locked(task, compiled)

    def _keep(self, problem: Problem, compiled: Any, median_us: float) -> None:
        """Keeps ``compiled`` if it is among the fastest ``keep_compiled`` of its problem."""
        if self.spec.keep_compiled <= 0:
            return
        with self._kept_lock:
            kept = self._kept.setdefault(problem, {})
            self._kept.move_to_end(problem)
            while len(self._kept) > KEPT_PROBLEMS:
                self._kept.popitem(last=False)
            kept[compiled.config.digest()] = (median_us, compiled)
            if len(kept) > self.spec.keep_compiled:
                slowest = max(kept, key=lambda d: kept[d][0])
                del kept[slowest]

    def _kept_executable(self, problem: Problem, config: Config) -> Any:
        with self._kept_lock:
            found = self._kept.get(problem, {}).get(config.digest())
            if found is not None:
                return found[1]
            return self._round_kept.get(problem, {}).get(config.digest())

    def _measure_locked(self, task: TaskMsg, compiled: Any) -> None:
        try:
            if task.kind == "trial":
                result: Any = self.evaluator.run(compiled, on_stage=self._hook(task))
                if result.ok and result.median_us is not None:
                    self._keep(task.problem, compiled, result.median_us)
            elif task.kind == "round":
                self._hook(task)("time")
                result = self._time_round(task, compiled)
            elif task.kind == "retime":
                iterations = int(task.extra["iterations"])
                # A program check: no compile thread runs Python beside it (_measure).
                program = _program_check(task)
                self._hook(task)("time")
                if task.config is None:
                    kernel = self._kernel(task.kernel_name)
                    # A round's re-time: the baseline's output was checked when it was first
                    # timed (a round times only one stored after that check).
                    result = self.evaluator.baseline(kernel, task.problem, iterations=iterations,
                                                     program=program, check=False)
                else:
                    result = self.evaluator.retime(compiled, iterations=iterations,
                                                   program=program)
                    if result.ok and not program and task.extra.get("median_us") is not None:
                        self._keep(task.problem, compiled, float(task.extra["median_us"]))
            else:
                kernel = self._kernel(task.kernel_name)
                self._hook(task)("run")
                if task.kind == "baseline":
                    result = self.evaluator.baseline(kernel, task.problem)
                else:
                    assert task.config is not None
                    result = self.evaluator.trace(
                        kernel,
                        task.problem,
                        task.config,
                        task.extra["out_dir"],
                        profile_space=task.extra["profile_space"],
                    )
        except Exception as e:  # noqa: BLE001
            self._error(task, e)
            return
        self.send(Result(task.id, result, time.time()))

"""The engine's worker processes: starting one per slot (fork + exec, with its GPU and log),
killing, reaping and respawning them, and what a dead worker's exit and stderr say.

:class:`WorkerPool` is an object the :class:`~.dispatcher.Engine` owns, beside its
:class:`~.tasks.TaskQueue`: it holds a :class:`WorkerHandle` per slot (None while the slot's
process is being replaced). The tasks a worker holds are the queue's; the pool only carries
them in the handle. It shares the engine's lock."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from autotune._paths import open_log
from autotune.engine.messages import (
    Fatal,
    Heartbeat,
    Ready,
    Retire,
    Stop,
    WorkerSpec,
)
from autotune.engine.tasks import Task
from autotune.engine.worker import BOOT
from autotune.evaluation.xla_autotune import autotune_cache_folder, pin_in
from autotune.space.outcomes import DeviceInfo, DeviceKind
from autotune.space.problem import Problem

log = logging.getLogger("autotune.engine.dispatcher")

STARTUP_TIMEOUT_S = 300.0
MAX_STARTUP_FAILURES = 3
STDERR_TAIL_CHARS = 2000


@dataclasses.dataclass(eq=False)
class WorkerHandle:
    """One worker process, as the dispatcher thread sees it."""

    slot: int
    gpu: int | None
    process: subprocess.Popen[bytes]
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
    tasks: dict[int, Task] = dataclasses.field(default_factory=dict)
    # The problems it has been sent work of: their first-use costs (the problem's first
    # compile, its inputs' and reference's programs loaded) are paid in this process.
    problems: set[Problem] = dataclasses.field(default_factory=set)

    @property
    def isolating(self) -> bool:
        return any(t.isolate for t in self.tasks.values())


def describe_exit(code: int | None) -> str:
    """How a worker's process ended, from its exit code (None: it did not end)."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died with {name}"
    return f"exited with code {code}"


class WorkerPool:
    """The worker processes of an engine, one per slot.

    Args:
      lock: the engine's lock (shared with its :class:`~.tasks.TaskQueue`).
      slots: the GPU of each slot (None: the GPUs this process sees), GPU-major.
      spec: what every worker is started with, less its GPU's lock file (set per slot).
      log_dir: where the workers' logs and the per-GPU lock files go.
      startup_timeout_s: a worker silent this long after its start is killed.

    Nothing starts until :meth:`start`. :meth:`kill_all` and the :attr:`handles` read by
    :meth:`~.dispatcher.Engine.in_flight` take no lock (a signal handler may use them); the
    other methods run on the engine's dispatcher thread (or before it starts).
    """

    def __init__(
        self,
        lock: threading.Lock,
        *,
        slots: Sequence[int | None],
        spec: WorkerSpec,
        log_dir: Path,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.lock = lock
        self.slots = list(slots)
        self.spec = spec
        self.mode = spec.mode
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.lock_paths = {
            gpu: str(log_dir / f"gpu-{'visible' if gpu is None else gpu}.lock")
            for gpu in dict.fromkeys(self.slots)
        }
        self.handles: dict[int, WorkerHandle | None] = {i: None for i in range(len(self.slots))}
        self._incarnation = itertools.count()
        self.startup_failures = 0
        self.worker_starts = 0
        # Set when a worker is ready, and when the pool gives up on starting them.
        self.ready_event = threading.Event()

    def start(self) -> None:
        """Starts a worker in every slot."""
        for slot in self.handles:
            self.handles[slot] = self.spawn(slot)

    def live(self) -> list[WorkerHandle]:
        """The workers started and not yet reaped."""
        return [w for w in list(self.handles.values()) if w is not None]

    def ready(self) -> list[WorkerHandle]:
        """The workers ready for tasks."""
        return [w for w in self.live() if w.state == "ready"]

    def spawn(self, slot: int) -> WorkerHandle:
        """Starts the worker of ``slot`` (its process, its pipe, its log)."""
        gpu = self.slots[slot]
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if self.mode == DeviceKind.GPU:
            # The tuner process may use the same GPU: a worker must not grab 75% of it.
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            # Every worker times the same XLA program for a baseline (evaluation.xla_autotune).
            pin_in(env, autotune_cache_folder(self.spec.compilation_cache, self.log_dir))
        if self.mode == DeviceKind.INTERPRET:
            env.setdefault("JAX_PLATFORMS", "cpu")
        env.setdefault("PYTHONFAULTHANDLER", "1")
        n = next(self._incarnation)
        log_path = str(self.log_dir / f"worker-{slot}-{n}.log")
        spec = dataclasses.replace(
            self.spec,
            log_level=logging.getLogger().getEffectiveLevel(),
            lock_path=self.lock_paths[gpu],
            engine_pid=os.getpid(),
        )
        ours, theirs = socket.socketpair()
        try:
            with os.fdopen(open_log(log_path), "ab") as log_file:  # never through a link
                process = subprocess.Popen(
                    [sys.executable, "-c", BOOT, json.dumps(sys.path), str(theirs.fileno())],
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
        with self.lock:
            self.worker_starts += 1
        log.debug("Started worker %d (gpu %s, pid %s).", slot, gpu, process.pid)
        return WorkerHandle(
            slot=slot,
            gpu=gpu,
            process=process,
            conn=conn,
            log_path=log_path,
            started=time.monotonic(),
            pid=process.pid,
            sentinel=sentinel,
        )

    def on_message(self, w: WorkerHandle, msg: Heartbeat | Ready | Fatal | Retire) -> None:
        """Takes a message about worker ``w`` itself (a task's are the queue's)."""
        now = time.monotonic()
        if isinstance(msg, Heartbeat):
            w.last_hb = now
        elif isinstance(msg, Ready):
            w.state, w.device, w.pid, w.last_hb = "ready", msg.device, msg.pid, now
            self.startup_failures = 0
            self.ready_event.set()
        elif isinstance(msg, Fatal):
            w.fatal = msg.error
        elif isinstance(msg, Retire):
            w.state = "retiring"
            log.info("Worker %d retires: %s", w.slot, msg.reason)

    def kill(self, w: WorkerHandle, *, dump_stacks: bool = False) -> None:
        """SIGKILLs ``w``'s process group (``dump_stacks``: asks it for its threads' stacks
        first, into its log)."""
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

    def kill_stalled_startups(self, now: float) -> None:
        """Kills the workers silent ``startup_timeout_s`` after their start."""
        for w in self.live():
            if w.state == "starting" and now - w.started > self.startup_timeout_s:
                w.fatal = w.fatal or f"no sign of life {self.startup_timeout_s:.0f} s after start"
                self.kill(w)

    def kill_all(self) -> None:
        """SIGKILLs every worker's process group at once. Takes no lock."""
        for w in list(self.handles.values()):
            if w is not None:
                with contextlib.suppress(OSError):
                    os.killpg(w.process.pid, signal.SIGKILL)

    def stderr_tail(self, w: WorkerHandle) -> str:
        """The last characters of ``w``'s log."""
        try:
            with open(w.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 8 * STDERR_TAIL_CHARS))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return text[-STDERR_TAIL_CHARS:].strip()

    def exited(self) -> list[WorkerHandle]:
        """The workers whose process exited, or whose pipe closed."""
        return [w for w in self.live() if w.process.poll() is not None or w.eof]

    def wait_exit(self, w: WorkerHandle) -> None:
        """Waits for ``w``'s process to end, killing it after 5 s."""
        try:
            w.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill(w)
            w.process.wait(timeout=5)

    def remove(self, w: WorkerHandle) -> None:
        """Closes a dead worker's handle and frees its slot (for :meth:`respawn`)."""
        self.close_handle(w)
        self.handles[w.slot] = None

    def close_handle(self, w: WorkerHandle) -> None:
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

    def startup_failed(self, w: WorkerHandle, why: str) -> str | None:
        """Counts a worker that did not start; after MAX_STARTUP_FAILURES in a row, the
        message that breaks the engine, in one line: what failed and the worker's log, which
        holds the traceback (a worker that died before it could say why: its log's last line,
        e.g. an import error)."""
        self.startup_failures += 1
        if not w.fatal:
            last = [line for line in self.stderr_tail(w).splitlines() if line.strip()]
            if last:
                why = f"{why}: {' '.join(last[-1].split())}"
        log.info("Worker %d failed to start (%s); its log: %s", w.slot, why, w.log_path)
        if self.startup_failures < MAX_STARTUP_FAILURES:
            return None
        return (
            f"Engine workers (mode {self.mode!r}) failed to start {self.startup_failures} "
            f"times in a row; last: {why.strip()} (traceback in the worker log {w.log_path})"
        )

    def respawn(self) -> None:
        """Starts a worker in every free slot."""
        for slot, w in self.handles.items():
            if w is None:
                self.handles[slot] = self.spawn(slot)

    def stop(self, *, kill: bool) -> None:
        """Stops every worker (``kill``: at once) and waits for them; the slots are freed."""
        workers = self.live()
        for w in workers:
            if kill:
                self.kill(w)
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
                self.kill(w)
                w.process.wait(timeout=5)
            self.close_handle(w)
        for slot in self.handles:
            self.handles[slot] = None

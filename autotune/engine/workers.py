"""The engine's worker processes: starting one per slot (fork + exec, with its GPU and log),
killing, reaping and respawning them, and what a dead worker's exit and stderr say.

:class:`_WorkerPool` is a part of :class:`~.dispatcher.Engine` (its base class): the methods
run on the engine's dispatcher thread, over the engine's own state and lock."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from autotune._paths import open_log
from autotune.engine.messages import (
    EngineError,
    Stop,
    WorkerSpec,
)
from autotune.engine.tasks import _ACTIVE_STAGES, _Task
from autotune.engine.worker import _BOOT
from autotune.evaluation.xla_autotune import autotune_cache_folder, pin_in
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Problem

log = logging.getLogger("autotune.engine.dispatcher")

_STARTUP_TIMEOUT_S = 300.0
_MAX_STARTUP_FAILURES = 3
_STDERR_TAIL_CHARS = 2000



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
    # The problems it has been sent work of: their first-use costs (the problem's first
    # compile, its inputs' and reference's programs loaded) are paid in this process.
    problems: set[Problem] = dataclasses.field(default_factory=set)

    @property
    def isolating(self) -> bool:
        return any(t.isolate for t in self.tasks.values())


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


class _WorkerPool:
    """The worker-process half of :class:`~.dispatcher.Engine`."""

    def _spawn(self, slot: int) -> _WorkerHandle:
        gpu = self._slots[slot]
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if self.mode == DeviceKind.GPU:
            # The tuner process may use the same GPU: a worker must not grab 75% of it.
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            # Every worker times the same XLA program for a baseline (evaluation.xla_autotune).
            pin_in(env, autotune_cache_folder(self.compilation_cache, self._log_dir))
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
            with os.fdopen(open_log(log_path), "ab") as log_file:  # never through a link
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
        """Counts a worker that did not start; after _MAX_STARTUP_FAILURES in a row the engine
        is broken, with one line: what failed and the worker's log, which holds the traceback
        (a worker that died before it could say why: its log's last line, e.g. an import
        error)."""
        self._startup_failures += 1
        if not w.fatal:
            last = [line for line in self._stderr_tail(w).splitlines() if line.strip()]
            if last:
                why = f"{why}: {' '.join(last[-1].split())}"
        log.info("Worker %d failed to start (%s); its log: %s", w.slot, why, w.log_path)
        if self._startup_failures >= _MAX_STARTUP_FAILURES:
            message = (
                f"Engine workers (mode {self.mode!r}) failed to start {self._startup_failures} "
                f"times in a row; last: {why.strip()} (traceback in the worker log {w.log_path})"
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

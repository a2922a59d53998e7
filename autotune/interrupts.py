"""Ctrl-C and SIGTERM on the command line: say at once what is waited for, and end soon.

The first SIGINT (Ctrl-C) or SIGTERM (what batch schedulers send) writes one line at once,
with what the process waits for (``status``: the configs in flight and where the worker logs
are), then raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread. The job
runner then closes its in-flight trials so that a later run measures them (finished ones stay
stored), and the engine kills its workers instead of waiting for them. A second signal ends
the process at once (``abort`` kills the workers first); the trials it leaves open are closed
by the next run, as after ``kill -9``.

Exit status: 128 + the signal's number, 130 for SIGINT and 143 for SIGTERM. After a signal the
process ends by :func:`end_process` (``os._exit``), not through the interpreter's teardown, in
which Python puts the default handlers back: a second signal then would end it by the signal
itself rather than with 128 + its number.

Only the command line installs these handlers (:func:`handling`); a program that calls
``autotune.tune`` keeps its own.

A bound on the ending (``handling(grace_s=...)``, every command but ``tune``): Python runs a
signal handler only once the main thread is back in Python code, so a thread blocked inside a
driver call (a database on a hung file system) would never see it. A watchdog thread hears the
signal at C level (``signal.set_wakeup_fd``) and, when the process has not ended ``grace_s``
after it, ends it with 128 + the signal's number. ``tune`` has its own bound: a second signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

__all__ = ["Interrupted", "Handler", "handling", "end_process", "SIGNALS", "GRACE_S"]

# How long a command other than ``tune`` may take to end after SIGINT or SIGTERM.
GRACE_S = 5.0

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The first signal a Handler of this process received (None: none).
_received: int | None = None


class Interrupted(KeyboardInterrupt):
    """The process got SIGINT or SIGTERM; ``exit_code`` is 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _say(text: str) -> None:
    # Straight to the file descriptor: the interrupted code may be inside sys.stderr's write.
    with contextlib.suppress(OSError):
        os.write(2, text.encode(errors="replace"))


class Handler:
    """The installed handler. ``status()`` says what the process waits for; ``abort()`` runs
    before a second signal ends the process (both optional, set while a job runs)."""

    def __init__(self) -> None:
        self.status: Callable[[], str] | None = None
        self.abort: Callable[[], None] | None = None
        self.received: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            _say(f"\nautotune: {_name(signum)} again: stopping at once; the next run closes "
                 "the trials left open and measures them.\n")
            if self.abort is not None:
                with contextlib.suppress(Exception):
                    self.abort()
            os._exit(128 + signum)
        self.received = signum
        global _received
        _received = _received or signum
        what = ""
        if self.status is not None:
            try:
                what = self.status()
            except Exception:  # noqa: BLE001 - the message must not fail the interrupt
                what = ""
        again = "Ctrl-C again" if signum == signal.SIGINT else "SIGTERM or Ctrl-C again"
        _say(f"\nautotune: {_name(signum)}: stopping; {what or 'nothing in flight'}. "
             f"{again} stops at once.\n")
        raise Interrupted(signum)


class _Watchdog:
    """Ends the process ``grace_s`` after SIGINT or SIGTERM reached it at C level, if it has
    not ended by then (see the module docstring)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="autotune-signal-watchdog", daemon=True).start()

    def _watch(self) -> None:
        try:
            while not self._stopped.is_set():
                data = os.read(self._read, 16)
                if not data:
                    return  # stop() closed the pipe
                heard = [b for b in data if b in SIGNALS]
                if heard:
                    deadline = time.monotonic() + self.grace_s
                    if not self._stopped.wait(max(0.0, deadline - time.monotonic())):
                        _say(f"\nautotune: still not ended {self.grace_s:g} s after "
                             f"{_name(heard[0])}: stopping at once.\n")
                        os._exit(128 + heard[0])
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read)

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._previous)
        with contextlib.suppress(OSError):
            os.close(self._write)


@contextlib.contextmanager
def handling(*, grace_s: float | None = None) -> Iterator[Handler]:
    """Installs a :class:`Handler` for SIGINT and SIGTERM (in the main thread only; elsewhere
    the handler is returned but not installed), and restores the previous handlers after,
    unless a signal came: then it stays, so that a second signal during the shutdown that
    follows (threads joined, workers reaped) still ends the process at once with 128 + its
    number, never with Python's own KeyboardInterrupt exit.

    ``grace_s``: once a signal came, the process ends at the latest ``grace_s`` later, even
    when its main thread is blocked in C code (:class:`_Watchdog`)."""
    handler = Handler()
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    watchdog = _Watchdog(grace_s) if grace_s is not None else None
    try:
        yield handler
    finally:
        if handler.received is None:
            if watchdog is not None:
                watchdog.stop()
            for s, old in previous.items():
                signal.signal(s, old)


def end_process(code: int) -> NoReturn:
    """Ends the process with exit status ``code``: after a signal, at once with ``os._exit``
    once stdout and stderr are flushed (everything to close is closed by then); otherwise by
    ``SystemExit``, through the interpreter's usual teardown."""
    if _received is None:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)

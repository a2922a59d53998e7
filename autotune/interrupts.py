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
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

__all__ = ["Interrupted", "Handler", "handling", "end_process", "SIGNALS"]

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


@contextlib.contextmanager
def handling() -> Iterator[Handler]:
    """Installs a :class:`Handler` for SIGINT and SIGTERM (in the main thread only; elsewhere
    the handler is returned but not installed), and restores the previous handlers after,
    unless a signal came: then it stays, so that a second signal during the shutdown that
    follows (threads joined, workers reaped) still ends the process at once with 128 + its
    number, never with Python's own KeyboardInterrupt exit."""
    handler = Handler()
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield handler
    finally:
        if handler.received is None:
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

"""Progress of a tuning job, drawn for people or written for machines.

The run loop (``autotune.tuning.scheduler``, which runs problems side by side) reports what
happens as :class:`~autotune.tuning.reports.Event` values to one callable, an *observer*; it never
prints. This module holds the observers the CLI and :func:`autotune.tune` use:

* :class:`BarProgress`: on a terminal, one live tqdm bar per problem (several problems in
  flight at once get one line each); log records are written above the bars
  (``tqdm.contrib.logging.logging_redirect_tqdm``), never through them.
* :class:`LineProgress`: elsewhere (a file, a CI log), one line per finished trial:
  problem, n/N, status, time, best so far, and for a crash the worker log's path.
* :class:`JsonlProgress`: one JSON object per event, for machines (``--jsonl``).
* :class:`Progress`: the base, which draws nothing and counts trials by outcome (``--quiet``).

Every observer counts the trials it saw finish by outcome (:attr:`Progress.counts`), so a
caller can say at the end how many crashed in this run. Events: ``start`` (a problem begins),
``trial`` (one config measured: ``status``, ``time_us``, ``number``, ``log_path``), ``skip``
(a problem needs no work) and ``done`` (a problem ended; ``message`` says why).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["Progress", "BarProgress", "LineProgress", "JsonlProgress", "make_progress", "MODES",
           "format_us"]

MODES = ("auto", "bar", "lines", "jsonl", "quiet")


class Progress:
    """The observer protocol, drawing nothing: call it with each event, ``close()`` at the end.

    ``counts`` maps an outcome (``"ok"``, ``"crashed"``, ...) to the trials seen ending so;
    ``crash_logs`` lists the worker logs of crashed trials.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.crash_logs: list[str] = []

    def __call__(self, event: Any) -> None:
        if event.kind == "trial" and event.status:
            self.counts[event.status] += 1
            if event.status == "crashed" and event.log_path:
                self.crash_logs.append(event.log_path)
        self.handle(event)

    def handle(self, event: Any) -> None:
        """Draws ``event``; the base draws nothing."""

    @contextlib.contextmanager
    def active(self) -> Iterator[Progress]:
        """The observer, open for the duration of a job; closed at the end."""
        try:
            yield self
        finally:
            self.close()

    def close(self) -> None:
        """Ends the display (bars are closed, lines flushed)."""


def format_us(us: float | None) -> str:
    """A time in the unit that reads best: ``812.3 us``, ``2.36 ms``, ``12.7 s``."""
    if us is None:
        return "-"
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def _best(event: Any) -> str:
    return format_us(event.best_us)


def _n_of(event: Any) -> str:
    return f"{event.done}/{event.total if event.total is not None else '?'}"


class LineProgress(Progress):
    """One line per finished trial (and per problem start, skip and end) to ``stream``."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self._stream = stream

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()

    def handle(self, event: Any) -> None:
        if event.kind == "trial":
            took = format_us(event.time_us)
            line = (f"{event.problem}: trial {_n_of(event)} {event.status or '?'} {took}; "
                    f"best {_best(event)}")
            if event.status == "crashed" and event.log_path:
                line += f"; worker log {event.log_path}"
            self._write(line)
        elif event.kind == "start":
            self._write(f"{event.problem}: start, {_n_of(event)} trials stored, best {_best(event)}")
        else:  # skip, done
            self._write(f"{event.problem}: {event.kind} {_n_of(event)}, best {_best(event)}"
                        + (f" ({event.message})" if event.message else ""))


class JsonlProgress(Progress):
    """One JSON object per event to ``stream`` (stdout by default): ``{"event": kind,
    "time": "2026-01-01T12:00:00.000+00:00", "problem": ..., "kernel", "shape", "dtype",
    "done", "total", "best_us", ...}``."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self._stream = stream

    def handle(self, event: Any) -> None:
        record: dict[str, Any] = {
            "event": event.kind,
            # when the event was written: UTC, ISO 8601 with milliseconds
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "problem": str(event.problem),
            "kernel": event.problem.kernel,
            "shape": event.problem.dims,
            "dtype": event.problem.dtype,
            "done": event.done,
            "total": event.total,
            "best_us": event.best_us,
        }
        if event.kind == "trial":
            record.update(number=event.number, status=event.status, time_us=event.time_us,
                          config=event.config, log_path=event.log_path or None)
        if event.message and event.kind != "trial":
            record["message"] = event.message
        stream = self._stream or sys.stdout
        stream.write(json.dumps(record, default=str) + "\n")
        stream.flush()


class BarProgress(Progress):
    """One tqdm bar per problem on ``stream`` (stderr by default); log records above them."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._bars: dict[Any, Any] = {}
        self._redirect: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[Progress]:
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm(loggers=[logging.getLogger()]):
            try:
                yield self
            finally:
                self.close()

    def _bar(self, event: Any) -> Any:
        from tqdm.auto import tqdm

        bar = self._bars.get(event.problem)
        if bar is None:
            bar = tqdm(total=event.total, initial=event.done, desc=str(event.problem),
                       unit="trial", file=self._stream or sys.stderr, leave=True,
                       position=len(self._bars), dynamic_ncols=True)
            self._bars[event.problem] = bar
        return bar

    def handle(self, event: Any) -> None:
        bar = self._bar(event)
        if event.total is not None and bar.total != event.total:
            bar.total = event.total
        bar.n = event.done
        postfix = f"best {_best(event)}"
        if event.kind == "trial" and event.status and event.status != "ok":
            postfix += f", last {event.status}"
        bar.set_postfix_str(postfix, refresh=False)
        if event.kind == "trial" and event.status == "crashed" and event.log_path:
            bar.write(f"{event.problem}: a trial crashed; worker log {event.log_path}",
                      file=self._stream or sys.stderr)
        if event.kind in ("skip", "done"):
            if event.message:
                bar.set_postfix_str(f"{postfix} ({event.message})", refresh=False)
            bar.refresh()
            bar.close()
            return
        bar.refresh()

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


def _sized_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal with a width: a pty allocated without a size (as some
    CI runners do) reports 0 columns, where tqdm's bars would draw nothing at all."""
    if not getattr(stream, "isatty", lambda: False)():
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


def make_progress(mode: str = "auto", *, stream: IO[str] | None = None) -> Progress:
    """The observer for ``mode``: ``"bar"`` (tqdm), ``"lines"``, ``"jsonl"``, ``"quiet"``,
    or ``"auto"``: bars when ``stream`` (default stderr) is a terminal with a width, else
    lines (a pty with no size gets lines too).

    Raises:
      ValueError: an unknown mode, naming the allowed ones.
    """
    if mode == "auto":
        target = stream or sys.stderr
        mode = "bar" if _sized_terminal(target) else "lines"
    if mode == "bar":
        return BarProgress(stream)
    if mode == "lines":
        return LineProgress(stream)
    if mode == "jsonl":
        return JsonlProgress(stream)
    if mode == "quiet":
        return Progress()
    raise ValueError(f"progress mode {mode!r} is unknown; expected one of {', '.join(MODES)}.")

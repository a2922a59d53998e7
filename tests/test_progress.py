"""Progress observers: lines when piped, tqdm bars on a terminal (logs above them), JSON
lines for machines, counts for the caller; autotune.tune() shows bars where a person watches."""

from __future__ import annotations

import io
import json
import logging
from contextlib import contextmanager

import pytest

from autotune import api
from autotune.progress import (
    BarProgress,
    JsonlProgress,
    LineProgress,
    Progress,
    format_us,
    make_progress,
)
from autotune.space.problem import Problem
from autotune.tuning.reports import Event

P = Problem("softmax", {"rows": 64, "cols": 512}, "float32")


def _events(crash: bool = False) -> list[Event]:
    return [
        Event("start", P, 0, 3, None),
        Event("trial", P, 1, 3, 12.5, status="ok", time_us=12.5, number=0, config={"b": 1}),
        Event("trial", P, 2, 3, 12.5, status="crashed" if crash else "ok",
              time_us=None if crash else 20.0, number=1, config={"b": 2},
              log_path="/x/worker-0-1.log" if crash else ""),
        Event("trial", P, 3, 3, 9.0, status="ok", time_us=9.0, number=3, config={"b": 4}),
        Event("done", P, 3, 3, 9.0, message="trial budget (3) spent"),
    ]


def test_lines_one_per_finished_trial_with_n_of_total_status_time_and_best():
    """LineProgress: a line per trial with problem, n/N, status, time, best so far; a crash
    names the worker log."""
    out = io.StringIO()
    progress = LineProgress(out)
    with progress.active():
        for e in _events(crash=True):
            progress(e)
    lines = out.getvalue().splitlines()
    trials = [line for line in lines if ": trial " in line]
    assert trials[0] == "softmax[cols=512,rows=64; float32]: trial 1/3 ok 12.5 us; best 12.5 us"
    assert trials[1].endswith("crashed -; best 12.5 us; worker log /x/worker-0-1.log")
    assert "trial budget (3) spent" in lines[-1]
    assert [format_us(x) for x in (812.34, 2361.7, 12722161.4)] == ["812.3 us", "2.36 ms", "12.72 s"]
    assert progress.counts == {"ok": 2, "crashed": 1} and progress.crash_logs == ["/x/worker-0-1.log"]


def test_jsonl_one_object_per_event():
    """JsonlProgress: one JSON object per event, trials with number, status, time and config."""
    out = io.StringIO()
    progress = JsonlProgress(out)
    for e in _events():
        progress(e)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["start", "trial", "trial", "trial", "done"]
    assert records[3]["number"] == 3 and records[3]["time_us"] == 9.0 and records[3]["config"] == {"b": 4}
    assert records[-1]["message"] == "trial budget (3) spent"


def test_jsonl_events_carry_a_utc_timestamp():
    """Every --jsonl event says when it was written: UTC, ISO 8601, milliseconds."""
    import datetime as dt

    out = io.StringIO()
    progress = JsonlProgress(out)
    before = dt.datetime.now(dt.UTC)
    for e in _events():
        progress(e)
    after = dt.datetime.now(dt.UTC)
    for line in out.getvalue().splitlines():
        stamp = dt.datetime.fromisoformat(json.loads(line)["time"])
        assert stamp.utcoffset() == dt.timedelta(0)
        assert before - dt.timedelta(milliseconds=1) <= stamp <= after


def test_bar_draws_with_tqdm_and_writes_log_records_above_it(capsys):
    """BarProgress: a tqdm bar per problem on stderr; a warning logged to stderr while it is
    open is written on a line of its own, never into the bar's line."""
    import sys

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)  # as the CLI's logging.basicConfig does
    root.addHandler(handler)
    try:
        progress = BarProgress()
        with progress.active():
            events = _events()
            for e in events[:2]:
                progress(e)
            logging.getLogger("autotune.engine.dispatcher").warning("Worker 0 died: SIGFPE")
            for e in events[2:]:
                progress(e)
    finally:
        root.removeHandler(handler)
    text = capsys.readouterr().err
    segments = [s.strip() for line in text.split("\n") for s in line.split("\r")]
    assert "Worker 0 died: SIGFPE" in segments, repr(text)
    assert any("3/3" in s and "best 9.0 us" in s and str(P) in s for s in segments)


def test_auto_mode_picks_lines_off_a_terminal_and_bars_on_one():
    """make_progress('auto'): lines for a file or pipe, tqdm bars for a terminal with a size,
    and lines for a pty with no size (as some CI runners allocate: bars drew nothing there)."""
    import fcntl
    import os
    import struct
    import termios

    assert type(make_progress("auto", stream=io.StringIO())) is LineProgress
    leader, follower = os.openpty()  # a fresh pty has no size: 0 rows, 0 columns
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert os.get_terminal_size(follower).columns == 0
            assert type(make_progress("auto", stream=tty)) is LineProgress
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            assert type(make_progress("auto", stream=tty)) is BarProgress
    finally:
        os.close(leader)
        os.close(follower)
    assert type(make_progress("quiet")) is Progress
    with pytest.raises(ValueError, match="expected one of auto, bar, lines, jsonl, quiet"):
        make_progress("fancy")


@pytest.mark.parametrize("watched, progress, drawn", [
    (True, True, True), (True, False, False), (False, True, False),
])
def test_tune_shows_progress_where_a_person_watches(watched, progress, drawn, monkeypatch, tmp_path, capsys):
    """autotune.tune(): bars on stderr by default when a person watches; progress=False or no
    terminal draws nothing; on_event still sees every event."""
    from tests.test_cli import _FakeEngine  # the CLI tests' in-process engine and toy kernel

    @contextmanager
    def fake_open_engine(device="auto", **kwargs):
        yield _FakeEngine("gpu")

    monkeypatch.setattr(api, "open_engine", fake_open_engine)
    monkeypatch.setattr(api, "_watched", lambda: watched)
    seen = []
    api.tune("cli_toy", [{"m": 512}], dtype="float32", trials=3, db=f"sqlite:///{tmp_path}/t.db",
             on_event=seen.append, progress=progress)
    err = capsys.readouterr().err
    assert ("3/3" in err and "cli_toy[m=512; float32]" in err) is drawn, err
    assert [e.kind for e in seen].count("trial") == 3

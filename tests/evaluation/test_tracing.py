"""Tests for autotune.evaluation.tracing: per-region durations from Perfetto trace files."""

from __future__ import annotations

import json
import sys

import pytest

from autotune.evaluation import tracing


def _pair(name, begin, end, pid=1, tid=1):
    return [
        {"name": name, "ph": "B", "ts": begin, "pid": pid, "tid": tid},
        {"name": name, "ph": "E", "ts": end, "pid": pid, "tid": tid},
    ]


def _write(path, events, *, wrap=True):
    path.write_text(
        json.dumps({"displayTimeUnit": "ns", "traceEvents": events} if wrap else events)
    )
    return path


def test_median_and_count_over_warpgroups_and_sms(tmp_path):
    """Durations pool over (pid, tid) traces: median over all pairs, count of pairs."""
    events = _pair("load", 0, 2, pid=1, tid=1) + _pair("load", 10, 14, pid=1, tid=2)
    events += _pair("load", 5, 11, pid=2, tid=3)
    _write(tmp_path / "k-1-trace.json", events)
    assert tracing.parse_trace_dir(tmp_path) == {"load": (4.0, 3)}


def test_nested_regions_are_matched_by_name(tmp_path):
    """An inner region inside an outer one closes its own begin, not the outer's."""
    events = [
        {"name": "outer", "ph": "B", "ts": 0, "pid": 1, "tid": 1},
        {"name": "inner", "ph": "B", "ts": 1, "pid": 1, "tid": 1},
        {"name": "inner", "ph": "E", "ts": 3, "pid": 1, "tid": 1},
        {"name": "outer", "ph": "E", "ts": 10, "pid": 1, "tid": 1},
    ]
    _write(tmp_path / "a.json", events)
    assert tracing.parse_trace_dir(tmp_path) == {"inner": (2.0, 1), "outer": (10.0, 1)}


def test_reentered_region_in_a_loop_counts_each_iteration(tmp_path):
    """A scope inside a loop gives one pair per iteration; a recursive re-entry nests."""
    events = _pair("step", 0, 1) + _pair("step", 1, 3) + _pair("step", 3, 6)
    events += [
        {"name": "rec", "ph": "B", "ts": 10, "pid": 1, "tid": 1},
        {"name": "rec", "ph": "B", "ts": 11, "pid": 1, "tid": 1},
        {"name": "rec", "ph": "E", "ts": 12, "pid": 1, "tid": 1},
        {"name": "rec", "ph": "E", "ts": 20, "pid": 1, "tid": 1},
    ]
    _write(tmp_path / "a.json", events)
    stats = tracing.parse_trace_dir(tmp_path, detailed=True)
    assert (stats["step"].median_us, stats["step"].count, stats["step"].traces) == (2.0, 3, 1)
    assert (stats["rec"].min_us, stats["rec"].max_us) == (1.0, 10.0)


def test_same_region_on_different_threads_is_not_crossed(tmp_path):
    """Begin on one warpgroup and end on another never form a pair."""
    events = [
        {"name": "r", "ph": "B", "ts": 0, "pid": 1, "tid": 1},
        {"name": "r", "ph": "B", "ts": 5, "pid": 1, "tid": 2},
        {"name": "r", "ph": "E", "ts": 6, "pid": 1, "tid": 2},
        {"name": "r", "ph": "E", "ts": 100, "pid": 1, "tid": 1},
    ]
    _write(tmp_path / "a.json", events)
    durations = sorted(
        d for _, d in tracing.region_durations(tracing.read_trace_events(tmp_path / "a.json"))["r"]
    )
    assert durations == [1.0, 100.0]


def test_unmatched_and_malformed_events_are_skipped(tmp_path):
    """Lone E, never-closed B, missing ts/name, end before begin: skipped, the rest counted."""
    events = _pair("ok", 0, 4)
    events += [
        {"name": "lone_end", "ph": "E", "ts": 3, "pid": 1, "tid": 1},
        {"name": "never_closed", "ph": "B", "ts": 3, "pid": 1, "tid": 1},
        {"name": "no_ts", "ph": "B", "pid": 1, "tid": 1},
        {"ph": "B", "ts": 1, "pid": 1, "tid": 1},
        {"name": "ok", "ph": "E", "ts": 50, "pid": 9, "tid": 9},
        {"name": "ok", "ph": "M", "ts": 50, "pid": 1, "tid": 1},
        "not an event",
    ]
    _write(tmp_path / "a.json", events)
    assert tracing.parse_trace_dir(tmp_path) == {"ok": (4.0, 1)}


def test_events_out_of_order_in_the_file_are_sorted_by_time(tmp_path):
    """Files list blocks one after another; matching goes by timestamp within a trace."""
    events = list(reversed(_pair("r", 1, 4)))
    _write(tmp_path / "a.json", events)
    assert tracing.parse_trace_dir(tmp_path) == {"r": (3.0, 1)}


def test_complete_events_and_bare_list_files(tmp_path):
    """``ph: X`` events with ``dur`` count as pairs; a file may be a bare event list."""
    _write(
        tmp_path / "a.json",
        [{"name": "x", "ph": "X", "ts": 0, "dur": 7, "pid": 1, "tid": 1}],
        wrap=False,
    )
    assert tracing.parse_trace_dir(tmp_path) == {"x": (7.0, 1)}


def test_files_are_pooled_but_their_traces_kept_apart(tmp_path):
    """Two files reuse pid/tid numbers: a begin in one never pairs with an end in the other."""
    _write(tmp_path / "a.json", [{"name": "r", "ph": "B", "ts": 0, "pid": 1, "tid": 1}])
    _write(
        tmp_path / "b.json",
        _pair("r", 10, 12) + [{"name": "r", "ph": "E", "ts": 30, "pid": 1, "tid": 1}],
    )
    assert tracing.parse_trace_dir(tmp_path) == {"r": (2.0, 1)}


def test_unreadable_file_is_skipped_with_a_warning(tmp_path, caplog):
    """A truncated trace (the kernel crashed while dumping) does not hide the others."""
    (tmp_path / "bad.json").write_text('{"traceEvents": [')
    (tmp_path / "odd.json").write_text('{"something": 1}')
    _write(tmp_path / "good.json", _pair("r", 0, 1))
    assert tracing.parse_trace_dir(tmp_path) == {"r": (1.0, 1)}
    assert "bad.json" in caplog.text and "odd.json" in caplog.text


def test_clock_ghz_converts_kilocycles_to_microseconds(tmp_path):
    """Mosaic GPU durations are SM cycles / 1000; at 2 GHz, 1000 units are 500 µs."""
    _write(tmp_path / "a.json", _pair("r", 0, 1000))
    assert tracing.parse_trace_dir(tmp_path, clock_ghz=2.0) == {"r": (500.0, 1)}


def test_empty_directory_gives_no_regions(tmp_path):
    """No trace files (interpret mode writes none): an empty result, not an error."""
    assert tracing.parse_trace_dir(tmp_path) == {}


def test_tracing_does_not_import_jax():
    """Reports read traces on machines without jax."""
    import subprocess

    code = "import autotune.evaluation.tracing, sys; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("name", tracing.__all__)
def test_public_api_is_defined(name):
    """Every name in ``__all__`` exists."""
    assert hasattr(tracing, name)

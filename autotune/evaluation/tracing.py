"""In-kernel traces: per-region durations from the Perfetto JSON files Mosaic GPU writes.

Building a kernel with ``profile_space`` > 0 makes each run write one file per kernel to the
profile directory (``<kernel>-<ns>-trace.json``)::

    {"displayTimeUnit": "ns",
     "traceEvents": [{"name": "load", "ph": "B", "ts": 12.5, "pid": 3, "tid": 17}, ...]}

with one begin (``B``) / end (``E``) pair per ``jax.named_scope`` region entered by each traced
warpgroup (or warp); ``pid`` is 1 + the SM and ``tid`` numbers the warpgroup across the grid.

Units. Mosaic GPU writes ``ts = (globaltimer_ns + clock_cycles) / 1000``: within one trace the
differences are SM clock cycles / 1000, which Perfetto shows as microseconds. Durations here
are in that unit ("trace µs") unless ``clock_ghz`` is given, which converts kilocycles to real
microseconds (the H200's SM clock boosts to about 1.98 GHz).

Pure Python: no jax, so reports can read traces on any machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "RegionStats",
    "region_durations",
    "summarize",
    "read_trace_events",
    "parse_trace_files",
    "parse_trace_dir",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RegionStats:
    """Durations of one named region over every warpgroup (or warp) on every SM.

    ``count`` is the number of matched begin/end pairs; ``traces`` the number of distinct
    (SM, warpgroup) traces the region appears in (a region inside a loop appears several times
    per trace).
    """

    name: str
    median_us: float
    min_us: float
    max_us: float
    count: int
    traces: int


def read_trace_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of one trace file (object form ``{"traceEvents": [...]}`` or a bare list).

    Raises:
      ValueError: the file is not JSON or holds no event list.
    """
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"Trace file {path} is not valid JSON: {e}") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"Trace file {path} has no 'traceEvents' list.")
    return [e for e in events if isinstance(e, dict)]


def region_durations(events: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[Any, float]]]:
    """Matches begin/end events per (pid, tid) and name; returns name -> [(trace, duration)].

    Regions may nest, and a name may be re-entered (a scope inside a loop): an ``E`` closes the
    innermost open ``B`` of the same name on the same trace. Unmatched ``E`` events (no open
    ``B``), ``B`` events never closed, events without a name, timestamp, or with a negative
    duration are skipped and logged at debug level. Complete events (``ph == "X"`` with
    ``dur``) count as one pair.
    """
    open_: dict[tuple[Any, Any, str], list[float]] = {}
    out: dict[str, list[tuple[Any, float]]] = {}
    skipped = 0
    # Stable sort by time within each trace: files list blocks one after another.
    indexed = [(i, e) for i, e in enumerate(events)]
    indexed.sort(key=lambda ie: (_ts(ie[1]) is None, _ts(ie[1]) or 0.0, ie[0]))
    for _, event in indexed:
        name, ph, ts = event.get("name"), event.get("ph"), _ts(event)
        if not isinstance(name, str) or ts is None:
            skipped += 1
            continue
        trace = (event.get("pid"), event.get("tid"))
        if ph == "X":
            dur = event.get("dur")
            if isinstance(dur, int | float) and dur >= 0:
                out.setdefault(name, []).append((trace, float(dur)))
            else:
                skipped += 1
        elif ph == "B":
            open_.setdefault((*trace, name), []).append(ts)
        elif ph == "E":
            stack = open_.get((*trace, name))
            if not stack:
                skipped += 1
                continue
            begin = stack.pop()
            if ts < begin:
                skipped += 1
                continue
            out.setdefault(name, []).append((trace, ts - begin))
    skipped += sum(len(s) for s in open_.values())
    if skipped:
        log.debug("Skipped %d unmatched or malformed trace events.", skipped)
    return out


def _ts(event: Mapping[str, Any]) -> float | None:
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return None
    return float(ts)


def summarize(
    durations: Mapping[str, list[tuple[Any, float]]], *, clock_ghz: float | None = None
) -> dict[str, RegionStats]:
    """Median, min, max and count of each region's durations (over warpgroups and SMs)."""
    scale = 1.0 / clock_ghz if clock_ghz else 1.0
    stats = {}
    for name, pairs in sorted(durations.items()):
        if not pairs:
            continue
        values = [d * scale for _, d in pairs]
        stats[name] = RegionStats(
            name=name,
            median_us=statistics.median(values),
            min_us=min(values),
            max_us=max(values),
            count=len(values),
            traces=len({t for t, _ in pairs}),
        )
    return stats


def parse_trace_files(
    paths: Iterable[str | os.PathLike[str]],
    *,
    clock_ghz: float | None = None,
    detailed: bool = False,
) -> dict[str, Any]:
    """Per-region ``(median_us, count)`` pooled over the given trace files.

    A file that is not a readable trace (truncated by a crash) is skipped with a warning.
    ``detailed=True`` returns :class:`RegionStats` values instead of tuples.
    """
    events: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        try:
            file_events = read_trace_events(path)
        except (OSError, ValueError) as e:
            log.warning("Skipping trace file %s: %s", path, e)
            continue
        # Keep traces of different files apart: pid/tid restart in every file.
        for event in file_events:
            event = dict(event)
            event["pid"] = (i, event.get("pid"))
            events.append(event)
    stats = summarize(region_durations(events), clock_ghz=clock_ghz)
    if detailed:
        return dict(stats)
    return {name: (s.median_us, s.count) for name, s in stats.items()}


def parse_trace_dir(
    out_dir: str | os.PathLike[str], *, clock_ghz: float | None = None, detailed: bool = False
) -> dict[str, Any]:
    """:func:`parse_trace_files` over every ``*.json`` file in ``out_dir`` (kernels, runs pooled).

    A region's name is what ``jax.named_scope`` gave it.
    """
    paths = sorted(Path(out_dir).glob("*.json"))
    return parse_trace_files(paths, clock_ghz=clock_ghz, detailed=detailed)

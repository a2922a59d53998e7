"""What a ground-truth record's time is: one place for every reader of ``benchmarks/data``.

A record of ``benchmarks/ground_truth.py`` holds one search-like timing (``median_us``, with
``min_us`` and ``max_us``). ``ground_truth.py --retime FRACTION`` times the configs near the
file's best again, in interleaved rounds (``Engine.confirm``), and appends each round's median
to the record as ``retimed_us``: a single timing taken in a slow moment of the GPU then no
longer decides which config is the best. Files without ``retimed_us`` read as before.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

RETIMED = "retimed_us"


def recorded_us(record: Mapping[str, Any]) -> float:
    """The record's time: the median of its re-timed rounds when it has any, else its median."""
    retimed = record.get(RETIMED)
    return float(statistics.median(retimed)) if retimed else record["median_us"]


def recorded_samples(record: Mapping[str, Any]) -> list[float]:
    """The samples the record's time is the median of (what a replay or a database may take as
    its measurements): the re-timed rounds' medians when present, else its min, median and
    max."""
    retimed = record.get(RETIMED)
    if retimed:
        return [float(t) for t in retimed]
    median = record["median_us"]
    return [record.get("min_us", median), median, record.get("max_us", median)]

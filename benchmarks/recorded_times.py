"""What a ground-truth record's time is, and where a device's records live: one place for every
reader of ``benchmarks/data``.

A record of ``benchmarks/ground_truth.py`` holds one search-like timing (``median_us``, with
``min_us`` and ``max_us``). ``ground_truth.py --retime FRACTION`` times the configs near the
file's best again, in interleaved rounds (``Engine.confirm``), and appends each round's median
to the record as ``retimed_us``: a single timing taken in a slow moment of the GPU then no
longer decides which config is the best. Files without ``retimed_us`` read as before.

Each device's files are kept apart: :func:`device_folder` names the folder of a device's ground
truth (``benchmarks/data/<device>/``; the H200's files, recorded first, are the ones directly in
``benchmarks/data``). ``python3 benchmarks/recorded_times.py "NVIDIA H100 80GB HBM3"`` prints it.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RETIMED = "retimed_us"
DATA = Path(__file__).resolve().parent / "data"
# The device whose files sit directly in benchmarks/data (recorded before per-device folders).
FIRST_DEVICE = "nvidia-h200"


def device_slug(name: str) -> str:
    """A device name as a folder name: ``"NVIDIA H100 80GB HBM3"`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"a device name needs a letter or digit, got {name!r}")
    return slug


def device_folder(name: str, root: Path = DATA) -> Path:
    """The folder of ``name``'s ground-truth files: ``root`` for the H200, else
    ``root/<device_slug(name)>``."""
    slug = device_slug(name)
    return root if slug == FIRST_DEVICE else root / slug


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


if __name__ == "__main__":
    print(device_folder(" ".join(sys.argv[1:])))

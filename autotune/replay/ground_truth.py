"""The recorded ground truth: every config of a problem measured on a GPU, one file per device
and kernel, versioned with the package.

Layout: ``autotune/replay/data/<device_slug(device)>/<kernel>.json.gz``, gzip'd JSON::

    {"format": 1, "device": "NVIDIA H200", "kernel": "hopper_matmul",
     "problems": [PROBLEM, ...],   # sorted by name
     "live": [LIVE, ...]}          # optional: configs that live jobs measured

A PROBLEM is what ``benchmarks/ground_truth.py`` writes for one shape, less its kernel and
device (the file's): ``name`` (``<kernel>__<shape>__<dtype>``, the name of the per-shape file it
came from), ``shape``, ``dtype``, ``jax`` (versions), ``valid_count``, ``sampled``,
``uniform_sample``, ``measured``, ``seconds``, ``iterations``, ``baseline`` and ``results``: one
record per config, ``{"config", "stage" (uniform, neighbourhood, estimated, grid, live or
vendor), "status" (an outcome), "median_us", "min_us", "max_us", "compile_s", "error" (only when
not empty), "retimed_us" (optional: the medians of interleaved re-timing rounds)}``. A LIVE entry is
``{"shape", "dtype", "times": [[config, median_us], ...]}``: each config's median over the live
jobs that measured it (``benchmarks/cost_model_check.py`` compares the cost model with them).

:func:`load_ground_truth` reads problems (each as the per-shape dict, with ``kernel`` and
``device`` filled in), :func:`find_problem` one of them by shape and dtype, and
:func:`fastest_configs` its configs fastest first; :func:`recorded_us` is the time a record
stands for. No jax, no
database: stdlib only.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_DIR",
    "FORMAT",
    "RETIMED",
    "device_slug",
    "fastest_configs",
    "find_problem",
    "ground_truth_path",
    "devices",
    "load_ground_truth",
    "load_live",
    "problem_name",
    "read_problem_file",
    "recorded_us",
    "recorded_samples",
    "save_ground_truth",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
FORMAT = 1
RETIMED = "retimed_us"
SUFFIX = ".json.gz"


def device_slug(name: str) -> str:
    """A device name as a folder name: ``"NVIDIA H100 80GB HBM3"`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"A device name needs a letter or digit, but got {name!r}.")
    return slug


def ground_truth_path(device: str, kernel: str, *, root: Path = DATA_DIR) -> Path:
    """The file of ``device``'s ground truth for ``kernel``: ``root/<slug>/<kernel>.json.gz``."""
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", kernel):
        raise ValueError(f"A kernel name is letters, digits and _.:-, but got {kernel!r}.")
    return root / device_slug(device) / f"{kernel}{SUFFIX}"


def problem_name(kernel: str, shape: Mapping[str, Any], dtype: str) -> str:
    """``<kernel>__<shape>__<dtype>``: ``hopper_matmul__k4096_m4096_n4096__bfloat16``, the
    name of the per-shape file ``benchmarks/ground_truth.py`` writes."""
    dims = "_".join(f"{k}{str(v).lower()}" for k, v in sorted(shape.items()))
    return f"{kernel}__{dims}__{dtype}"


def _read(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != FORMAT or "problems" not in data:
        raise ValueError(f"{path}: not a ground-truth file of format {FORMAT} (docs/replay.md).")
    return data


def _files(device: str | None, kernel: str | None, root: Path) -> list[Path]:
    if device is not None and kernel is not None:
        path = ground_truth_path(device, kernel, root=root)
        return [path] if path.exists() else []
    folders = [root / device_slug(device)] if device is not None else sorted(
        p for p in root.iterdir() if p.is_dir())
    return sorted(p for folder in folders for p in folder.glob(f"*{SUFFIX}")
                  if kernel is None or p.name == f"{kernel}{SUFFIX}")


def devices(*, root: Path = DATA_DIR) -> list[str]:
    """The devices with recorded ground truth, by name (``"NVIDIA H200"``)."""
    return sorted({_read(p)["device"] for p in _files(None, None, root)})


def load_ground_truth(device: str | None = None, kernel: str | None = None, *,
                      root: Path = DATA_DIR) -> list[dict[str, Any]]:
    """The recorded problems of ``device`` (a name, ``"NVIDIA H200"``) and ``kernel`` (None:
    every one), in file order (device folder, kernel, problem name). Each is the per-shape dict
    of docs/replay.md with ``kernel`` and ``device`` filled in; a fresh copy on every call."""
    out = []
    for path in _files(device, kernel, root):
        data = _read(path)
        for problem in data["problems"]:
            out.append({"kernel": data["kernel"], "device": data["device"], **problem})
    return out


def read_problem_file(path: str | os.PathLike[str],
                      required: Sequence[str] = ("kernel", "shape", "dtype", "results")) -> dict[str, Any]:
    """A per-shape ground-truth file (``benchmarks/ground_truth.py --out DIR`` writes them) as
    its dict. ValueError naming the file when it cannot be read as JSON or lacks a ``required``
    key."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e}); give files written by "
                         "benchmarks/ground_truth.py") from None
    missing = [k for k in required if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path}: not a ground-truth file (no {', '.join(missing)}); give files "
                         "written by benchmarks/ground_truth.py")
    return dict(data)


def find_problem(device: str, kernel: str, shape: Mapping[str, Any], dtype: str, *,
                 root: Path = DATA_DIR) -> dict[str, Any] | None:
    """The recorded problem of ``kernel`` at ``shape`` and ``dtype`` on ``device`` (as
    :func:`load_ground_truth` gives it), or None when none is recorded."""
    return next((p for p in load_ground_truth(device, kernel, root=root)
                 if p["shape"] == dict(shape) and p["dtype"] == dtype), None)


def fastest_configs(device: str, kernel: str, shape: Mapping[str, int], dtype: str, *,
                    root: Path = DATA_DIR) -> list[dict[str, Any]]:
    """The configs measured ``ok`` in that recorded problem (:func:`find_problem`), fastest
    first by :func:`recorded_us`; empty when none is recorded."""
    problem = find_problem(device, kernel, shape, dtype, root=root)
    ok = [r for r in (problem or {}).get("results", ()) if r["status"] == "ok"]
    return [dict(r["config"]) for r in sorted(ok, key=recorded_us)]


def load_live(device: str, kernel: str, *, root: Path = DATA_DIR) -> list[dict[str, Any]]:
    """The configs live jobs measured on ``device`` for ``kernel``: ``{"kernel", "shape",
    "dtype", "times": [[config, median_us], ...]}`` per problem (none when not recorded)."""
    out = []
    for path in _files(device, kernel, root):
        data = _read(path)
        out += [{"kernel": data["kernel"], **entry} for entry in data.get("live", [])]
    return out


def save_ground_truth(problems: Iterable[Mapping[str, Any]], *, root: Path = DATA_DIR,
                      live: Sequence[Mapping[str, Any]] | None = None) -> list[Path]:
    """Merges per-shape problems (dicts as ``benchmarks/ground_truth.py`` writes them, with
    ``kernel`` and ``device``) into their device's and kernel's files: a problem of the same
    name is replaced, others are kept. ``live`` (entries with ``kernel`` and ``device``)
    replaces the live entries of the files it names. Each file is written beside itself, then
    renamed, byte for byte the same for the same content. Returns the files written."""
    groups: dict[Path, tuple[str, str, dict[str, dict[str, Any]], list[dict[str, Any]] | None]] = {}

    def group(device: str, kernel: str) -> tuple[str, str, dict[str, dict[str, Any]], list[dict[str, Any]] | None]:
        path = ground_truth_path(device, kernel, root=root)
        if path not in groups:
            old = _read(path) if path.exists() else {"problems": []}
            groups[path] = (device, kernel, {p["name"]: p for p in old["problems"]}, old.get("live"))
        return groups[path]

    for problem in problems:
        record = {k: v for k, v in problem.items() if k not in ("kernel", "device", "date", "file")}
        record["name"] = problem_name(problem["kernel"], problem["shape"], problem["dtype"])
        record["results"] = [{k: v for k, v in r.items() if not (k == "error" and not v)}
                             for r in problem["results"]]
        group(problem["device"], problem["kernel"])[2][record["name"]] = record
    if live is not None:
        by_file: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for entry in live:
            by_file.setdefault((entry["device"], entry["kernel"]), []).append(
                {k: v for k, v in entry.items() if k not in ("kernel", "device")})
        for (device, kernel), entries in by_file.items():
            _, _, named, _ = group(device, kernel)
            groups[ground_truth_path(device, kernel, root=root)] = (device, kernel, named, entries)
    written = []
    for path, (device, kernel, named, live_entries) in sorted(groups.items()):
        data: dict[str, Any] = {"format": FORMAT, "device": device, "kernel": kernel,
                                "problems": [named[n] for n in sorted(named)]}
        if live_entries:
            data["live"] = live_entries
        buffer = io.BytesIO()
        # mtime 0 and no file name: the same content gives the same bytes (a clean git diff).
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
            f.write(json.dumps(data, separators=(",", ":")).encode())
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(buffer.getvalue())
        os.replace(partial, path)
        written.append(path)
    return written


def recorded_us(record: Mapping[str, Any]) -> float:
    """The record's time: the median of its re-timed rounds when it has any, else its median."""
    retimed = record.get(RETIMED)
    return float(statistics.median(retimed)) if retimed else float(record["median_us"])


def recorded_samples(record: Mapping[str, Any]) -> list[float]:
    """The samples the record's time is the median of (what a replay or a database may take as
    its measurements): the re-timed rounds' medians when present, else its min, median and
    max."""
    retimed = record.get(RETIMED)
    if retimed:
        return [float(t) for t in retimed]
    median = record["median_us"]
    return [record.get("min_us", median), median, record.get("max_us", median)]

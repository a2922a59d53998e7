"""Recorded ground truth (and the live jobs' results recorded beside it) into a results
database, so that a live job there starts warm."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autotune.replay.ground_truth import load_live, recorded_samples
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config
from autotune.storage.store import Store

__all__ = ["store_ground_truth", "store_live", "store_live_results"]


def store_ground_truth(db: str, problems: Iterable[Mapping[str, Any]]) -> int:
    """Stores every result of ``problems`` (ground-truth dicts,
    :func:`~autotune.replay.ground_truth.load_ground_truth`) in ``db`` as trials of the device
    they were measured on (kind ``gpu``, CUPTI timing); returns the trials written (a config
    already stored is kept once)."""
    written = 0
    with Store(db) as store:
        for data in problems:
            kernel = get_kernel(data["kernel"])
            problem = kernel.problem(data["shape"], data["dtype"])
            device = DeviceInfo(name=data["device"], kind=DeviceKind.GPU)
            software = {k: str(v) for k, v in data.get("jax", {}).items()}
            for r in data["results"]:
                if r["status"] == "ok":
                    result = TrialResult.timed(recorded_samples(r), compile_s=r.get("compile_s"),
                                               rel_error=None, timing="cupti")
                else:
                    result = TrialResult.failed(Outcome(r["status"]), r.get("error", ""))
                recorded = store.record_trial(problem, Config(r["config"]), result, device=device,
                                              software=software, worker="ground-truth")
                written += not recorded.duplicate
    return written


def store_live(db: str, device: str, entries: Iterable[Mapping[str, Any]], *,
               software: Mapping[str, str] | None = None) -> int:
    """Stores live jobs' recorded results (``load_live`` entries: ``kernel``, ``shape``,
    ``dtype``, ``times`` as ``[config, median_us]`` pairs) in ``db`` as trials of ``device``
    (kind ``gpu``, CUPTI timing, the median as their one sample), as a store of that device holds
    them, with ``software`` (the versions they ran under, when known); returns the trials
    written (a config already stored is kept once)."""
    written = 0
    with Store(db) as store:
        info = DeviceInfo(name=device, kind=DeviceKind.GPU)
        for entry in entries:
            problem = get_kernel(entry["kernel"]).problem(entry["shape"], entry["dtype"])
            for config, median_us in entry["times"]:
                result = TrialResult.timed([float(median_us)], compile_s=None, rel_error=None,
                                           timing="cupti")
                recorded = store.record_trial(problem, Config(config), result, device=info,
                                              software=dict(software or {}), worker="live-job")
                written += not recorded.duplicate
    return written


def store_live_results(db: str, problems: Sequence[Mapping[str, Any]]) -> int:
    """The live jobs' results recorded beside ``problems`` (:func:`load_live`, per device and
    kernel) into ``db``, for the problems that have no ground truth there."""
    written = 0
    for device, kernel in sorted({(p["device"], p["kernel"]) for p in problems}):
        recorded = {(json.dumps(p["shape"], sort_keys=True), p["dtype"]) for p in problems
                    if (p["device"], p["kernel"]) == (device, kernel)}
        entries = [e for e in load_live(device, kernel)
                   if (json.dumps(e["shape"], sort_keys=True), e["dtype"]) not in recorded]
        software = next({k: str(v) for k, v in p.get("jax", {}).items()} for p in problems
                        if (p["device"], p["kernel"]) == (device, kernel))
        written += store_live(db, device, entries, software=software)
    return written

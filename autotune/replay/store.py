"""Recorded ground truth into a results database, so that a live job there starts warm."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.replay.ground_truth import recorded_samples
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config
from autotune.storage.store import Store

__all__ = ["store_ground_truth"]


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

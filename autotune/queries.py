"""Asking the results database what is best: the API a kernel's caller uses at run time.

    >>> best_config("matmul", {"m": 4096, "n": 4096, "k": 4096}, "bf16")
    {'tile_m': 128, 'tile_n': 256, ...}

Every function opens the database (``db``, else ``$AUTOTUNE_DB``, else
``sqlite:///results/autotune.db``), answers, and closes it. A missing SQLite file answers
"nothing tuned" (None, or an empty list) and is not created.

Devices: ``device`` names a device kind (``"gpu"``, ``"interpret"``, ``"fake"``) or a device
(``"NVIDIA H200"``, or any unambiguous part of the name, such as ``"h200"``). By default GPU
results are used when the problem has any, else interpret-mode ones; the answer says which.
Interpret-mode times are never returned for ``device="gpu"`` or a GPU's name.

This module must not import jax, directly or indirectly: asking for a config must not
initialise CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.errors import JobError
from autotune.problem import Problem, ShapeValue, canonical_dtype, parse_shape
from autotune.storage import ProblemSummary, Store, resolve_url, sqlite_path

__all__ = [
    "best_config", "best_result", "list_results", "nearest_results", "shape_distance",
    "BestResult", "ProblemSummary",
]

log = logging.getLogger(__name__)

DEVICE_KINDS = ("gpu", "interpret", "fake")


@dataclasses.dataclass(frozen=True)
class BestResult:
    """The fastest stored config of a problem, and how it compares with the best baseline.

    ``ratio`` is ``median_us / baseline_us``: below 1 the tuned kernel beats the baseline
    (``speedup`` is its inverse). Both are None without a baseline on the same device.
    """

    problem: Problem
    config: dict[str, Any] = dataclasses.field(hash=False)
    median_us: float
    device: str
    device_kind: str
    jax_version: str
    measured_at: dt.datetime
    trial_id: int
    baseline_name: str | None
    baseline_us: float | None
    ratio: float | None

    @property
    def speedup(self) -> float | None:
        """``baseline_us / median_us``: above 1 the tuned kernel is faster."""
        return None if self.ratio is None else 1.0 / self.ratio

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``measured_at`` as ISO 8601 text)."""
        return {
            "kernel": self.problem.kernel,
            "shape": self.problem.dims,
            "dtype": self.problem.dtype,
            "config": dict(self.config),
            "median_us": self.median_us,
            "device": self.device,
            "device_kind": self.device_kind,
            "jax_version": self.jax_version,
            "measured_at": self.measured_at.isoformat(),
            "trial_id": self.trial_id,
            "baseline_name": self.baseline_name,
            "baseline_us": self.baseline_us,
            "ratio": self.ratio,
            "speedup": self.speedup,
        }


def best_config(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
) -> dict[str, Any] | None:
    """The fastest stored config of a problem, with the kernel's own parameter names, or None.

    ``shape`` is a mapping (``{"m": 4096, ...}``) or ``--shape`` text (``"m=4096,n=4096"``);
    ``dtype`` may be an alias (``"bf16"``).
    """
    result = best_result(kernel, shape, dtype, device=device, db=db)
    return None if result is None else dict(result.config)


def best_result(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
) -> BestResult | None:
    """The fastest stored trial of a problem with its baseline comparison, or None."""
    problem = Problem(kernel, parse_shape(shape) if isinstance(shape, str) else shape, dtype)
    with _open(db) as store:
        if store is None:
            return None
        if device is None:
            rows = store.best(problem, device_kind="gpu")
            if not rows:
                rows = store.best(problem, device_kind="interpret")
                if rows:
                    log.info("%s has no GPU results; answering from interpret mode.", problem)
        else:
            name, kind = _device_filter(store, device)
            rows = store.best(problem, device_name=name, device_kind=kind)
        if not rows:
            return None
        return _best_result(store, problem, rows[0])


def _best_result(store: Store, problem: Problem, best: Any) -> BestResult:
    baseline = store.baseline(problem, device_name=best.device.name, device_kind=best.device.kind)
    assert best.median_us is not None  # best() returns timed ok trials only
    return BestResult(
        problem=problem,
        config=dict(best.config),
        median_us=best.median_us,
        device=best.device.name,
        device_kind=best.device.kind,
        jax_version=best.software.get("jax", ""),
        measured_at=best.finished_at,
        trial_id=best.id,
        baseline_name=None if baseline is None else baseline.name,
        baseline_us=None if baseline is None else baseline.median_us,
        ratio=None if baseline is None else best.median_us / baseline.median_us,
    )


def shape_distance(a: Mapping[str, ShapeValue], b: Mapping[str, ShapeValue]) -> float:
    """How far apart two shapes are: ``sum_k |log2(a_k / b_k)|`` over the size keys.

    Size keys are those with integer (not bool) values; every other key (``causal``) must be
    equal, and both shapes must have the same keys, else the distance is infinite.
    """
    if set(a) != set(b):
        return math.inf
    total = 0.0
    for key, x in a.items():
        y = b[key]
        sized = all(isinstance(v, int) and not isinstance(v, bool) for v in (x, y))
        if sized:
            total += abs(math.log2(x / y))
        elif x != y:
            return math.inf
    return total


def nearest_results(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
    limit: int = 5,
) -> list[BestResult]:
    """The best results of the tuned problems nearest to ``shape`` (same kernel and dtype,
    the problem itself excluded), nearest first by :func:`shape_distance`.

    With ``device=None``, problems with GPU results come first (up to ``limit``), then
    problems with interpret-mode results only (up to ``limit``); ties in distance keep the
    order problems were stored in.
    """
    problem = Problem(kernel, parse_shape(shape) if isinstance(shape, str) else shape, dtype)
    with _open(db) as store:
        if store is None:
            return []
        candidates = [
            (d, p)
            for p in store.problems(kernel)
            if p.dtype == problem.dtype and p != problem
            and math.isfinite(d := shape_distance(p.dims, problem.dims))
        ]
        candidates.sort(key=lambda item: item[0])
        filters = (
            [(None, "gpu"), (None, "interpret")]
            if device is None
            else [_device_filter(store, device)]
        )
        out: list[BestResult] = []
        for name, kind in filters:
            found = 0
            for _, other in candidates:
                if found >= limit:
                    break
                rows = store.best(other, device_name=name, device_kind=kind)
                if rows:
                    out.append(_best_result(store, other, rows[0]))
                    found += 1
        return out


def list_results(
    db: str | None = None,
    *,
    kernel: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
) -> list[ProblemSummary]:
    """One summary per stored (problem, device): trials by outcome, best time and config,
    fastest baseline. ``device=None`` lists every device, interpret mode included (each
    summary names its device and kind)."""
    dtype = None if dtype is None else canonical_dtype(dtype)
    with _open(db) as store:
        if store is None:
            return []
        name, kind = (None, None) if device is None else _device_filter(store, device)
        return store.summaries(kernel=kernel, dtype=dtype, device_name=name, device_kind=kind)


@contextlib.contextmanager
def _open(db: str | None) -> Iterator[Store | None]:
    path = sqlite_path(resolve_url(db))
    if path is not None and not path.exists():
        log.info("No results database at %s: nothing has been tuned there.", path)
        yield None
        return
    store = Store(db)
    try:
        yield store
    finally:
        store.close()


def _device_filter(store: Store, device: str) -> tuple[str | None, str | None]:
    """(device name, device kind) to filter by, from a kind, a name, or part of a name."""
    if not isinstance(device, str) or not device.strip():
        raise JobError(
            f"device must be a kind ({', '.join(DEVICE_KINDS)}) or a device name such as "
            f"'NVIDIA H200', but got {device!r}."
        )
    key = device.strip()
    if key.lower() in DEVICE_KINDS:
        return None, key.lower()
    devices = store.devices()
    names = sorted({d.name for d in devices})
    if key in names:
        return key, None
    matches = [name for name in names if key.casefold() in name.casefold()]
    gpus = sorted({d.name for d in devices if d.is_gpu and d.name in matches})
    if len(matches) > 1 and len(gpus) == 1:
        return gpus[0], "gpu"  # "h200" means the GPU, not an interpret run that names it
    if len(matches) > 1:
        raise JobError(
            f"device {device!r} matches several stored devices ({', '.join(matches)}); "
            "give the full name or a kind."
        )
    return (matches[0] if matches else key), None

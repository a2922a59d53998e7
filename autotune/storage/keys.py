"""What every :class:`~.store.Store` method shares: timestamps, the software and device keys,
get-or-create of a keyed row (race-safe inserts), the checks of a result's times, the trial
query with the :class:`~.rows.TrialRow` it reads."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from autotune.devices import DeviceFacts
from autotune.space.outcomes import (
    MAX_TIME_US,
    MIN_TIME_US,
    DeviceInfo,
    DeviceKind,
    Outcome,
    TrialResult,
)
from autotune.space.problem import Config, Problem
from autotune.storage.rows import (
    TrialRow,
)
from autotune.storage.schema import (
    Base,
    Configs,
    Devices,
    Kernels,
    Problems,
    Software,
    TraceRegions,
    Trials,
)

SOFTWARE_COLUMNS = ("jax", "jaxlib", "autotune")
_UTC = dt.UTC


def utc_now() -> dt.datetime:
    return dt.datetime.now(_UTC)


def check_aware(name: str, value: dt.datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError(
            f"{name} must be timezone-aware, e.g. datetime.now(timezone.utc), but got {value!r}."
        )


def software_key(software: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(software, Mapping):
        raise ValueError(
            f"software must map names to versions, e.g. {{'jax': '0.10.2'}}, but got {software!r}."
        )
    for key, value in software.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(
                f"software must map names to version strings, but got {key!r}: {value!r}."
            )
    columns = {name: software.get(name, "") for name in SOFTWARE_COLUMNS}
    extra = {k: v for k, v in software.items() if k not in SOFTWARE_COLUMNS and v}
    columns["extra"] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    if len(columns["extra"]) > 1000:
        raise ValueError(f"software has too many extra keys to store: {sorted(extra)}.")
    return columns


def software_from_row(row: Software) -> dict[str, str]:
    out = {name: getattr(row, name) for name in SOFTWARE_COLUMNS if getattr(row, name)}
    out.update(json.loads(row.extra or "{}"))
    return out


def device_from_row(row: Devices) -> DeviceInfo:
    return DeviceInfo(
        name=row.name, kind=DeviceKind(row.kind), compute_capability=row.compute_capability,
        driver=row.driver,
        facts=_facts(row.facts),
    )


def _facts(text: str | None) -> DeviceFacts | None:
    """A device row's stored facts, or None (NULL, or written by an autotune that knew other
    fields: facts are informative, never a reason a read fails)."""
    if not text:
        return None
    try:
        return DeviceFacts.from_dict(json.loads(text))
    except (ValueError, TypeError):
        return None


def _facts_json(device: DeviceInfo) -> str | None:
    return json.dumps(device.facts.to_dict(), sort_keys=True) if device.facts is not None else None


def device_row_id(session: Session, device: DeviceInfo, *, fill: bool = False) -> int:
    """The id of ``device``'s row, created with its facts; ``fill``: also writes the facts
    into a row stored without them (done once per job run, not per trial)."""
    facts = _facts_json(device)
    device_id = get_or_create(session, Devices, device_key(device), facts=facts)
    if fill and facts is not None:
        session.execute(
            sa.update(Devices)
            .where(Devices.id == device_id, Devices.facts.is_(None))
            .values(facts=facts)
        )
    return device_id


def problem_from_rows(kernel: Kernels, row: Problems) -> Problem:
    return Problem(kernel.name, json.loads(row.shape_json), row.dtype)


def get_or_create(session: Session, model: type[Base], key: Mapping[str, Any], **extra: Any) -> int:
    """The id of the row matching ``key``, inserting it (with ``extra``) if missing
    (race-safe: :func:`insert_or_stored`)."""
    query = sa.select(model.id).filter_by(**key)  # type: ignore[attr-defined]
    found = session.scalar(query)
    if found is not None:
        return int(found)
    return insert_or_stored(session, model(**key, **extra), query)[0]


def insert_or_stored(session: Session, row: Base, query: Any) -> tuple[int, bool]:
    """Inserts ``row``: ``(its id, False)``; or, where another transaction stored the same row
    first, ``(that row's id, True)``, read with ``query``.

    Race-safe: of two transactions inserting the same row, the second waits for the first,
    fails on the unique constraint inside a savepoint, and reads the first one's row.
    """
    try:
        with session.begin_nested():
            session.add(row)
    except sa_exc.IntegrityError:
        found = session.scalar(query)
        if found is None:
            raise
        return int(found), True
    return int(row.id), False  # type: ignore[attr-defined]


def plausible(column: Any) -> Any:
    """The SQL form of :func:`autotune.space.outcomes.plausible_us` on ``column``: false for
    NULL, NaN (PostgreSQL sorts NaN above every number; SQLite stores it as NULL), infinities,
    zero, negative and implausible times, so that the database never ranks them first."""
    return column.between(MIN_TIME_US, MAX_TIME_US)


def checked_samples(samples_us: Sequence[float], what: str) -> tuple[float, ...]:
    values = tuple(float(s) for s in samples_us)
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} must be a non-empty sequence of finite times, but got {values!r}.")
    return values


def check_times(result: TrialResult) -> None:
    """Non-finite times are never stored (they would break strict JSON and exports)."""
    if not all(math.isfinite(float(v)) for v in result.samples_us):
        raise ValueError(
            f"a trial's times must be finite numbers of microseconds, but got {result.samples_us!r}."
        )


# SQLite files a writer found sound in this process: (path, size, mtime) as checked.


def checked_policy(cache: str) -> str:
    from autotune.space.outcomes import CACHE_POLICIES

    if cache not in CACHE_POLICIES:
        raise ValueError(
            f"cache policy must be one of {', '.join(CACHE_POLICIES)}, but got {cache!r}."
        )
    return cache


def device_key(device: DeviceInfo) -> dict[str, str]:
    return {
        "name": device.name,
        "kind": device.kind,
        "compute_capability": device.compute_capability,
        "driver": device.driver,
    }


def device_filter(query: Any, device_name: str | None, device_kind: str | None) -> Any:
    if device_kind is not None:
        query = query.where(Devices.kind == device_kind)
    if device_name is not None:
        query = query.where(Devices.name == device_name)
    return query


def listing_filter(query: Any, *, kernel: str | None, dtype: str | None,
                   device_name: str | None, device_kind: str | None) -> Any:
    """``query`` (joined to Kernels, Problems and Devices) narrowed to a kernel name, a dtype and
    a device: the filters every listing of stored trials takes (None: any)."""
    if kernel is not None:
        query = query.where(Kernels.name == kernel)
    if dtype is not None:
        query = query.where(Problems.dtype == dtype)
    return device_filter(query, device_name, device_kind)


def trial_query() -> Any:
    traced = sa.exists().where(TraceRegions.trial_id == Trials.id).label("traced")
    return (
        sa.select(Trials, Problems, Kernels, Configs, Devices, Software, traced)
        .join(Problems, Problems.id == Trials.problem_id)
        .join(Kernels, Kernels.id == Problems.kernel_id)
        .join(Configs, Configs.id == Trials.config_id)
        .join(Devices, Devices.id == Trials.device_id)
        .join(Software, Software.id == Trials.software_id)
    )


def trial_row(
    t: Trials,
    p: Problems,
    k: Kernels,
    c: Configs,
    d: Devices,
    s: Software,
    traced: bool,
) -> TrialRow:
    return TrialRow(
        id=t.id,
        problem=problem_from_rows(k, p),
        config=Config.from_json(c.config_json),
        device=device_from_row(d),
        software=software_from_row(s),
        status=Outcome(t.status),
        median_us=t.median_us,
        min_us=t.min_us,
        max_us=t.max_us,
        samples_us=t.samples_us,
        compile_s=t.compile_s,
        rel_error=t.rel_error,
        timing=t.timing,
        error=t.error,
        study_name=t.study_name,
        optuna_trial_number=t.optuna_trial_number,
        worker=t.worker,
        host=t.host,
        started_at=t.started_at,
        finished_at=t.finished_at,
        traced=bool(traced),
        cache_policy=t.cache_policy,
        stored_spread=t.spread,
    )

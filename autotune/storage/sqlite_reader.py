"""Reading an SQLite results database through the standard library's :mod:`sqlite3`, without
SQLAlchemy: the reads a best-config query makes (``autotune best``, :func:`best_result`).

Importing SQLAlchemy costs more CPU than the rest of ``autotune best`` together (0.17 s of its
0.4 s; ``benchmarks/RESULTS.md`` §17); a best-config query on an SQLite file at the newest schema
needs none of it. :class:`SQLiteReader` answers the :class:`~.store.Store` read methods such a
query calls (:meth:`~SQLiteReader.preferred_policy`, :meth:`~SQLiteReader.best`,
:meth:`~SQLiteReader.baseline`, :meth:`~SQLiteReader.confirmations`,
:meth:`~SQLiteReader.program_checks`, :meth:`~SQLiteReader.trial`, :meth:`~SQLiteReader.devices`) with the same signatures and the same
rows, from the same SQL a store sends (``tests/storage/test_sqlite_reader.py`` compares the two
over stores of every kind of row).

It opens only what it can read as a store would, read-only: the file is checked as a store
checks it (:func:`~.urls.check_sqlite_file`: no pipe, device or folder), opened as a ``mode=ro``
URI with the read timeout as its busy timeout (nothing is ever written, not its header), and its
schema must be exactly the migration scripts' head (one row in ``at_alembic_version``).
Anything else (an older or newer schema, no autotune tables, a file SQLite cannot read) makes
:meth:`SQLiteReader.open` return None, and the caller opens a :class:`~.store.Store`, which
upgrades, refuses or words the failure as it always does. A failing read raises the
:class:`~autotune.errors.StorageError` a store's read raises.

This module imports neither SQLAlchemy nor alembic (``tests/test_cli.py`` checks that ``autotune
best`` imports neither); :mod:`.connection` takes :data:`VERSION_TABLE`, :func:`script_head` and
:func:`damaged_hint` from here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import pathlib
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import StorageError
from autotune.space.outcomes import (
    MAX_TIME_US,
    MIN_TIME_US,
    PROGRAM_METHOD,
    DeviceInfo,
    DeviceKind,
    Outcome,
)
from autotune.space.problem import Config, Problem
from autotune.storage.rows import (
    BaselineRow,
    ConfirmationRow,
    ConfirmedProgram,
    TrialRow,
    VerificationRow,
)
from autotune.storage.urls import check_sqlite_file, mask_text

__all__ = ["SQLiteReader", "VERSION_TABLE", "script_head", "damaged_hint"]

# Optuna's RDB storage owns ``alembic_version``; ours must not collide with it.
VERSION_TABLE = "at_alembic_version"
MIGRATIONS_DIR = pathlib.Path(__file__).resolve().parent / "migrations"
SOFTWARE_COLUMNS = ("jax", "jaxlib", "autotune")
_UTC = dt.UTC


@functools.cache
def script_head() -> str | None:
    """The head revision of the migration scripts, read from their ``revision`` and
    ``down_revision`` lines without importing alembic (0.3 s of a query's start); None when
    they do not make one linear chain (alembic then decides).
    ``tests/storage/test_storage.py::test_the_head_read_without_alembic_is_alembics``."""
    revisions: dict[str, str | None] = {}
    pattern = re.compile(r'^(down_revision|revision)\b[^=]*=\s*(None|"([^"]*)")\s*$', re.M)
    for script in (MIGRATIONS_DIR / "versions").glob("[0-9]*.py"):
        found = {m.group(1): m.group(3) for m in pattern.finditer(script.read_text())}
        if "revision" not in found or found["revision"] is None:
            return None
        revisions[found["revision"]] = found.get("down_revision")
    heads = set(revisions) - {d for d in revisions.values() if d is not None}
    return heads.pop() if len(heads) == 1 else None


def damaged_hint(reason: str) -> str:
    """What to do when ``reason`` (a database's words for a failure) says the file is damaged,
    else ""."""
    if "malformed" in reason or "not a database" in reason:
        return ("The database file is damaged and was left as it is: restore it from a backup, "
                "or move it aside and point AUTOTUNE_DB at another file.")
    return ""


# -- the rows, as a store's columns read them (autotune.storage.schema, autotune.storage.keys)


def _stamp(value: Any) -> dt.datetime | None:
    """A stored UTC datetime (SQLite keeps it naive, as ISO text) as an aware one."""
    if value is None:
        return None
    stamp = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return stamp.replace(tzinfo=_UTC) if stamp.tzinfo is None else stamp.astimezone(_UTC)


def _samples(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in json.loads(value or "[]"))


def _rounds(value: Any) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in r) for r in json.loads(value or "[]"))


def _software(jax: str, jaxlib: str, autotune: str, extra: str | None) -> dict[str, str]:
    out = {k: v for k, v in zip(SOFTWARE_COLUMNS, (jax, jaxlib, autotune), strict=True) if v}
    out.update(json.loads(extra or "{}"))
    return out


def _device(name: str, kind: str, compute_capability: str, driver: str,
            facts: str | None) -> DeviceInfo:
    from autotune.devices import DeviceFacts

    known = None
    if facts:  # as a store reads them: facts that do not parse are left out, never an error
        try:
            known = DeviceFacts.from_dict(json.loads(facts))
        except (ValueError, TypeError):
            known = None
    return DeviceInfo(name=name, kind=DeviceKind(kind), compute_capability=compute_capability,
                      driver=driver, facts=known)


_PROBLEM = "k.name, p.shape_json, p.dtype"
_DEVICE = "d.name, d.kind, d.compute_capability, d.driver, d.facts"
_SOFTWARE = "s.jax, s.jaxlib, s.autotune, s.extra"
# keys.trial_query: a trial with its problem, config, device, software and whether it has
# trace regions.
_TRIAL = (
    "SELECT t.id, t.status, t.median_us, t.min_us, t.max_us, t.samples_us, t.compile_s, "
    "t.rel_error, t.timing, t.error, t.study_name, t.optuna_trial_number, t.worker, t.host, "
    f"t.started_at, t.finished_at, t.cache_policy, t.spread, {_PROBLEM}, c.config_json, "
    f"{_DEVICE}, {_SOFTWARE}, "
    "EXISTS (SELECT 1 FROM at_trace_regions r WHERE r.trial_id = t.id) "
    "FROM at_trials t JOIN at_problems p ON p.id = t.problem_id "
    "JOIN at_kernels k ON k.id = p.kernel_id JOIN at_configs c ON c.id = t.config_id "
    "JOIN at_devices d ON d.id = t.device_id JOIN at_software s ON s.id = t.software_id"
)


def _trial_row(row: Sequence[Any]) -> TrialRow:
    (tid, status, median, low, high, samples, compile_s, rel_error, timing, error, study,
     number, worker, host, started, finished, policy, spread, kernel, shape, dtype, config,
     d_name, d_kind, d_cc, d_driver, d_facts, jax, jaxlib, autotune, extra, traced) = row
    finished_at = _stamp(finished)
    assert finished_at is not None  # NOT NULL in the schema
    return TrialRow(
        id=tid, problem=Problem(kernel, json.loads(shape), dtype), config=Config.from_json(config),
        device=_device(d_name, d_kind, d_cc, d_driver, d_facts),
        software=_software(jax, jaxlib, autotune, extra), status=Outcome(status),
        median_us=median, min_us=low, max_us=high, samples_us=_samples(samples),
        compile_s=compile_s, rel_error=rel_error, timing=timing, error=error, study_name=study,
        optuna_trial_number=number, worker=worker, host=host, started_at=_stamp(started),
        finished_at=finished_at, traced=bool(traced), cache_policy=policy, stored_spread=spread,
    )


def _device_where(name: str | None, kind: str | None) -> tuple[str, list[Any]]:
    """keys.device_filter: `` AND d.kind = ? AND d.name = ?`` for those given."""
    sql = ""
    args: list[Any] = []
    if kind is not None:
        sql, args = sql + " AND d.kind = ?", [*args, str(kind)]
    if name is not None:
        sql, args = sql + " AND d.name = ?", [*args, name]
    return sql, args


def _checked_policy(cache: str) -> str:
    from autotune.space.outcomes import CACHE_POLICIES

    if cache not in CACHE_POLICIES:
        raise ValueError(
            f"cache policy must be one of {', '.join(CACHE_POLICIES)}, but got {cache!r}."
        )
    return cache


class SQLiteReader:
    """A best-config query's reads of one SQLite file at the newest schema, through
    :mod:`sqlite3` (see the module's text). One connection, shared by a process's threads
    under a lock; :meth:`open` makes one, :meth:`close` closes it."""

    read_only = True

    def __init__(self, connection: sqlite3.Connection, where: str) -> None:
        self._connection = connection
        self._where = where
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: pathlib.Path, timeout_s: float) -> SQLiteReader | None:
        """The reader of the SQLite file ``path`` (which exists), or None when a store must
        open it instead: its schema is not exactly the scripts' head, or SQLite cannot read it.

        Raises:
          StorageError: the path is not a regular file, or its file system does not answer
            (:func:`~.urls.check_sqlite_file`, as a store raises it).
        """
        check_sqlite_file(path, timeout_s=timeout_s)
        head = script_head()
        if head is None:
            return None
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        try:
            connection = sqlite3.connect(uri, uri=True, timeout=timeout_s,
                                         check_same_thread=False, isolation_level=None)
        except sqlite3.Error:
            return None
        try:
            found = [str(v) for (v,) in connection.execute(f"SELECT version_num FROM {VERSION_TABLE}")]
        except sqlite3.Error:
            found = []
        if found != [head]:  # exactly one row, the head: anything else is the store's to handle
            connection.close()
            return None
        return cls(connection, str(path))

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def _rows(self, what: str, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement; a failure worded as a store's read words it."""
        try:
            with self._lock:
                return self._connection.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as e:
            text = str(e).strip()
            reason = mask_text(text.splitlines()[0]) if text else type(e).__name__
            hint = damaged_hint(reason)
            raise StorageError(
                f"Could not {what} from {self._where}: {reason}." + (f" {hint}" if hint else "")
            ) from e

    # -- the reads (each as the Store method of the same name: autotune.storage.reading)

    def preferred_policy(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
    ) -> str:
        """``cold`` when ``problem`` has a plausible ok trial timed cold on these devices,
        else ``warm``."""
        where, args = _device_where(device_name, device_kind)
        rows = self._rows(
            "read the cache policies",
            "SELECT t.id FROM at_trials t JOIN at_problems p ON p.id = t.problem_id "
            "JOIN at_devices d ON d.id = t.device_id WHERE p.digest = ? AND t.status = ? "
            "AND t.cache_policy = 'cold' AND t.median_us BETWEEN ? AND ?" + where + " LIMIT 1",
            [problem.digest(), Outcome.OK.value, MIN_TIME_US, MAX_TIME_US, *args])
        return "cold" if rows else "warm"

    def best(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        n: int = 1,
        versions: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]:
        """The ``n`` fastest plausible ok trials of ``problem``, lowest median first."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, but got {n!r}.")
        where, args = _device_where(device_name, device_kind)
        if cache is None:
            cache = self.preferred_policy(problem, device_name=device_name, device_kind=device_kind)
        where, args = where + " AND t.cache_policy = ?", [*args, _checked_policy(cache)]
        for key, value in (versions or {}).items():
            if key not in SOFTWARE_COLUMNS:
                raise ValueError(
                    f"versions may name {', '.join(SOFTWARE_COLUMNS)}, but got {key!r}."
                )
            where, args = where + f" AND s.{key} = ?", [*args, value]
        rows = self._rows(
            "read the best trials",
            _TRIAL + " WHERE p.digest = ? AND t.status = ? AND t.median_us BETWEEN ? AND ?"
            + where + " ORDER BY t.median_us, t.id LIMIT ?",
            [problem.digest(), Outcome.OK.value, MIN_TIME_US, MAX_TIME_US, *args, n])
        return [_trial_row(r) for r in rows]

    def trial(self, trial_id: int) -> TrialRow | None:
        """The trial with id ``trial_id``, or None."""
        rows = self._rows("read a trial", _TRIAL + " WHERE t.id = ?", [trial_id])
        return _trial_row(rows[0]) if rows else None

    def baselines(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> list[BaselineRow]:
        """Stored baselines of ``problem``, fastest first (of one cache policy, if given)."""
        where = ""
        args: list[Any] = []
        if name is not None:
            where, args = where + " AND b.name = ?", [*args, name]
        if cache is not None:
            where, args = where + " AND b.cache_policy = ?", [*args, _checked_policy(cache)]
        device_sql, device_args = _device_where(device_name, device_kind)
        rows = self._rows(
            "read baselines",
            "SELECT b.id, b.name, b.median_us, b.min_us, b.max_us, b.samples_us, b.measured_at, "
            f"b.cache_policy, b.spread, {_PROBLEM}, {_DEVICE}, {_SOFTWARE} "
            "FROM at_baselines b JOIN at_problems p ON p.id = b.problem_id "
            "JOIN at_kernels k ON k.id = p.kernel_id JOIN at_devices d ON d.id = b.device_id "
            "JOIN at_software s ON s.id = b.software_id WHERE p.digest = ?" + where + device_sql
            + " AND b.median_us BETWEEN ? AND ? ORDER BY b.median_us, b.id",
            [problem.digest(), *args, *device_args, MIN_TIME_US, MAX_TIME_US])
        out = []
        for (bid, bname, median, low, high, samples, measured, policy, spread, kernel, shape,
             dtype, d_name, d_kind, d_cc, d_driver, d_facts, jax, jaxlib, autotune, extra) in rows:
            measured_at = _stamp(measured)
            assert measured_at is not None  # NOT NULL in the schema
            out.append(BaselineRow(
                id=bid, problem=Problem(kernel, json.loads(shape), dtype),
                device=_device(d_name, d_kind, d_cc, d_driver, d_facts),
                software=_software(jax, jaxlib, autotune, extra), name=bname, median_us=median,
                min_us=low, max_us=high, samples_us=_samples(samples), measured_at=measured_at,
                cache_policy=policy, spread=spread,
            ))
        return out

    def baseline(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> BaselineRow | None:
        """The fastest stored baseline of ``problem`` (of ``name``, if given), or None."""
        rows = self.baselines(
            problem, device_name=device_name, device_kind=device_kind, name=name, cache=cache
        )
        return rows[0] if rows else None

    def devices(self) -> list[DeviceInfo]:
        """Every device with anything stored."""
        rows = self._rows("read devices", "SELECT d.name, d.kind, d.compute_capability, "
                          "d.driver, d.facts FROM at_devices d ORDER BY d.kind, d.name, d.id")
        return [_device(*r) for r in rows]

    def confirmations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        cache: str | None = None,
        limit: int | None = None,
    ) -> list[ConfirmationRow]:
        """The stored confirmation rounds of ``problem``, newest first (the newest ``limit``)."""
        where = ""
        args: list[Any] = []
        if cache is not None:
            where, args = " AND f.cache_policy = ?", [_checked_policy(cache)]
        device_sql, device_args = _device_where(device_name, device_kind)
        sql = ("SELECT f.id FROM at_confirmations f JOIN at_problems p ON p.id = f.problem_id "
               "JOIN at_devices d ON d.id = f.device_id WHERE p.digest = ?" + where + device_sql
               + " ORDER BY f.id DESC")
        if limit is not None:
            sql, device_args = sql + " LIMIT ?", [*device_args, limit]
        ids = [int(i) for (i,) in self._rows("read confirmation rounds", sql,
                                             [problem.digest(), *args, *device_args])]
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        programs: dict[int, list[ConfirmedProgram]] = {}
        for (cid, trial_id, position, rounds_us, median, spread, diff, noise, tie, crowned,
             config) in self._rows(
                "read confirmation rounds",
                "SELECT g.confirmation_id, g.trial_id, g.position, g.rounds_us, g.median_us, "
                "g.spread, g.diff, g.noise, g.tie, g.crowned, c.config_json "
                "FROM at_confirmation_programs g JOIN at_trials t ON t.id = g.trial_id "
                "JOIN at_configs c ON c.id = t.config_id "
                f"WHERE g.confirmation_id IN ({marks}) ORDER BY g.confirmation_id, g.position",
                ids):
            programs.setdefault(cid, []).append(ConfirmedProgram(
                trial_id=trial_id, config=Config.from_json(config), position=position,
                rounds_us=_rounds(rounds_us), median_us=median, spread=spread, diff=diff,
                noise=noise, tie=bool(tie), crowned=bool(crowned),
            ))
        out = []
        for (fid, policy, rounds, iterations, crowned_id, fastest_id, baseline_name,
             baseline_rounds, baseline_median, baseline_spread, speedup, speedup_spread,
             speedup_low, speedup_high, created, run_id, kernel, shape, dtype, d_name, d_kind,
             d_cc, d_driver, d_facts, jax, jaxlib, autotune, extra) in self._rows(
                "read confirmation rounds",
                "SELECT f.id, f.cache_policy, f.rounds, f.iterations, f.crowned_trial_id, "
                "f.fastest_trial_id, f.baseline_name, f.baseline_rounds_us, "
                "f.baseline_median_us, f.baseline_spread, f.speedup, f.speedup_spread, "
                f"f.speedup_low, f.speedup_high, f.created_at, f.run_id, {_PROBLEM}, {_DEVICE}, "
                f"{_SOFTWARE} FROM at_confirmations f JOIN at_problems p ON p.id = f.problem_id "
                "JOIN at_kernels k ON k.id = p.kernel_id JOIN at_devices d ON d.id = f.device_id "
                f"JOIN at_software s ON s.id = f.software_id WHERE f.id IN ({marks})", ids):
            created_at = _stamp(created)
            assert created_at is not None  # NOT NULL in the schema
            out.append(ConfirmationRow(
                id=fid, problem=Problem(kernel, json.loads(shape), dtype),
                device=_device(d_name, d_kind, d_cc, d_driver, d_facts),
                software=_software(jax, jaxlib, autotune, extra), cache_policy=policy,
                rounds=rounds, iterations=iterations, crowned_trial_id=crowned_id,
                fastest_trial_id=fastest_id, baseline_name=baseline_name,
                baseline_median_us=baseline_median, baseline_spread=baseline_spread,
                baseline_rounds_us=_rounds(baseline_rounds), speedup=speedup,
                speedup_spread=speedup_spread, speedup_low=speedup_low,
                speedup_high=speedup_high, created_at=created_at, run_id=run_id,
                programs=tuple(programs.get(fid, ())),
            ))
        return sorted(out, key=lambda r: -r.id)

    def program_checks(self, confirmation_ids: Sequence[int]) -> dict[int, VerificationRow]:
        """The newest program check (a verification row of method
        :data:`~autotune.space.outcomes.PROGRAM_METHOD`) of each of the confirmation rounds
        ``confirmation_ids`` that has one, by confirmation id: one statement for them all."""
        ids = sorted({int(i) for i in confirmation_ids})
        if not ids:
            return {}
        marks = ", ".join("?" * len(ids))
        out: dict[int, VerificationRow] = {}
        for (vid, cid, method, rounds, calls, baseline_name, winner_rounds, baseline_rounds,
             others, winner_median, baseline_median, speedup, speedup_low, speedup_high,
             stored_speedup, still_wins, created, config, kernel, shape, dtype, d_name, d_kind,
             d_cc, d_driver, d_facts, jax, jaxlib, autotune, extra) in self._rows(
                "read verifications",
                "SELECT v.id, v.confirmation_id, v.method, v.rounds, v.calls, v.baseline_name, "
                "v.winner_rounds_us, v.baseline_rounds_us, v.others_json, v.winner_median_us, "
                "v.baseline_median_us, v.speedup, v.speedup_low, v.speedup_high, "
                "v.stored_speedup, v.still_wins, v.created_at, c.config_json, "
                f"{_PROBLEM}, {_DEVICE}, {_SOFTWARE} FROM at_verifications v "
                "JOIN at_problems p ON p.id = v.problem_id JOIN at_kernels k ON k.id = p.kernel_id "
                "JOIN at_devices d ON d.id = v.device_id JOIN at_software s ON s.id = v.software_id "
                "JOIN at_configs c ON c.id = v.config_id WHERE v.id IN (SELECT max(w.id) FROM "
                f"at_verifications w WHERE w.method = ? AND w.confirmation_id IN ({marks}) "
                "GROUP BY w.confirmation_id)", [PROGRAM_METHOD, *ids]):
            created_at = _stamp(created)
            assert created_at is not None  # NOT NULL in the schema
            out[cid] = VerificationRow(
                id=vid, problem=Problem(kernel, json.loads(shape), dtype),
                device=_device(d_name, d_kind, d_cc, d_driver, d_facts),
                software=_software(jax, jaxlib, autotune, extra), confirmation_id=cid,
                config=Config.from_json(config), method=method, rounds=rounds, calls=calls,
                baseline_name=baseline_name, winner_rounds_us=_rounds(winner_rounds),
                baseline_rounds_us=_rounds(baseline_rounds), others=tuple(json.loads(others)),
                winner_median_us=winner_median, baseline_median_us=baseline_median,
                speedup=speedup, speedup_low=speedup_low, speedup_high=speedup_high,
                stored_speedup=stored_speedup,
                still_wins=None if still_wins is None else bool(still_wins),
                created_at=created_at,
            )
        return out

"""The results database: every trial, baseline and trace region, in SQLite or PostgreSQL.

One :class:`Store` wraps one SQLAlchemy engine. Opening it brings the schema to the newest
version (alembic, version table ``at_alembic_version``); every table is prefixed ``at_`` so
that Optuna's RDB storage can share the database. Callers get frozen snapshots
(:class:`TrialRow`, :class:`BaselineRow`, ...), never ORM objects or sessions.

Invariants the database itself enforces:

* one trial per (problem, config, device, software): a config is never measured twice. A
  second :meth:`Store.record_trial` for the same key keeps the first row and says so
  (``RecordedTrial.duplicate``); it neither raises nor replaces.
* every write is one transaction. On SQLite, writes take the write lock up front
  (``BEGIN IMMEDIATE``) and wait up to 30 s for it, in WAL mode, so that many worker
  processes can share one file without "database is locked".

Thread safety: a Store may be shared by the threads of one process (each call uses its own
session). After ``fork``, open a new Store in the child (or call
``store.engine.dispose(close=False)``) rather than reuse the parent's connections.

This module does not import jax: :mod:`autotune.queries.best` uses it.

The tables are in :mod:`.schema`, the row values in :mod:`.rows`, the URL policy in
:mod:`.urls`. Why one piece (over 400 lines): every method of :class:`Store` is one transaction
over the same tables, keys and software/device bookkeeping (``_get_or_create``, the device and
software keys); the migration step on open shares the engine set-up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import pathlib
import socket
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import StorageError
from autotune.evaluation.trial import DeviceInfo, DeviceKind, Outcome, TrialResult, relative_spread
from autotune.space.problem import Config, Problem
from autotune.storage.rows import (
    BaselineRow,
    ConfirmationRow,
    ConfirmedProgram,
    ProblemSummary,
    RecordedTrial,
    RunRow,
    TraceRegionRow,
    TrialRow,
)
from autotune.storage.schema import (
    Base,
    _Baselines,
    _Configs,
    _ConfirmationPrograms,
    _Confirmations,
    _Devices,
    _Kernels,
    _Problems,
    _Runs,
    _Software,
    _TraceRegions,
    _Trials,
)
from autotune.storage.urls import (
    _read_only_url,
    display_url,
    read_timeout_s,
    resolve_url,
    sqlite_path,
)

__all__ = [
    "Store",
    "failure_reason",
    "damaged_hint",
    "VERSION_TABLE",
]

log = logging.getLogger(__name__)

# Optuna's RDB storage owns ``alembic_version``; ours must not collide with it.
VERSION_TABLE = "at_alembic_version"
SQLITE_BUSY_TIMEOUT_S = 30.0
# Key of the PostgreSQL advisory lock that serialises concurrent migrations ("autotune").
_PG_MIGRATION_LOCK = 0x6175746F74756E65
_MIGRATIONS_DIR = pathlib.Path(__file__).resolve().parent / "migrations"
_SOFTWARE_COLUMNS = ("jax", "jaxlib", "autotune")
_UTC = dt.UTC


# ----------------------------------------------------------------------------- schema


# ----------------------------------------------------------------------------- snapshots


# ----------------------------------------------------------------------------- URLs, engines


def _create_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.get_backend_name() != "sqlite":
        kwargs: dict[str, Any] = {}
        if url.get_backend_name() == "postgresql":
            kwargs["pool_pre_ping"] = True  # workers hold a Store for hours
        return sa.create_engine(url, **kwargs)

    memory = url.database in (None, "", ":memory:")
    connect_args: dict[str, Any] = {"check_same_thread": False}
    if not read_only:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
    if memory:
        engine = sa.create_engine(url, connect_args=connect_args, poolclass=sa.pool.StaticPool)
    else:
        engine = sa.create_engine(url, connect_args=connect_args)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        # sqlite3 must not issue BEGIN itself: _on_begin does, as BEGIN IMMEDIATE for writes.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not read_only:  # a read-only URI carries its own timeout
                cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if not memory and not read_only:  # switching the journal mode writes the header
                mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("SQLite database %s is in %s mode, not WAL.", url.database, mode)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # Writers take the write lock up front, so two of them never deadlock on an upgrade
        # from a read lock; readers in WAL mode never wait.
        if read_only or connection.get_execution_options().get("autotune_read_only"):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def failure_reason(error: BaseException) -> str:
    """The database's own words for a failure, under SQLAlchemy's (and Optuna's) wrapping."""
    if getattr(error, "orig", None) is None and isinstance(error.__cause__, sa_exc.SQLAlchemyError):
        error = error.__cause__  # Optuna raises its StorageInternalError from SQLAlchemy's
    # SQLite rolls the whole transaction back on some errors (a full disk, an I/O error): the
    # savepoint around the failed statement is gone, and "no such savepoint" would hide what
    # happened. The error being handled when that one was raised says it.
    while "no such savepoint" in str(error) and error.__context__ is not None:
        error = error.__context__
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def damaged_hint(reason: str) -> str:
    """What to do when ``reason`` (:func:`failure_reason`) says the file is damaged, else ""."""
    if "malformed" in reason or "not a database" in reason:
        return ("The database file is damaged and was left as it is: restore it from a backup, "
                "or move it aside and point AUTOTUNE_DB at another file.")
    return ""


def _open_hint(path: pathlib.Path | None, reason: str) -> str:
    """What to do when an SQLite file cannot be opened, or nothing for other backends."""
    if path is None:
        return ""
    if damaged_hint(reason):
        return " " + damaged_hint(reason)
    if "locked" in reason:
        return (f" Another process holds a lock on {path.name} for longer than the wait: re-run "
                "once it is done.")
    return (
        f" SQLite must read and write {path.name} and create {path.name}-wal and "
        f"{path.name}-shm beside it: check that the file and its folder are writable and the "
        "disk has room, then re-run."
    )


# ----------------------------------------------------------------------------- migrations


def _alembic_config(connection: sa.Connection | None = None) -> Any:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


class _SchemaBehind(StorageError):
    """A read-only store found a schema older than head (it migrates through a writer)."""


def _migrate(engine: Engine, read_engine: Engine, where: str, *, read_only: bool = False) -> None:
    """Brings the schema to head; refuses a schema newer than this code. ``read_only``: only
    checks, raising :class:`_SchemaBehind` when the schema is older than head."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config())
    head = script.get_current_head()
    known = {rev.revision for rev in script.walk_revisions()}

    def current(connection: sa.Connection) -> set[str]:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        revisions = set(context.get_current_heads())
        unknown = sorted(revisions - known)
        if unknown:
            raise StorageError(
                f"The database {where} has schema version {', '.join(unknown)}, which this "
                f"autotune does not know (it knows up to {head}): a newer autotune wrote it. "
                "Upgrade autotune, or point AUTOTUNE_DB at another database."
            )
        return revisions

    # Fast path: a read that takes no write lock, the common case of an up-to-date schema.
    with read_engine.connect() as connection:
        if current(connection) == {head}:
            return
    if read_only:
        raise _SchemaBehind(f"The database {where} has an older autotune schema than {head}.")
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        if current(connection) != {head}:
            log.info("Upgrading the autotune schema of %s to %s.", where, head)
            command.upgrade(_alembic_config(connection), "head")


# ----------------------------------------------------------------------------- the store


def _now() -> dt.datetime:
    return dt.datetime.now(_UTC)


def _check_aware(name: str, value: dt.datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError(
            f"{name} must be timezone-aware, e.g. datetime.now(timezone.utc), but got {value!r}."
        )


def _software_key(software: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(software, Mapping):
        raise ValueError(
            f"software must map names to versions, e.g. {{'jax': '0.10.2'}}, but got {software!r}."
        )
    for key, value in software.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(
                f"software must map names to version strings, but got {key!r}: {value!r}."
            )
    columns = {name: software.get(name, "") for name in _SOFTWARE_COLUMNS}
    extra = {k: v for k, v in software.items() if k not in _SOFTWARE_COLUMNS and v}
    columns["extra"] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    if len(columns["extra"]) > 1000:
        raise ValueError(f"software has too many extra keys to store: {sorted(extra)}.")
    return columns


def _software_dict(row: _Software) -> dict[str, str]:
    out = {name: getattr(row, name) for name in _SOFTWARE_COLUMNS if getattr(row, name)}
    out.update(json.loads(row.extra or "{}"))
    return out


def _device_info(row: _Devices) -> DeviceInfo:
    return DeviceInfo(
        name=row.name, kind=row.kind, compute_capability=row.compute_capability, driver=row.driver
    )


def _problem(kernel: _Kernels, row: _Problems) -> Problem:
    return Problem(kernel.name, json.loads(row.shape_json), row.dtype)


def _get_or_create(session: Session, model: type[Base], key: Mapping[str, Any], **extra: Any) -> int:
    """The id of the row matching ``key``, inserting it (with ``extra``) if missing.

    Race-safe: of two transactions inserting the same row, the second waits for the first,
    fails on the unique constraint inside a savepoint, and reads the first one's row.
    """
    query = sa.select(model.id).filter_by(**key)  # type: ignore[attr-defined]
    found = session.scalar(query)
    if found is not None:
        return int(found)
    row = model(**key, **extra)
    try:
        with session.begin_nested():
            session.add(row)
    except sa_exc.IntegrityError:
        found = session.scalar(query)
        if found is None:
            raise
        return int(found)
    return int(row.id)  # type: ignore[attr-defined]


def _samples(samples_us: Sequence[float], what: str) -> tuple[float, ...]:
    values = tuple(float(s) for s in samples_us)
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} must be a non-empty sequence of finite times, but got {values!r}.")
    return values


def _check_times(result: TrialResult) -> None:
    """Non-finite times are never stored (they would break strict JSON and exports)."""
    if not all(math.isfinite(float(v)) for v in result.samples_us):
        raise ValueError(
            f"a trial's times must be finite numbers of microseconds, but got {result.samples_us!r}."
        )


# SQLite files a writer found sound in this process: (path, size, mtime) as checked.
_SOUND_FILES: set[tuple[str, int, int]] = set()


class Store:
    """The results database (SQLite or PostgreSQL), migrated to the newest schema on open.

    Args:
      url: any SQLAlchemy URL (``sqlite:///results/autotune.db``,
        ``postgresql://user@host/db``), or a bare SQLite path. Default: ``$AUTOTUNE_DB``, else
        ``sqlite:///results/autotune.db`` relative to the current directory (its folder is
        created).
      read_only: open it for reading only (what queries and read commands do): nothing is
        ever written through it, no folder is created, and every wait (connecting, a lock, a
        statement) is bounded by ``timeout_s``. An older schema is upgraded first through a
        writer, and only once SQLite's ``quick_check`` finds the file sound.
      timeout_s: the bound on those waits (read-only stores; default :func:`read_timeout_s`).

    Raises:
      StorageError: the database cannot be reached, is not a database (the file is left
        untouched), or has a schema newer than this code.
    """

    def __init__(
        self, url: str | None = None, *, read_only: bool = False, timeout_s: float | None = None
    ) -> None:
        self._url = resolve_url(url)
        path = sqlite_path(self._url)
        self._where = str(path) if path is not None else display_url(self._url)
        # Read-only applies to SQLite files and PostgreSQL; an in-memory database is private
        # to its store, so it is opened (and created) as usual.
        read_only = read_only and (path is not None or self._url.get_backend_name() == "postgresql")
        self.read_only = read_only
        if read_only:
            # Opened read-only, the database is never written: not its header (no journal
            # mode switch), not its schema (an older one is upgraded by a writer, and only
            # once SQLite's quick_check found the file sound), not a row.
            self._url = _read_only_url(self._url, read_timeout_s(timeout_s))
        elif path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(f"Cannot create the folder of the database {path}: {e}.") from e
        try:
            self.engine: Engine = _create_engine(self._url, read_only=read_only)
        except (sa_exc.ArgumentError, ImportError) as e:
            raise StorageError(
                f"Cannot use the database URL {self!r}: {failure_reason(e)}. Expected sqlite:///PATH "
                "or postgresql://user@host:5432/dbname; for PostgreSQL, install psycopg 3 "
                "(pip install 'autotune[postgres]')."
            ) from e
        self._read_engine = self.engine.execution_options(autotune_read_only=True)
        self._writes = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(self._read_engine)
        try:
            if not read_only and path is not None:
                self._check_sound(path)
            try:
                _migrate(self.engine, self._read_engine, self._where, read_only=read_only)
            except _SchemaBehind:
                self._upgrade(url, path)
        except StorageError:
            self.engine.dispose()
            raise
        except sa_exc.DatabaseError as e:
            self.engine.dispose()
            if path is not None and "not a database" in failure_reason(e):
                raise StorageError(
                    f"Cannot open {path}: it is not an SQLite database ({failure_reason(e)}). The "
                    "file was left untouched; move it aside or point AUTOTUNE_DB at another file."
                ) from e
            raise StorageError(
                f"Cannot open the database {self._where}: {failure_reason(e)}.{_open_hint(path, failure_reason(e))}"
            ) from e
        except sa_exc.SQLAlchemyError as e:
            self.engine.dispose()
            raise StorageError(
                f"Cannot open the database {self._where}: {failure_reason(e)}.{_open_hint(path, failure_reason(e))}"
            ) from e

    def _check_sound(self, path: pathlib.Path) -> None:
        """A writer's first step on an existing SQLite file: SQLite's ``quick_check`` reads
        every page, so that a damaged file is refused before anything (the schema, a run's
        record, a trial) is written into it. Once per process for an unchanged file."""
        try:
            stat = path.stat()
        except OSError:
            return  # a new file: created by the migration
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if stat.st_size == 0 or key in _SOUND_FILES:
            return
        with self._read_engine.connect() as connection:
            verdict = str(connection.exec_driver_sql("PRAGMA quick_check").scalar())
        if verdict != "ok":
            raise StorageError(
                f"Cannot open the database {self._where}: database disk image is malformed "
                f"(quick_check: {verdict[:200]}). {damaged_hint('malformed')}"
            )
        _SOUND_FILES.add(key)

    def _upgrade(self, url: str | None, path: pathlib.Path | None) -> None:
        """Upgrades an older schema found by a read-only store, through a writer, once the
        file has proven sound (a damaged file is never written to)."""
        if path is not None:
            self._check_sound(path)
        Store(url).close()

    @property
    def url(self) -> str:
        """The full URL (password included), usable by another Store or by Optuna; that of a
        read-only store opens the database read-only."""
        return self._url.render_as_string(hide_password=False)

    def __repr__(self) -> str:
        return f"Store({display_url(self._url)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every pooled connection. The store must not be used afterwards."""
        self.engine.dispose()

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[Session]:
        try:
            with self._writes.begin() as session:
                yield session
        except sa_exc.SQLAlchemyError as e:
            raise StorageError(f"Could not {what} in {self._where}: {failure_reason(e)}.") from e

    @contextlib.contextmanager
    def _read(self, what: str) -> Iterator[Session]:
        try:
            with self._reads() as session:
                yield session
        except sa_exc.SQLAlchemyError as e:
            reason = failure_reason(e)
            hint = damaged_hint(reason)
            raise StorageError(
                f"Could not {what} from {self._where}: {reason}." + (f" {hint}" if hint else "")
            ) from e

    # --- writes ---------------------------------------------------------------------------

    def _ids(
        self,
        session: Session,
        problem: Problem,
        device: DeviceInfo,
        software: Mapping[str, str],
    ) -> tuple[int, int, int, int]:
        kernel_id = _get_or_create(session, _Kernels, {"name": problem.kernel})
        problem_id = _get_or_create(
            session,
            _Problems,
            {"digest": problem.digest()},
            kernel_id=kernel_id,
            shape_json=problem.shape_json,
            dtype=problem.dtype,
        )
        device_id = _get_or_create(session, _Devices, _device_key(device))
        software_id = _get_or_create(session, _Software, _software_key(software))
        return kernel_id, problem_id, device_id, software_id

    def record_trial(
        self,
        problem: Problem,
        config: Config,
        result: TrialResult,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        study_name: str | None = None,
        optuna_trial_number: int | None = None,
        worker: str = "",
        started_at: dt.datetime | None = None,
        cache: str | None = None,
    ) -> RecordedTrial:
        """Stores one finished trial, in one transaction.

        If a trial of the same (problem, config, device, software, cache policy) is already
        stored, nothing is written: the first result stays, and its id comes back with
        ``duplicate=True``. ``cache``: the cache policy it was timed with (default:
        ``result.cache``, else ``warm``).

        Raises:
          ValueError: a malformed argument (a naive ``started_at``, non-string versions).
          StorageError: the database could not be written.
        """
        _check_aware("started_at", started_at)
        _software_key(software)  # validates before any write
        _check_times(result)
        with self._write("record a trial") as session:
            return self._record_trial_in(
                session, problem, config, result, device=device, software=software,
                study_name=study_name, optuna_trial_number=optuna_trial_number, worker=worker,
                started_at=started_at, cache=cache,
            )

    def record_trials(
        self, trials: Sequence[tuple[Problem, Config, TrialResult, DeviceInfo, Mapping[str, str]]],
        *, worker: str = "", cache: str | None = None,
    ) -> list[RecordedTrial]:
        """Stores many finished trials ``(problem, config, result, device, software)`` in ONE
        transaction: all of them, or (on any error) none. Duplicates are kept as for
        :meth:`record_trial`.

        Raises:
          ValueError: a malformed argument (checked before anything is written).
          StorageError: the database could not be written; nothing was.
        """
        for _, _, result, _, software in trials:
            _software_key(software)
            _check_times(result)
        with self._write(f"record {len(trials)} trials") as session:
            return [
                self._record_trial_in(session, problem, config, result, device=device,
                                      software=software, worker=worker, cache=cache)
                for problem, config, result, device, software in trials
            ]

    def _record_trial_in(
        self,
        session: Session,
        problem: Problem,
        config: Config,
        result: TrialResult,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        study_name: str | None = None,
        optuna_trial_number: int | None = None,
        worker: str = "",
        started_at: dt.datetime | None = None,
        cache: str | None = None,
    ) -> RecordedTrial:
        outcome = Outcome(result.outcome)
        policy = _policy(cache or result.cache or "warm")
        if not isinstance(config, Config):
            config = Config(config)
        kernel_id, problem_id, device_id, software_id = self._ids(
            session, problem, device, software
        )
        config_id = _get_or_create(
            session,
            _Configs,
            {"kernel_id": kernel_id, "digest": config.digest()},
            config_json=config.to_json(),
        )
        query = sa.select(_Trials.id).filter_by(
            problem_id=problem_id, config_id=config_id, device_id=device_id,
            software_id=software_id, cache_policy=policy,
        )
        existing = session.scalar(query)
        if existing is not None:
            log.debug("Trial of %s %s already stored as %d.", problem, config, existing)
            return RecordedTrial(int(existing), duplicate=True)
        row = _Trials(
            problem_id=problem_id,
            config_id=config_id,
            device_id=device_id,
            software_id=software_id,
            status=outcome.value,
            median_us=result.median_us,
            min_us=result.min_us,
            max_us=result.max_us,
            samples_us=tuple(result.samples_us),
            compile_s=result.compile_s,
            rel_error=result.rel_error,
            timing=result.timing,
            cache_policy=policy,
            spread=result.spread,
            error=result.error,
            study_name=study_name,
            optuna_trial_number=optuna_trial_number,
            worker=worker,
            host=socket.gethostname(),
            started_at=started_at,
            finished_at=_now(),
        )
        try:
            with session.begin_nested():
                session.add(row)
        except sa_exc.IntegrityError:
            # Another worker stored the same measurement between our check and insert.
            existing = session.scalar(query)
            if existing is None:
                raise
            return RecordedTrial(int(existing), duplicate=True)
        return RecordedTrial(int(row.id), duplicate=False)

    def record_baseline(
        self,
        problem: Problem,
        name: str,
        samples_us: Sequence[float],
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        cache: str = "warm",
    ) -> int:
        """Stores a baseline's timing (e.g. ``name="xla"``) and returns its row id.

        One baseline per (problem, device, software, name, cache policy): a second one is not
        written, and the first one's id comes back.
        """
        policy = _policy(cache)
        if not isinstance(name, str) or not name:
            raise ValueError(f"baseline name must be a non-empty string such as 'xla', but got {name!r}.")
        values = _samples(samples_us, "baseline samples_us")
        _software_key(software)
        with self._write("record a baseline") as session:
            _, problem_id, device_id, software_id = self._ids(session, problem, device, software)
            return _get_or_create(
                session,
                _Baselines,
                {
                    "problem_id": problem_id,
                    "device_id": device_id,
                    "software_id": software_id,
                    "name": name,
                    "cache_policy": policy,
                },
                median_us=statistics.median(values),
                min_us=min(values),
                max_us=max(values),
                samples_us=values,
                measured_at=_now(),
                spread=relative_spread(values),
            )

    def record_trace_regions(
        self, trial_id: int, regions: Mapping[str, tuple[float, int]], trace_path: str
    ) -> None:
        """Stores per-region times of a traced trial: region -> (median_us, count).

        Regions already stored for the trial are kept as they are.

        Raises:
          StorageError: there is no trial ``trial_id``.
        """
        with self._write("record trace regions") as session:
            if session.get(_Trials, trial_id) is None:
                raise StorageError(
                    f"Cannot record trace regions of trial {trial_id}: {self._where} has no "
                    "trial with that id. Pass the id record_trial returned."
                )
            for region, (median_us, count) in regions.items():
                _get_or_create(
                    session,
                    _TraceRegions,
                    {"trial_id": trial_id, "region": region},
                    median_us=float(median_us),
                    count=int(count),
                    trace_path=trace_path,
                )

    # --- reads ----------------------------------------------------------------------------

    def finished_digests(
        self,
        problem: Problem,
        *,
        device: DeviceInfo | None = None,
        software: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> set[str]:
        """Digests of the configs of ``problem`` with a stored trial (any outcome).

        ``device``, ``software`` and ``cache``, when given, restrict to trials on exactly that
        device and software, timed with that cache policy: the configs a worker there must not
        measure again.
        """
        query = (
            sa.select(_Configs.digest)
            .join(_Trials, _Trials.config_id == _Configs.id)
            .join(_Problems, _Problems.id == _Trials.problem_id)
            .where(_Problems.digest == problem.digest())
        )
        if device is not None:
            query = query.join(_Devices, _Devices.id == _Trials.device_id).filter_by(
                **_device_key(device)
            )
        if software is not None:
            query = query.join(_Software, _Software.id == _Trials.software_id).filter_by(
                **_software_key(software)
            )
        if cache is not None:
            query = query.where(_Trials.cache_policy == _policy(cache))
        with self._read("read finished configs") as session:
            return set(session.scalars(query))

    def trials(
        self,
        problem: Problem | None = None,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        status: Outcome | str | None = None,
        device_kind: str | None = None,
        dtype: str | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]:
        """Stored trials, oldest first, filtered by problem, kernel, device name and kind,
        outcome, dtype and cache policy."""
        query = _trial_query()
        if problem is not None:
            query = query.where(_Problems.digest == problem.digest())
        if kernel is not None:
            query = query.where(_Kernels.name == kernel)
        if dtype is not None:
            query = query.where(_Problems.dtype == dtype)
        query = _device_filter(query, device_name, device_kind)
        if status is not None:
            query = query.where(_Trials.status == Outcome(status).value)
        if cache is not None:
            query = query.where(_Trials.cache_policy == _policy(cache))
        with self._read("read trials") as session:
            return [_trial_row(*row) for row in session.execute(query.order_by(_Trials.id))]

    def trial(self, trial_id: int) -> TrialRow | None:
        """The trial with id ``trial_id``, or None."""
        with self._read("read a trial") as session:
            row = session.execute(_trial_query().where(_Trials.id == trial_id)).first()
            return None if row is None else _trial_row(*row)

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
        """The ``n`` fastest ok trials of ``problem`` (lowest median first).

        Only devices of ``device_kind`` count (None: any kind), so GPU and interpret-mode
        times never mix; ``device_name`` further restricts to one device model. ``versions``
        (``{"jax": ..., "jaxlib": ...}``) restricts to trials measured with exactly those
        versions of the keys it gives. ``cache`` restricts to one cache policy; without it,
        the policy is the one :meth:`preferred_policy` picks, so that times of two policies
        are never ranked together.
        """
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, but got {n!r}.")
        query = (
            _trial_query()
            .where(_Problems.digest == problem.digest())
            .where(_Trials.status == Outcome.OK.value, _Trials.median_us.is_not(None))
        )
        query = _device_filter(query, device_name, device_kind)
        if cache is None:
            cache = self.preferred_policy(problem, device_name=device_name, device_kind=device_kind)
        query = query.where(_Trials.cache_policy == _policy(cache))
        for key, value in (versions or {}).items():
            if key not in _SOFTWARE_COLUMNS:
                raise ValueError(
                    f"versions may name {', '.join(_SOFTWARE_COLUMNS)}, but got {key!r}."
                )
            query = query.where(getattr(_Software, key) == value)
        query = query.order_by(_Trials.median_us, _Trials.id).limit(n)
        with self._read("read the best trials") as session:
            return [_trial_row(*row) for row in session.execute(query)]

    def preferred_policy(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
    ) -> str:
        """The cache policy whose results answer for ``problem`` on these devices: ``cold``
        when it has an ok trial timed cold there, else ``warm`` (one query)."""
        query = (
            sa.select(_Trials.id)
            .join(_Problems, _Problems.id == _Trials.problem_id)
            .join(_Devices, _Devices.id == _Trials.device_id)
            .where(_Problems.digest == problem.digest())
            .where(_Trials.status == Outcome.OK.value, _Trials.cache_policy == "cold")
        )
        query = _device_filter(query, device_name, device_kind).limit(1)
        with self._read("read the cache policies") as session:
            return "cold" if session.scalar(query) is not None else "warm"

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
        query = (
            sa.select(_Baselines, _Problems, _Kernels, _Devices, _Software)
            .join(_Problems, _Problems.id == _Baselines.problem_id)
            .join(_Kernels, _Kernels.id == _Problems.kernel_id)
            .join(_Devices, _Devices.id == _Baselines.device_id)
            .join(_Software, _Software.id == _Baselines.software_id)
            .where(_Problems.digest == problem.digest())
        )
        if name is not None:
            query = query.where(_Baselines.name == name)
        if cache is not None:
            query = query.where(_Baselines.cache_policy == _policy(cache))
        query = _device_filter(query, device_name, device_kind)
        query = query.order_by(_Baselines.median_us, _Baselines.id)
        with self._read("read baselines") as session:
            return [
                BaselineRow(
                    id=b.id,
                    problem=_problem(k, p),
                    device=_device_info(d),
                    software=_software_dict(s),
                    name=b.name,
                    median_us=b.median_us,
                    min_us=b.min_us,
                    max_us=b.max_us,
                    samples_us=b.samples_us,
                    measured_at=b.measured_at,
                    cache_policy=b.cache_policy,
                    spread=b.spread,
                )
                for b, p, k, d, s in session.execute(query)
            ]

    def trace_regions(self, trial_id: int) -> list[TraceRegionRow]:
        """The trace regions stored for a trial, by region name."""
        query = (
            sa.select(_TraceRegions)
            .where(_TraceRegions.trial_id == trial_id)
            .order_by(_TraceRegions.region)
        )
        with self._read("read trace regions") as session:
            return [
                TraceRegionRow(r.trial_id, r.region, r.median_us, r.count, r.trace_path)
                for r in session.scalars(query)
            ]

    def problems(self, kernel: str | None = None) -> list[Problem]:
        """The problems with anything stored, by kernel name then insertion order."""
        query = sa.select(_Kernels, _Problems).join(_Problems, _Problems.kernel_id == _Kernels.id)
        if kernel is not None:
            query = query.where(_Kernels.name == kernel)
        query = query.order_by(_Kernels.name, _Problems.id)
        with self._read("read problems") as session:
            return [_problem(k, p) for k, p in session.execute(query)]

    def devices(self) -> list[DeviceInfo]:
        """Every device with anything stored."""
        query = sa.select(_Devices).order_by(_Devices.kind, _Devices.name, _Devices.id)
        with self._read("read devices") as session:
            return [_device_info(d) for d in session.scalars(query)]

    # --- job runs and confirmation rounds (revision 0003) -----------------------------------

    def start_run(
        self,
        job: str,
        *,
        device: DeviceInfo,
        cache: str,
        clocks_before: Mapping[str, Any],
    ) -> int:
        """Stores the start of a job run (with the GPU's clocks before it); returns its id."""
        policy = _policy(cache)
        with self._write("record a job run") as session:
            device_id = _get_or_create(session, _Devices, _device_key(device))
            row = _Runs(
                job=str(job)[:200], device_id=device_id, host=socket.gethostname(),
                cache_policy=policy, started_at=_now(), finished_at=None,
                clocks_before=json.dumps(dict(clocks_before), sort_keys=True),
                clocks_after=None, warnings="[]",
            )
            session.add(row)
            session.flush()
            return int(row.id)

    def finish_run(
        self, run_id: int, *, clocks_after: Mapping[str, Any], warnings: Sequence[str] = ()
    ) -> None:
        """Stores the end of a job run: the clocks after it and the warnings they gave.

        Raises:
          StorageError: there is no run ``run_id``.
        """
        with self._write("finish a job run") as session:
            row = session.get(_Runs, run_id)
            if row is None:
                raise StorageError(f"There is no job run {run_id} in {self._where}.")
            row.finished_at = _now()
            row.clocks_after = json.dumps(dict(clocks_after), sort_keys=True)
            row.warnings = json.dumps(list(warnings))

    def runs(self) -> list[RunRow]:
        """Every job run, oldest first."""
        query = sa.select(_Runs, _Devices).join(_Devices, _Devices.id == _Runs.device_id)
        with self._read("read job runs") as session:
            return [
                RunRow(
                    id=r.id, job=r.job, device=_device_info(d), host=r.host,
                    cache_policy=r.cache_policy, started_at=r.started_at,
                    finished_at=r.finished_at, clocks_before=json.loads(r.clocks_before),
                    clocks_after=None if r.clocks_after is None else json.loads(r.clocks_after),
                    warnings=tuple(json.loads(r.warnings or "[]")),
                )
                for r, d in session.execute(query.order_by(_Runs.id))
            ]

    def record_confirmation(
        self,
        problem: Problem,
        confirmation: Any,
        *,
        trial_ids: Sequence[int],
        device: DeviceInfo,
        software: Mapping[str, str],
        cache: str,
        iterations: int,
        baseline_name: str | None,
        run_id: int | None = None,
    ) -> int:
        """Stores a confirmation round (an :class:`autotune.tuning.confirmation.Confirmation`) as rows
        of its own, in one transaction; returns its id. ``trial_ids[i]`` is the stored search
        trial of ``confirmation.configs[i]``. Nothing stored before is changed.

        Raises:
          ValueError: ``trial_ids`` does not match the configs, or names a trial of another
            problem.
        """
        policy = _policy(cache)
        programs = list(confirmation.configs)
        if len(trial_ids) != len(programs):
            raise ValueError(
                f"trial_ids must name one stored trial per confirmed config ({len(programs)}), "
                f"but got {len(trial_ids)}."
            )
        base = confirmation.baseline
        with self._write("record a confirmation round") as session:
            _, problem_id, device_id, software_id = self._ids(session, problem, device, software)
            for trial_id in trial_ids:
                trial = session.get(_Trials, trial_id)
                if trial is None or trial.problem_id != problem_id:
                    raise ValueError(
                        f"trial {trial_id} is not a stored trial of {problem}: a confirmation "
                        "names the search trials of its own problem."
                    )
            row = _Confirmations(
                run_id=run_id, problem_id=problem_id, device_id=device_id,
                software_id=software_id, cache_policy=policy,
                rounds=len(programs[0].rounds_us), iterations=int(iterations),
                crowned_trial_id=int(trial_ids[confirmation.crowned]),
                fastest_trial_id=int(trial_ids[confirmation.fastest]),
                baseline_name=baseline_name if base is not None else None,
                baseline_rounds_us=() if base is None else base.rounds_us,
                baseline_median_us=None if base is None else base.median_us,
                baseline_spread=None if base is None else base.spread,
                speedup=confirmation.speedup, speedup_spread=confirmation.speedup_spread,
                speedup_low=confirmation.speedup_low, speedup_high=confirmation.speedup_high,
                created_at=_now(),
            )
            session.add(row)
            session.flush()
            for position, (trial_id, p) in enumerate(zip(trial_ids, programs, strict=True)):
                session.add(_ConfirmationPrograms(
                    confirmation_id=row.id, trial_id=int(trial_id), position=position,
                    rounds_us=p.rounds_us, median_us=p.median_us, spread=p.spread,
                    diff=p.diff, noise=p.noise, tie=bool(p.tie), crowned=bool(p.crowned),
                ))
            return int(row.id)

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
        query = (
            sa.select(_Confirmations.id)
            .join(_Problems, _Problems.id == _Confirmations.problem_id)
            .join(_Devices, _Devices.id == _Confirmations.device_id)
            .where(_Problems.digest == problem.digest())
        )
        if cache is not None:
            query = query.where(_Confirmations.cache_policy == _policy(cache))
        query = _device_filter(query, device_name, device_kind)
        query = query.order_by(_Confirmations.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read("read confirmation rounds") as session:
            ids = [int(i) for i in session.scalars(query)]
        rows = dict(self._confirmation_rows(ids)).values()
        return sorted(rows, key=lambda r: -r.id)

    def _confirmation_rows(self, ids: Sequence[int]) -> list[tuple[int, ConfirmationRow]]:
        """(problem id, row) of the confirmations ``ids``, with their programs."""
        if not ids:
            return []
        query = (
            sa.select(_Confirmations, _Problems, _Kernels, _Devices, _Software)
            .join(_Problems, _Problems.id == _Confirmations.problem_id)
            .join(_Kernels, _Kernels.id == _Problems.kernel_id)
            .join(_Devices, _Devices.id == _Confirmations.device_id)
            .join(_Software, _Software.id == _Confirmations.software_id)
            .where(_Confirmations.id.in_(list(ids)))
        )
        programs_q = (
            sa.select(_ConfirmationPrograms, _Configs)
            .join(_Trials, _Trials.id == _ConfirmationPrograms.trial_id)
            .join(_Configs, _Configs.id == _Trials.config_id)
            .where(_ConfirmationPrograms.confirmation_id.in_(list(ids)))
            .order_by(_ConfirmationPrograms.confirmation_id, _ConfirmationPrograms.position)
        )
        with self._read("read confirmation rounds") as session:
            programs: dict[int, list[ConfirmedProgram]] = {}
            for p, c in session.execute(programs_q):
                programs.setdefault(p.confirmation_id, []).append(ConfirmedProgram(
                    trial_id=p.trial_id, config=Config.from_json(c.config_json),
                    position=p.position, rounds_us=p.rounds_us, median_us=p.median_us,
                    spread=p.spread, diff=p.diff, noise=p.noise, tie=bool(p.tie),
                    crowned=bool(p.crowned),
                ))
            out = []
            for c, p, k, d, s in session.execute(query):
                out.append((p.id, ConfirmationRow(
                    id=c.id, problem=_problem(k, p), device=_device_info(d),
                    software=_software_dict(s), cache_policy=c.cache_policy, rounds=c.rounds,
                    iterations=c.iterations, crowned_trial_id=c.crowned_trial_id,
                    fastest_trial_id=c.fastest_trial_id, baseline_name=c.baseline_name,
                    baseline_median_us=c.baseline_median_us, baseline_spread=c.baseline_spread,
                    baseline_rounds_us=c.baseline_rounds_us, speedup=c.speedup,
                    speedup_spread=c.speedup_spread, speedup_low=c.speedup_low,
                    speedup_high=c.speedup_high, created_at=c.created_at, run_id=c.run_id,
                    programs=tuple(programs.get(c.id, ())),
                )))
        return out

    def summaries(
        self,
        *,
        kernel: str | None = None,
        dtype: str | None = None,
        device_name: str | None = None,
        device_kind: str | None = None,
    ) -> list[ProblemSummary]:
        """One summary per (problem, device name, device kind, cache policy) with stored trials;
        each carries its policy's newest confirmation round, if any."""
        group = (_Trials.problem_id, _Devices.name, _Devices.kind, _Trials.cache_policy)

        def filtered(query: Any) -> Any:
            query = (
                query.join(_Devices, _Devices.id == _Trials.device_id)
                .join(_Problems, _Problems.id == _Trials.problem_id)
                .join(_Kernels, _Kernels.id == _Problems.kernel_id)
            )
            if kernel is not None:
                query = query.where(_Kernels.name == kernel)
            if dtype is not None:
                query = query.where(_Problems.dtype == dtype)
            return _device_filter(query, device_name, device_kind)

        counts_q = filtered(sa.select(*group, _Trials.status, sa.func.count()).select_from(_Trials))
        counts_q = counts_q.group_by(*group, _Trials.status)
        rank = sa.func.row_number().over(partition_by=group, order_by=(_Trials.median_us, _Trials.id))
        ranked = filtered(
            sa.select(*group, _Trials.id, _Trials.median_us, _Configs.config_json, rank.label("rank"))
            .select_from(_Trials)
            .join(_Configs, _Configs.id == _Trials.config_id)
            .where(_Trials.status == Outcome.OK.value, _Trials.median_us.is_not(None))
        ).subquery()
        best_q = sa.select(ranked).where(ranked.c.rank == 1)
        base_rank = sa.func.row_number().over(
            partition_by=(_Baselines.problem_id, _Devices.name, _Devices.kind,
                          _Baselines.cache_policy),
            order_by=(_Baselines.median_us, _Baselines.id),
        )
        base_sub = (
            sa.select(
                _Baselines.problem_id, _Devices.name, _Devices.kind, _Baselines.cache_policy,
                _Baselines.name.label("baseline"), _Baselines.median_us, base_rank.label("rank"),
            )
            .join(_Devices, _Devices.id == _Baselines.device_id)
            .subquery()
        )
        base_q = sa.select(base_sub).where(base_sub.c.rank == 1)

        with self._read("summarise results") as session:
            trials: dict[tuple[int, str, str, str], dict[str, int]] = {}
            for problem_id, name, kind, policy, status, count in session.execute(counts_q):
                trials.setdefault((problem_id, name, kind, policy), {})[status] = int(count)
            best = {
                (r.problem_id, r.name, r.kind, r.cache_policy):
                    (r.id, r.median_us, json.loads(r.config_json))
                for r in session.execute(best_q)
            }
            baselines = {
                (r.problem_id, r.name, r.kind, r.cache_policy): (r.baseline, r.median_us)
                for r in session.execute(base_q)
            }
            newest = (
                sa.select(sa.func.max(_Confirmations.id))
                .join(_Devices, _Devices.id == _Confirmations.device_id)
                .where(_Confirmations.problem_id.in_(sorted({k[0] for k in trials})))
                .group_by(_Confirmations.problem_id, _Devices.name, _Devices.kind,
                          _Confirmations.cache_policy)
            )
            confirmation_ids = [int(i) for i in session.scalars(newest)]
            problem_ids = sorted({key[0] for key in trials})
            problems = {
                p.id: _problem(k, p)
                for k, p in session.execute(
                    sa.select(_Kernels, _Problems)
                    .join(_Problems, _Problems.kernel_id == _Kernels.id)
                    .where(_Problems.id.in_(problem_ids))
                )
            }
        confirmations = {
            (problem_id, c.device.name, c.device.kind, c.cache_policy): c
            for problem_id, c in self._confirmation_rows(confirmation_ids)
        }
        out = []
        for key in sorted(trials, key=lambda k: (problems[k[0]].kernel, k[0], k[2], k[1], k[3])):
            best_id, best_us, best_config = best.get(key, (None, None, None))
            baseline_name, baseline_us = baselines.get(key, (None, None))
            confirmation = confirmations.get(key)
            out.append(
                ProblemSummary(
                    problem=problems[key[0]],
                    device=key[1],
                    device_kind=key[2],
                    by_status=trials[key],
                    best_us=best_us,
                    best_config=best_config,
                    best_trial_id=best_id,
                    baseline_name=baseline_name,
                    baseline_us=baseline_us,
                    cache_policy=key[3],
                    confirmation=confirmation,
                )
            )
        return out


def _policy(cache: str) -> str:
    from autotune.evaluation.trial import CACHE_POLICIES

    if cache not in CACHE_POLICIES:
        raise ValueError(
            f"cache policy must be one of {', '.join(CACHE_POLICIES)}, but got {cache!r}."
        )
    return cache


def _device_key(device: DeviceInfo) -> dict[str, str]:
    return {
        "name": device.name,
        "kind": device.kind,
        "compute_capability": device.compute_capability,
        "driver": device.driver,
    }


def _device_filter(query: Any, device_name: str | None, device_kind: str | None) -> Any:
    if device_kind is not None:
        query = query.where(_Devices.kind == device_kind)
    if device_name is not None:
        query = query.where(_Devices.name == device_name)
    return query


def _trial_query() -> Any:
    traced = sa.exists().where(_TraceRegions.trial_id == _Trials.id).label("traced")
    return (
        sa.select(_Trials, _Problems, _Kernels, _Configs, _Devices, _Software, traced)
        .join(_Problems, _Problems.id == _Trials.problem_id)
        .join(_Kernels, _Kernels.id == _Problems.kernel_id)
        .join(_Configs, _Configs.id == _Trials.config_id)
        .join(_Devices, _Devices.id == _Trials.device_id)
        .join(_Software, _Software.id == _Trials.software_id)
    )


def _trial_row(
    t: _Trials,
    p: _Problems,
    k: _Kernels,
    c: _Configs,
    d: _Devices,
    s: _Software,
    traced: bool,
) -> TrialRow:
    return TrialRow(
        id=t.id,
        problem=_problem(k, p),
        config=Config.from_json(c.config_json),
        device=_device_info(d),
        software=_software_dict(s),
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

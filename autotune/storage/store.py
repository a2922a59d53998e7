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
:mod:`.urls`. :class:`Store` opens the database (engines, soundness check, migration) and
owns three objects: the :class:`~.connection.Sessions` (one session per call, failures
worded), a :class:`~.writing.StoreWriter` (every write transaction) and a
:class:`~.reading.StoreReader` (every read), both over those sessions and sharing the keys
and row conversions of :mod:`.keys`. Its public methods forward to them, with the same
signatures (``tests/storage/test_storage.py`` checks that they match).
"""

from __future__ import annotations

import datetime as dt
import logging
import pathlib
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from autotune.errors import StorageError
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.connection import (
    VERSION_TABLE,
    SchemaBehind,
    Sessions,
    damaged_hint,
    failure_reason,
    make_engine,
    migrate,
    open_hint,
)
from autotune.storage.reading import HISTORY_PER_SHAPE, HISTORY_SHAPES, StoreReader
from autotune.storage.rows import (
    BaselineRow,
    ConfirmationRow,
    Observed,
    ProblemSummary,
    RecordedTrial,
    RunRow,
    TraceRegionRow,
    TrialRow,
    TrialTable,
    VerificationRow,
)
from autotune.storage.urls import (
    check_database_path,
    display_url,
    read_only_url,
    read_timeout_s,
    resolve_url,
    sqlite_path,
)
from autotune.storage.writing import StoreWriter

__all__ = [
    "Store",
    "failure_reason",
    "damaged_hint",
    "VERSION_TABLE",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the store


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
      EmptyDatabaseError: ``read_only`` and the database holds no autotune tables (an empty
        file, another program's database); nothing was written to it.
      StorageError: the database cannot be reached, is a folder, is not a database (the file
        is left untouched), or has a schema newer than this code.
    """

    def __init__(
        self, url: str | None = None, *, read_only: bool = False, timeout_s: float | None = None
    ) -> None:
        self._url = resolve_url(url)
        path = sqlite_path(self._url)
        self._where = str(path) if path is not None else display_url(self._url)
        # A pipe, a device or a socket would hold SQLite's open() forever: refused first.
        check_database_path(self._url, timeout_s=timeout_s)
        # Read-only applies to SQLite files and PostgreSQL; an in-memory database is private
        # to its store, so it is opened (and created) as usual.
        read_only = read_only and (path is not None or self._url.get_backend_name() == "postgresql")
        self.read_only = read_only
        if read_only:
            # Opened read-only, the database is never written: not its header (no journal
            # mode switch), not its schema (an older one is upgraded by a writer, and only
            # once SQLite's quick_check found the file sound), not a row.
            self._url = read_only_url(self._url, read_timeout_s(timeout_s))
        elif path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(f"Cannot create the folder of the database {path}: {e}.") from e
        try:
            self.engine: Engine = make_engine(self._url, read_only=read_only)
        except (sa_exc.ArgumentError, ImportError) as e:
            raise StorageError(
                f"Cannot use the database URL {self!r}: {failure_reason(e)}. Expected sqlite:///PATH "
                "or postgresql://user@host:5432/dbname; for PostgreSQL, install psycopg 3 "
                "(pip install 'autotune[postgres]')."
            ) from e
        self._read_engine = self.engine.execution_options(autotune_read_only=True)
        self._sessions = Sessions(self.engine, self._read_engine, self._where)
        self._writer = StoreWriter(self._sessions)
        self._reader = StoreReader(self._sessions)
        try:
            if not read_only and path is not None:
                self._check_sound(path)
            try:
                migrate(self.engine, self._read_engine, self._where, read_only=read_only)
            except SchemaBehind:
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
                f"Cannot open the database {self._where}: {failure_reason(e)}.{open_hint(path, failure_reason(e))}"
            ) from e
        except sa_exc.SQLAlchemyError as e:
            self.engine.dispose()
            raise StorageError(
                f"Cannot open the database {self._where}: {failure_reason(e)}.{open_hint(path, failure_reason(e))}"
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
                f"(quick_check: {' '.join(verdict.split())[:200]}). {damaged_hint('malformed')}"
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
        """Closes every pooled connection. The store must not be used afterwards.

        A writer of an SQLite file first moves what the write-ahead log holds into the file
        (:meth:`checkpoint`): the log is folded in only when the last connection to the file
        closes, and Optuna's engine or a query's reader in the same process may outlive this
        one, so a program that tuned and then looked up could leave every result in
        ``<file>-wal``, and a copy of the file alone would hold none of them."""
        self.checkpoint()  # does nothing for a reader or another backend
        self.engine.dispose()

    def checkpoint(self) -> bool:
        """Copies every transaction of an SQLite file's write-ahead log into the file itself
        (``PRAGMA wal_checkpoint(PASSIVE)``: it never waits on other connections), so that the
        file alone holds every result. True when the whole log is in the file; False where a
        reader mid-read holds some of it back (it stays in the log: nothing is lost), or the
        database is not an SQLite file opened for writing."""
        if self.read_only or sqlite_path(self._url) is None:
            return False
        try:
            raw = self.engine.raw_connection()
            try:
                # The raw connection is in autocommit (connection._on_connect): no BEGIN, which
                # a checkpoint cannot run inside.
                cursor = raw.cursor()
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                row = cursor.fetchone()
                cursor.close()
            finally:
                raw.close()
        except (sa_exc.SQLAlchemyError, sqlite3.Error, OSError) as e:
            log.debug("No checkpoint of %s: %s", self._where, e)
            return False
        if row is None:  # not in WAL mode: nothing to copy
            return True
        busy, frames, copied = row
        if busy or copied < frames:
            log.debug("The checkpoint of %s copied %d of %d frames (a reader holds the rest).",
                      self._where, copied, frames)
            return False
        return True

    # -- writes: StoreWriter (.writing) ----------------------------------------------------

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
        """Stores one finished trial, in one transaction
        (:meth:`.writing.StoreWriter.record_trial`)."""
        return self._writer.record_trial(problem, config, result, device=device, software=software,
            study_name=study_name, optuna_trial_number=optuna_trial_number, worker=worker,
            started_at=started_at, cache=cache)

    def record_trials(
        self, trials: Sequence[tuple[Problem, Config, TrialResult, DeviceInfo, Mapping[str, str]]],
        *, worker: str = "", cache: str | None = None,
        spreads: Sequence[float | None] | None = None,
    ) -> list[RecordedTrial]:
        """Stores many finished trials ``(problem, config, result, device, software)`` in ONE
        transaction: all of them, or (on any error) none
        (:meth:`.writing.StoreWriter.record_trials`)."""
        return self._writer.record_trials(trials, worker=worker, cache=cache, spreads=spreads)

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
        """Stores a baseline's timing (e.g. ``name="xla"``) and returns its row id
        (:meth:`.writing.StoreWriter.record_baseline`)."""
        return self._writer.record_baseline(problem, name, samples_us, device=device,
            software=software, cache=cache)

    def record_trace_regions(
        self, trial_id: int, regions: Mapping[str, tuple[float, int]], trace_path: str
    ) -> None:
        """Stores per-region times of a traced trial: region -> (median_us, count)
        (:meth:`.writing.StoreWriter.record_trace_regions`)."""
        return self._writer.record_trace_regions(trial_id, regions, trace_path)

    def start_run(
        self,
        job: str,
        *,
        device: DeviceInfo,
        cache: str,
        clocks_before: Mapping[str, Any],
    ) -> int:
        """Stores the start of a job run (with the GPU's clocks before it); returns its id
        (:meth:`.writing.StoreWriter.start_run`)."""
        return self._writer.start_run(job, device=device, cache=cache, clocks_before=clocks_before)

    def finish_run(
        self, run_id: int, *, clocks_after: Mapping[str, Any], warnings: Sequence[str] = ()
    ) -> None:
        """Stores the end of a job run: the clocks after it and the warnings they gave
        (:meth:`.writing.StoreWriter.finish_run`)."""
        return self._writer.finish_run(run_id, clocks_after=clocks_after, warnings=warnings)

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
        """Stores a confirmation round (an :class:`autotune.tuning.confirmation.Confirmation`) as
        rows of its own, in one transaction; returns its id
        (:meth:`.writing.StoreWriter.record_confirmation`)."""
        return self._writer.record_confirmation(problem, confirmation, trial_ids=trial_ids,
            device=device, software=software, cache=cache, iterations=iterations,
            baseline_name=baseline_name, run_id=run_id)

    def record_verification(
        self,
        problem: Problem,
        verification: Any,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
    ) -> int:
        """Stores an independent re-time (an :class:`autotune.tuning.verify.Verification`) as a row
        of its own, in one transaction; returns its id
        (:meth:`.writing.StoreWriter.record_verification`)."""
        return self._writer.record_verification(problem, verification, device=device,
            software=software)

    # -- reads: StoreReader (.reading) ----------------------------------------------------

    def finished_digests(
        self,
        problem: Problem,
        *,
        device: DeviceInfo | None = None,
        software: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> set[str]:
        """Digests of the configs of ``problem`` with a stored trial (any outcome)
        (:meth:`.reading.StoreReader.finished_digests`)."""
        return self._reader.finished_digests(problem, device=device, software=software,
            cache=cache)

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
        """Stored trials, oldest first, filtered by problem, kernel, device name and kind, outcome,
        dtype and cache policy (:meth:`.reading.StoreReader.trials`)."""
        return self._reader.trials(problem, kernel=kernel, device_name=device_name, status=status,
            device_kind=device_kind, dtype=dtype, cache=cache)

    def observations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = None,
        shapes: int = HISTORY_SHAPES,
        per_shape: int = HISTORY_PER_SHAPE,
    ) -> list[Observed]:
        """What ``problem``'s kernel measured on these devices, as a bounded summary: every trial
        of ``problem`` itself, then of the ``shapes`` other problems of the kernel nearest to it
        (:func:`~autotune.space.problem.shape_distance`, same dtype first) with a trial there, at
        most ``per_shape`` trials each: all of a problem's when it has that few, else its
        ``per_shape // 4`` fastest ok trials (on the ``ix_at_trials_best`` index) and an even
        sample of the others (every n-th by id) (:meth:`.reading.StoreReader.observations`)."""
        return self._reader.observations(problem, device_name=device_name, device_kind=device_kind,
            shapes=shapes, per_shape=per_shape)

    def trial_table(
        self,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        status: Outcome | str | None = None,
        device_kind: str | None = None,
        dtype: str | None = None,
        limit: int | None = None,
    ) -> TrialTable:
        """Stored trials as columns, oldest first, filtered as :meth:`trials` filters them, the
        first ``limit`` only (filters and limit in SQL)
        (:meth:`.reading.StoreReader.trial_table`)."""
        return self._reader.trial_table(kernel=kernel, device_name=device_name, status=status,
            device_kind=device_kind, dtype=dtype, limit=limit)

    def trial(self, trial_id: int) -> TrialRow | None:
        """The trial with id ``trial_id``, or None (:meth:`.reading.StoreReader.trial`)."""
        return self._reader.trial(trial_id)

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
        """The ``n`` fastest ok trials of ``problem`` (lowest median first)
        (:meth:`.reading.StoreReader.best`)."""
        return self._reader.best(problem, device_name=device_name, device_kind=device_kind, n=n,
            versions=versions, cache=cache)

    def preferred_policy(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
    ) -> str:
        """The cache policy whose results answer for ``problem`` on these devices: ``cold`` when it
        has an ok trial timed cold there, else ``warm`` (one query)
        (:meth:`.reading.StoreReader.preferred_policy`)."""
        return self._reader.preferred_policy(problem, device_name=device_name,
            device_kind=device_kind)

    def baseline(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> BaselineRow | None:
        """The fastest stored baseline of ``problem`` (of ``name``, if given), or None
        (:meth:`.reading.StoreReader.baseline`)."""
        return self._reader.baseline(problem, device_name=device_name, device_kind=device_kind,
            name=name, cache=cache)

    def baselines(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> list[BaselineRow]:
        """Stored baselines of ``problem``, fastest first (of one cache policy, if given)
        (:meth:`.reading.StoreReader.baselines`)."""
        return self._reader.baselines(problem, device_name=device_name, device_kind=device_kind,
            name=name, cache=cache)

    def trace_regions(self, trial_id: int) -> list[TraceRegionRow]:
        """The trace regions stored for a trial, by region name
        (:meth:`.reading.StoreReader.trace_regions`)."""
        return self._reader.trace_regions(trial_id)

    def problems(self, kernel: str | None = None) -> list[Problem]:
        """The problems with anything stored, by kernel name then insertion order
        (:meth:`.reading.StoreReader.problems`)."""
        return self._reader.problems(kernel)

    def devices(self) -> list[DeviceInfo]:
        """Every device with anything stored (:meth:`.reading.StoreReader.devices`)."""
        return self._reader.devices()

    def runs(self) -> list[RunRow]:
        """Every job run, oldest first (:meth:`.reading.StoreReader.runs`)."""
        return self._reader.runs()

    def confirmations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        cache: str | None = None,
        limit: int | None = None,
    ) -> list[ConfirmationRow]:
        """The stored confirmation rounds of ``problem``, newest first (the newest ``limit``)
        (:meth:`.reading.StoreReader.confirmations`)."""
        return self._reader.confirmations(problem, device_name=device_name,
            device_kind=device_kind, cache=cache, limit=limit)

    def verifications(
        self,
        problem: Problem | None = None,
        *,
        device_name: str | None = None,
        device_kind: str | None = None,
        limit: int | None = None,
    ) -> list[VerificationRow]:
        """The stored ``autotune verify`` rows (of ``problem``, or of every problem), newest first
        (the newest ``limit``) (:meth:`.reading.StoreReader.verifications`)."""
        return self._reader.verifications(problem, device_name=device_name,
            device_kind=device_kind, limit=limit)

    def program_checks(self, confirmation_ids: Sequence[int]) -> dict[int, VerificationRow]:
        """The newest program check of each of the confirmation rounds ``confirmation_ids``
        that has one, by confirmation id (:meth:`.reading.StoreReader.program_checks`)."""
        return self._reader.program_checks(confirmation_ids)

    def summaries(
        self,
        *,
        kernel: str | None = None,
        dtype: str | None = None,
        device_name: str | None = None,
        device_kind: str | None = None,
    ) -> list[ProblemSummary]:
        """One summary per (problem, device name, device kind, cache policy) with stored trials;
        each carries its policy's newest confirmation round, if any
        (:meth:`.reading.StoreReader.summaries`)."""
        return self._reader.summaries(kernel=kernel, dtype=dtype, device_name=device_name,
            device_kind=device_kind)

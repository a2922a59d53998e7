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
:mod:`.urls`. :class:`Store` is this module's opening (engines, soundness check, migration,
one session per call) over three parts: :mod:`.connection` (SQLAlchemy engines and PRAGMAs,
failure wording, migrations), :mod:`.writing` (``_StoreWrites``: every write transaction) and
:mod:`.reading` (``_StoreReads``: every read), which share the keys and row conversions of
:mod:`.keys`.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import StorageError
from autotune.storage.connection import (
    VERSION_TABLE,
    _create_engine,
    _migrate,
    _open_hint,
    _SchemaBehind,
    damaged_hint,
    failure_reason,
)
from autotune.storage.reading import _StoreReads
from autotune.storage.urls import (
    _read_only_url,
    check_database_path,
    display_url,
    read_timeout_s,
    resolve_url,
    sqlite_path,
)
from autotune.storage.writing import _StoreWrites

__all__ = [
    "Store",
    "failure_reason",
    "damaged_hint",
    "VERSION_TABLE",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the store


_SOUND_FILES: set[tuple[str, int, int]] = set()


class Store(_StoreWrites, _StoreReads):
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

"""The connection to the results database: SQLAlchemy engines (SQLite PRAGMAs, read-only
and busy timeouts, PostgreSQL), how a database failure is worded, and migrating the schema on
open (alembic, the ``at_alembic_version`` table), and the :class:`Sessions` a store's reader
and writer share. Used by :class:`~.store.Store`."""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import EmptyDatabaseError, StorageError
from autotune.storage.sqlite_reader import MIGRATIONS_DIR as _MIGRATIONS_DIR
from autotune.storage.sqlite_reader import VERSION_TABLE as VERSION_TABLE
from autotune.storage.sqlite_reader import damaged_hint as damaged_hint
from autotune.storage.sqlite_reader import script_head as _script_head
from autotune.storage.urls import in_memory, mask_text

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 30.0
# Key of the PostgreSQL advisory lock that serialises concurrent migrations ("autotune").
_PG_MIGRATION_LOCK = 0x6175746F74756E65


def make_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.get_backend_name() != "sqlite":
        kwargs: dict[str, Any] = {}
        if url.get_backend_name() == "postgresql":
            kwargs["pool_pre_ping"] = True  # workers hold a Store for hours
        return sa.create_engine(url, **kwargs)

    memory = in_memory(url)
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
    # The driver's words may quote the URL or a connection string: secrets masked here, once.
    return mask_text(text.splitlines()[0]) if text else type(error).__name__


def open_hint(path: pathlib.Path | None, reason: str) -> str:
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


@functools.cache
def _scripts() -> Any:
    """The migration scripts (alembic's ScriptDirectory), read once per process: they ship
    inside the package and do not change while it runs."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


class SchemaRecordError(StorageError):
    """autotune's tables exist but the schema version record is missing or not one row."""


REPAIR_COMMAND = "autotune db repair"


def _version_rows(connection: sa.Connection) -> list[str] | None:
    """The rows of the version table (None: no such table)."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    table = sa.table(VERSION_TABLE, sa.column("version_num"))
    return [str(v) for v in connection.execute(sa.select(table.c.version_num)).scalars()]


def _our_tables(connection: sa.Connection) -> list[str]:
    return sorted(t for t in sa.inspect(connection).get_table_names()
                  if t.startswith("at_") and t != VERSION_TABLE)


def _check_version_record(connection: sa.Connection, where: str) -> None:
    """Raises :class:`SchemaRecordError` when autotune's tables exist but the version record
    is missing, empty, or more than one row; a database without our tables passes (new)."""
    rows = _version_rows(connection)
    if rows is not None and len(rows) == 1:
        return
    if rows and len(rows) > 1:
        problem = (f"holds {len(rows)} schema version records ({', '.join(rows)}) in "
                   f"{VERSION_TABLE}, where there must be exactly one")
    elif _our_tables(connection):
        problem = (f"holds autotune's tables but no schema version record (the table "
                   f"{VERSION_TABLE} is {'missing' if rows is None else 'empty'})")
    else:
        return
    raise SchemaRecordError(
        f"The database {where} {problem}, so autotune cannot tell which schema it has; "
        f"nothing was read or changed. Repair it with `{REPAIR_COMMAND} --db URL` (it records the "
        "schema version its tables match, then the database opens as usual), or restore it "
        "from a backup."
    )


def _fingerprint(connection: sa.Connection) -> frozenset[tuple[str, ...]]:
    """autotune's tables, their columns and their ``ix_`` indexes: what tells two schema
    versions apart, on any backend."""
    inspector = sa.inspect(connection)
    found: set[tuple[str, ...]] = set()
    for table in _our_tables(connection):
        found.add((table,))
        found |= {(table, c["name"]) for c in inspector.get_columns(table)}
        found |= {(table, "index", str(i["name"])) for i in inspector.get_indexes(table)
                  if str(i["name"]).startswith("ix_")}
    return frozenset(found)


def repair_version_record(url: URL, where: str) -> tuple[list[str] | None, str]:
    """Writes the one schema version record of the database at ``url``: the version whose
    tables, columns and indexes its own match (each version is built in memory to compare).
    Returns (the rows found, None for no table; the version recorded). A sound record (one
    row) is left as it is and returned as found.

    Raises:
      StorageError: the database holds no autotune tables, or its tables match no version
        this autotune knows.
    """
    from alembic import command

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            rows = _version_rows(connection)
            tables = _our_tables(connection)
            ours = _fingerprint(connection)
        if rows is not None and len(rows) == 1:
            return rows, rows[0]  # sound: nothing to repair
        if not tables:
            raise StorageError(f"The database {where} holds no autotune tables: nothing to repair.")
        revisions = [r.revision for r in reversed(list(_scripts().walk_revisions()))]
        match = None
        for revision in revisions:
            memory = make_engine(sa.make_url("sqlite://"))
            try:
                with memory.begin() as mc:
                    command.upgrade(_alembic_config(mc), revision)
                with memory.connect() as mc:
                    if _fingerprint(mc) == ours:
                        match = revision
            finally:
                memory.dispose()
        if match is None:
            raise StorageError(
                f"The tables of {where} match no schema version this autotune knows "
                f"({', '.join(revisions)}); nothing was changed. Restore it from a backup."
            )
        with engine.begin() as connection:
            command.stamp(_alembic_config(connection), match, purge=True)
        return rows, match
    finally:
        engine.dispose()


class SchemaBehind(StorageError):
    """A read-only store found a schema older than head (it migrates through a writer)."""


def _at_head(read_engine: Engine) -> bool:
    """Whether the schema is at the scripts' head, by one read of the version table (no
    alembic import): the common case of every query. Only a record of exactly one row, the
    head, counts: a missing, empty or doubled one is the full check's to name."""
    head = _script_head()
    if head is None:
        return False
    try:
        with read_engine.connect() as connection:
            found = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    except sa.exc.DBAPIError:  # no version table yet: the full check says what to do
        return False
    return list(found) == [head]  # exactly one row: a doubled record goes to the full check


def migrate(engine: Engine, read_engine: Engine, where: str, *, read_only: bool = False) -> None:
    """Brings the schema to head: a database without autotune's tables gets it in one step
    (:func:`create_schema`), an older one is upgraded through the migrations; refuses a schema
    newer than this code. ``read_only``: only checks, raising :class:`SchemaBehind` when the
    schema is older than head."""
    if _at_head(read_engine):
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    script = _scripts()
    head = script.get_current_head()
    known = {rev.revision for rev in script.walk_revisions()}

    def current(connection: sa.Connection) -> set[str]:
        _check_version_record(connection, where)
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

    # Fast path: a read that takes no write lock, the common case of an up-to-date schema. It
    # reads one snapshot: on PostgreSQL each statement of a READ COMMITTED transaction sees
    # every commit before it, so a schema another process commits between the read of the
    # version table and the list of tables would read as tables without a version record.
    with read_engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execution_options(isolation_level="REPEATABLE READ")
        revisions = current(connection)
    if revisions == {head}:
        return
    if read_only and not revisions:  # never given autotune's tables: a reader leaves it so
        raise EmptyDatabaseError(
            f"The database {where} holds no autotune tables (an empty file, or another "
            "program's database): nothing is stored there, and it was left as it is. Point --db "
            "or AUTOTUNE_DB at the database autotune stores its results in."
        )
    if read_only:
        raise SchemaBehind(f"The database {where} has an older autotune schema than {head}.")
    # One writer at a time creates or upgrades the schema, in one transaction, and reads the
    # version record again once it holds the lock: another may have just done it. SQLite: the
    # BEGIN IMMEDIATE of every write transaction (make_engine) is the lock; PostgreSQL: an
    # advisory lock, released at commit.
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        revisions = current(connection)
        if revisions == {head}:
            return
        if not revisions:  # no autotune tables (current() refused tables without a record)
            log.info("Creating the autotune schema %s in %s.", head, where)
            create_schema(connection)
        else:
            log.info("Upgrading the autotune schema of %s to %s.", where, head)
            command.upgrade(_alembic_config(connection), "head")


def create_schema(connection: sa.Connection) -> None:
    """Creates the newest schema in a database without autotune's tables, on ``connection``
    (in its transaction): every table from the models, then the head recorded as its version
    (alembic's recipe "Building an Up to Date Database from Scratch"), instead of running every
    migration in turn. The schema is the one the migrations build
    (``tests/storage/test_storage.py::test_a_fresh_schema_is_the_one_every_migration_builds``)."""
    from alembic.runtime.migration import MigrationContext

    from autotune.storage.schema import Base

    Base.metadata.create_all(connection)
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    context.stamp(_scripts(), "head")


class Sessions:
    """One database's sessions, shared by a store's :class:`~.reading.StoreReader` and
    :class:`~.writing.StoreWriter`: a write session is one transaction, a read session runs
    on the read-only engine; a database error in either becomes a :class:`StorageError` that
    says what was being done, where, and why.

    ``where``: the database as messages name it (a SQLite path, or the URL without password).
    """

    def __init__(self, engine: Engine, read_engine: Engine, where: str) -> None:
        self.where = where
        self._writes = sessionmaker(engine, expire_on_commit=False)
        self._reads = sessionmaker(read_engine)

    @contextlib.contextmanager
    def write(self, what: str) -> Iterator[Session]:
        """A session in one write transaction, committed on leaving (``what``: for errors)."""
        try:
            with self._writes.begin() as session:
                yield session
        except sa_exc.SQLAlchemyError as e:
            raise StorageError(f"Could not {what} in {self.where}: {failure_reason(e)}.") from e

    @contextlib.contextmanager
    def read(self, what: str) -> Iterator[Session]:
        """A read session (``what``: for errors, which carry the damaged-file hint)."""
        try:
            with self._reads() as session:
                yield session
        except sa_exc.SQLAlchemyError as e:
            reason = failure_reason(e)
            hint = damaged_hint(reason)
            raise StorageError(
                f"Could not {what} from {self.where}: {reason}." + (f" {hint}" if hint else "")
            ) from e

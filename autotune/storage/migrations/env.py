"""Alembic environment of the autotune schema.

Run by :class:`autotune.storage.store.Store` with an open connection in
``config.attributes["connection"]``; run by the ``alembic`` command line (see
``autotune/storage/alembic.ini``) it connects to ``$AUTOTUNE_DB`` (or the default database).
Only ``at_*`` tables are ours: Optuna's tables may share the database and are never touched.
"""

from __future__ import annotations

from typing import Any

from alembic import context

from autotune.storage.connection import VERSION_TABLE, make_engine
from autotune.storage.schema import Base
from autotune.storage.urls import resolve_url

config = context.config


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table":
        return name is not None and name.startswith("at_")
    return True


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=_include_name,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
        **kwargs,
    )


def _url() -> Any:
    return resolve_url(config.get_main_option("sqlalchemy.url") or None)


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

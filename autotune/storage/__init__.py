"""Storage: the results database (SQLite or PostgreSQL) behind one :class:`~.store.Store`.

The schema and row values (:mod:`.schema`), database URLs (:mod:`.urls`), alembic migrations
(:mod:`.migrations`) and the store itself (:mod:`.store`). May import :mod:`autotune.space` and
:mod:`autotune.space.outcomes`; never jax, never Optuna.
"""

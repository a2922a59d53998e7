"""Alembic migrations of the autotune schema (a package, so that they ship in the wheel).

:class:`autotune.storage.store.Store` runs them on open, with a programmatic alembic ``Config`` whose
``script_location`` is this folder. To write the next revision after changing the models in
``autotune/storage/store.py``::

    AUTOTUNE_DB=sqlite:///tmp/dev.db alembic -c autotune/storage/alembic.ini upgrade head
    AUTOTUNE_DB=sqlite:///tmp/dev.db alembic -c autotune/storage/alembic.ini revision --autogenerate -m "..."
"""

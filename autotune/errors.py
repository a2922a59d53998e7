"""The exception tree. Every error names the rule, the value, and the way out.

    AutotuneError
    ├── SpaceError (ValueError)          a space is declared wrongly
    │   └── NoValidConfigError           a problem has no valid config; names the binding rule
    ├── JobError (ValueError)            a job file or CLI input is malformed
    ├── KernelNotFoundError (LookupError) a kernel name or import path does not resolve
    ├── StorageError                     the database cannot be opened, migrated or written
    │   └── EmptyDatabaseError           a read-only store found no autotune tables
    └── NothingTunedError (LookupError)  a query found no stored result

    MissingDatabaseWarning (UserWarning)  a query's database file does not exist

Trial outcomes (a config that fails to compile, times out or crashes) are *values*
(:class:`autotune.space.outcomes.Outcome`), never exceptions.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AutotuneError",
    "SpaceError",
    "NoValidConfigError",
    "JobError",
    "KernelNotFoundError",
    "StorageError",
    "EmptyDatabaseError",
    "NothingTunedError",
    "did_you_mean",
    "MissingDatabaseWarning",
]


class AutotuneError(Exception):
    """Base of every error this package raises on purpose."""


class SpaceError(AutotuneError, ValueError):
    """A search space or config is malformed."""


class NoValidConfigError(SpaceError):
    """A problem has no valid config; the message names the rule that excludes everything."""


class JobError(AutotuneError, ValueError):
    """A job file, CLI argument or API argument is malformed; the message names the field."""


class KernelNotFoundError(AutotuneError, LookupError):
    """A kernel name (or ``package.module:name`` path) does not resolve."""


class StorageError(AutotuneError):
    """The database cannot be opened, migrated or written."""


class EmptyDatabaseError(StorageError):
    """A read-only store was pointed at a database without autotune's tables (an empty file,
    another program's database): nothing is stored there, and nothing was written to it."""


class NothingTunedError(AutotuneError, LookupError):
    """A query found no stored result for the problem asked about."""


class MissingDatabaseWarning(UserWarning):
    """A query was pointed at a SQLite database file that does not exist (warned once per
    file and process); it answers "nothing tuned" and creates nothing."""


def did_you_mean(value: object, allowed: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` naming the allowed values closest to ``value`` (difflib), or
    ``""`` when none is close. Appended to an error message that already lists the allowed."""
    if not isinstance(value, str):
        return ""
    choices = list(dict.fromkeys(allowed))
    close = difflib.get_close_matches(value, choices, n=2, cutoff=0.6)
    if not close:
        folded = {c.casefold(): c for c in choices}
        close = [folded[m] for m in difflib.get_close_matches(value.casefold(), folded, n=2, cutoff=0.6)]
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"

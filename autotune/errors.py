"""The exception tree. Every error names the rule, the value, and the way out.

    AutotuneError
    ├── SpaceError (ValueError)          a space is declared wrongly
    │   └── NoValidConfigError           a problem has no valid config; names the binding rule
    ├── JobError (ValueError)            a job file or CLI input is malformed
    ├── KernelNotFoundError (LookupError) a kernel name or import path does not resolve
    ├── StorageError                     the database cannot be opened, migrated or written
    └── NothingTunedError (LookupError)  a query found no stored result

Trial outcomes (a config that fails to compile, times out or crashes) are *values*
(:class:`autotune.evaluation.Outcome`), never exceptions.
"""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "SpaceError",
    "NoValidConfigError",
    "JobError",
    "KernelNotFoundError",
    "StorageError",
    "NothingTunedError",
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


class NothingTunedError(AutotuneError, LookupError):
    """A query found no stored result for the problem asked about."""

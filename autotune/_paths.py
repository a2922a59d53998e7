"""Paths under the results directory built from names that come from job files, kernels,
configs or the database: they must never lead out of it.

    safe_path("results", "traces", problem.kernel, problem.digest())
    # -> Path("results/traces/hopper_matmul/3f2a...")

Each part is one or more relative path components (``"a/b"`` is two); a component may not be
empty, ``.`` or ``..``, hold a NUL byte or a backslash, or be longer than a file name may be
(255 bytes). The check is on the names alone (nothing is created or resolved), so it does not
depend on what exists on disk; symbolic links the user put inside the results directory are
the user's to point where they like.
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.errors import JobError

__all__ = ["UnsafePathError", "safe_path", "check_file_name", "RESULTS_DIR_ENV",
           "default_results_dir"]

_NAME_MAX_BYTES = 255
# Where traces, worker logs and reports go when no folder is given: $AUTOTUNE_RESULTS_DIR,
# else ``results`` under the working directory.
RESULTS_DIR_ENV = "AUTOTUNE_RESULTS_DIR"


def default_results_dir() -> str:
    """``$AUTOTUNE_RESULTS_DIR`` when set (and not blank), else ``"results"`` (relative to the
    working directory). The database's default is separate (``$AUTOTUNE_DB``)."""
    return os.environ.get(RESULTS_DIR_ENV, "").strip() or "results"


class UnsafePathError(JobError):
    """A name would make a path that leaves its root directory (or is not a file name)."""


def _rule_broken(text: str) -> str | None:
    """Why ``text`` is not a safe relative path, or None when it is."""
    if "\x00" in text:
        return "it holds a NUL byte"
    if "\\" in text:
        return "it holds a backslash"
    if text.startswith("/"):
        return "it is an absolute path"
    for component in text.split("/"):
        if component in ("", ".", ".."):
            return f"it has the path component {component!r}"
        if len(component.encode("utf-8", "surrogateescape")) > _NAME_MAX_BYTES:
            return f"a component is longer than {_NAME_MAX_BYTES} bytes"
    return None


def safe_path(root: str | os.PathLike[str], *parts: str) -> Path:
    """``root / part / ...``, refusing any part that could lead out of ``root``.

    Raises:
      UnsafePathError: a part is not a string, or is empty, absolute, holds ``.`` or ``..``
        components, a NUL byte or a backslash, or a component over 255 bytes; the message names
        the part, its value and the rule.
    """
    path = Path(root)
    for part in parts:
        if not isinstance(part, str):
            raise UnsafePathError(
                f"A path part under {str(root)!r} must be a string, but got "
                f"{type(part).__name__} {part!r}."
            )
        why = _rule_broken(part)
        if why is not None:
            raise UnsafePathError(
                f"The name {part!r} cannot be used in a path under {str(root)!r}: {why}. Names "
                "that become paths must be relative, without '.', '..' or empty components, "
                "NUL bytes or backslashes, so that nothing is written outside the results "
                "directory."
            )
        path = path / part
    return path


def check_file_name(field: str, value: object) -> str:
    """``value`` if it can be one file name (a single safe path component), else an error
    naming ``field``.

    Raises:
      UnsafePathError: ``value`` is not a string, holds a ``/``, or breaks a rule of
        :func:`safe_path`.
    """
    if not isinstance(value, str) or not value:
        raise UnsafePathError(f"{field} must be a non-empty string, but got {value!r}.")
    why = "it holds a '/'" if "/" in value else _rule_broken(value)
    if why is not None:
        raise UnsafePathError(
            f"{field} = {value!r} is not allowed: {why}. It names files, so it must be one "
            "file name: no '/', backslash or NUL, not '.' or '..', at most 255 bytes."
        )
    return value

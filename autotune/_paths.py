"""Paths under the results directory built from names that come from job files, kernels,
configs or the database: they must never lead out of it.

    safe_path("results", "traces", problem.kernel, problem.digest())
    # -> Path("results/traces/hopper_matmul/3f2a...")

Each part is one or more relative path components (``"a/b"`` is two); a component may not be
empty, ``.`` or ``..``, hold a NUL byte or a backslash, or be longer than a file name may be
(255 bytes). The check is on the names alone (nothing is created or resolved), so it does not
depend on what exists on disk.

Writing under an output folder (``report --out``, ``export --out``, ``tune --results-dir``:
traces, worker logs) never follows a symbolic link autotune did not create, so that a shared
folder does not let another user redirect the files: :func:`write_output` writes a temporary
file opened with ``O_EXCL`` (``mkstemp``: never a link) and renames it over the target (a
rename replaces a link, it never writes through it), and refuses a target that already is a
link; :func:`output_dir` creates the folders below a root and refuses one that is a link;
:func:`open_log` appends with ``O_NOFOLLOW``. The root folder the user named may itself be a
link (the user chose it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from autotune.errors import JobError

__all__ = ["UnsafePathError", "safe_path", "check_file_name", "RESULTS_DIR_ENV",
           "default_results_dir", "write_output", "output_dir", "open_log", "LinkRefusedError"]

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


class LinkRefusedError(UnsafePathError):
    """An output file or folder is already a symbolic link: autotune never writes through one."""


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise LinkRefusedError(
            f"{path} is a symbolic link (to {os.readlink(path)!r}) that autotune did not create; "
            f"it never writes a {what} through a link, which could send it anywhere. Remove "
            "the link, or choose an output folder only you can write to."
        )


def output_dir(root: str | os.PathLike[str], *parts: str) -> Path:
    """``safe_path(root, *parts)``, created folder by folder below ``root``, refusing any
    folder below ``root`` that already is a symbolic link.

    Raises:
      UnsafePathError: a part breaks a :func:`safe_path` rule.
      LinkRefusedError: a folder below ``root`` is a symbolic link.
      OSError: a folder cannot be created.
    """
    path = safe_path(root, *parts)
    Path(root).mkdir(parents=True, exist_ok=True)
    current = Path(root)
    for part in parts:
        for component in part.split("/"):
            current = current / component
            _refuse_link(current, "file")
            with contextlib.suppress(FileExistsError):
                current.mkdir()
            _refuse_link(current, "file")  # raced in between: refused all the same
    return path


def write_output(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None) -> Path:
    """Writes ``data`` to ``path`` atomically and never through a symbolic link: a temporary
    file created exclusively beside it (``O_EXCL``), flushed, then renamed over it. ``mode``:
    the new file's permissions (default: the existing file's, else 0o666 less the umask).

    Raises:
      LinkRefusedError: ``path`` already is a symbolic link.
      OSError: the file cannot be written; ``path`` is as it was, no temporary file is left.
    """
    target = Path(path)
    _refuse_link(target, "file")
    if mode is None:
        try:
            mode = target.lstat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)  # replaces a link raced in since the check; never follows it
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def open_log(path: str | os.PathLike[str]) -> int:
    """A file descriptor appending to the log file ``path`` (created 0o644 if missing), opened
    with ``O_NOFOLLOW``: a log is never written through a symbolic link.

    Raises:
      LinkRefusedError: ``path`` is a symbolic link.
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o644)
    except OSError as e:
        import errno

        if e.errno == errno.ELOOP:
            _refuse_link(Path(path), "log")
        raise


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

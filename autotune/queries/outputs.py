"""Where the CLI writes files: output folders checked up front, export files written atomically.

    check_output_dir("results/report", flag="--out")      # JobError if a file / not writable
    write_export_file("best.json", text, db=url, force=False)

Nothing is written through a symbolic link (:func:`autotune._paths.write_output`): an
``--out`` that is a link, or a link in the report folder, is refused. Nothing the user did not
ask to replace is replaced: ``export --out`` refuses an existing file
that is not one of our exports unless ``force``, and always refuses the database in use (and
its ``-wal``/``-shm``/``-journal`` files), whatever path or symbolic link leads to it, and
never a target that is not a regular file (a device such as ``/dev/null``, a FIFO, a socket, a
folder): renaming over it would replace the device node itself. Files are written to a
temporary file in the same folder and renamed over the target, so a reader never sees half a
file and a failed write leaves the old file as it was. A blank path (``--out ""``) is refused
rather than taken as the working directory.
"""

from __future__ import annotations

import os
import pathlib
import stat
import tempfile

from autotune._paths import write_output
from autotune.errors import JobError

__all__ = ["check_output_dir", "write_export_file", "atomic_write_text"]

_HEAD_BYTES = 4096


def _check_not_blank(path: str | os.PathLike[str], *, flag: str, what: str) -> None:
    """Refuses an empty or blank path, which would otherwise mean the working directory."""
    if not str(path).strip():
        raise JobError(f"{flag} {str(path)!r} is blank; give a {what} name.")


def _not_a_regular_file(path: pathlib.Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (``"a folder"``, ``"a
    character device"``, ...), through symbolic links; None for a regular file or no file."""
    try:
        mode = path.stat().st_mode
    except OSError:  # missing, or not reachable: the write itself says why
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_output_dir(path: str | os.PathLike[str], *, flag: str) -> pathlib.Path:
    """``path`` if it is (or can be created as) a writable folder; leaves nothing behind
    (a probe file is created and removed in the nearest existing folder).

    Raises:
      JobError: ``path`` is blank, or it (or the nearest existing folder above it) is a file,
        a device or anything else that is not a folder, or is not writable; the message names
        ``flag``, the path and why.
    """
    _check_not_blank(path, flag=flag, what="folder")
    target = pathlib.Path(path)
    existing = target
    while not existing.exists() and not existing.is_symlink():
        parent = existing.parent
        if parent == existing:
            break
        existing = parent
    if existing.is_symlink() and not existing.exists():
        raise JobError(f"{flag} {str(path)!r}: {existing} is a broken symbolic link; give a folder.")
    if not existing.is_dir():
        where = "is" if existing == target else f"is under {existing}, which is"
        what = _not_a_regular_file(existing) or "a file"
        raise JobError(
            f"{flag} {str(path)!r} {where} {what}, not a folder; give a folder (it is created if "
            "missing)."
        )
    try:  # a real probe: permissions, read-only file systems and root all answer truly
        fd, probe = tempfile.mkstemp(prefix=".autotune-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = "" if existing == target else f" (the nearest existing folder, {existing}, is not)"
        raise JobError(
            f"{flag} {str(path)!r} is not writable{where}: {e.strerror or e}; give a folder you "
            "can write to."
        ) from None
    return target


def _database_files(db: str | None) -> list[pathlib.Path]:
    """The files of the SQLite database in use (none for a server)."""
    from autotune.storage.urls import resolve_url, sqlite_path

    path = sqlite_path(resolve_url(db))
    if path is None:
        return []
    return [pathlib.Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", "-journal")]


def _same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def write_export_file(
    path: str | os.PathLike[str], text: str, *, db: str | None, force: bool, flag: str = "--out"
) -> pathlib.Path:
    """Writes ``text`` to ``path`` atomically; returns the file written.

    Raises:
      JobError: ``path`` is blank, the database in use (even with ``force``), a folder, a
        device, FIFO or socket (even with ``force``), an existing file that is not an autotune
        export (without ``force``), or in a folder that is missing, a file, or not writable.
    """
    from autotune.queries.exchange import is_export

    _check_not_blank(path, flag=flag, what="file")
    target = pathlib.Path(path).expanduser()
    for db_file in _database_files(db):
        if _same_file(target, db_file):
            raise JobError(
                f"{flag} {str(path)!r} is the database in use ({db_file}); an export never "
                "replaces it (not even with --force). Give another file name."
            )
    what = _not_a_regular_file(target)
    if what == "a folder":
        raise JobError(f"{flag} {str(path)!r} is a folder; give a file name inside it.")
    if what is not None:  # renamed over, /dev/null itself would be replaced by a file
        raise JobError(
            f"{flag} {str(path)!r} is {what}, not a regular file; an export replaces its target "
            f"with a new file, so it never writes there (not even with --force). Give a file "
            f"name, or leave out {flag} to write to stdout."
        )
    if target.exists() and not force:
        try:
            with target.open("rb") as f:
                head = f.read(_HEAD_BYTES).decode("utf-8", "replace")
        except OSError as e:
            raise JobError(f"{flag} {str(path)!r} exists and cannot be read ({e.strerror or e}).") from None
        if not is_export(head):
            raise JobError(
                f"{flag} {str(path)!r} exists and is not an autotune export; it is left as it is. "
                "Give another file name, or pass --force to replace it."
            )
    if not target.parent.is_dir():
        check_output_dir(target.parent, flag=f"the folder of {flag} {str(path)!r},")  # a file?
        raise JobError(
            f"{flag} {str(path)!r} cannot be written: its folder {str(target.parent)!r} does not "
            "exist; give a file in an existing, writable folder."
        )
    check_output_dir(target.parent, flag=f"the folder of {flag} {str(path)!r},")
    atomic_write_text(target, text)  # never through a link: a link there is refused
    return target


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path``, then renames it over ``path``.

    Raises:
      JobError: ``path`` exists and is not a regular file (renaming over a device such as
        ``/dev/null`` would replace it), or the file cannot be written (the message names it
        and why); ``path`` is as it was and no temporary file is left.
    """
    if path.is_symlink():
        write_output(path, text)  # raises LinkRefusedError, naming the link
    what = _not_a_regular_file(path)
    if what is not None:
        raise JobError(f"cannot write {path}: it is {what}, not a regular file, and renaming a "
                       "new file over it would replace it.")
    try:
        write_output(path, text)
    except OSError as e:
        raise JobError(f"cannot write {path}: {e.strerror or e}.") from None

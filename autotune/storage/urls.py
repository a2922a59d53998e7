"""Database URLs: which database to use (:func:`resolve_url`), and how to show one.

Which database: ``url``, else ``$AUTOTUNE_DB``, else ``sqlite:///results/autotune.db``
(:func:`resolve_url`); the file an SQLite URL names (:func:`sqlite_path`); the bounded waits of
read-only stores (:func:`read_timeout_s`) and the URL that opens a database read-only.

Database URLs as people see them: the one place a URL is turned into text for output.

    display_url("postgresql+psycopg://me:S3cret@db:5432/tune?password=x")
    # -> 'postgresql+psycopg://me:***@db:5432/tune?password=***'

Every message, log line, report and stored row that names a database goes through
:func:`display_url`, and every message, log line and file the command line writes through
:func:`mask_text`; both mask with one function, :func:`mask_url`, which takes the URL apart
(never a pattern), so a password (in the URL's user part, with any character in it, or in a
``password=``-like query parameter) never appears in output. Only code that connects uses the full URL
(:attr:`autotune.storage.store.Store.url`).
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import stat
import threading
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import StorageError

if TYPE_CHECKING:  # SQLAlchemy is imported where a URL is parsed: plain_sqlite_file needs none
    from sqlalchemy.engine import URL

__all__ = [
    "display_url",
    "mask_text",
    "mask_url",
    "mask_argv",
    "check_database_path",
    "in_memory",
    "MASK",
    "resolve_url",
    "sqlite_path",
    "plain_sqlite_file",
    "plain_sqlite_text",
    "check_sqlite_file",
    "read_timeout_s",
    "DEFAULT_URL",
    "ENV_VAR",
    "READ_TIMEOUT_ENV",
]

DEFAULT_URL = "sqlite:///results/autotune.db"
ENV_VAR = "AUTOTUNE_DB"
# Read-only stores (queries, read commands, the run-time lookup) wait this long at most to
# connect, for a lock, or for one statement; ``$AUTOTUNE_READ_TIMEOUT_S`` overrides it.
READ_TIMEOUT_S = 5.0
READ_TIMEOUT_ENV = "AUTOTUNE_READ_TIMEOUT_S"

MASK = "***"
# A query parameter (or a ``key=value`` word of a message) names a secret when its name holds
# one of these (password, passwd, pwd, sslpassword, secret, token, credentials, ...) or ends
# like an API key's (api_key, apikey, x-api-key).
_SECRET_KEY_PARTS = ("pass", "pwd", "secret", "token", "credential")
_SECRET_KEY_ENDS = ("_key", "-key", "apikey")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-_")
_CLOSING = {"'": "'", '"': '"', "`": "`", "<": ">", "(": ")", "[": "]", "{": "}"}


def display_url(url: str | URL | None) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``
    (:func:`mask_url`). Never raises."""
    if url is None:
        return ""
    if not isinstance(url, str):  # a SQLAlchemy URL
        url = url.render_as_string(hide_password=False)  # masked below, as text is
    return mask_url(url)


def _secret_key(key: str) -> bool:
    name = urllib.parse.unquote_plus(key).strip().lower()
    return any(part in name for part in _SECRET_KEY_PARTS) or name.endswith(_SECRET_KEY_ENDS)


def _mask_pairs(query: str) -> str:
    """A query string (``a=1&password=x``) with the values of secret keys masked."""
    pairs = []
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        # A value may carry a secret of its own: options=-c%20password%3Dx
        plain = urllib.parse.unquote_plus(value)
        hidden = eq and (_secret_key(key) or _mask_words(plain) != plain)
        pairs.append(f"{key}={MASK}" if hidden else pair)
    return "&".join(pairs)


def mask_url(text: str) -> str:
    """One URL (any form SQLAlchemy accepts, as text) with its secrets replaced by ``***``.

    The URL is taken apart, not matched by a pattern: the user part ends at the *last* ``@``
    (a password may hold unencoded ``@``, ``:``, ``/``, ``?``, ``#``, ``%`` or any character),
    its password is everything after the user name's ``:``; the query string is split into
    ``key=value`` pairs (:mod:`urllib.parse` reads the keys), and the value of every key that
    names a secret (``password``, ``sslpassword``, ``token``, ``secret``, ``api_key``, ...) is
    masked. Where the text is ambiguous, more is masked rather than less.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _mask_words(text)
    at = rest.rfind("@")
    colon = rest.find(":")
    if at != -1 and 0 <= colon < at and "/" not in rest[:colon]:
        rest = f"{rest[:colon + 1]}{MASK}{rest[at:]}"
        at = colon + 1 + len(MASK)
    head, question, query = rest.partition("?") if at == -1 else (
        rest[:at] + rest[at:].partition("?")[0], "?" if "?" in rest[at:] else "",
        rest[at:].partition("?")[2])
    if question:
        query, hash_, fragment = query.partition("#")
        query = _mask_pairs(query) + hash_ + fragment
    return f"{scheme}{sep}{head}{question}{query}"


def _mask_words(text: str) -> str:
    """``key=value`` words whose key names a secret (``password=x``, libpq's form), masked."""
    out = []
    for word in text.split(" "):
        key, eq, _ = word.partition("=")
        out.append(f"{key}={MASK}" if eq and key and _secret_key(key.lstrip("-'\"([{"))
                   and "&" not in word else (_mask_pairs(word) if "&" in word else word))
    return " ".join(out)


def mask_text(text: str) -> str:
    """``text`` (any message, log line or file) with the secrets of every URL in it masked
    (:func:`mask_url`), and ``password=...``-like words outside URLs too.

    A URL starts at its scheme (``postgresql+psycopg://``); it ends at the quote, bracket or
    parenthesis that opened it (``'postgresql://u:p w@h'`` in a ``repr``), else at the first
    whitespace.
    """
    out: list[str] = []
    i = 0
    while True:
        found = text.find("://", i)
        if found == -1:
            out.append(_mask_outside(text[i:]))
            return "".join(out)
        start = found
        while start > i and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        opener = text[start - 1] if start > 0 else ""
        end = found + 3
        closing = _CLOSING.get(opener)
        while end < len(text):
            c = text[end]
            if closing is not None and c == closing and text[end - 1] != "\\":
                break
            if closing is None and c.isspace():
                break
            if c == "\n":
                break
            end += 1
        if closing is None and ":" in text[found + 3:end] and "@" not in text[found + 3:end]:
            # A password with a space in it (``u:my pass@h``): the user part runs to the '@'.
            line_end = text.find("\n", end)
            at = text.find("@", end, len(text) if line_end == -1 else line_end)
            if at != -1 and "://" not in text[end:at]:
                end = at
                while end < len(text) and not text[end].isspace():
                    end += 1
        out.append(_mask_outside(text[i:start]))
        out.append(mask_url(text[start:end]))
        i = end


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A command line with every URL's secrets masked (:func:`mask_text`), and the value of any
    password-like option (``--password X``, ``--token=X``, ``password=X``) too."""
    out: list[str] = []
    for arg in argv:
        flag = out[-1] if out else ""
        after_flag = flag.startswith("-") and "=" not in flag and _secret_key(flag.lstrip("-"))
        out.append(MASK if after_flag else mask_text(arg))
    return out


def _mask_outside(text: str) -> str:
    return "\n".join(_mask_words(line) for line in text.split("\n"))


def resolve_url(url: str | None = None) -> URL:
    """The database URL to use: ``url``, else ``$AUTOTUNE_DB``, else ``sqlite:///results/autotune.db``.

    ``postgresql://`` (and ``postgres://``) URLs are mapped to the psycopg 3 driver; a bare
    path (no ``://``) means the SQLite file of exactly that name (``?``, ``#``, ``%`` and all);
    a relative SQLite path is made absolute against the current working directory.

    Raises:
      StorageError: the text is not a database URL.
    """
    text = url if url is not None else (os.environ.get(ENV_VAR) or DEFAULT_URL)
    if not isinstance(text, str) or not text.strip():
        raise StorageError(
            f"The database URL must be a non-empty string such as {DEFAULT_URL!r}, but got {text!r}."
        )
    text = text.strip()
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import URL

    try:
        # A bare path is the SQLite file of exactly that name, even with ``?``, ``#`` or ``%``.
        parsed = URL.create("sqlite", database=text) if "://" not in text else sa.make_url(text)
    except (sa_exc.ArgumentError, ValueError):
        raise StorageError(
            f"{display_url(text)!r} is not a database URL; expected e.g. {DEFAULT_URL!r} or "
            "'postgresql://user@host:5432/dbname'."
        ) from None  # SQLAlchemy's message repeats the text, password included
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    path = sqlite_path(parsed)
    if path is not None and not path.is_absolute():
        parsed = parsed.set(database=str(pathlib.Path.cwd() / path))
    return parsed


# The characters of a database path that SQLAlchemy's URL keeps as they are, both parsed
# (``sqlite:///PATH``) and shown (``display_url``): what :func:`plain_sqlite_file` reads itself.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+ -]+")
_SQLITE_PREFIX = "sqlite:///"


def plain_sqlite_file(url: str | None = None) -> pathlib.Path | None:
    """The absolute SQLite file that ``url`` (as :func:`resolve_url` takes it: None means
    ``$AUTOTUNE_DB``, else the default) names, read without SQLAlchemy, when it is a plain one:
    ``sqlite:///PATH`` or a bare ``PATH`` of letters, digits, ``_ . / + -`` and spaces only (no
    query, no ``~``, no quoting). None for anything else, which :func:`resolve_url` reads.
    ``sqlite_path(resolve_url(url))`` names the same file, and ``display_url(resolve_url(url))``
    is :func:`plain_sqlite_text` of it (``tests/storage/test_sqlite_reader.py``)."""
    text = url if url is not None else (os.environ.get(ENV_VAR) or DEFAULT_URL)
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text.startswith(_SQLITE_PREFIX):
        text = text[len(_SQLITE_PREFIX):]
    elif "://" in text:
        return None
    if not _PLAIN_PATH.fullmatch(text):
        return None
    path = pathlib.Path(text)
    if not path.is_absolute():
        return pathlib.Path.cwd() / path
    return path if str(path) == text else None  # "/a//b": the URL keeps it as written


def plain_sqlite_text(path: pathlib.Path) -> str:
    """How :func:`display_url` shows the URL of a :func:`plain_sqlite_file`."""
    return _SQLITE_PREFIX + str(path)


def sqlite_path(url: URL | str) -> pathlib.Path | None:
    """The file an SQLite URL names, or None (another backend, or an in-memory database)."""
    if isinstance(url, str):
        import sqlalchemy as sa

        url = sa.make_url(url)
    database = url.database
    if url.get_backend_name() != "sqlite" or database is None or in_memory(url):
        return None
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        return None  # an sqlite URI: left to sqlite
    return pathlib.Path(database).expanduser()


# What stat's file type is called in a message (a regular file is the one accepted).
_FILE_TYPES = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
# The files SQLite opens beside the database; each must be a regular file too.
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def _file_type(mode: int) -> str | None:
    """What a file of ``mode`` is, in words, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, words in _FILE_TYPES:
        if test(mode):
            return words
    return "not a regular file"


def check_database_path(url: URL | str, *, timeout_s: float | None = None) -> None:
    """Refuses, within ``timeout_s`` (default :func:`read_timeout_s`), an SQLite database path
    that names anything but a regular file or nothing yet: a folder, a named pipe, a socket, a
    device (SQLite would wait on a pipe or a device forever, deaf to Ctrl-C), or a file whose
    ``-wal``, ``-shm`` or ``-journal`` companion is one of those. A URL of another backend and
    an in-memory database pass. Links are followed: what counts is what SQLite would open.

    Every database opening goes through this check (:class:`autotune.storage.store.Store`:
    ``--db``, ``$AUTOTUNE_DB`` and the Python API alike).

    Raises:
      StorageError: the path is not a regular file (naming what it is and the way out), or
        the file system did not answer ``stat`` within ``timeout_s``.
    """
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_file(path, timeout_s=timeout_s)


def check_sqlite_file(path: pathlib.Path, *, timeout_s: float | None = None) -> None:
    """:func:`check_database_path` of the SQLite file ``path`` itself (no URL to parse)."""
    timeout = read_timeout_s(timeout_s)
    found: dict[str, Any] = {}

    def look() -> None:  # stat never opens the file, but a hung file system can still block it
        try:
            for candidate in (path, *(path.with_name(path.name + s) for s in _SQLITE_SIDECARS)):
                try:
                    mode = candidate.stat().st_mode
                except FileNotFoundError:
                    continue
                kind = _file_type(mode)
                if kind is not None:
                    found["bad"] = (candidate, kind)
                    return
        except OSError:
            pass  # unreadable, or under a file: the opening itself says so, in SQLite's words
        finally:
            found["done"] = True

    worker = threading.Thread(target=look, name="autotune-db-stat", daemon=True)
    worker.start()
    worker.join(timeout)
    if "done" not in found:
        raise StorageError(
            f"The database {path} did not answer within {timeout:g} s (its file system does "
            f"not respond); nothing was read. Check the mount, or raise ${READ_TIMEOUT_ENV}."
        )
    if "bad" in found:
        candidate, kind = found["bad"]
        if candidate == path and kind == "a folder":
            raise StorageError(
                f"The database {path} is a folder, not a file: name a file in it, e.g. "
                f"{path / 'autotune.db'}."
            )
        what = "The database" if candidate == path else f"SQLite's companion file of {path.name}"
        raise StorageError(
            f"{what} {candidate} is {kind}, not a regular file: autotune opens only regular "
            "files as SQLite databases (or a database URL such as "
            "postgresql://user@host:5432/dbname). Point --db or AUTOTUNE_DB at a database file."
        )


def in_memory(url: URL | str) -> bool:
    """Whether ``url`` is an in-memory SQLite database, which keeps nothing once closed."""
    if isinstance(url, str):
        import sqlalchemy as sa

        url = sa.make_url(url)
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or database.startswith("file::memory:")
        or url.query.get("mode") == "memory"
    )


def read_timeout_s(value: float | None = None) -> float:
    """The timeout of read-only stores: ``value``, else ``$AUTOTUNE_READ_TIMEOUT_S``, else 5 s.

    Raises:
      StorageError: the value is not a positive, finite number of seconds.
    """
    if value is None:
        text = os.environ.get(READ_TIMEOUT_ENV, "").strip()
        if not text:
            return READ_TIMEOUT_S
        where, shown = f"${READ_TIMEOUT_ENV}", repr(text)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
    else:
        where, shown = "timeout_s", repr(value)
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < math.inf):
        raise StorageError(
            f"{where} must be a positive, finite number of seconds (default {READ_TIMEOUT_S:g}), "
            f"but got {shown}."
        )
    return float(value)


def read_only_url(url: URL, timeout_s: float) -> URL:
    """``url`` opened so that nothing can be written through it, with bounded waits.

    SQLite: the file as a ``mode=ro`` URI (no journal or header is ever written) with a busy
    timeout. PostgreSQL: ``connect_timeout``, ``statement_timeout`` and read-only transactions.
    """
    from sqlalchemy.engine import URL

    path = sqlite_path(url)
    if path is not None:  # quoted: SQLite reads ``?``, ``#`` and ``%`` in a URI's path as syntax
        return URL.create("sqlite", database=f"file:{urllib.parse.quote(str(path))}",
                          query={"mode": "ro", "uri": "true", "timeout": f"{timeout_s:g}"})
    if url.get_backend_name() == "postgresql":
        options = str(url.query.get("options") or "")
        extra = (f"-c statement_timeout={max(1, int(timeout_s * 1000))} "
                 "-c default_transaction_read_only=on")
        return url.update_query_dict({
            "connect_timeout": str(max(1, math.ceil(timeout_s))),
            "options": f"{options} {extra}".strip(),
        })
    return url

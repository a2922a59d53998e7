"""Database URLs as people see them: the one place a URL is turned into text for output.

    display_url("postgresql+psycopg://me:S3cret@db:5432/tune?password=x")
    # -> 'postgresql+psycopg://me:***@db:5432/tune?password=***'

Every message, log line, report and stored row that names a database goes through
:func:`display_url`, so a password (in the URL's user part or in a ``password=`` query
parameter) never appears in output. Only code that connects uses the full URL
(:attr:`autotune.storage.store.Store.url`).
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import URL

__all__ = ["display_url", "MASK"]

MASK = "***"
_SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "sslpassword", "secret", "token"})
# Fallback for text that is not a parseable URL: scheme://user:SECRET@ and key=SECRET.
_USERINFO = re.compile(r"(://[^/@:\s]*:)[^/\s]*(@)")
_QUERY = re.compile(r"(?i)\b(" + "|".join(sorted(_SECRET_QUERY_KEYS)) + r")=[^&\s]*")


def display_url(url: str | URL | None) -> str:
    """``url`` with its password (and secret query parameters) replaced by ``***``.

    Never raises: text that is not a URL is masked by pattern (``user:SECRET@``,
    ``password=SECRET``).
    """
    if url is None:
        return ""
    if isinstance(url, str):
        try:
            url = sa.make_url(url)
        except Exception:  # noqa: BLE001 - unparseable text is masked by pattern below
            return mask_text(url)
    # SQLAlchemy masks the user part's password; query parameters are masked by pattern.
    return mask_text(url.render_as_string(hide_password=True))


def mask_text(text: str) -> str:
    """``text`` (any message) with URL passwords and ``password=`` values masked."""
    return _QUERY.sub(lambda m: f"{m.group(1)}={MASK}", _USERINFO.sub(rf"\g<1>{MASK}\g<2>", text))

"""What every stored result carries besides its config and its times: the software versions
it was measured with, the engine's cache policy, and when its measurement started (UTC)."""

from __future__ import annotations

import datetime as dt

from autotune import __version__ as AUTOTUNE_VERSION

__all__ = ["software_versions", "cache_policy_of", "utc"]


def software_versions() -> dict[str, str]:
    """The jax and jaxlib versions stored with every result, from the installed packages'
    metadata (what the lookup compares with: :func:`autotune.queries.running_versions`), so
    that the main process does not import jax (seconds, while the workers start) before its
    first trial; imported only when a package has no metadata (a source checkout)."""
    from autotune._jax_compat import installed_versions, jax_versions

    versions = installed_versions()
    if not versions.get("jax") or "jaxlib" not in versions:
        versions = jax_versions()
    return {**versions, "autotune": AUTOTUNE_VERSION}


def cache_policy_of(engine: object) -> str:
    """The cache policy an engine times with (``warm`` for engines that do not say)."""
    return str(getattr(engine, "cache_policy", "warm"))


def utc(ts: float) -> dt.datetime:
    """The UTC datetime of ``ts`` (seconds since the epoch, as ``time.time()``)."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC)

"""Shared fixtures. ``db_url``: a fresh, empty database per test, on each storage backend."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

# The PostgreSQL server the postgres-marked tests use (trust auth). Override to point elsewhere.
PG_URL = os.environ.get(
    "AUTOTUNE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
_pg_unreachable: list[str | None] = []  # memo: [None] reachable, [reason] not


def _pg_connect() -> Any:
    import psycopg

    return psycopg.connect(
        PG_URL.replace("+psycopg", "", 1), autocommit=True, connect_timeout=3
    )


def _start_local_postgres() -> None:
    """Starts this machine's PostgreSQL cluster (CI must start the services its tests need);
    a no-op where there is none or it already runs."""
    import shutil
    import subprocess
    import time

    if shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
        return
    for version in sorted(os.listdir("/etc/postgresql")):
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            capture_output=True, check=False, timeout=60,
        )
    for _ in range(30):
        try:
            with _pg_connect():
                return
        except Exception:  # noqa: BLE001 - still starting
            time.sleep(1)


def _pg_unreachable_reason() -> str | None:
    if not _pg_unreachable:
        try:
            try:
                with _pg_connect():
                    pass
            except Exception:  # noqa: BLE001 - not running: start it once, then try again
                _start_local_postgres()
                with _pg_connect():
                    pass
            _pg_unreachable.append(None)
        except Exception as e:  # any failure to connect means unreachable
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            _pg_unreachable.append(
                f"PostgreSQL at {PG_URL} is unreachable ({first}); start it or set "
                "AUTOTUNE_TEST_PG"
            )
    return _pg_unreachable[0]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A URL of a fresh database: an SQLite file in tmp_path, or a new PostgreSQL schema
    (dropped afterwards). PostgreSQL is skipped when unreachable, unless CI=true."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/autotune.db"
        return
    reason = _pg_unreachable_reason()
    if reason is not None:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(reason)
        pytest.skip(f"{reason} (with CI=true this fails instead)")
    schema = f"at_test_{uuid.uuid4().hex[:16]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in PG_URL else "?"
    try:
        # Every connection made from this URL (Store, Optuna, worker processes) puts the
        # schema first on its search path, so each test sees only its own tables.
        yield f"{PG_URL}{separator}options=-csearch_path%3D{schema}"
    finally:
        with _pg_connect() as conn:
            conn.execute("SET lock_timeout = '20s'")
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --------------------------------------------------------------------------- reliability campaign
# tests/test_bad_input.py and tests/test_faults.py count what they try through the `campaign`
# fixture; the session prints the totals (summed over pytest-xdist workers) and fails if a
# finished trial was lost or stored twice.

_CAMPAIGN = ("bad_inputs", "faults", "completed", "lost", "duplicates")
# Where the session writes its campaign counts as JSON (benchmarks/campaign.py sets it).
CAMPAIGN_OUT_ENV = "AUTOTUNE_CAMPAIGN_OUT"
_campaign_counts: dict[str, int] = dict.fromkeys(_CAMPAIGN, 0)


class Campaign:
    """Counters of the reliability campaign: bad inputs tried, faults injected, jobs completed
    after a re-run, finished trials lost, and trials stored (or measured) twice."""

    def add(self, **counts: int) -> None:
        for key, n in counts.items():
            if key not in _campaign_counts:
                raise KeyError(f"unknown campaign counter {key!r}; known: {_CAMPAIGN}")
            _campaign_counts[key] += int(n)


@pytest.fixture
def campaign() -> Campaign:
    return Campaign()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: add up a worker's counts as it finishes."""
    for key, n in getattr(node, "workeroutput", {}).get("reliability_campaign", {}).items():
        _campaign_counts[key] += n


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints the totals
        workeroutput["reliability_campaign"] = dict(_campaign_counts)
        return
    out = os.environ.get(CAMPAIGN_OUT_ENV)
    if out:  # benchmarks/campaign.py: the counts, written by the controller only
        import json

        with open(out, "w", encoding="utf-8") as f:
            json.dump(dict(_campaign_counts), f, indent=1, sort_keys=True)
    if _campaign_counts["lost"] or _campaign_counts["duplicates"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _check_checkout(session)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    c = _campaign_counts
    if hasattr(config, "workeroutput") or not any(c.values()):
        return
    bad = bool(c["lost"] or c["duplicates"])
    terminalreporter.write_line(
        f"reliability campaign: {c['bad_inputs']} bad inputs tried, {c['faults']} faults "
        f"injected, {c['completed']} jobs completed after re-run, {c['lost']} trials lost, "
        f"{c['duplicates']} duplicates" + (" (must be 0: FAILED)" if bad else ""),
        red=bad, green=not bad, bold=True,
    )


# Nothing the suite runs may write into the checkout: results go to tmp paths, Hypothesis keeps
# no example database here. Checked at the end of the run (the controller, under xdist).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WATCHED = ("results", ".hypothesis")


def _checkout_files() -> set[str]:
    found = set()
    for name in _WATCHED:
        for root, dirs, files in os.walk(os.path.join(_REPO, name)):
            found.update(os.path.relpath(os.path.join(root, f), _REPO) for f in (*dirs, *files))
    return found


# Traces, worker logs and reports of commands run without a folder (and the CLI processes the
# tests start, which inherit it) go to a scratch folder of this process, removed at its end.
_SCRATCH = tempfile.mkdtemp(prefix="autotune-tests-")
os.environ["AUTOTUNE_RESULTS_DIR"] = os.path.join(_SCRATCH, "results")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)

try:
    from hypothesis import settings as _hypothesis_settings
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(os.path.join(_SCRATCH, "hypothesis"))  # its caches, not .hypothesis/
    _hypothesis_settings.register_profile("autotune-tests", database=None)
    _hypothesis_settings.load_profile("autotune-tests")
except ImportError:  # hypothesis is in the test extra; without it its tests are not collected
    pass


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._autotune_checkout_before = _checkout_files()  # type: ignore[attr-defined]


def _check_checkout(session: pytest.Session) -> None:
    """Fails the run naming any path the suite added under the watched folders."""
    before = getattr(session.config, "_autotune_checkout_before", set())
    added = sorted(_checkout_files() - before)
    if added:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = (f"the tests wrote {len(added)} path(s) into the checkout (use tmp paths): "
                + ", ".join(added[:10]))
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

@pytest.fixture
def on_profile(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``on_profile("h200")``: this test works for that device profile, as on a machine
    without a GPU (the driver is not asked), and in the worker processes it starts. For tests
    that replay a device's recorded measurements (autotune/replay/data: the H200's, the H100's)."""
    from autotune import devices

    def use(name: str) -> Any:
        monkeypatch.setattr(devices, "read_device", lambda ordinal=0: None)
        monkeypatch.setattr(devices, "_DRIVER", {})
        monkeypatch.setenv(devices.PROFILE_ENV_VAR, name.lower())
        devices.profile(name)  # a bad name fails here
        return devices.current_device()

    return use


@pytest.fixture
def h200_latencies(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``h200_latencies()``: from here on, hopper_matmul's cost model takes the H200's fitted
    latencies on every device: the model that misjudged the H100 (tile_k 64 at 8 stages 24%
    slow at 64x4096x4096, a cluster 0.5% slow where it measured 7% fast), for tests of what the
    search does with a wrong estimate, and controls (docs/ranked_sampler.md, "Latencies per
    device")."""
    from search_spaces import hopper_matmul

    def use() -> None:
        only = {hopper_matmul.FITTED_ON: hopper_matmul.FITTED_LATENCIES[hopper_matmul.FITTED_ON]}
        monkeypatch.setattr(hopper_matmul, "FITTED_LATENCIES", only)
        hopper_matmul._model_of.cache_clear()

    yield use
    hopper_matmul._model_of.cache_clear()


@pytest.fixture(autouse=True)
def _no_background_import_in_flight() -> Iterator[None]:
    """A test starts once the ranked sampler's background import of scikit-learn (the daemon
    thread ``autotune-sklearn-import``, started by an earlier test) has finished: that import
    builds ASTs (``inspect.signature`` of builtins), and on CPython 3.11 an ``ast.parse`` on
    another thread meanwhile can fail with "SystemError: AST constructor recursion depth
    mismatch" (python/cpython#106905; tests/test_docs.py and tests/test_architecture.py
    parse)."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "autotune-sklearn-import":
            thread.join(120)
    yield

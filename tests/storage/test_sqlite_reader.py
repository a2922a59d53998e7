"""SQLiteReader (stdlib sqlite3, no SQLAlchemy) reads what a Store reads, opens only a file at
the newest schema, never writes; plain_sqlite_file reads the URLs resolve_url reads."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.devices import PROFILES
from autotune.errors import StorageError
from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage import urls
from autotune.storage.sqlite_reader import VERSION_TABLE, SQLiteReader
from autotune.storage.store import Store

REPO = Path(__file__).resolve().parents[2]
GPU = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86",
                 facts=dataclasses.replace(next(iter(PROFILES.values())), source="driver"))
OTHER_GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
NEW = {"jax": "0.10.2", "jaxlib": "0.10.2", "autotune": "0.1.0", "cuda": "12.8"}
OLD = {"jax": "0.9.0", "jaxlib": "0.9.0", "autotune": "0.1.0"}
P1 = Problem("matmul", {"m": 256, "n": 256, "k": 128}, "bf16")
P2 = Problem("matmul", {"m": 512, "n": 256, "k": 128}, "float32")
ABSENT = Problem("matmul", {"m": 64, "n": 64, "k": 64}, "bf16")


def timed(*samples_us: float) -> TrialResult:
    return TrialResult.timed(samples_us, compile_s=0.25, rel_error=1e-3, timing="fake")


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with every kind of row a best-config query reads: trials of two problems on
    three devices, two software versions and both cache policies (ties in time, a failed one, an
    implausible time, a traced one), baselines, three confirmation rounds, and program checks of
    two of them among verifications of other methods."""
    from autotune.tuning.confirmation import Candidate, analyse_confirmation
    from autotune.tuning.verify import VerifyTarget, analyse

    path = tmp_path_factory.mktemp("reader") / "filled.db"
    with Store(f"sqlite:///{path}") as store:
        times = itertools.cycle([12.0, 9.5, 9.5, 30.0, 7.25, 1e9, 11.0])
        for problem, device, software, cache, tile in itertools.product(
                (P1, P2), (GPU, OTHER_GPU, INTERPRET), (NEW, OLD), ("warm", "cold"), range(4)):
            if cache == "cold" and device is OTHER_GPU:
                continue  # one device with warm results only
            t = next(times)
            result = timed(t, t * 1.01, t * 0.99) if tile != 3 else TrialResult(
                Outcome.COMPILE_ERROR, error="invalid on purpose", compile_s=0.5, timing="")
            store.record_trial(problem, Config(tile=tile, name=f"c{tile}", flag=tile % 2 == 0),
                               result, device=device, software=software, cache=cache,
                               worker="w", study_name="s" if tile else None,
                               optuna_trial_number=tile)
        first = store.best(P1, device_kind="gpu", cache="warm")[0]
        store.record_trace_regions(first.id, {"main": (3.0, 2)}, "trace/dir")
        for device, cache, us in ((GPU, "warm", 20.0), (GPU, "warm", 15.0), (GPU, "cold", 25.0),
                                  (OTHER_GPU, "warm", 18.0), (INTERPRET, "warm", 99.0)):
            store.record_baseline(P1, f"xla{us:g}", [us, us * 1.02], device=device,
                                  software=NEW, cache=cache)
        rounds = lambda c: ((c, c * 1.001), (c * 1.002, c))  # noqa: E731
        for software, baseline in ((NEW, "xla"), (OLD, None), (NEW, "xla")):
            ids = [r.id for r in store.best(P1, device_name=GPU.name, n=2, cache="warm",
                                             versions={"jax": software["jax"]})]
            confirmation = analyse_confirmation(
                [Candidate(dict(store.trial(i).config), rounds(9.5 + k)) for k, i in enumerate(ids)],
                rounds(20.0), default_config=None)
            store.record_confirmation(P1, confirmation, trial_ids=ids, device=GPU,
                                      software=software, cache="warm", iterations=2,
                                      baseline_name=baseline)
        # Program checks (verification rows of PROGRAM_METHOD): two of round 1 (the newer
        # answers), one of round 3 between verifications of another method; none of round 2.
        winner = store.trial(store.confirmations(P1, device_name=GPU.name)[0].crowned_trial_id)
        for cid, method, kernel_us in ((1, PROGRAM_METHOD, 10.0), (1, PROGRAM_METHOD, 9.0),
                                       (3, "cupti-independent", 9.5), (3, PROGRAM_METHOD, 9.8),
                                       (3, "wall-clock", 9.7)):
            target = VerifyTarget(P1, winner.config, (), 2.0, None, None, "xla", cid)
            store.record_verification(P1, analyse(
                target, [(kernel_us, kernel_us * 1.01)] * 3, [(20.0,), (20.1,), (19.9,)],
                method=method, calls=20), device=GPU, software=NEW)
    return path


def _reader(path: Path) -> SQLiteReader:
    reader = SQLiteReader.open(path, 5.0)
    assert reader is not None
    return reader


def test_every_read_answers_as_the_stores(filled: Path):
    """Each method, over every filter combination a best-config query sends, returns rows
    equal to the Store's (configs, times, datetimes, facts, samples, programs and all)."""
    reader = _reader(filled)
    with Store(f"sqlite:///{filled}", read_only=True) as store:
        assert reader.devices() == store.devices() and len(store.devices()) == 3
        filters = [dict(device_name=n, device_kind=k) for n, k in
                   ((None, "gpu"), (None, "interpret"), (None, None), (GPU.name, None),
                    (OTHER_GPU.name, "gpu"), ("no such device", None))]
        checked = 0
        for problem in (P1, P2, ABSENT):
            for f in filters:
                assert reader.preferred_policy(problem, **f) == store.preferred_policy(problem, **f)
                for cache, n, versions in itertools.product(
                        (None, "warm", "cold"), (1, 3, 50),
                        (None, {"jax": "0.9.0"}, {"jax": "0.10.2", "jaxlib": "0.10.2"})):
                    mine = reader.best(problem, **f, n=n, versions=versions, cache=cache)
                    assert mine == store.best(problem, **f, n=n, versions=versions, cache=cache)
                    checked += len(mine)
                for cache, name in itertools.product((None, "warm", "cold"), (None, "xla15")):
                    assert reader.baselines(problem, **f, name=name, cache=cache) == \
                        store.baselines(problem, **f, name=name, cache=cache)
                    assert reader.baseline(problem, **f, name=name, cache=cache) == \
                        store.baseline(problem, **f, name=name, cache=cache)
                for cache, limit in itertools.product((None, "warm", "cold"), (None, 1, 2, 4)):
                    assert reader.confirmations(problem, **f, cache=cache, limit=limit) == \
                        store.confirmations(problem, **f, cache=cache, limit=limit)
        assert checked > 100
        every = store.trials()
        assert any(t.traced for t in every) and any(t.device.facts for t in every)
        for t in every + [None]:
            trial_id = 10**6 if t is None else t.id
            assert reader.trial(trial_id) == store.trial(trial_id)
        # Three rounds of P1 on the GPU, all returned newest first (a store once kept one).
        assert [c.id for c in reader.confirmations(P1, device_name=GPU.name)] == [3, 2, 1]
        # Program checks: the newest of method PROGRAM_METHOD per round, alike in both readers.
        for ids in ([], [1], [2], [3, 1], [1, 2, 3, 99], [3, 3]):
            assert reader.program_checks(ids) == store.program_checks(ids)
        checks = store.program_checks([1, 2, 3])
        assert sorted(checks) == [1, 3]
        assert {c.method for c in checks.values()} == {PROGRAM_METHOD}
        assert checks[1].winner_median_us == pytest.approx(9.0 * 1.005)  # the newer of two
        assert checks[3].winner_median_us == pytest.approx(9.8 * 1.005)
        newest = max(v.id for v in store.verifications(P1) if v.method == PROGRAM_METHOD)
        assert checks[3].id == newest and checks[3].still_wins is None
        # A summary carries its own round's check: round 3 is P1's newest warm GPU round.
        summary = next(s for s in store.summaries(device_name=GPU.name)
                       if s.problem == P1 and s.cache_policy == "warm")
        assert summary.confirmation.id == 3 and summary.program_check == checks[3]
        assert summary.verdict_figures.source == "program-check"
        assert all(s.program_check is None for s in store.summaries()
                   if s.confirmation is None or s.confirmation.id not in checks)
    with pytest.raises(ValueError, match="cache policy must be one of"):
        reader.best(P1, cache="lukewarm")
    with pytest.raises(ValueError, match="versions may name"):
        reader.best(P1, versions={"python": "3"})
    reader.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_it_opens_only_a_file_at_the_newest_schema_and_writes_nothing(filled: Path, tmp_path: Path):
    """An older schema, a doubled version record, no version table, an empty file and a file
    that is not a database give None (a Store handles each); reading changes no byte."""
    before = _digest(filled)
    reader = _reader(filled)
    reader.best(P1)
    reader.close()
    assert _digest(filled) == before and not Path(f"{filled}-journal").exists()

    def copy_with(sql: str | None) -> Path:
        path = tmp_path / f"copy{len(list(tmp_path.iterdir()))}.db"
        path.write_bytes(filled.read_bytes())
        if sql is not None:
            with sqlite3.connect(path) as c:
                c.execute(sql)
        return path

    assert SQLiteReader.open(copy_with(None), 5.0) is not None
    assert SQLiteReader.open(copy_with(f"UPDATE {VERSION_TABLE} SET version_num = '0004'"), 5.0) is None
    assert SQLiteReader.open(copy_with(f"INSERT INTO {VERSION_TABLE} VALUES ('0004')"), 5.0) is None
    assert SQLiteReader.open(copy_with(f"DROP TABLE {VERSION_TABLE}"), 5.0) is None
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert SQLiteReader.open(empty, 5.0) is None and empty.read_bytes() == b""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    assert SQLiteReader.open(junk, 5.0) is None
    folder = tmp_path / "folder.db"
    folder.mkdir()
    with pytest.raises(StorageError, match="is a folder"):
        SQLiteReader.open(folder, 5.0)


def test_a_failing_read_is_worded_as_a_stores(filled: Path, tmp_path: Path):
    """A read that fails (here: a table gone) raises StorageError naming what was read,
    where, and SQLite's words."""
    path = tmp_path / "broken.db"
    path.write_bytes(filled.read_bytes())
    reader = _reader(path)
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE at_trace_regions")
    with pytest.raises(StorageError, match=r"Could not read the best trials from .*broken\.db: "
                                           r"no such table: at_trace_regions\."):
        reader.best(P1, cache="warm")
    reader.close()


PLAIN = ["sqlite:////tmp/a.db", "/tmp/a.db", "rel/a.db", "sqlite:///rel/a.db", "a b+c-d_e.db",
         "sqlite:////tmp/dir with space/x.db", "./x.db", "sub/../x.db", "  /tmp/a.db  "]
# Read by resolve_url (SQLAlchemy): quoted or syntax in a URL, or kept as written.
NOT_PLAIN = ["/tmp//a.db", "/tmp/./a.db", "~/a.db", "/tmp/a%20b.db", "/tmp/a?b.db", "/tmp/a#b.db",
             "sqlite:///:memory:", "sqlite://", "sqlite:///file:x.db?mode=ro&uri=true",
             "sqlite+pysqlite:////tmp/a.db", "postgresql://u:p@h/db", ":memory:", "/tmp/a:b.db",
             "/tmp/a@b.db", "/tmp/a!b.db", "/tmp/a=b.db", "/tmp/a,b.db", "/tmp/a*b.db"]


@pytest.mark.parametrize("text", PLAIN + NOT_PLAIN)
def test_plain_sqlite_file_reads_what_resolve_url_reads(text: str):
    """Where plain_sqlite_file answers, resolve_url names the same file and shows the same
    text; it declines every character SQLAlchemy quotes or reads as syntax."""
    path = urls.plain_sqlite_file(text)
    assert (path is not None) == (text in PLAIN)
    if path is not None:
        url = urls.resolve_url(text)
        assert urls.sqlite_path(url) == path and path.is_absolute()
        assert urls.display_url(url) == urls.plain_sqlite_text(path)


def test_plain_sqlite_file_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(urls.ENV_VAR, raising=False)
    assert urls.plain_sqlite_file(None) == tmp_path / "results" / "autotune.db"
    monkeypatch.setenv(urls.ENV_VAR, "sqlite:////srv/x.db")
    assert urls.plain_sqlite_file(None) == Path("/srv/x.db") == urls.sqlite_path(urls.resolve_url(None))
    monkeypatch.setenv(urls.ENV_VAR, "postgresql://u@h/db")
    assert urls.plain_sqlite_file(None) is None


def test_the_reader_imports_no_sqlalchemy(filled: Path):
    """The module and a read through it import neither SQLAlchemy nor alembic."""
    code = ("import sys\nfrom pathlib import Path\n"
            "from autotune.storage.sqlite_reader import SQLiteReader\n"
            "from autotune.space.problem import Problem\n"
            f"r = SQLiteReader.open(Path({str(filled)!r}), 5.0)\n"
            f"assert r.best(Problem('matmul', {P1.dims!r}, 'bf16'))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"

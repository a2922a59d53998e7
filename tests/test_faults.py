"""Fault campaign: whatever happens to a tuning job, no finished trial is lost or stored twice.

Each test runs the real ``autotune tune`` in its own process (``tests/fault_driver.py``: the CLI,
the job runner, the store, Optuna and the engine's worker processes are the real ones; the
evaluator is the fake one, so no GPU or jax is needed), on a real database, injects one fault,
and then re-runs the job (a re-run without faults goes through the same driver in the test's
process, ``Job.rerun``: what it must show does not depend on its process, and it spares the
start of a fresh interpreter). The job must either finish or stop with a clear error (exit code 2,
``autotune: error: ...``, no traceback), and after the re-run:

* every trial committed before the fault (the driver journals each commit, fsynced) is still
  stored, unchanged (same row, status, time and finish time): none lost or replaced;
* no config is stored twice, measured twice after it was stored, or COMPLETE twice in Optuna;
* the job is complete (its trial budget of distinct configs stored), and the Optuna study has
  no trial left RUNNING.

Faults: SIGKILL at chosen and random points (between measuring and storing, inside the store's
write, inside Optuna's writes, while the schema or the study is created, during a migration),
SIGKILL of the tuner and its workers from outside, Ctrl-C, worker crashes and hangs, a database
locked by another process (briefly, and for longer than the tuner waits), a database that is
read-only from the start or becomes so, a full disk (SQLite's page limit, and a file size limit
in the kernel), a database of an older schema version, a corrupted database file, and a tuner
of another host killed mid-job.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from autotune.space.problem import Config
from autotune.storage.store import Store
from autotune.storage.urls import resolve_url
from autotune.tuning import jobs as jobs_module
from tests.fault_driver import KILL_EXIT, SLOW, STEADY, db_files, set_read_only, sqlite_file

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[1]
TRIALS = 12  # per job; STEADY has 24 valid configs
PROBLEM = STEADY.problem({"n": 1}, "float32")
# The campaign checks that a job's whole trial budget gets stored: no early stop on a plateau.
NO_EARLY_STOP = "patience = 0\n" if "patience" in jobs_module._SETTINGS else ""


# --------------------------------------------------------------------------- running jobs


class Job:
    """A job file of one fake problem, its database, and the journal of committed trials."""

    def __init__(
        self, tmp_path: Path, url: str, *, kernel: str = STEADY.name, trials: int = TRIALS,
        sampler: str = "tpe",
    ) -> None:
        self.url = url
        self.trials = trials
        self.job = tmp_path / "job.toml"
        self.journal = tmp_path / "journal.jsonl"
        self.results = tmp_path / "results"
        self.job.write_text(
            f'[defaults]\ntrials = {trials}\nseed = 0\nsampler = "{sampler}"\n{NO_EARLY_STOP}'
            f'[[problem]]\nkernel = "{kernel}"\ndtype = "float32"\nshape = {{ n = 1 }}\n'
        )

    def command(self, faults: tuple[str, ...], cli: tuple[str, ...]) -> list[str]:
        return [
            sys.executable, "-m", "tests.fault_driver", "--journal", str(self.journal), *faults,
            "--", "tune", str(self.job), "--db", self.url, "--allow-import",
            "--results-dir", str(self.results), *cli,
        ]

    def start(self, *faults: str, cli: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "AUTOTUNE_DB")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return subprocess.Popen(
            self.command(faults, cli), cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )

    def run(self, *faults: str, cli: tuple[str, ...] = (), timeout: float = 240) -> Run:
        proc = self.start(*faults, cli=cli)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            stop_group(proc)
        return Run(proc.returncode, out, err)

    def rerun(self, *options: str) -> Run:
        """A re-run without faults (``options``: only those that leave the process alone), in
        this process (``fault_driver.run_in_process``): the same command
        line, job runner, store, Optuna and worker processes as :meth:`run`'s, on the same
        database and journal, without a fresh interpreter to start. What a re-run must show
        (it finishes, and what ``settle`` reads from the database and the journal after it)
        does not depend on the process it runs in; the faults themselves run in their own
        process (:meth:`run`)."""
        import autotune.api
        from tests.fault_driver import run_in_process

        open_engine, record_trial = autotune.api.open_engine, Store.record_trial
        run = Run(*run_in_process(self.command(options, ())[3:]))
        assert (autotune.api.open_engine, Store.record_trial) == (open_engine, record_trial), \
            "the in-process re-run left the fake engine or the journal patched in"
        return run

    def entries(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line]


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-5000:]}"


def stop_group(proc: subprocess.Popen[str]) -> None:
    """Ends what the run left behind in its process group (a lock holder), then reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=60)


def assert_clear_error(run: Run, *words: str) -> None:
    """Exit code 2 and one ``autotune: error:`` line naming what went wrong; no traceback."""
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr, run
    message = run.stderr.strip().splitlines()[-1]
    assert message.startswith("autotune: error: "), run
    text = message.lower()
    assert any(w.lower() in text for w in words), (words, run)
    assert "re-run" in text or "move it aside" in text or "restore" in text, run


# --------------------------------------------------------------------------- checking the database


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(resolve_url(url), poolclass=sa.pool.NullPool)


_ROWS = sa.text(
    "SELECT t.id, p.digest, c.digest, d.name, t.software_id, t.status, t.median_us, "
    "t.finished_at FROM at_trials t JOIN at_problems p ON p.id = t.problem_id "
    "JOIN at_configs c ON c.id = t.config_id JOIN at_devices d ON d.id = t.device_id "
    "ORDER BY t.id"
)


def stored(url: str) -> list[tuple[Any, ...]]:
    """Every stored trial, read with plain SQL (not through the code under test), without
    creating or migrating anything: ``(id, problem, config, device, software, status, median,
    finished_at)``."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("at_trials"):
                return []
            return [tuple(r) for r in conn.execute(_ROWS)]
    finally:
        engine.dispose()


def snapshot(url: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Stored trials by measurement key (problem, config, device, software)."""
    return {row[1:5]: (row[0], *row[5:]) for row in stored(url)}


def settle(
    job: Job, campaign: Any, before: dict[tuple[Any, ...], tuple[Any, ...]], *,
    strict_study: bool = True,
) -> None:
    """After the re-run: every trial stored before it (and every journaled commit) is kept,
    unchanged and once; the job is complete; the Optuna study has no RUNNING trial and no
    config COMPLETE twice (``strict_study``: and exactly the stored ok trials are COMPLETE)."""
    rows = stored(job.url)
    keys = collections.Counter(row[1:5] for row in rows)
    after = {row[1:5]: (row[0], *row[5:]) for row in rows}
    by_id = {row[0]: row for row in rows}
    journal = job.entries()
    lost = [key for key, value in before.items() if after.get(key) != value]
    lost += [e for e in journal if e["id"] not in by_id or by_id[e["id"]][2] != e["config"]]
    duplicates = sum(n - 1 for n in keys.values()) + sum(e["duplicate"] for e in journal)

    running, complete_twice = [], 0
    ok_configs = {row[2] for row in rows if row[5] == "ok"}
    for name in optuna.get_all_study_names(storage=job.url):
        trials = optuna.load_study(study_name=name, storage=job.url).get_trials(deepcopy=False)
        running += [t.number for t in trials if t.state == TrialState.RUNNING]
        complete = collections.Counter(
            Config(t.params).digest() for t in trials if t.state == TrialState.COMPLETE
        )
        complete_twice += sum(n - 1 for n in complete.values())
        assert set(complete) <= ok_configs, "a COMPLETE Optuna trial has no stored result"
        if strict_study:
            assert set(complete) == ok_configs, "stored ok trials and COMPLETE trials differ"
    duplicates += complete_twice

    campaign.add(lost=len(lost), duplicates=duplicates)
    assert not lost, f"finished trials lost or replaced: {lost}"
    assert duplicates == 0, f"{duplicates} trial(s) stored, measured or completed twice"
    assert not running, f"Optuna trials left RUNNING: {running}"
    assert len(rows) == job.trials, f"the job is not complete: {len(rows)} of {job.trials} stored"
    campaign.add(completed=1)


def fault_then_rerun(
    job: Job, campaign: Any, *faults: str, expect: int | None = KILL_EXIT,
    words: tuple[str, ...] = (), cli: tuple[str, ...] = (), strict_study: bool = True,
    rerun: tuple[str, ...] = (), pause_s: float = 0.0,
) -> Run:
    """Runs the job with ``faults`` (which must end it as ``expect`` says: killed, exit 2 with
    an error naming one of ``words``, or None for finishing normally), re-runs it cleanly, and
    checks that nothing was lost or doubled."""
    first = job.run(*faults, cli=cli)
    campaign.add(faults=1)
    if expect == 2:
        assert_clear_error(first, *words)
    elif expect is not None:
        assert first.returncode == expect, first
    else:
        assert first.returncode == 0, first
    before = snapshot(job.url)
    committed = {(e["problem"], e["config"]) for e in job.entries()}
    assert committed <= {key[:2] for key in before}, "a committed trial vanished at the fault"
    time.sleep(pause_s)
    again = job.rerun(*rerun)
    assert again.returncode == 0, again
    settle(job, campaign, before, strict_study=strict_study)
    return first


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite database where the job has stored 4 of its 12 trials (cleanly closed)."""
    root = tmp_path_factory.mktemp("seeded")
    (root / "db").mkdir()
    path = root / "db" / "autotune.db"
    run = Job(root, f"sqlite:///{path}").run(cli=("--trials", "4"))
    assert run.returncode == 0, run
    assert len(stored(f"sqlite:///{path}")) == 4
    assert not Path(f"{path}-wal").exists()
    return path


def seeded_job(tmp_path: Path, seeded_db: Path, trials: int = TRIALS) -> Job:
    """A copy of the seeded database, alone in its folder, and the job that resumes it."""
    (tmp_path / "db").mkdir()
    path = tmp_path / "db" / "autotune.db"
    shutil.copyfile(seeded_db, path)
    return Job(tmp_path, f"sqlite:///{path}", trials=trials)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- SIGKILL


KILL_POINTS = {
    "between measuring and storing": ("--kill-before-store", "5"),
    "inside the trial's write": ("--kill-on-sql", r"^INSERT INTO at_trials\b", "--nth", "5"),
    "stored, Optuna not told": ("--kill-after-store", "5"),
    "inside Optuna's tell": ("--kill-on-sql", r"^INSERT INTO trial_values\b", "--nth", "4"),
    "inside Optuna's ask": ("--kill-on-sql", r"^INSERT INTO trial_params\b", "--nth", "9"),
    "creating the study": ("--kill-on-sql", r"^INSERT INTO study_directions\b"),
    "creating the schema": ("--kill-on-sql", r"^CREATE TABLE at_trials\b"),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_at_a_chosen_point_then_rerun_completes(point, tmp_path, campaign):
    """SIGKILL of the tuner at one point of a trial's life; the re-run completes the job."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    fault_then_rerun(job, campaign, *KILL_POINTS[point])


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(
    "point", ["between measuring and storing", "inside the trial's write", "stored, Optuna not told"]
)
def test_sigkill_on_postgresql(point, db_url, tmp_path, campaign):
    """The same on PostgreSQL: a killed connection's transaction leaves nothing behind."""
    fault_then_rerun(Job(tmp_path, db_url), campaign, *KILL_POINTS[point])


# A random sweep: the default run keeps seed 11; 12 and 13 are its tail (`-m extended`).
@pytest.mark.parametrize("seed", [11, *(pytest.param(s, marks=pytest.mark.extended)
                                         for s in (12, 13))])
def test_sigkill_at_random_writes_twice_then_rerun_completes(seed, tmp_path, campaign):
    """Two runs killed inside random writes (store or Optuna), then a clean re-run."""
    rng = random.Random(seed)
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    before: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for _ in range(2):
        nth = rng.randint(1, 40)
        run = job.run("--kill-on-sql", r"^(INSERT|UPDATE|DELETE)\b", "--nth", str(nth))
        campaign.add(faults=1)
        assert run.returncode == KILL_EXIT, (nth, run)
        now = snapshot(job.url)
        assert all(now.get(k) == v for k, v in before.items()), "a killed run changed a trial"
        before = now
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


def test_sigkill_of_tuner_and_workers_at_a_random_moment(tmp_path, campaign):
    """``kill -9`` of the whole process group (tuner and workers) at a random moment."""
    rng = random.Random(7)
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    proc = job.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(job.entries()) < 2:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.3))
        assert proc.poll() is None, "the job finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
        stop_group(proc)
    campaign.add(faults=1)
    assert proc.returncode == KILL_EXIT
    before = snapshot(job.url)
    assert len(before) >= 2
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


def test_ctrl_c_stops_cleanly_and_rerun_completes(tmp_path, campaign):
    """Ctrl-C: exit 130 with a message that finished trials are kept; the re-run completes."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    first = fault_then_rerun(job, campaign, "--sigint-after-store", "4", expect=130)
    assert "finished trials are stored" in first.stderr and "Traceback" not in first.stderr


def test_tuner_of_another_host_killed_its_trials_are_freed_by_heartbeat(tmp_path, campaign):
    """A tuner on another host dies; after the heartbeat grace period this host's run frees
    its trials (no RUNNING trial stays, its stored results are kept) and completes the job."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    first = job.run("--hostname", "other-host", "--kill-after-store", "4")
    campaign.add(faults=1)
    assert first.returncode == KILL_EXIT, first
    before = snapshot(job.url)
    time.sleep(2.5)
    rerun = job.run("--grace-s", "2")  # its own process: the heartbeats are per process
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before, strict_study=False)


# --------------------------------------------------------------------------- workers


def test_worker_crashes_and_hangs_are_stored_and_the_job_finishes(tmp_path, campaign):
    """Configs that segfault or hang their worker are stored as crashed / timeout; the job
    finishes with exit 3 (trials crashed), and a re-run measures nothing again."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db", kernel="tests.fault_driver:FLAKY",
              trials=6, sampler="brute")
    fault_then_rerun(job, campaign, expect=3)  # exit 3: the job ended, some trials crashed
    statuses = collections.Counter(row[5] for row in stored(job.url))
    assert statuses == {"ok": 2, "crashed": 2, "timeout": 2}, statuses
    assert len(job.entries()) == 6  # the re-run measured nothing


# --------------------------------------------------------------------------- locks


def test_database_locked_briefly_by_another_process_is_waited_for(tmp_path, campaign):
    """Another process holds the write lock for 1.5 s: the tuner waits and finishes."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    fault_then_rerun(job, campaign, "--lock-after-store", "3", "--lock-s", "1.5", expect=None)
    times = [e["t"] for e in job.entries()]
    assert times[3] - times[2] >= 1.0, "the tuner did not wait for the lock"


def test_database_locked_too_long_stops_with_a_clear_error(tmp_path, campaign):
    """A lock held past the tuner's patience: exit 2 naming the lock; the re-run completes."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db")
    fault_then_rerun(
        job, campaign, "--busy-timeout-s", "0.5", "--lock-after-store", "3", "--lock-s", "120",
        expect=2, words=("locked",),
    )


# --------------------------------------------------------------------------- read-only, full


@pytest.fixture
def writable_again(tmp_path):
    """Makes read-only database files writable again, whatever the test did; skips where files
    cannot be made read-only for real (root on a file system without ``chattr +i``)."""
    probe = tmp_path / "probe" / "probe.db"
    probe.parent.mkdir()
    probe.write_bytes(b"x")
    try:
        set_read_only(probe, True)
        try:
            with open(probe, "ab") as f:
                f.write(b"y")
            pytest.skip("files cannot be made read-only here (root without chattr +i)")
        except OSError:
            pass
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"files cannot be made read-only here: {e}")
    finally:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            set_read_only(probe, False)
    shutil.rmtree(probe.parent)
    paths: list[Path] = []
    yield paths.append
    for path in paths:
        set_read_only(path, False)


def test_read_only_database_is_a_clear_error_and_left_unchanged(tmp_path, seeded_db, campaign,
                                                                writable_again):
    """A read-only database (really: ``chattr +i`` as root): exit 2, file unchanged; once
    writable again the re-run completes."""
    job = seeded_job(tmp_path, seeded_db)
    path = sqlite_file(job.url)
    before = snapshot(job.url)
    digest = sha256(path)
    writable_again(path)
    set_read_only(path, True)
    first = job.run()
    campaign.add(faults=1)
    assert_clear_error(first, "read-only", "readonly", "permission", "not permitted", "unable to open")
    assert sha256(path) == digest
    set_read_only(path, False)
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


def test_database_becoming_read_only_mid_job_stops_with_a_clear_error(tmp_path, campaign,
                                                                       writable_again):
    """The database turns read-only after 5 stored trials: exit 2; the re-run completes."""
    (tmp_path / "db").mkdir()
    job = Job(tmp_path, f"sqlite:///{tmp_path}/db/autotune.db")
    writable_again(sqlite_file(job.url))
    first = job.run("--readonly-after-store", "5")
    campaign.add(faults=1)
    assert_clear_error(first, "read-only", "readonly", "i/o error", "not permitted")
    set_read_only(sqlite_file(job.url), False)
    before = snapshot(job.url)
    assert len(before) >= 5
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


@pytest.mark.parametrize(
    "limit",
    [("--max-pages-headroom", "0"), ("--fsize-headroom", "16384")],
    ids=["sqlite page limit", "file size limit"],
)
def test_full_disk_stops_with_a_clear_error_and_rerun_completes(limit, tmp_path, seeded_db,
                                                                campaign):
    """The database cannot grow (SQLITE_FULL, or the kernel refusing to write past a file
    size): exit 2 naming it; on a disk with room the re-run completes."""
    job = seeded_job(tmp_path, seeded_db, trials=40)  # enough to need new pages
    fault_then_rerun(job, campaign, *limit, expect=2, words=("full", "i/o error"))


# --------------------------------------------------------------------------- schema, corruption


def _head_revision() -> str:
    from alembic.script import ScriptDirectory

    from autotune.storage.connection import _alembic_config

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def _version(url: str) -> str:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM at_alembic_version")).scalar()
    finally:
        engine.dispose()


def build_old_database(url: str, n_trials: int = 4) -> None:
    """A database as the first autotune release (schema 0001) left it, with ``n_trials`` of
    the job's trials stored by it (same device and software as the fake engine's)."""
    from importlib.metadata import version

    from alembic import command

    import autotune
    from autotune.storage.connection import _alembic_config

    engine = _engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "0001")
        with engine.begin() as conn:
            def insert(table: str, **values: Any) -> int:
                columns = ", ".join(values)
                marks = ", ".join(f":{k}" for k in values)
                conn.execute(sa.text(f"INSERT INTO {table} ({columns}) VALUES ({marks})"), values)
                return conn.execute(sa.text(f"SELECT max(id) FROM {table}")).scalar()

            kernel = insert("at_kernels", name=PROBLEM.kernel)
            problem = insert("at_problems", kernel_id=kernel, shape_json=PROBLEM.shape_json,
                             dtype=PROBLEM.dtype, digest=PROBLEM.digest())
            device = insert("at_devices", name="fake-gpu (CUDA_VISIBLE_DEVICES=)", kind="fake",
                            compute_capability="", driver="")
            software = insert("at_software", jax=version("jax"), jaxlib=version("jaxlib"),
                              autotune=autotune.__version__, extra="{}")
            for i in range(n_trials):
                config = Config(cost_us=33 - i, run_ms=40)
                config_id = insert("at_configs", kernel_id=kernel, config_json=config.to_json(),
                                   digest=config.digest())
                insert("at_trials", problem_id=problem, config_id=config_id, device_id=device,
                       software_id=software, status="ok", median_us=float(33 - i),
                       min_us=float(33 - i), max_us=float(33 - i),
                       samples_us=json.dumps([float(33 - i)] * 3), compile_s=0.0, rel_error=0.0,
                       timing="fake", error="", study_name=None, optuna_trial_number=None,
                       worker="old", host="old-host", started_at=None,
                       finished_at="2025-01-01 00:00:00")
    finally:
        engine.dispose()


def test_old_schema_database_is_migrated_and_the_job_resumes(db_url, tmp_path, campaign):
    """A database of schema 0001 holding trials: opened, migrated to the newest schema, its
    trials kept and counted, and the job completed without measuring them again."""
    build_old_database(db_url)
    assert _version(db_url) == "0001"
    before = snapshot(db_url)
    job = Job(tmp_path, db_url)
    run = job.run()
    campaign.add(faults=1)
    assert run.returncode == 0, run
    assert _version(db_url) == _head_revision()
    assert not {e["config"] for e in job.entries()} & {k[1] for k in before}, "re-measured"
    settle(job, campaign, before, strict_study=False)


def test_sigkill_during_a_migration_leaves_the_old_schema_then_rerun_completes(
    db_url, tmp_path, campaign
):
    """SIGKILL inside the migration from 0001: the database stays at 0001 with its trials
    (the migration is one transaction); the re-run migrates and completes the job."""
    if _head_revision() == "0001":
        pytest.skip("no migration after 0001 yet")
    build_old_database(db_url)
    before = snapshot(db_url)
    job = Job(tmp_path, db_url)
    first = job.run("--kill-on-sql", r"^(CREATE|ALTER|DROP)\b")
    campaign.add(faults=1)
    assert first.returncode == KILL_EXIT, first
    assert _version(db_url) == "0001" and snapshot(db_url) == before
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    assert _version(db_url) == _head_revision()
    settle(job, campaign, before, strict_study=False)


def _garbage_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:100] = b"\x00not an sqlite header\xff" * 4 + b"\x00" * 12
    path.write_bytes(bytes(data))


def _garbage_pages(path: Path) -> None:
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    rng = random.Random(0)
    for start in range(2 * page, len(data), page):  # every page but the first (the schema)
        data[start:start + page] = rng.randbytes(page)
    path.write_bytes(bytes(data))


def _garbage_data_pages(path: Path) -> None:
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    rng = random.Random(3)
    for i in rng.sample(range(2, len(data) // page), 3):  # three pages of trials or studies
        data[i * page:(i + 1) * page] = rng.randbytes(page)
    path.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 1000])


@pytest.mark.parametrize(
    "corrupt", [_garbage_header, _garbage_pages, _garbage_data_pages, _truncated],
    ids=["header", "all pages", "three data pages", "truncated"],
)
def test_corrupted_database_is_a_clear_error_and_never_overwritten(corrupt, tmp_path, seeded_db,
                                                                   campaign):
    """A corrupted database file: exit 2 naming it, the file byte for byte as it was; the job
    then completes on the restored backup with its trials kept."""
    job = seeded_job(tmp_path, seeded_db)
    path = sqlite_file(job.url)
    before = snapshot(job.url)
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)
    corrupt(path)
    damaged = sha256(path)
    first = job.run()
    campaign.add(faults=1)
    assert_clear_error(first, "not an sqlite database", "malformed", "corrupt")
    assert str(path) in first.stderr
    assert sha256(path) == damaged, "the corrupted file was written to"
    assert not job.entries()
    for extra in db_files(path)[1:-1]:
        extra.unlink()
    shutil.copyfile(backup, path)  # the user restores the backup
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


def test_a_trial_never_tagged_with_its_owner_is_freed_after_the_grace_period(tmp_path,
                                                                              monkeypatch):
    """A RUNNING trial without an owner (its process died inside Optuna's ask, as older
    versions could) is left alone while its owner may still be asking, and released once it
    is GRACE_S old, so its config is measured after all."""
    import warnings

    from autotune.space.outcomes import DeviceInfo
    from autotune.storage.store import Store
    from autotune.tuning import studies
    from autotune.tuning.sampling import distributions
    from autotune.tuning.tuner import run_job
    from tests.tuning.test_tuner import PROBLEM as TOY_PROBLEM
    from tests.tuning.test_tuner import TOY, FakeEngine, _job

    url = f"sqlite:///{tmp_path}/t.db"
    device = DeviceInfo(name="fake-gpu", kind="fake")
    study = optuna.create_study(study_name=studies.study_name(TOY_PROBLEM, device),
                                storage=studies.optuna_storage(url))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        untagged = study.ask(distributions(TOY.valid_space(TOY_PROBLEM)))
    def state() -> TrialState:
        return optuna.load_study(study_name=study.study_name, storage=url).trials[
            untagged.number].state

    with Store(url) as store:
        # What every runner does on opening a problem and while it waits for others' trials.
        studies.close_orphans(study, store, TOY_PROBLEM, device)
        assert state() == TrialState.RUNNING
        monkeypatch.setattr(studies, "GRACE_S", 1)
        time.sleep(1.2)
        (report,) = run_job(_job(5), store=store, engine=FakeEngine())
    assert state() == TrialState.FAIL and report.measured_now == 5


def test_the_campaign_summary_adds_up_over_workers_and_fails_on_a_lost_trial(tmp_path):
    """The summary line sums every xdist worker's counts, and a lost trial fails the session
    even when the test that counted it passed."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_counts.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('i', range(4))\n"
        "def test_count(i, campaign):\n"
        "    campaign.add(bad_inputs=1, faults=2, completed=1, lost=int(i == 3))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert "4 passed" in run.stdout, run.stdout + run.stderr
    assert ("reliability campaign: 4 bad inputs tried, 8 faults injected, 4 jobs completed "
            "after re-run, 1 trials lost, 0 duplicates (must be 0: FAILED)") in run.stdout
    assert run.returncode == 1, run.stdout


# --------------------------------------------------------------------------- read commands


def _read_commands(url: str, tmp_path: Path) -> dict[str, Any]:
    """Every read-only way into the database: the CLI's read commands and the run-time lookup."""
    from autotune.cli import main as cli_main
    from autotune.queries import lookup

    def run_lookup() -> int:
        lookup.clear_cache()
        lookup.lookup_config(STEADY, {"n": 1}, "float32", db=url, default={"cost_us": 10},
                             timeout_s=2)
        return 0

    return {
        "results": lambda: cli_main(["results", "--db", url]),
        "best": lambda: cli_main(["best", STEADY.name, "--shape", "n=1", "--dtype", "float32",
                                  "--db", url]),
        "export": lambda: cli_main(["export", "--db", url, "--format", "json"]),
        "report": lambda: cli_main(["report", "--db", url, "--out", str(tmp_path / "report")]),
        "lookup": run_lookup,
    }


@pytest.mark.parametrize("journal", ["delete", "wal"])
@pytest.mark.parametrize(
    "corrupt", [_garbage_header, _garbage_pages, _garbage_data_pages, _truncated],
    ids=["header", "all pages", "three data pages", "truncated"],
)
def test_read_commands_never_write_a_damaged_database(corrupt, journal, tmp_path, seeded_db,
                                                      campaign, capsys):
    """results, best, export, report and the lookup on a damaged database, in rollback-journal
    and WAL mode: each answers or stops with a one-line message, and the file stays byte for byte
    as it was (they used to switch its journal mode, rewriting the header)."""
    from autotune.queries.best import close_stores

    job = seeded_job(tmp_path, seeded_db)
    path = sqlite_file(job.url)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute(f"PRAGMA journal_mode = {journal}").fetchone()[0] == journal
    corrupt(path)
    damaged = sha256(path)
    for name, command in _read_commands(job.url, tmp_path).items():
        try:
            code = command()
        finally:
            close_stores()
        campaign.add(faults=1)
        err = capsys.readouterr().err
        assert code in (0, 1, 2), (name, code, err)  # 1: `best` read no row of the problem
        assert code == 0 or err.strip().splitlines()[-1].startswith("autotune: "), (name, err)
        assert "Traceback" not in err, (name, err)
        assert sha256(path) == damaged, f"`{name}` wrote to the damaged database"


# --------------------------------------------------------------------------- interrupts


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the engine's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _still_running(pids: list[int], grace_s: float) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie) after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        running = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                running.append(pid)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


class _Lines:
    """A process's stderr lines, read as they come, with the time each arrived."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def first(self, text: str, timeout: float) -> tuple[float, str] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines):
                if text in line:
                    return when, line
            time.sleep(0.02)
        return None

    def text(self) -> str:
        self._thread.join(10)
        return "".join(line for _, line in self.lines)


def _interrupted_mid_job(tmp_path: Path, signals: tuple[int, ...],
                         faults: tuple[str, ...] = ()) -> tuple[Job, dict[str, Any]]:
    """Starts a job of SLOW configs, and once some are stored and minute-long compiles are in
    flight sends ``signals`` (the next one once the first was answered)."""
    job = Job(tmp_path, f"sqlite:///{tmp_path}/autotune.db", kernel=SLOW.name, trials=8,
              sampler="random")
    proc = job.start("--trial-timeout-s", "300", *faults)
    lines = _Lines(proc.stderr)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not job.entries():
            time.sleep(0.05)
        time.sleep(1.0)  # the compile threads are now held by minute-long configs
        assert proc.poll() is None, "the job ended before it could be interrupted"
        workers = _children(proc.pid)
        stored_before = len(job.entries())
        sent = time.monotonic()
        os.kill(proc.pid, signals[0])
        said = lines.first("stops at once", timeout=10)
        for signum in signals[1:]:
            os.kill(proc.pid, signum)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        ended = time.monotonic()
        alive_workers = _still_running(workers, grace_s=1.0)
    finally:
        stop_group(proc)
    return job, {
        "code": proc.returncode, "said": said, "sent": sent, "ended": ended,
        "stderr": lines.text(), "stored_before": stored_before, "workers": workers,
        "alive_workers": alive_workers,
    }


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["Ctrl-C", "SIGTERM"])
def test_interrupt_says_what_it_waits_for_and_ends_within_5_s(signum, code, tmp_path, campaign):
    """The first Ctrl-C (or SIGTERM) says at once how many configs are in flight and where the
    worker logs are, and the tuner ends within 5 s (not when the minute-long compiles in flight
    finish) with 130 (143); a re-run completes the job: none lost, none measured twice."""
    job, run = _interrupted_mid_job(tmp_path, (signum,))
    campaign.add(faults=1)
    assert run["said"] is not None, run["stderr"]
    when, line = run["said"]
    assert when - run["sent"] < 1.0, line
    in_flight = re.search(r"closing (\d+) config\(s\) in flight", line)
    assert in_flight and int(in_flight.group(1)) >= 1, line
    assert f"worker logs: {job.results / 'logs'}" in line, line
    assert run["code"] == code, run
    assert run["ended"] - run["sent"] < 5.0, run
    assert "finished trials are stored" in run["stderr"] and "Traceback" not in run["stderr"]
    assert not run["alive_workers"], run
    before = snapshot(job.url)
    assert len(before) >= run["stored_before"] >= 1
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


def test_a_second_ctrl_c_ends_at_once(tmp_path, campaign):
    """A second Ctrl-C ends the process at once (exit 130), its workers killed; the next run
    closes the trials left open and completes the job with none lost or doubled. (The engine
    takes 10 s to close here, so that the second Ctrl-C lands during the first one's shutdown:
    otherwise that can be over before the second is sent, as in one CI run.)"""
    job, run = _interrupted_mid_job(tmp_path, (signal.SIGINT, signal.SIGINT),
                                    faults=("--slow-close-s", "10"))
    campaign.add(faults=1)
    assert run["said"] is not None, run["stderr"]
    assert run["code"] == 130, run
    assert run["ended"] - run["sent"] < 2.0, run
    assert "again: stopping at once" in run["stderr"], run
    assert run["workers"] and not run["alive_workers"], run
    before = snapshot(job.url)
    rerun = job.rerun()
    assert rerun.returncode == 0, rerun
    settle(job, campaign, before)


# --------------------------------------------------------------------------- database paths

# Each way into a database, run against one path in a fresh interpreter: the CLI's --db, the
# AUTOTUNE_DB variable, the query API, the run-time lookup with strict=True. Each prints its
# outcome on one line: the exit code, or the exception's type and message.
_EVERY_WAY_IN = r"""
import os, sys, warnings
warnings.simplefilter("ignore")
path = sys.argv[1]
from autotune.cli import main
from autotune.errors import StorageError
for name, argv, env in [("--db", ["results", "--db", path], None),
                        ("AUTOTUNE_DB", ["export", "--format", "json"], path),
                        ("report", ["report", "--db", path, "--out", "report"], None)]:
    if env is not None:
        os.environ["AUTOTUNE_DB"] = env
    print(name, "exit", main(argv), flush=True)
    os.environ.pop("AUTOTUNE_DB", None)
import autotune
from autotune.queries import lookup
from tests.fault_driver import STEADY
for name, call in [
    ("api", lambda: autotune.best_config(STEADY.name, {"n": 1}, "float32", db=path)),
    ("lookup", lambda: lookup.lookup_config(STEADY, {"n": 1}, "float32", db=path, strict=True,
                                            timeout_s=1)),
]:
    try:
        call()
        print(name, "answered", flush=True)
    except StorageError as e:
        print(name, "StorageError", str(e).replace("\n", " "), flush=True)
"""


def _make_socket(path: Path) -> None:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))  # left bound: the test's folder goes with it


_NOT_FILES = {
    "fifo": lambda p: os.mkfifo(p),
    "link to a fifo": lambda p: (os.mkfifo(p.with_name("pipe")), os.symlink(p.with_name("pipe"), p)),
    "socket": _make_socket,
    "character device": lambda p: os.symlink("/dev/zero", p),
    "folder": lambda p: p.mkdir(),
    "wal is a fifo": lambda p: (sqlite3.connect(p).close(), os.mkfifo(p.with_name(p.name + "-wal"))),
    "journal is a fifo": lambda p: (sqlite3.connect(p).close(),
                                    os.mkfifo(p.with_name(p.name + "-journal"))),
}


@pytest.mark.parametrize("kind", list(_NOT_FILES))
def test_a_database_path_that_is_not_a_regular_file_is_refused_at_once(kind, tmp_path, campaign):
    """--db, AUTOTUNE_DB, the query API and the lookup, on a path that names a pipe, a socket,
    a device, a folder (or whose -wal/-journal file is a pipe): each refuses it within the read
    timeout, naming what it is, exit 2 (SQLite used to wait on a pipe forever, deaf to Ctrl-C)."""
    path = tmp_path / "autotune.db"
    _NOT_FILES[kind](path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOTUNE_READ_TIMEOUT_S": "1"}
    start = time.monotonic()
    try:
        run = subprocess.run([sys.executable, "-c", _EVERY_WAY_IN, str(path)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=30,
                             start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a read on a {kind} did not end: {e.stdout!r}")
    elapsed = time.monotonic() - start
    campaign.add(faults=5)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run
    assert [line.split()[:3] for line in lines[:3]] == [
        ["--db", "exit", "2"], ["AUTOTUNE_DB", "exit", "2"], ["report", "exit", "2"]], run
    assert all(line.split()[1] == "StorageError" for line in lines[3:]) and len(lines) == 5, run
    what = "folder" if kind == "folder" else "not a regular file"
    assert run.stderr.count(what) >= 3 and "Traceback" not in run.stderr, run.stderr
    assert all(what in line for line in lines[3:]), lines
    assert elapsed < 30, elapsed


def test_a_command_blocked_in_the_driver_still_ends_within_5_s_of_sigterm(tmp_path):
    """A read command whose main thread is blocked inside the database driver (here SQLite
    opening a pipe, which retries on EINTR, so Python's handler never runs) still ends with
    128 + the signal's number within the grace after SIGTERM or Ctrl-C."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = ("import sqlite3, sys\n"
            "from autotune.interrupts import handling\n"
            "with handling(grace_s=1):\n"
            "    print('blocked', flush=True)\n"
            f"    sqlite3.connect('file:{fifo}?mode=ro', uri=True).execute('select 1')\n")
    for signum in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert proc.stdout.readline().strip() == "blocked"
            time.sleep(0.3)  # inside sqlite's open()
            sent = time.monotonic()
            proc.send_signal(signum)
            proc.wait(timeout=10)
            assert time.monotonic() - sent < 5
            assert proc.returncode == 128 + signum, proc.stderr.read()
            assert "stopping at once" in proc.stderr.read()
        finally:
            stop_group(proc)


# --------------------------------------------------------------------------- the schema record


def _break_record(url: str, how: str) -> None:
    """Damages the schema version record of the database at ``url`` as ``how`` says."""
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            (head,) = conn.execute(sa.text("SELECT version_num FROM at_alembic_version")).scalars()
            if how == "missing":
                conn.execute(sa.text("DROP TABLE at_alembic_version"))
            elif how == "empty":
                conn.execute(sa.text("DELETE FROM at_alembic_version"))
            elif how == "doubled":
                conn.execute(sa.text("INSERT INTO at_alembic_version VALUES ('0002')"))
            else:  # the same row twice, in a table without its key (another tool rebuilt it)
                conn.execute(sa.text("DROP TABLE at_alembic_version"))
                conn.execute(sa.text("CREATE TABLE at_alembic_version (version_num VARCHAR(32))"))
                conn.execute(sa.text("INSERT INTO at_alembic_version VALUES (:v), (:v)"), {"v": head})
    finally:
        engine.dispose()


@pytest.mark.parametrize("how", ["missing", "empty", "doubled", "same row twice"])
def test_a_damaged_schema_record_is_one_clear_message_naming_the_repair(how, db_url, tmp_path,
                                                                         capsys, campaign):
    """A populated database whose version record is missing, empty or doubled: every command
    (read commands, tune, import) and the lookup's strict mode stop with one message naming
    the problem and `autotune db repair` (it used to read as "no results stored", or end in an
    internal error); `autotune db repair` records the version the tables match, and then every
    stored trial is there, none lost or duplicated (SQLite and PostgreSQL)."""
    from autotune.cli import main as cli_main
    from autotune.errors import StorageError
    from autotune.queries import lookup
    from autotune.queries.best import close_stores

    job = Job(tmp_path, db_url, trials=4)
    filled = job.rerun()  # a clean run (in this process, as the re-runs): the database to damage
    assert filled.returncode == 0, filled
    before = stored(db_url)
    assert len(before) == 4
    _break_record(db_url, how)
    commands = {**_read_commands(db_url, tmp_path),
                "tune": lambda: cli_main(["tune", str(job.job), "--db", db_url, "--allow-import"]),
                "import": lambda: cli_main(["import", str(tmp_path / "none.json"), "--db", db_url])}
    commands.pop("lookup")
    for name, command in commands.items():
        try:
            code = command()
        finally:
            close_stores()
        campaign.add(faults=1)
        err = capsys.readouterr().err
        if name == "import":  # the file is checked first: a missing one is named
            assert code == 2, err
            continue
        assert code == 2, (name, code, err)
        assert "schema version record" in err and "autotune db repair" in err, (name, err)
        assert "Traceback" not in err and "no results stored" not in err, (name, err)
    lookup.clear_cache()
    with pytest.raises(StorageError, match="autotune db repair"):
        lookup.lookup_config(STEADY, {"n": 1}, "float32", db=db_url, strict=True, timeout_s=2)
    lookup.clear_cache()
    campaign.add(faults=1)
    assert cli_main(["db", "repair", "--db", db_url]) == 0
    out = capsys.readouterr()
    assert "now 0" in out.out + out.err, out
    assert cli_main(["db", "repair", "--db", db_url]) == 0
    assert "nothing to repair" in "".join(capsys.readouterr())
    close_stores()
    assert stored(db_url) == before
    assert cli_main(["results", "--db", db_url]) == 0
    close_stores()
    capsys.readouterr()


def test_repair_records_an_older_schema_which_then_upgrades(db_url, capsys, campaign):
    """A schema-0001 database that lost its version record: `db repair` finds that its tables
    match 0001 (not the newest version), records it, and the next open upgrades it to head with
    every trial kept."""
    from autotune.cli import main as cli_main
    from autotune.queries.best import close_stores

    build_old_database(db_url)
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            n_trials = conn.execute(sa.text("SELECT count(*) FROM at_trials")).scalar()
            conn.execute(sa.text("DROP TABLE at_alembic_version"))
    finally:
        engine.dispose()
    campaign.add(faults=1)
    assert cli_main(["results", "--db", db_url]) == 2
    assert "autotune db repair" in capsys.readouterr().err
    assert cli_main(["db", "repair", "--db", db_url]) == 0
    assert "now 0001" in "".join(capsys.readouterr())
    assert cli_main(["results", "--db", db_url]) == 0
    close_stores()
    assert _version(db_url) == _head_revision()
    assert len(stored(db_url)) == n_trials == 4

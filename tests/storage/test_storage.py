"""The results database: round trips, uniqueness, migrations, concurrency, Optuna coexistence."""

from __future__ import annotations

import dataclasses
import datetime as dt
import multiprocessing
import pathlib
import pickle
import socket

import pytest
import sqlalchemy as sa

from autotune.errors import StorageError
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage import connection, rows, schema, urls
from autotune.storage import store as storage
from autotune.storage.store import Store
from autotune.storage.urls import resolve_url

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
OTHER_GPU = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.10.2", "jaxlib": "0.10.2", "autotune": "0.1.0"}
PROBLEM = Problem("matmul", {"m": 256, "n": 256, "k": 128}, "bf16")
# The newest schema revision (autotune/storage/migrations/versions).
HEAD = "0005"
AT_TABLES = {
    "at_verifications",
    "at_kernels",
    "at_problems",
    "at_devices",
    "at_software",
    "at_configs",
    "at_trials",
    "at_baselines",
    "at_trace_regions",
    "at_runs",
    "at_confirmations",
    "at_confirmation_programs",
    "at_alembic_version",
}


def timed(*samples_us: float) -> TrialResult:
    return TrialResult.timed(samples_us, compile_s=0.25, rel_error=1e-3, timing="fake")


@pytest.fixture
def store(db_url: str):
    s = Store(db_url)
    yield s
    s.close()


def record(store: Store, config: Config, result: TrialResult, device: DeviceInfo = GPU, **kw):
    return store.record_trial(PROBLEM, config, result, device=device, software=SOFTWARE, **kw)


# --------------------------------------------------------------------------- round trips


def test_public_api_is_pinned():
    """storage (store, rows, urls) exports exactly the documented names."""
    assert sorted(storage.__all__ + rows.__all__ + [n for n in urls.__all__ if n not in ("display_url", "MASK")]) == sorted(
        [
            "Store", "RecordedTrial", "TrialRow", "BaselineRow", "TraceRegionRow",
            "ProblemSummary", "resolve_url", "sqlite_path", "in_memory", "failure_reason", "damaged_hint",
            "mask_text", "mask_url", "mask_argv", "check_database_path", "check_sqlite_file",
            "plain_sqlite_file", "plain_sqlite_text", "DEFAULT_URL", "ENV_VAR",
            "VERSION_TABLE", "READ_TIMEOUT_ENV", "read_timeout_s", "RESULT_FIELDS",
            "RunRow", "ConfirmationRow", "ConfirmedProgram", "Observed", "TrialTable",
        ]
    )


def test_the_store_owns_a_reader_and_a_writer_and_forwards_to_them_unchanged(store: Store):
    """Store is no mixin: it owns a StoreReader and a StoreWriter, and each public method of
    theirs is a Store method of the same name and signature (defaults included), so a
    default changed on one side only fails here."""
    import inspect

    from autotune.storage.reading import StoreReader
    from autotune.storage.writing import StoreWriter

    assert Store.__mro__ == (Store, object)
    for part in (StoreReader, StoreWriter):
        public = [n for n, f in vars(part).items() if callable(f) and not n.startswith("_")]
        assert public, part
        for name in public:
            assert inspect.signature(getattr(Store, name)) == inspect.signature(
                getattr(part, name)), f"Store.{name} differs from {part.__name__}.{name}"
    extra = {n for n, f in vars(Store).items() if callable(f) and not n.startswith("_")}
    extra -= {n for part in (StoreReader, StoreWriter) for n in vars(part)}
    assert extra == {"close", "checkpoint"}, extra  # (url is a property)


def test_trial_round_trips_every_field(store: Store):
    """Every field of a recorded trial reads back unchanged."""
    problem = Problem("attention", {"batch": 2, "seq_len": 1024, "head_dim": 128, "causal": True}, "f16")
    config = Config(block_q=64, block_kv=128, swizzle=True, order="kv_major")
    result = TrialResult(
        outcome=Outcome.OK,
        samples_us=(12.5, 11.25, 13.0, 12.0),
        compile_s=3.5,
        error="",
        rel_error=2.5e-4,
        timing="cupti",
        cache="cold",
    )
    software = {**SOFTWARE, "jax_cuda13_plugin": "0.10.2"}
    started = dt.datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    before = dt.datetime.now(dt.UTC)
    recorded = store.record_trial(
        problem, config, result, device=GPU, software=software, study_name="study-1",
        optuna_trial_number=7, worker="w3", started_at=started,
    )
    after = dt.datetime.now(dt.UTC)
    assert recorded == rows.RecordedTrial(recorded.id, duplicate=False)

    [row] = store.trials(problem)
    assert row.id == recorded.id
    assert row.problem == problem and row.problem.dims["causal"] is True
    assert row.config == config and row.config.digest() == config.digest()
    assert row.device == GPU
    assert row.software == software
    assert row.status is Outcome.OK
    assert (row.median_us, row.min_us, row.max_us) == (12.25, 11.25, 13.0)
    assert row.samples_us == result.samples_us
    assert (row.compile_s, row.rel_error, row.timing, row.error) == (3.5, 2.5e-4, "cupti", "")
    assert (row.study_name, row.optuna_trial_number, row.worker) == ("study-1", 7, "w3")
    assert row.host == socket.gethostname()
    assert row.started_at == started and row.started_at.tzinfo == dt.UTC
    assert before <= row.finished_at <= after
    assert row.result() == result
    assert row.cache_policy == "cold" and row.stored_spread == pytest.approx(result.spread)
    assert store.trial(recorded.id) == row
    assert store.problems() == [problem]


def test_failed_outcomes_round_trip_and_count_as_finished(store: Store):
    """Failed trials keep their outcome and error text and are 'finished' for dedup."""
    record(store, Config(tile=1), TrialResult.failed(Outcome.COMPILE_ERROR, "ptxas: too many registers", compile_s=1.0))
    record(store, Config(tile=2), TrialResult.failed(Outcome.TIMEOUT, "killed after 60 s"))
    record(store, Config(tile=3), timed(5.0))
    rows = {row.config["tile"]: row for row in store.trials(PROBLEM)}
    assert rows[1].status is Outcome.COMPILE_ERROR and rows[1].error == "ptxas: too many registers"
    assert rows[1].median_us is None and rows[1].samples_us == () and rows[1].compile_s == 1.0
    assert rows[2].status is Outcome.TIMEOUT
    expected = {Config(tile=i).digest() for i in (1, 2, 3)}
    assert store.finished_digests(PROBLEM) == expected
    assert store.finished_digests(PROBLEM, device=GPU, software=SOFTWARE) == expected
    assert [r.config["tile"] for r in store.trials(status="timeout")] == [2]


def test_finished_digests_filters_by_device_and_software(store: Store):
    """finished_digests restricts to the exact device and software when given."""
    record(store, Config(tile=1), timed(1.0))
    store.record_trial(PROBLEM, Config(tile=2), timed(1.0), device=INTERPRET, software=SOFTWARE)
    store.record_trial(PROBLEM, Config(tile=3), timed(1.0), device=GPU, software={"jax": "0.11.2"})
    digest = {i: Config(tile=i).digest() for i in (1, 2, 3)}
    assert store.finished_digests(PROBLEM) == set(digest.values())
    assert store.finished_digests(PROBLEM, device=GPU) == {digest[1], digest[3]}
    assert store.finished_digests(PROBLEM, device=GPU, software=SOFTWARE) == {digest[1]}
    assert store.finished_digests(PROBLEM, software={"jax": "0.11.2"}) == {digest[3]}
    other = Problem("matmul", {"m": 512, "n": 256, "k": 128}, "bf16")
    assert store.finished_digests(other) == set()


def test_duplicate_trial_keeps_the_first_and_says_so(store: Store):
    """A second record_trial of the same measurement writes nothing and flags duplicate."""
    first = record(store, Config(tile=1), timed(10.0), worker="a")
    second = record(store, Config(tile=1), timed(1.0), worker="b")
    third = record(store, Config(tile=1), TrialResult.failed(Outcome.CRASHED, "segfault"))
    assert not first.duplicate
    assert second.duplicate and second.id == first.id
    assert third.duplicate and third.id == first.id
    [row] = store.trials()
    assert (row.median_us, row.worker, row.status) == (10.0, "a", Outcome.OK)


def test_same_config_on_other_device_or_software_is_a_new_trial(store: Store):
    """Uniqueness is per (problem, config, device, software), not per config alone."""
    a = record(store, Config(tile=1), timed(1.0))
    b = record(store, Config(tile=1), timed(2.0), device=OTHER_GPU)
    c = store.record_trial(PROBLEM, Config(tile=1), timed(3.0), device=GPU, software={"jax": "0.11.2"})
    assert len({a.id, b.id, c.id}) == 3 and not (a.duplicate or b.duplicate or c.duplicate)


def test_rows_are_frozen_picklable_snapshots(store: Store):
    """Rows are frozen dataclasses that survive pickling, not ORM objects."""
    record(store, Config(tile=1), timed(1.0))
    [row] = store.trials()
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.median_us = 0.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(row)) == row
    store.close()
    assert row.config == Config(tile=1)  # still readable with the store closed


def test_bad_arguments_are_rejected_before_writing(store: Store):
    """A naive started_at or non-string versions raise ValueError and store nothing."""
    with pytest.raises(ValueError, match="timezone-aware"):
        record(store, Config(tile=1), timed(1.0), started_at=dt.datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="version strings"):
        store.record_trial(PROBLEM, Config(tile=1), timed(1.0), device=GPU, software={"jax": 10})
    with pytest.raises(ValueError, match="non-empty sequence"):
        store.record_baseline(PROBLEM, "xla", [], device=GPU, software=SOFTWARE)
    assert store.trials() == []


# --------------------------------------------------------------------------- queries


def test_best_ignores_failed_and_interpret_rows(store: Store):
    """best() returns only ok trials on the asked device kind, fastest first."""
    record(store, Config(tile=1), timed(10.0))
    record(store, Config(tile=2), timed(5.0, 6.0, 7.0))
    wrong = TrialResult(outcome=Outcome.WRONG_RESULT, samples_us=(1.0,), rel_error=0.5, timing="fake")
    record(store, Config(tile=3), wrong)
    record(store, Config(tile=4), TrialResult.failed(Outcome.INVALID, "bad"))
    record(store, Config(tile=5), timed(0.5), device=INTERPRET)
    record(store, Config(tile=6), timed(8.0), device=OTHER_GPU)

    assert [r.config["tile"] for r in store.best(PROBLEM)] == [2]
    assert [r.config["tile"] for r in store.best(PROBLEM, n=10)] == [2, 6, 1]
    assert [r.config["tile"] for r in store.best(PROBLEM, device_name="NVIDIA H200", n=10)] == [2, 1]
    assert [r.config["tile"] for r in store.best(PROBLEM, device_kind="interpret")] == [5]
    assert store.best(PROBLEM, device_name="cpu-interpret (x86_64)") == []  # kind gpu by default
    assert store.best(PROBLEM, device_name="NVIDIA B200") == []
    assert store.best(Problem("matmul", {"m": 1, "n": 1, "k": 1}, "bf16")) == []
    with pytest.raises(ValueError, match="positive integer"):
        store.best(PROBLEM, n=0)


def test_trials_filters(store: Store):
    """trials() filters by problem, kernel, device name and status."""
    other = Problem("attention", {"seq_len": 128}, "bf16")
    record(store, Config(tile=1), timed(1.0))
    record(store, Config(tile=2), TrialResult.failed(Outcome.CRASHED, "abort"), device=OTHER_GPU)
    store.record_trial(other, Config(block=64), timed(2.0), device=GPU, software=SOFTWARE)
    assert len(store.trials()) == 3
    assert [r.problem for r in store.trials(kernel="attention")] == [other]
    assert [r.config["tile"] for r in store.trials(PROBLEM, device_name=OTHER_GPU.name)] == [2]
    assert [r.config["tile"] for r in store.trials(PROBLEM, status=Outcome.OK)] == [1]
    assert store.problems(kernel="attention") == [other]
    assert set(store.devices()) == {GPU, OTHER_GPU}


def test_baselines_round_trip_and_keep_the_first(store: Store):
    """record_baseline stores once per (problem, device, software, name); baseline() picks the fastest."""
    xla = store.record_baseline(PROBLEM, "xla", [20.0, 22.0, 21.0], device=GPU, software=SOFTWARE)
    again = store.record_baseline(PROBLEM, "xla", [1.0], device=GPU, software=SOFTWARE)
    cudnn = store.record_baseline(PROBLEM, "cudnn", [15.0], device=GPU, software=SOFTWARE)
    store.record_baseline(PROBLEM, "xla", [900.0], device=INTERPRET, software=SOFTWARE)
    assert again == xla and cudnn != xla
    best = store.baseline(PROBLEM)
    assert best is not None and (best.name, best.median_us) == ("cudnn", 15.0)
    row = store.baseline(PROBLEM, name="xla")
    assert row is not None and row.id == xla and row.device == GPU and row.software == SOFTWARE
    assert (row.median_us, row.min_us, row.max_us, row.samples_us) == (21.0, 20.0, 22.0, (20.0, 22.0, 21.0))
    assert row.measured_at.tzinfo == dt.UTC
    interp = store.baseline(PROBLEM, device_kind="interpret")
    assert interp is not None and interp.median_us == 900.0
    assert store.baseline(PROBLEM, device_name="NVIDIA H100 80GB HBM3") is None


def test_trace_regions_round_trip(store: Store):
    """Trace regions read back by trial and mark it traced; re-recording keeps the first; unknown trials fail."""
    trial = record(store, Config(tile=1), timed(1.0))
    assert store.trial(trial.id).traced is False
    store.record_trace_regions(trial.id, {"mainloop": (8.5, 32), "epilogue": (1.25, 1)}, "/tmp/t.json")
    store.record_trace_regions(trial.id, {"mainloop": (99.0, 1), "prologue": (0.5, 1)}, "/tmp/u.json")
    regions = {r.region: r for r in store.trace_regions(trial.id)}
    assert regions["mainloop"] == rows.TraceRegionRow(trial.id, "mainloop", 8.5, 32, "/tmp/t.json")
    assert regions["epilogue"].median_us == 1.25 and regions["prologue"].trace_path == "/tmp/u.json"
    assert [row.traced for row in store.best(PROBLEM)] == [True]
    with pytest.raises(StorageError, match="no trial with that id"):
        store.record_trace_regions(trial.id + 1000, {"x": (1.0, 1)}, "/tmp/t.json")


def test_summaries_count_trials_per_problem_and_device(store: Store):
    """summaries() counts trials by outcome per (problem, device) with the best time."""
    record(store, Config(tile=1), timed(10.0))
    record(store, Config(tile=2), timed(4.0))
    record(store, Config(tile=3), TrialResult.failed(Outcome.COMPILE_ERROR, "x"))
    record(store, Config(tile=4), timed(1.0), device=INTERPRET)
    store.record_baseline(PROBLEM, "xla", [8.0], device=GPU, software=SOFTWARE)
    gpu, interp = store.summaries()
    assert (gpu.device, gpu.device_kind, gpu.by_status) == ("NVIDIA H200", "gpu", {"ok": 2, "compile_error": 1})
    assert (gpu.best_us, gpu.best_config, gpu.total) == (4.0, {"tile": 2}, 3)
    assert (gpu.baseline_name, gpu.baseline_us) == ("xla", 8.0)
    assert (interp.device_kind, interp.best_us, interp.baseline_name) == ("interpret", 1.0, None)
    assert store.summaries(device_kind="interpret") == [interp]
    assert store.summaries(kernel="attention") == []


# --------------------------------------------------------------------------- URLs, files


def test_default_url_is_results_autotune_db_under_cwd(tmp_path, monkeypatch):
    """Without a URL or AUTOTUNE_DB the store is results/autotune.db under the cwd."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_DB", raising=False)
    with Store() as store:
        assert store.url == f"sqlite:///{tmp_path}/results/autotune.db"
    assert (tmp_path / "results" / "autotune.db").is_file()


def test_env_var_and_argument_choose_the_database(tmp_path, monkeypatch):
    """AUTOTUNE_DB overrides the default, and an argument overrides AUTOTUNE_DB."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_DB", "sqlite:///from_env/a.db")
    assert resolve_url(None).database == str(tmp_path / "from_env" / "a.db")
    assert resolve_url("sqlite:///arg.db").database == str(tmp_path / "arg.db")
    assert resolve_url("plain/path.db").database == str(tmp_path / "plain" / "path.db")


def test_postgresql_urls_use_psycopg3():
    """postgresql:// and postgres:// URLs are mapped to the psycopg 3 driver."""
    for text in ("postgresql://u:pw@db.example:5433/at", "postgres://u:pw@db.example:5433/at"):
        url = resolve_url(text)
        assert url.drivername == "postgresql+psycopg"
        assert (url.host, url.port, url.database, url.password) == ("db.example", 5433, "at", "pw")
    assert resolve_url("postgresql+psycopg://u@h/d").drivername == "postgresql+psycopg"
    with pytest.raises(StorageError, match="not a database URL"):
        resolve_url("postgresql://host:port/db")
    with pytest.raises(StorageError, match="Cannot use the database URL"):
        Store("nope://")


def test_unreachable_server_is_a_storage_error():
    """A server that refuses connections gives a StorageError without the password."""
    with pytest.raises(StorageError, match="Cannot open the database") as info:
        Store("postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2")
    assert "secret" not in str(info.value)


def test_sqlite_is_wal_with_busy_timeout_and_begin_immediate(tmp_path):
    """SQLite connections use WAL, a 30 s busy timeout, foreign keys, and BEGIN IMMEDIATE writes."""
    with Store(f"sqlite:///{tmp_path}/a.db") as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        statements: list[str] = []
        sa.event.listen(
            store.engine, "before_cursor_execute", lambda c, cur, s, *a: statements.append(s)
        )
        record(store, Config(tile=1), timed(1.0))
        store.trials()
    begins = [s for s in statements if s.startswith("BEGIN")]
    assert begins == ["BEGIN IMMEDIATE", "BEGIN"]  # the write, then the read


def test_a_closed_writer_leaves_every_result_in_the_file_itself(tmp_path):
    """SQLite folds its write-ahead log into the file only when the last connection closes. A
    program that tunes and then looks up keeps Optuna's engine and a query's reader open past
    the writer (measured: a tune and a lookup left the whole database in ``<file>-wal``, the
    file 4 KiB), so closing the writer moves the log into the file itself: a copy of the file
    alone holds every result."""
    import shutil
    import sqlite3

    path = tmp_path / "a.db"
    with Store(f"sqlite:///{path}") as store:
        other = sqlite3.connect(path)  # outlives the writer, as Optuna's engine does
        other.execute("SELECT count(*) FROM sqlite_master").fetchone()
        record(store, Config(tile=1), timed(1.0))
        record(store, Config(tile=2), timed(2.0))
    try:
        shutil.copyfile(path, tmp_path / "copy.db")  # the file alone, not its -wal
        copy = sqlite3.connect(tmp_path / "copy.db")
        assert copy.execute("SELECT count(*) FROM at_trials").fetchone() == (2,)
        copy.close()
    finally:
        other.close()
    # A reader checkpoints nothing; nor does a store of another kind.
    with Store(f"sqlite:///{path}", read_only=True) as reader:
        assert reader.checkpoint() is False
    with Store("sqlite://") as memory:
        assert memory.checkpoint() is False


def test_a_checkpoint_behind_a_readers_open_read_keeps_the_log(tmp_path):
    """A reader in the middle of a read holds back the log's newer frames: the checkpoint does
    not wait for it, says the file lacks some (False) and loses nothing; once the read ends,
    the next copies the rest."""
    import sqlite3

    path = tmp_path / "a.db"
    store = Store(f"sqlite:///{path}")
    record(store, Config(tile=1), timed(1.0))
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM at_trials").fetchone() == (1,)
    record(store, Config(tile=2), timed(2.0))
    assert store.checkpoint() is False
    reader.execute("COMMIT")
    reader.close()
    assert store.checkpoint() is True
    store.close()
    copy = sqlite3.connect(path)
    assert copy.execute("SELECT count(*) FROM at_trials").fetchone() == (2,)
    copy.close()


def test_corrupted_sqlite_file_is_a_storage_error_and_left_untouched(tmp_path):
    """A file that is not a database raises StorageError naming it and is not modified."""
    path = tmp_path / "autotune.db"
    garbage = b"this is not an sqlite database\x00\xff" * 200
    path.write_bytes(garbage)
    with pytest.raises(StorageError, match="not an SQLite database") as info:
        Store(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.db"]


# --------------------------------------------------------------------------- migrations


def _differences_from_the_models(conn: sa.Connection) -> list[object]:
    """alembic's autogenerate comparison of the at_ tables with the models (none: []), once
    the database is recorded at the head."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={
        "version_table": storage.VERSION_TABLE, "compare_type": True,
        "include_name": lambda name, type_, parents: type_ != "table" or name.startswith("at_"),
    })
    assert context.get_current_heads() == (HEAD,)
    return list(compare_metadata(context, schema.Base.metadata))


def test_migrations_create_the_schema_from_empty(db_url: str):
    """Opening an empty database creates exactly the at_ tables, at head, matching the models."""
    with Store(db_url) as store:
        with store.engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) == AT_TABLES
            assert _differences_from_the_models(conn) == []
    with Store(db_url) as store:  # reopening is a no-op
        assert store.trials() == []


def _schema_of(conn: sa.Connection) -> dict[str, dict[str, object]]:
    """Every at_ table as the database describes it (SQLAlchemy's inspector): its columns
    (type, nullability, server default), primary key, foreign keys, indexes and unique
    constraints, by name. Column order is left out: a migration appends the columns it adds."""
    inspector = sa.inspect(conn)
    out: dict[str, dict[str, object]] = {}
    for table in sorted(t for t in inspector.get_table_names() if t.startswith("at_")):
        out[table] = {
            "columns": {c["name"]: (str(c["type"]), c["nullable"], c.get("default"))
                        for c in inspector.get_columns(table)},
            "pk": inspector.get_pk_constraint(table),
            "fks": sorted((f["name"], tuple(f["constrained_columns"]), f["referred_table"],
                           tuple(f["referred_columns"])) for f in inspector.get_foreign_keys(table)),
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                              for i in inspector.get_indexes(table)),
            "unique": sorted((u["name"], tuple(u["column_names"]))
                             for u in inspector.get_unique_constraints(table)),
        }
    return out


def test_a_fresh_schema_is_the_one_every_migration_builds(db_url: str, monkeypatch):
    """Opening a database without autotune's tables creates them from the models and records
    the head (no migration runs); the schema is the one running every migration from 0001
    builds: the same tables, columns, keys, indexes and constraints (the inspector), and
    alembic's autogenerate finds no difference between either and the models."""
    from alembic import command

    engine = connection.make_engine(resolve_url(db_url))
    try:
        with engine.begin() as conn:
            command.upgrade(connection._alembic_config(conn), "head")
        with engine.connect() as conn:
            migrated = _schema_of(conn)
            assert _differences_from_the_models(conn) == []
        with engine.begin() as conn:
            schema.Base.metadata.drop_all(conn)
            conn.execute(sa.text(f"DROP TABLE {storage.VERSION_TABLE}"))
            assert _schema_of(conn) == {}
    finally:
        engine.dispose()

    def no_migration(*args: object, **kwargs: object) -> None:
        raise AssertionError("a fresh database ran the migrations")

    monkeypatch.setattr(command, "upgrade", no_migration)
    with Store(db_url) as store, store.engine.connect() as conn:
        created = _schema_of(conn)
        assert _differences_from_the_models(conn) == []
    assert set(created) == AT_TABLES
    assert created == migrated


def test_a_schema_committed_between_two_reads_of_the_check_is_not_a_damaged_record(
        db_url: str, monkeypatch):
    """The schema check reads one snapshot: another process committing the whole schema
    between its read of the version table and its list of tables is no "tables without a
    version record" (PostgreSQL's READ COMMITTED showed it, and a runner of a job sharing a
    fresh database stopped with SchemaRecordError); the opening goes on to find the head."""
    real = connection._version_rows
    committed: list[str] = []

    def then_another_process_commits(conn: sa.Connection) -> list[str] | None:
        rows = real(conn)
        if rows is None and not committed:
            committed.append("schema")
            Store(db_url).close()  # another connection creates the schema and commits
        return rows

    monkeypatch.setattr(connection, "_version_rows", then_another_process_commits)
    with Store(db_url) as store, store.engine.connect() as conn:
        assert committed == ["schema"]
        found = conn.execute(sa.text(f"SELECT version_num FROM {storage.VERSION_TABLE}")).scalars()
        assert list(found) == [HEAD]


def test_migration_0001_to_0002_adds_the_lookup_index(db_url: str):
    """A database at revision 0001 gets ix_at_trials_rank when opened, keeping its trials."""
    from alembic import command

    def indexes(store: Store) -> dict[str, list[str]]:
        with store.engine.connect() as conn:
            return {i["name"]: i["column_names"] for i in sa.inspect(conn).get_indexes("at_trials")}

    with Store(db_url) as store:
        record(store, Config(tile=1), timed(5.0))
        with store.engine.begin() as conn:
            command.downgrade(connection._alembic_config(conn), "0001")
        assert "ix_at_trials_rank" not in indexes(store)
    with Store(db_url) as store:  # opening migrates 0001 -> 0002
        assert indexes(store)["ix_at_trials_rank"] == ["problem_id", "status", "median_us"]
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM at_alembic_version")).scalar() == HEAD
        assert [r.median_us for r in store.best(PROBLEM)] == [5.0]


def test_newer_schema_version_is_refused(db_url: str):
    """A schema version this code does not know raises StorageError and changes nothing."""
    with Store(db_url) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE at_alembic_version SET version_num = '9999_future'"))
    with pytest.raises(StorageError, match="9999_future.*newer autotune"):
        Store(db_url)
    engine = sa.create_engine(resolve_url(db_url))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM at_alembic_version")).scalar() == "9999_future"
    engine.dispose()


def test_read_only_store_reads_and_never_writes(db_url: str):
    """A read-only store (what queries and read commands open) reads what a writer stored and
    refuses every write: SQLite's mode=ro, PostgreSQL's read-only transactions."""
    with Store(db_url) as writer:
        record(writer, Config(tile=1), timed(5.0))
    with Store(db_url, read_only=True, timeout_s=2) as reader:
        assert reader.read_only
        assert [r.median_us for r in reader.best(PROBLEM)] == [5.0]
        with pytest.raises(StorageError, match="read-only|readonly"):
            record(reader, Config(tile=2), timed(4.0))
    with Store(db_url) as writer:
        assert len(writer.trials()) == 1


def test_read_only_store_upgrades_an_older_schema_only_when_sound(tmp_path):
    """A read command on an older schema upgrades it as before; on a damaged older file it
    refuses, and the file is left byte for byte as it was."""
    from alembic import command

    url = f"sqlite:///{tmp_path}/a.db"
    with Store(url) as store:
        for i in range(300):
            record(store, Config(tile=i), timed(5.0 + i))
        with store.engine.begin() as conn:
            command.downgrade(connection._alembic_config(conn), "0001")
    path = tmp_path / "a.db"
    healthy = path.read_bytes()
    with Store(url, read_only=True) as reader:
        assert [r.median_us for r in reader.best(PROBLEM)][:1] == [5.0]
        with reader.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM at_alembic_version")).scalar() == HEAD
    path.write_bytes(healthy)
    for sidecar in tmp_path.glob("a.db-*"):
        sidecar.unlink()
    data = bytearray(healthy)
    page = int.from_bytes(data[16:18], "big")
    for i in range(len(data) // page - 4, len(data) // page):  # the last pages: trial rows
        data[i * page:(i + 1) * page] = b"\xa5" * page
    path.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="malformed|damaged"):
        Store(url, read_only=True)
    assert path.read_bytes() == bytes(data)


def test_a_damaged_file_is_named_in_one_line_whatever_quick_check_lists(tmp_path):
    """SQLite's quick_check lists one line per damaged cell ("*** in database main ***", then
    "On tree page N cell M: ..."): the error keeps them on one line, so the CLI's single
    "autotune: error:" line holds the whole message."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/a.db"
    path = tmp_path / "a.db"
    with Store(url) as store:
        record(store, Config(tile=1), timed(5.0))
    conn = sqlite3.connect(path)  # a table of its own to damage, beside the store's
    with conn:
        conn.execute("CREATE TABLE filler (a INTEGER PRIMARY KEY, b TEXT)")
        conn.execute("CREATE INDEX filler_b ON filler (b)")
        conn.executemany("INSERT INTO filler (b) VALUES (?)", [(str(i) * 20,) for i in range(3000)])
    conn.close()  # the last connection: its pages written back from the WAL into the file
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    last = len(data) // page - 3  # an index page: its cells' offsets zeroed
    data[last * page + 8:last * page + 64] = bytes(56)
    path.write_bytes(bytes(data))
    conn = sqlite3.connect(path)
    assert "\n" in conn.execute("PRAGMA quick_check").fetchone()[0]
    conn.close()
    with pytest.raises(StorageError, match="quick_check: [*]{3} in database main") as info:
        Store(url)
    assert "\n" not in str(info.value) and "move it aside" in str(info.value)
    assert path.read_bytes() == bytes(data)


def test_read_timeout_comes_from_the_argument_or_the_environment(monkeypatch):
    """read_timeout_s: the argument, else $AUTOTUNE_READ_TIMEOUT_S, else 5 s; nonsense is a
    StorageError naming the value."""
    monkeypatch.delenv(urls.READ_TIMEOUT_ENV, raising=False)
    assert urls.read_timeout_s() == 5.0
    monkeypatch.setenv(urls.READ_TIMEOUT_ENV, "2.5")
    assert urls.read_timeout_s() == 2.5
    assert urls.read_timeout_s(1) == 1.0
    for bad in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(StorageError, match="positive, finite"):
            urls.read_timeout_s(bad)
    monkeypatch.setenv(urls.READ_TIMEOUT_ENV, "soon")
    with pytest.raises(StorageError, match="AUTOTUNE_READ_TIMEOUT_S.*'soon'"):
        urls.read_timeout_s()


# --------------------------------------------------------------------------- concurrency


def _worker(url: str, worker: int, n: int, shared: bool, barrier, queue) -> None:
    try:
        barrier.wait(timeout=60)
        store = Store(url)  # all four open (and migrate) the empty database at once
        duplicates = 0
        for i in range(n):
            config = Config(tile=i) if shared else Config(tile=i, worker=worker)
            recorded = store.record_trial(
                PROBLEM, config, timed(float(i + 1)), device=GPU, software=SOFTWARE,
                worker=f"w{worker}",
            )
            duplicates += recorded.duplicate
        store.close()
        queue.put((worker, duplicates, ""))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put((worker, -1, f"{type(e).__name__}: {e}"))


def _run_workers(url: str, n: int, shared: bool) -> list[tuple[int, int, str]]:
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, w, n, shared, barrier, queue)) for w in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sorted(results)


def _open(url: str, delay: float, barrier, queue) -> None:
    import time

    try:
        barrier.wait(timeout=60)
        time.sleep(delay)
        Store(url).close()
        queue.put("")
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put(f"{type(e).__name__}: {e}")


def test_processes_creating_one_fresh_schema_at_once_all_open_it(db_url: str):
    """6 processes open one fresh database at staggered moments within 0.15 s (one creates the
    schema while others read, wait for the lock or find it made): every one opens it, and the
    database holds autotune's tables once, with one schema version record, the head."""
    import random

    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(6), ctx.Queue()
    delays = [0.0, 0.15] + [random.uniform(0.0, 0.15) for _ in range(4)]
    procs = [ctx.Process(target=_open, args=(db_url, d, barrier, queue)) for d in delays]
    for p in procs:
        p.start()
    errors = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert errors == [""] * len(procs)
    engine = connection.make_engine(resolve_url(db_url))
    try:
        with engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) == AT_TABLES
            found = conn.execute(sa.text(f"SELECT version_num FROM {storage.VERSION_TABLE}"))
            assert list(found.scalars()) == [HEAD]
    finally:
        engine.dispose()


def test_four_processes_writing_at_once_lose_nothing(db_url: str):
    """4 spawned processes x 50 trials on one fresh database: all 200 stored, no lock errors."""
    results = _run_workers(db_url, 50, shared=False)
    assert [error for _, _, error in results] == [""] * 4
    assert [dups for _, dups, _ in results] == [0] * 4
    with Store(db_url) as store:
        rows = store.trials(PROBLEM)
    assert len(rows) == 200
    assert {(r.config["worker"], r.config["tile"]) for r in rows} == {(w, i) for w in range(4) for i in range(50)}


def test_racing_processes_store_each_config_once(db_url: str):
    """4 processes recording the same 25 configs: 25 rows, 75 reported duplicates, no errors."""
    results = _run_workers(db_url, 25, shared=True)
    assert [error for _, _, error in results] == [""] * 4
    assert sum(dups for _, dups, _ in results) == 75
    with Store(db_url) as store:
        assert sorted(r.config["tile"] for r in store.trials()) == list(range(25))


# --------------------------------------------------------------------------- Optuna


def test_optuna_and_store_share_a_database_store_first(db_url: str):
    """Optuna's RDB storage works on a database the Store created, and vice versa after."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with Store(db_url) as store:
        record(store, Config(tile=1), timed(1.0))
    study = optuna.create_study(storage=db_url, study_name="s1")
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=3)
    with Store(db_url) as store:
        record(store, Config(tile=2), timed(2.0), study_name="s1", optuna_trial_number=0)
        assert len(store.trials()) == 2
        with store.engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
    assert AT_TABLES <= tables and {"studies", "trials", "version_info", "alembic_version"} <= tables
    assert len(optuna.load_study(study_name="s1", storage=db_url).trials) == 3


def test_optuna_and_store_share_a_database_optuna_first(db_url: str):
    """The Store migrates a database Optuna created without touching Optuna's version table."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=db_url, study_name="s2")
    study.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=2)
    engine = sa.create_engine(resolve_url(db_url))
    read_version = sa.text("SELECT version_num FROM alembic_version")
    with engine.connect() as conn:
        optuna_version = conn.execute(read_version).scalar()
    with Store(db_url) as store:
        record(store, Config(tile=1), timed(1.0))
        assert len(store.trials()) == 1
    with engine.connect() as conn:
        assert conn.execute(read_version).scalar() == optuna_version
    engine.dispose()
    reloaded = optuna.load_study(study_name="s2", storage=db_url)
    reloaded.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=1)
    assert len(reloaded.trials) == 3


def test_migrations_ship_inside_the_package():
    """The alembic scripts live in the autotune package, found without an alembic.ini."""
    migrations = pathlib.Path(storage.__file__).parent / "migrations"
    assert (migrations / "env.py").is_file() and (migrations / "versions" / "0001_initial.py").is_file()


# --------------------------------------------------------------------------- measurements (0003)


def test_migration_0002_to_0003_keeps_every_row_as_warm(db_url: str):
    """Rows stored before revision 0003 read back unchanged with the warm policy (spread from
    their samples); a cold timing of the same config is a new row, a warm one a duplicate."""
    from alembic import command

    with Store(db_url) as store:
        first = record(store, Config(tile=1), timed(5.0, 6.0, 7.0))
        store.record_baseline(PROBLEM, "xla", [9.0, 10.0], device=GPU, software=SOFTWARE)
        with store.engine.begin() as conn:
            command.downgrade(connection._alembic_config(conn), "0002")
    with Store(db_url) as store:  # opening migrates 0002 -> 0003
        [row] = store.trials(PROBLEM)
        assert (row.id, row.median_us, row.cache_policy, row.stored_spread) == (first.id, 6.0, "warm", None)
        assert row.spread == pytest.approx(1.6 / 6.0)
        assert store.baseline(PROBLEM).cache_policy == "warm"
        assert record(store, Config(tile=1), timed(5.0)).duplicate
        cold = store.record_trial(PROBLEM, Config(tile=1), timed(8.0), device=GPU,
                                  software=SOFTWARE, cache="cold")
        assert not cold.duplicate and store.trial(cold.id).cache_policy == "cold"
        assert store.record_baseline(PROBLEM, "xla", [12.0], device=GPU, software=SOFTWARE,
                                     cache="cold") != store.baseline(PROBLEM, cache="warm").id


def test_best_and_baselines_never_mix_cache_policies(store: Store):
    """best() ranks one policy's trials only: cold when there are any, else warm, or the one
    asked for; baselines likewise."""
    record(store, Config(tile=1), timed(5.0))  # warm
    assert [r.median_us for r in store.best(PROBLEM)] == [5.0]
    store.record_trial(PROBLEM, Config(tile=2), timed(9.0), device=GPU, software=SOFTWARE,
                       cache="cold")
    assert [(r.median_us, r.cache_policy) for r in store.best(PROBLEM, n=5)] == [(9.0, "cold")]
    assert [r.median_us for r in store.best(PROBLEM, n=5, cache="warm")] == [5.0]
    assert store.preferred_policy(PROBLEM) == "cold"
    store.record_baseline(PROBLEM, "xla", [3.0], device=GPU, software=SOFTWARE, cache="warm")
    assert store.baseline(PROBLEM, cache="cold") is None
    with pytest.raises(ValueError, match="cache policy must be one of cold, warm"):
        store.best(PROBLEM, cache="lukewarm")
    kinds = {(s.cache_policy, s.best_us) for s in store.summaries()}
    assert kinds == {("warm", 5.0), ("cold", 9.0)}


def test_a_confirmation_round_is_stored_as_rows_of_its_own(store: Store):
    """The round, its programs' samples and tie marks read back; the search trials it names
    are unchanged; a trial of another problem is refused."""
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    ids = [record(store, Config(tile=t), timed(10.0 + t)).id for t in (1, 2)]
    before = store.trials(PROBLEM)
    rounds = lambda c: ((c, c * 1.001), (c * 1.002, c))  # noqa: E731
    confirmation = analyse_confirmation(
        [Candidate({"tile": 1}, rounds(10.0)), Candidate({"tile": 2}, rounds(10.005))],
        rounds(20.0), default_config={"tile": 2},
    )
    cid = store.record_confirmation(PROBLEM, confirmation, trial_ids=ids, device=GPU,
                                    software=SOFTWARE, cache="cold", iterations=2,
                                    baseline_name="xla")
    [row] = store.confirmations(PROBLEM)
    assert row.id == cid and row.cache_policy == "cold" and (row.rounds, row.iterations) == (2, 2)
    assert (row.fastest_trial_id, row.crowned_trial_id) == (ids[0], ids[1])
    assert row.crowned.config == {"tile": 2} and row.programs[1].tie
    assert row.programs[0].rounds_us == rounds(10.0)
    assert row.speedup == pytest.approx(confirmation.speedup)
    assert row.baseline_rounds_us == rounds(20.0) and row.to_dict()["config"] == {"tile": 2}
    assert store.trials(PROBLEM) == before
    assert store.confirmations(PROBLEM, cache="warm") == []
    other = Problem("matmul", {"m": 512, "n": 256, "k": 128}, "bf16")
    with pytest.raises(ValueError, match="not a stored trial of"):
        store.record_confirmation(other, confirmation, trial_ids=ids, device=GPU,
                                  software=SOFTWARE, cache="cold", iterations=2, baseline_name=None)


def test_a_config_raced_out_of_a_round_keeps_its_fewer_rounds(store: Store):
    """A round whose first config was raced out after 2 of its 3 rounds stores that config's
    2 rounds and the others' 3; the round's count is the longest, 3."""
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    ids = [record(store, Config(tile=t), timed(10.0 + t)).id for t in (1, 2)]
    three = ((10.0, 10.01), (10.02, 10.0), (10.01, 10.0))
    confirmation = analyse_confirmation(
        [Candidate({"tile": 1}, ((12.0, 12.1), (12.1, 12.0))), Candidate({"tile": 2}, three)],
        tuple((20.0, 20.0) for _ in range(3)))
    store.record_confirmation(PROBLEM, confirmation, trial_ids=ids, device=GPU,
                              software=SOFTWARE, cache="cold", iterations=2, baseline_name="xla")
    [row] = store.confirmations(PROBLEM)
    assert row.rounds == 3 and len(row.baseline_rounds_us) == 3
    assert [len(p.rounds_us) for p in row.programs] == [2, 3]
    assert row.crowned.config == {"tile": 2}


def test_a_summary_carries_the_newest_program_check_of_its_own_confirmation(store: Store):
    """On both backends: each summary's program_check is the newest verification row of method
    PROGRAM_METHOD tied to that summary's confirmation round (a check of an older round, or a
    verification of another method, never answers); summaries read every check in one statement,
    however many problems there are."""
    from autotune.space.outcomes import PROGRAM_METHOD
    from autotune.tuning.confirmation import Candidate, analyse_confirmation
    from autotune.tuning.verify import VerifyTarget, analyse

    rounds = lambda c: ((c, c * 1.001), (c * 1.002, c))  # noqa: E731

    def confirm(problem: Problem) -> int:
        tid = store.record_trial(problem, Config(tile=1), timed(10.0), device=GPU,
                                 software=SOFTWARE, cache="warm").id
        confirmation = analyse_confirmation([Candidate({"tile": 1}, rounds(10.0))],
                                            rounds(20.0), default_config=None)
        return store.record_confirmation(problem, confirmation, trial_ids=[tid], device=GPU,
                                         software=SOFTWARE, cache="warm", iterations=2,
                                         baseline_name="xla")

    def check(problem: Problem, cid: int, kernel_us: float, method: str = PROGRAM_METHOD) -> int:
        target = VerifyTarget(problem, Config(tile=1), (), 2.0, None, None, "xla", cid)
        return store.record_verification(problem, analyse(
            target, [(kernel_us,)] * 3, [(20.0,)] * 3, method=method, calls=20),
            device=GPU, software=SOFTWARE)

    def statements_of_summaries() -> int:
        seen: list[str] = []
        listener = lambda c, cur, s, *a: seen.append(s)  # noqa: E731
        sa.event.listen(store.engine, "before_cursor_execute", listener)
        try:
            store.summaries()
        finally:
            sa.event.remove(store.engine, "before_cursor_execute", listener)
        return len([s for s in seen if s.lstrip().upper().startswith(("SELECT", "WITH"))])

    older = confirm(PROBLEM)
    check(PROBLEM, older, 8.0)  # the kernel 2.5x faster: of the older round, never answers
    newer = confirm(PROBLEM)
    [summary] = store.summaries()
    assert summary.confirmation.id == newer and summary.program_check is None
    assert summary.verdict_figures.source == "confirmation"
    check(PROBLEM, newer, 30.0)  # XLA faster as a program calls them
    newest = check(PROBLEM, newer, 25.0)
    check(PROBLEM, newer, 5.0, method="cupti-independent")  # another method: not a check
    [summary] = store.summaries()
    assert summary.program_check.id == newest and summary.program_check.confirmation_id == newer
    assert summary.program_check.speedup == pytest.approx(20.0 / 25.0)
    verdict = summary.verdict_figures
    assert verdict.source == "program-check" and verdict.speedup == pytest.approx(0.8)
    record_dict = summary.to_dict()
    assert record_dict["verdict_source"] == "program-check"
    assert record_dict["program_speedup"] == pytest.approx(0.8)
    assert record_dict["confirmed_speedup"] == pytest.approx(summary.confirmation.speedup)
    one = statements_of_summaries()
    for m in (512, 1024, 2048):  # three more problems, each confirmed and checked
        other = Problem("matmul", {"m": m, "n": 256, "k": 128}, "bf16")
        check(other, confirm(other), 9.0)
    assert all(s.program_check is not None for s in store.summaries())
    assert statements_of_summaries() == one


def test_job_runs_keep_the_clocks_before_and_after(store: Store):
    """A run's clocks and warnings read back as stored."""
    run_id = store.start_run("job", device=GPU, cache="cold",
                             clocks_before={"available": True, "sm_clock_mhz": 1980})
    store.finish_run(run_id, clocks_after={"available": True, "sm_clock_mhz": 1755},
                     warnings=["the SM clock moved"])
    [run] = store.runs()
    assert (run.job, run.cache_policy, run.device) == ("job", "cold", GPU)
    assert run.clocks_before["sm_clock_mhz"] == 1980 and run.clocks_after["sm_clock_mhz"] == 1755
    assert run.warnings == ("the SM clock moved",) and run.finished_at >= run.started_at
    with pytest.raises(StorageError, match="no job run 99"):
        store.finish_run(99, clocks_after={})


def test_migration_0003_to_0004_adds_verifications_and_keeps_every_row(db_url: str):
    """A database at revision 0003 gets at_verifications when opened; its trials and baselines
    read back unchanged, and a verification is then stored as a row of its own."""
    from alembic import command

    from autotune.tuning.verify import VerifyTarget, analyse

    with Store(db_url) as store:
        first = record(store, Config(tile=1), timed(5.0, 6.0, 7.0))
        store.record_baseline(PROBLEM, "xla", [9.0, 10.0], device=GPU, software=SOFTWARE)
        with store.engine.begin() as conn:
            command.downgrade(connection._alembic_config(conn), "0003")
            assert "at_verifications" not in sa.inspect(conn).get_table_names()
    with Store(db_url) as store:  # opening migrates 0003 -> 0004
        [row] = store.trials(PROBLEM)
        assert (row.id, row.median_us) == (first.id, 6.0)
        assert store.verifications() == []
        target = VerifyTarget(PROBLEM, Config(tile=1), (), 1.5, 6.0, 9.0, "xla", None)
        v = analyse(target, [(6.0,), (6.1,)], [(9.0,), (9.2,)], method="fake", calls=3)
        vid = store.record_verification(PROBLEM, v, device=GPU, software=SOFTWARE)
        [stored] = store.verifications(PROBLEM)
        assert (stored.id, stored.config, stored.rounds, stored.stored_speedup) == (
            vid, Config(tile=1), 2, 1.5)
        assert [r.id for r in store.trials(PROBLEM)] == [first.id]


def test_the_head_read_without_alembic_is_alembics():
    """The schema head read from the migration scripts' text (the fast path of every open,
    without importing alembic) is the head alembic computes."""
    from alembic.script import ScriptDirectory

    from autotune.storage import connection

    script = ScriptDirectory.from_config(connection._alembic_config())
    assert connection._script_head() == script.get_current_head()


def test_opening_an_up_to_date_store_does_not_import_alembic(tmp_path):
    """A store whose schema is at head opens (and answers a query) without importing alembic or
    numpy: ``autotune best`` stays light (issue 36)."""
    import subprocess
    import sys

    db = tmp_path / "light.db"
    storage.Store(f"sqlite:///{db}").close()
    code = (f"import sys; from autotune.queries.best import best_config; "
            f"from autotune.storage.store import Store; Store('sqlite:///{db}').close(); "
            "print(sorted(m for m in ('alembic', 'numpy', 'optuna', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

# --------------------------------------------------------------------------- device facts (0005)


def test_device_facts_are_stored_with_the_device_row(db_url: str):
    """A device's facts (autotune.devices.DeviceFacts) are stored with its row and read back
    with every trial and device; they are not part of its identity (the same device with and
    without facts is one row); a row stored without them gets them at the next job run's start."""
    import dataclasses

    from autotune.devices import profile

    facts = dataclasses.replace(profile("h100-pcie"), source="driver")
    pcie = DeviceInfo("NVIDIA H100 PCIe", "gpu", "9.0", "570.86", facts=facts)
    bare = DeviceInfo("NVIDIA H100 PCIe", "gpu", "9.0", "570.86")
    assert pcie == bare and hash(pcie) == hash(bare)
    with Store(db_url) as store:
        record(store, Config(tile=1), timed(5.0), device=pcie)
        record(store, Config(tile=2), timed(6.0), device=bare)
        record(store, Config(tile=3), timed(7.0), device=GPU)  # no facts
        by_name = {d.name: d for d in store.devices()}
        assert len(by_name) == 2
        assert by_name["NVIDIA H100 PCIe"].facts == facts
        assert by_name["NVIDIA H200"].facts is None
        assert {r.config["tile"]: r.device.facts for r in store.trials(PROBLEM)} == {
            1: facts, 2: facts, 3: None}
        h200 = dataclasses.replace(GPU, facts=profile("h200"))
        store.start_run("job", device=h200, cache="cold", clocks_before={})
        assert {d.name: d.facts for d in store.devices()}["NVIDIA H200"] == profile("h200")


def test_migration_0003_to_0005_adds_device_facts_keeping_devices(db_url: str):
    """A database at revision 0003 gets at_devices.facts (NULL) when opened; its devices and
    trials read back unchanged; unreadable facts read as None, never an error."""
    from alembic import command

    with Store(db_url) as store:
        record(store, Config(tile=1), timed(5.0))
        with store.engine.begin() as conn:
            command.downgrade(connection._alembic_config(conn), "0003")
            assert "facts" not in {c["name"] for c in sa.inspect(conn).get_columns("at_devices")}
    with Store(db_url) as store:
        assert [(d.name, d.facts) for d in store.devices()] == [("NVIDIA H200", None)]
        assert [r.median_us for r in store.best(PROBLEM)] == [5.0]
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE at_devices SET facts = '{\"num_sms\": \"many\"'"))
        assert store.devices()[0].facts is None

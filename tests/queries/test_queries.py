"""Queries: best config and result per problem and device, listings, and no jax import."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from autotune.errors import JobError
from autotune.queries import best as queries
from autotune.queries.best import best_config, best_result, list_results, nearest_results
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store

H200 = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
SHAPE = {"m": 4096, "n": 4096, "k": 4096}
MATMUL = Problem("matmul", SHAPE, "bfloat16")
MATMUL_SMALL = Problem("matmul", {"m": 128, "n": 128, "k": 128}, "float16")  # interpret only
ATTENTION = Problem("attention", {"seq_len": 2048, "head_dim": 128, "causal": True}, "bfloat16")


def timed(*samples_us: float) -> TrialResult:
    return TrialResult.timed(samples_us, compile_s=1.0, rel_error=1e-3, timing="fake")


@pytest.fixture
def db(db_url: str) -> str:
    """A database with GPU and interpret results for a few problems."""
    with Store(db_url) as store:

        def add(problem: Problem, config: dict, result: TrialResult, device: DeviceInfo) -> None:
            store.record_trial(problem, Config(config), result, device=device, software=SOFTWARE)

        add(MATMUL, {"tile_m": 128, "tile_n": 128}, timed(900.0), H200)
        add(MATMUL, {"tile_m": 128, "tile_n": 256}, timed(700.0, 710.0), H200)
        add(MATMUL, {"tile_m": 64, "tile_n": 64}, TrialResult(Outcome.WRONG_RESULT, (10.0,)), H200)
        add(MATMUL, {"tile_m": 256, "tile_n": 256}, TrialResult.failed(Outcome.COMPILE_ERROR, "smem"), H200)
        add(MATMUL, {"tile_m": 64, "tile_n": 128}, timed(1000.0), H100)
        add(MATMUL, {"tile_m": 16, "tile_n": 16}, timed(1.0), INTERPRET)
        store.record_baseline(MATMUL, "xla", [1410.0], device=H200, software=SOFTWARE)
        store.record_baseline(MATMUL, "cudnn", [1900.0], device=H200, software=SOFTWARE)
        store.record_baseline(MATMUL, "xla", [0.5], device=INTERPRET, software=SOFTWARE)
        add(MATMUL_SMALL, {"tile_m": 32, "tile_n": 32}, timed(50.0), INTERPRET)
        add(ATTENTION, {"block_q": 64, "block_kv": 128}, timed(300.0), H200)
    return db_url


def test_public_api_is_pinned():
    """queries exports exactly the documented names."""
    assert sorted(queries.__all__) == sorted(
        [
            "best_config", "best_result", "list_results", "nearest_results", "shape_distance",
            "running_versions", "results_frame", "close_stores", "BestResult", "ProblemSummary",
            "FRAME_COLUMNS", "served_summaries", "unservable_results", "UnservableResult",
            "stored_kernels", "stored_trial_seconds", "check_device", "host_has_gpu",
            "faster_of", "choice_words", "margin_words", "verdict_figures", "Verdict", "FASTER",
            "runs_of", "written_runs", "RUNS",
        ]
    )


def test_importing_queries_does_not_import_jax():
    """import autotune.queries.best (and a query) never imports jax."""
    code = textwrap.dedent(
        """
        import sys
        import autotune.queries.best as q
        assert q.best_config("matmul", {"m": 1}, "bf16", db="sqlite:///:memory:") is None
        assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))
        """
    )
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_best_config_returns_the_kernels_parameter_names(db: str):
    """best_config returns the fastest ok GPU config as a plain dict of the kernel's parameters."""
    config = best_config("matmul", SHAPE, "bf16", db=db)
    assert config == {"tile_m": 128, "tile_n": 256} and type(config) is dict
    assert best_config("matmul", "m=4096,n=4096,k=4k", "bfloat16", db=db) == config
    assert best_config("attention", {"seq_len": 2048, "head_dim": 128, "causal": True}, "bf16", db=db) == {
        "block_q": 64,
        "block_kv": 128,
    }


def test_best_result_reports_baseline_device_and_versions(db: str):
    """best_result carries the time, device, jax version and ratio to the fastest baseline."""
    result = best_result("matmul", SHAPE, "bf16", db=db)
    assert result is not None
    assert (result.median_us, result.device, result.device_kind) == (705.0, "NVIDIA H200", "gpu")
    assert (result.baseline_name, result.baseline_us) == ("xla", 1410.0)
    assert result.ratio == pytest.approx(0.5) and result.speedup == pytest.approx(2.0)
    assert result.jax_version == "0.11.2" and result.problem == MATMUL
    assert result.measured_at.tzinfo == dt.UTC
    as_json = json.loads(json.dumps(result.to_dict()))
    assert as_json["config"] == {"tile_m": 128, "tile_n": 256} and as_json["shape"] == SHAPE
    assert dt.datetime.fromisoformat(as_json["measured_at"]) == result.measured_at


def test_nothing_stored_is_none(db: str):
    """A problem without results, or with only failed ones, answers None."""
    assert best_config("matmul", {"m": 1, "n": 1, "k": 1}, "bf16", db=db) is None
    assert best_result("flash", SHAPE, "bf16", db=db) is None


def test_default_leaves_interpret_results_out_unless_asked_for(db: str, monkeypatch):
    """Interpret-mode rows are functional runs, not GPU timings: on a machine with a GPU the
    default answer (GPU only) is None without GPU results; device='interpret' returns them,
    labelled as such."""
    monkeypatch.setattr(queries, "host_has_gpu", lambda: True)
    small = {"m": 128, "n": 128, "k": 128}
    assert best_result("matmul", small, "f16", db=db) is None
    assert nearest_results("matmul", small, "f16", db=db) == [] or all(
        r.device_kind == "gpu" for r in nearest_results("matmul", small, "f16", db=db))
    result = best_result("matmul", small, "f16", device="interpret", db=db)
    assert result is not None and result.device_kind == "interpret"
    assert result.config == {"tile_m": 32, "tile_n": 32} and result.baseline_name is None


def test_without_a_gpu_the_default_answers_with_interpret_results_labelled(db: str, monkeypatch):
    """On a machine without a GPU, a problem with no GPU result is answered from its
    interpret-mode results (what ran there), labelled as interpret; a problem with GPU results
    still gets those."""
    monkeypatch.setattr(queries, "host_has_gpu", lambda: False)
    small = {"m": 128, "n": 128, "k": 128}
    result = best_result("matmul", small, "f16", db=db)
    assert result is not None and result.device_kind == "interpret"
    assert best_config("matmul", small, "f16", db=db) == {"tile_m": 32, "tile_n": 32}
    assert best_result("matmul", SHAPE, "bf16", db=db).device_kind == "gpu"
    assert best_config("matmul", small, "f16", device="gpu", db=db) is None


def test_host_has_gpu_is_told_without_jax(monkeypatch):
    """CUDA_VISIBLE_DEVICES set to nothing hides every GPU; the answer never imports jax."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert queries.host_has_gpu() is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert queries.host_has_gpu() is False


def test_results_frame_bad_status_lists_the_allowed_ones(db: str):
    """results_frame(status=...) with an unknown outcome names every allowed one."""
    pytest.importorskip("pandas")
    from autotune.errors import JobError

    with pytest.raises(JobError, match="expected one of ok, invalid, compile_error.*Did you mean 'ok'"):
        queries.results_frame(db, status="okk")


def test_missing_database_warns_once_naming_the_path_and_autotune_db(tmp_path, monkeypatch):
    """A query on a database file that does not exist warns once (per file), naming the
    resolved path and AUTOTUNE_DB, and answers None without creating it."""
    import warnings

    from autotune.errors import MissingDatabaseWarning

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_DB", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert best_config("matmul", SHAPE, "bf16") is None
        assert best_config("matmul", SHAPE, "bf16") is None
    missing = [w for w in caught if issubclass(w.category, MissingDatabaseWarning)]
    assert len(missing) == 1
    text = str(missing[0].message)
    assert str(tmp_path / "results" / "autotune.db") in text and "AUTOTUNE_DB" in text
    assert not (tmp_path / "results").exists()


def test_interpret_results_are_never_gpu_results(db: str):
    """device='gpu' (or a GPU name) never returns an interpret-mode row."""
    small = {"m": 128, "n": 128, "k": 128}
    assert best_config("matmul", small, "f16", device="gpu", db=db) is None
    assert best_config("matmul", small, "f16", device="NVIDIA H200", db=db) is None
    interp = best_result("matmul", SHAPE, "bf16", device="interpret", db=db)
    assert interp is not None and interp.config == {"tile_m": 16, "tile_n": 16}
    assert (interp.baseline_name, interp.baseline_us) == ("xla", 0.5)
    assert best_result("matmul", SHAPE, "bf16", device="gpu", db=db).median_us == 705.0


def test_device_by_name_or_part_of_it(db: str):
    """device= takes a full name or an unambiguous part of it; an ambiguous part is an error."""
    assert best_config("matmul", SHAPE, "bf16", device="NVIDIA H100 80GB HBM3", db=db) == {
        "tile_m": 64,
        "tile_n": 128,
    }
    assert best_config("matmul", SHAPE, "bf16", device="h100", db=db) == {"tile_m": 64, "tile_n": 128}
    assert best_config("matmul", SHAPE, "bf16", device="B200", db=db) is None
    with pytest.raises(JobError, match="several stored devices"):
        best_config("matmul", SHAPE, "bf16", device="NVIDIA", db=db)


def test_list_results_summarises_each_problem_and_device(db: str):
    """list_results counts trials by outcome per (problem, device) with the best time."""
    rows = {(r.problem, r.device): r for r in list_results(db)}
    assert len(rows) == 5
    h200 = rows[(MATMUL, "NVIDIA H200")]
    assert h200.by_status == {"ok": 2, "wrong_result": 1, "compile_error": 1} and h200.total == 4
    assert (h200.best_us, h200.best_config) == (705.0, {"tile_m": 128, "tile_n": 256})
    assert (h200.baseline_name, h200.baseline_us, h200.speedup) == ("xla", 1410.0, 2.0)
    assert h200.problem_text == str(MATMUL)
    assert json.loads(json.dumps(h200.to_dict()))["config"] == {"tile_m": 128, "tile_n": 256}
    assert rows[(MATMUL_SMALL, INTERPRET.name)].device_kind == "interpret"

    assert {r.problem for r in list_results(db, kernel="attention")} == {ATTENTION}
    assert {r.problem for r in list_results(db, dtype="f16")} == {MATMUL_SMALL}
    assert all(r.device_kind == "gpu" for r in list_results(db, device="gpu"))
    assert [r.device for r in list_results(db, device="h100")] == [H100.name]


def test_missing_sqlite_file_answers_nothing_and_is_not_created(tmp_path, monkeypatch):
    """Queries on a database file that does not exist answer None or [] and create nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_DB", raising=False)
    assert best_config("matmul", SHAPE, "bf16") is None
    assert list_results() == []
    assert best_result("matmul", SHAPE, "bf16", db=str(tmp_path / "other.db")) is None
    assert list(tmp_path.iterdir()) == []


def test_queries_use_the_autotune_db_variable(db: str, monkeypatch):
    """Without db=, queries read the database named by AUTOTUNE_DB."""
    monkeypatch.setenv("AUTOTUNE_DB", db)
    assert best_config("matmul", SHAPE, "bf16") == {"tile_m": 128, "tile_n": 256}


# --------------------------------------------------------------------------- software versions

OLD = {"jax": "0.0.1", "jaxlib": "0.0.1", "autotune": "0.1.0"}


def _running() -> dict[str, str]:
    return {**queries.running_versions(), "autotune": "0.1.0"}


def test_running_versions_come_from_package_metadata():
    """running_versions names the installed jax and jaxlib (a copy, safe to change)."""
    from importlib import metadata

    versions = queries.running_versions()
    assert versions == {"jax": metadata.version("jax"), "jaxlib": metadata.version("jaxlib")}
    versions["jax"] = "changed"
    assert queries.running_versions()["jax"] == metadata.version("jax")


def test_running_versions_win_even_when_slower(db_url: str):
    """Of two versions' results, the running one's answers, even though the old one was faster."""
    with Store(db_url) as store:
        store.record_trial(MATMUL, Config(tile_m=64), timed(100.0), device=H200, software=OLD)
        store.record_trial(MATMUL, Config(tile_m=128), timed(300.0), device=H200, software=_running())
    result = best_result("matmul", SHAPE, "bf16", db=db_url)
    assert result is not None and result.config == {"tile_m": 128} and not result.stale
    assert result.jax_version == queries.running_versions()["jax"]
    assert result.jaxlib_version == queries.running_versions()["jaxlib"]
    assert best_config("matmul", SHAPE, "bf16", device="h200", db=db_url) == {"tile_m": 128}


def test_other_versions_are_the_fallback_and_marked_stale(db_url: str, caplog):
    """With only another version's results, they answer, marked stale, and the fallback is logged."""
    with Store(db_url) as store:
        store.record_trial(MATMUL, Config(tile_m=64), timed(100.0), device=H200, software=OLD)
        store.record_trial(MATMUL, Config(tile_m=32), timed(1.0), device=INTERPRET, software=_running())
    with caplog.at_level("INFO", logger="autotune.queries.best"):
        result = best_result("matmul", SHAPE, "bf16", db=db_url)
    assert result is not None and result.config == {"tile_m": 64} and result.stale  # GPU first
    assert (result.jax_version, result.to_dict()["stale"]) == ("0.0.1", True)
    assert "no result measured with the running" in caplog.text
    interp = best_result("matmul", SHAPE, "bf16", device="interpret", db=db_url)
    assert interp is not None and not interp.stale


# --------------------------------------------------------------------------- results_frame


def test_results_frame_has_one_row_per_trial_with_shape_and_config_columns(db: str):
    """Every trial is a row with its status, time, device, versions, shape and config."""
    frame = queries.results_frame(db)
    assert len(frame) == 8
    assert list(frame.columns[: len(queries.FRAME_COLUMNS)]) == list(queries.FRAME_COLUMNS)
    assert {"shape.m", "shape.n", "shape.k", "shape.causal", "config.tile_m", "config.block_q"} <= set(frame.columns)
    best = frame[(frame.device == "NVIDIA H200") & (frame.status == "ok") & (frame.kernel == "matmul")]
    assert sorted(best["median_us"]) == [705.0, 900.0]
    row = best.sort_values("median_us").iloc[0]
    assert (row["shape.m"], row["config.tile_n"], row["jax"], row["jaxlib"]) == (4096, 256, "0.11.2", "0.11.2")
    assert row["finished_at"].tzinfo is not None


def test_results_frame_keeps_whole_numbers_whole_where_some_are_missing(db: str):
    """A config or shape column of whole numbers with gaps (None, or a key another kernel
    lacks) is pandas' nullable Int64, not float64 (64 read as 64.0); strings stay objects."""
    import pandas as pd

    frame = queries.results_frame(db)
    for column in ("config.tile_m", "config.block_q", "shape.m"):
        assert frame[column].dtype == pd.Int64Dtype(), (column, frame[column].dtype)
    matmul = frame[frame.kernel == "matmul"]
    assert sorted(int(v) for v in matmul["config.tile_m"]) == [16, 32, 64, 64, 128, 128, 256]
    assert frame[frame.kernel == "attention"]["config.tile_m"].isna().all()
    assert str(int(frame["config.block_q"].dropna().iloc[0])) == "64"


def test_results_frame_filters(db: str):
    """kernel, dtype (aliases too), device (kind or name) and status narrow the rows."""
    assert set(queries.results_frame(db, kernel="attention")["kernel"]) == {"attention"}
    assert len(queries.results_frame(db, dtype="f16")) == 1
    assert set(queries.results_frame(db, device="interpret")["device_kind"]) == {"interpret"}
    assert set(queries.results_frame(db, device="h100")["device"]) == {H100.name}
    failed = queries.results_frame(db, status="compile_error")
    assert list(failed["status"]) == ["compile_error"] and failed["median_us"].isna().all()
    empty = queries.results_frame(db, kernel="nothing")
    assert len(empty) == 0 and list(empty.columns) == list(queries.FRAME_COLUMNS)


def test_results_frame_without_pandas_names_the_extra(db: str, monkeypatch):
    """Without pandas, results_frame raises ImportError saying what to install."""
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    with pytest.raises(ImportError, match=r"pip install 'autotune\[report\]'"):
        queries.results_frame(db)


def _frame_from_rows(db: str, **filters):
    """results_frame as it was built before issue 36: a record per TrialRow (whole numbers with a
    gap as Int64)."""
    import pandas as pd

    from autotune.queries.best import _frame_rows, open_store

    with open_store(db) as store:
        rows = _frame_rows(store, filters.get("kernel"), filters.get("dtype"), filters.get("device"),
                           filters.get("status"))
    records, shape_keys, config_keys = [], {}, {}
    for r in rows:
        record = {
            "trial_id": r.id, "kernel": r.problem.kernel, "dtype": r.problem.dtype,
            "problem": str(r.problem), "status": r.status.value, "median_us": r.median_us,
            "min_us": r.min_us, "max_us": r.max_us, "compile_s": r.compile_s,
            "rel_error": r.rel_error, "timing": r.timing, "cache_policy": r.cache_policy,
            "spread": r.spread, "device": r.device.name,
            "device_kind": r.device.kind, "compute_capability": r.device.compute_capability,
            "driver": r.device.driver, "jax": r.software.get("jax", ""),
            "jaxlib": r.software.get("jaxlib", ""), "autotune": r.software.get("autotune", ""),
            "study_name": r.study_name, "optuna_trial_number": r.optuna_trial_number,
            "worker": r.worker, "host": r.host, "started_at": r.started_at,
            "finished_at": r.finished_at, "traced": r.traced, "error": r.error,
        }
        for key, value in r.problem.dims.items():
            record[f"shape.{key}"] = value
            shape_keys[f"shape.{key}"] = None
        for key, value in r.config.items():
            record[f"config.{key}"] = value
            config_keys[f"config.{key}"] = None
        records.append(record)
    columns = [*queries.FRAME_COLUMNS, *shape_keys, *config_keys]
    frame = pd.DataFrame.from_records(records, columns=columns)
    for column in columns:  # whole numbers with a gap stay whole (Int64), as results_frame keeps them
        values = [record.get(column) for record in records]
        present = [v for v in values if v is not None]
        if (present and len(present) < len(values)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in present)):
            frame[column] = pd.array(values, dtype="Int64")
    return frame


@pytest.mark.parametrize("filters", [{}, {"kernel": "matmul"}, {"status": "ok"}, {"device": "interpret"}])
def test_results_frame_built_from_columns_equals_one_built_from_rows(db: str, filters):
    """The frame built column by column (issue 36) holds exactly what a record per stored
    trial gave: the same columns in the same order, values and dtypes."""
    import pandas.testing

    pandas.testing.assert_frame_equal(queries.results_frame(db, **filters), _frame_from_rows(db, **filters))


def _many_trials(url: str, per_problem: int) -> str:
    """``per_problem`` trials of three problems (a config each, some with None, one kernel's
    keys another's lacks), on two devices, some in a study, one traced, one failed."""
    with Store(url) as store:
        trials = []
        for problem, device in ((MATMUL, H200), (MATMUL_SMALL, INTERPRET), (ATTENTION, H100)):
            for i in range(per_problem):
                config = ({"block_q": 16 * (1 + i % 8), "block_kv": i, "causal_mask": i % 2 == 0}
                          if problem is ATTENTION else {"tile_m": 16 * (1 + i), "tile_n": None if i % 5 == 0 else i,
                                                        "order": "MN"[i % 2]})
                result = timed(10.0 + i) if i % 7 else TrialResult.failed(Outcome.COMPILE_ERROR, "smem")
                trials.append((problem, Config(config), result, device, SOFTWARE))
        recorded = store.record_trials(trials, worker="w0")
        store.record_trace_regions(recorded[1].id, {"main": (3.0, 2)}, "trace/dir")
        store.record_trial(MATMUL, Config(tile_m=1, tile_n=1, order="M"), timed(5.0), device=H200,
                           software=SOFTWARE, study_name="s", optuna_trial_number=3)
    return url


def _statements(url: str, call) -> list[str]:
    """The SQL statements ``call()`` sends to the database at ``url`` (opened afresh)."""
    import sqlalchemy as sa

    queries.close_stores()
    sent: list[str] = []

    def trace(dbapi_connection, record):
        dbapi_connection.set_trace_callback(sent.append)

    sa.event.listen(sa.engine.Engine, "connect", trace)
    try:
        call()
    finally:
        sa.event.remove(sa.engine.Engine, "connect", trace)
        queries.close_stores()
    return sent


@pytest.fixture(scope="module")
def small_and_big(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Databases of 6 and 600 trials (:func:`_many_trials`), written once for the tests that
    only read them (writing the 600 takes 2 s)."""
    folder = tmp_path_factory.mktemp("frames")
    return (_many_trials(f"sqlite:///{folder}/small.db", 2),
            _many_trials(f"sqlite:///{folder}/big.db", 200))


@pytest.mark.parametrize("filters", [{}, {"kernel": "matmul"}, {"device": "gpu", "status": "ok"},
                                     {"dtype": "float16"}, {"kernel": "attention", "limit": 5}])
def test_results_frame_reads_in_batches_and_a_bounded_number_of_statements(small_and_big, monkeypatch,
                                                                           filters):
    """results_frame sends as many statements for 600 trials (and 600 configs, read kernel by
    kernel past a bound) as for 6: none per trial or per config; read in several batches, the
    frame is the one a record per trial gives."""
    import pandas.testing

    from autotune.storage import reading

    monkeypatch.setattr(reading, "TABLE_BATCH", 7)
    monkeypatch.setattr(reading, "_CONFIGS_BY_ID", 50)
    small, big = small_and_big
    counts = [len(_statements(url, lambda url=url: queries.results_frame(url, **filters)))
              for url in (small, big)]
    assert counts[0] == counts[1] and counts[0] < 20, counts
    limit = filters.pop("limit", None)
    frame = queries.results_frame(big, **filters, limit=limit)
    expected = _frame_from_rows(big, **filters)
    if limit is not None:
        expected = expected.head(limit)
    # Trial numbers with gaps are floats with NaN in results_frame (as pandas infers them);
    # the record-per-trial helper makes every gapped whole-number column Int64.
    expected["optuna_trial_number"] = expected["optuna_trial_number"].astype(
        frame["optuna_trial_number"].dtype)
    assert len(frame) >= 5 and (filters or frame["traced"].sum() == 1)
    pandas.testing.assert_frame_equal(frame, expected)


def test_results_frame_limit_keeps_the_oldest_and_is_checked(db: str):
    """limit=N gives the N oldest trials (in SQL); a negative or fractional limit is refused."""
    whole = queries.results_frame(db)
    assert list(queries.results_frame(db, limit=3)["trial_id"]) == list(whole["trial_id"][:3])
    assert len(queries.results_frame(db, limit=0)) == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(JobError, match="limit"):
            queries.results_frame(db, limit=bad)


def test_the_choice_in_words_names_the_winner_its_margin_and_interval():
    """choice_words: the baseline named with its margin and interval where it wins; the
    kernel's margin where it wins; a tie within the noise; no comparison without one."""
    config = {"tile_m": 128}
    assert queries.faster_of(0.98, 0.97, 0.99) == "baseline"
    assert queries.faster_of(1.03, 1.01, 1.05) == "kernel"
    assert queries.faster_of(1.0, 0.99, 1.01) == "tie"
    assert queries.faster_of(None, None, None) == "tie"
    words = queries.choice_words(config, 1 / 1.021, 1 / 1.03, 1 / 1.012, "xla")
    assert words.startswith("xla is 2.1% faster (interval 1.2% to 3.0%): it runs")
    assert "the kernel's best config is {\"tile_m\": 128}" in words
    assert queries.choice_words(config, 1.03, 1.01, 1.05, "cudnn").startswith(
        "the kernel is 3.0% faster than cudnn (interval 1.0% to 5.0%): config")
    assert queries.choice_words(config, 1.0, 0.99, 1.01, "xla").startswith(
        "no faster than xla (within the measured noise: -1.0% to +1.0%): xla runs; the "
        "kernel's best config is {\"tile_m\": 128}")
    assert "no confirmed comparison" in queries.choice_words(config, None, None, None, None)


def test_runs_of_routes_to_the_implementation_the_estimate_puts_ahead():
    """runs_of, the one route rule: the kernel where the verdict's speedup is above 1.0, the
    baseline at or below it, ties (the interval holding 1.0) included, and the kernel where
    there is no verdict (a figure missing or not finite); faster_of still says "tie".
    written_runs: an exported entry's runs as written, else by its figures, else by its
    "faster" alone."""
    nan = float("nan")
    table = [
        ((0.98, 0.97, 0.99), "baseline", "baseline"),
        ((0.976, 0.95, 1.004), "tie", "baseline"),
        ((1.0, 0.99, 1.01), "tie", "baseline"),
        ((1.01, 1.0, 1.02), "tie", "kernel"),
        ((1.028, 0.99, 1.06), "tie", "kernel"),
        ((0.99, 0.98, 1.0), "tie", "baseline"),
        ((1.03, 1.01, 1.05), "kernel", "kernel"),
        ((None, None, None), "tie", "kernel"),
        ((0.9, None, None), "tie", "kernel"),
        ((0.9, 0.8, None), "tie", "kernel"),
        ((nan, 0.9, 1.1), "tie", "kernel"),
        ((1.0, nan, 1.1), "tie", "kernel"),
    ]
    for figures, faster, runs in table:
        assert (queries.faster_of(*figures), queries.runs_of(*figures)) == (faster, runs), figures
    # A tie the estimate puts the kernel ahead runs it only where the other timing (the
    # confirmation's, where the program check decides) does not put the baseline ahead.
    for figures, other, runs in [((1.01, 0.99, 1.03), 0.915, "baseline"),
                                 ((1.01, 0.99, 1.03), 1.0, "baseline"),
                                 ((1.01, 0.99, 1.03), 1.02, "kernel"),
                                 ((1.01, 0.99, 1.03), None, "kernel"),
                                 ((1.01, 0.99, 1.03), nan, "kernel"),
                                 ((1.03, 1.01, 1.05), 0.9, "kernel"),
                                 ((0.99, 0.97, 1.01), 1.05, "baseline")]:
        assert queries.runs_of(*figures, other) == runs, (figures, other)
    assert queries.choice_words({"t": 1}, 1.01, 0.99, 1.03, "xla", 0.915).endswith(
        ': xla runs; the kernel\'s best config is {"t": 1}')
    assert queries.RUNS == ("kernel", "baseline")
    assert queries.written_runs("kernel", "tie", 1.0, 0.99, 1.01) == "kernel"
    assert queries.written_runs(None, "tie", 1.0, 0.99, 1.01) == "baseline"
    assert queries.written_runs(None, "tie", 1.004, 0.99, 1.01) == "kernel"
    # The words of a tie say which runs, by the same estimate.
    words = queries.choice_words({"tile_m": 64}, 1.004, 0.99, 1.01, "xla")
    assert words.startswith("no faster than xla") and ': the kernel runs with config {"tile_m": 64}' in words
    words = queries.choice_words({"tile_m": 64}, 0.996, 0.99, 1.01, "xla")
    assert ": xla runs; the kernel's best config is" in words
    assert queries.written_runs(None, "tie", None, None, None) == "kernel"
    assert queries.written_runs(None, "baseline", None, None, None) == "baseline"
    assert queries.written_runs("maybe", "kernel", 1.03, 1.01, 1.05) == "kernel"

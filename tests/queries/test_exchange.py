"""Export and import of best configs: json round trip, python module, csv, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune import cli
from autotune.queries.exchange import export_records, import_json, render
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
MATMUL = Problem("hopper_matmul", {"m": 256, "n": 256, "k": 256}, "bfloat16")
SOFTMAX = Problem("softmax", {"rows": 64, "cols": 1024}, "float16")


def _valid(problem: Problem, n: int) -> list[dict]:
    """``n`` distinct configs valid for ``problem`` under today's rules (no jax)."""
    space = get_kernel(problem.kernel).valid_space(problem)
    return [dict(c) for c in space.sample(n, seed=1)]


M1, M2, M3 = _valid(MATMUL, 3)
(S1,) = _valid(SOFTMAX, 1)


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=1.0, rel_error=1e-3, timing="fake")


@pytest.fixture
def source(tmp_path) -> str:
    """A database with GPU and interpret results for two problems."""
    url = f"sqlite:///{tmp_path}/src.db"
    with Store(url) as store:
        for problem, config, us, device in [
            (MATMUL, M1, 90.0, GPU),
            (MATMUL, M2, 70.0, GPU),
            (MATMUL, M3, 5.0, INTERPRET),
            (SOFTMAX, S1, 12.0, GPU),
        ]:
            store.record_trial(problem, Config(config), timed(us), device=device, software=SOFTWARE)
    return url


def _bests(url: str) -> dict:
    return {(r["kernel"], json.dumps(r["shape"], sort_keys=True), r["dtype"], r["device"]):
            (r["config"], r["median_us"]) for r in export_records(url)}


def test_json_round_trip_preserves_best_configs(source, tmp_path, capsys):
    """export json -> import into a fresh database gives the same best config everywhere."""
    out = tmp_path / "export.json"
    assert cli.main(["export", "--db", source, "--out", str(out)]) == 0
    target = f"sqlite:///{tmp_path}/dst.db"
    assert cli.main(["import", str(out), "--db", target]) == 0
    assert "imported 2" in capsys.readouterr().out  # interpret-mode results are left out
    assert _bests(target) == _bests(source) and len(_bests(source)) == 2
    record = json.loads(out.read_text())["records"][0]
    assert record["jax_version"] == "0.11.2" and {"kernel", "shape", "dtype", "device"} <= set(record)


def test_import_never_replaces_existing_results(source, tmp_path):
    """Importing into a database that already has the trials keeps them unchanged."""
    out = tmp_path / "export.json"
    out.write_text(render(export_records(source), "json"))
    with Store(source) as store:
        before = store.trials()
    assert import_json(out, source) == (0, 2)
    with Store(source) as store:
        assert store.trials() == before


def test_python_module_imports_in_isolation(source, tmp_path):
    """The python export imports with `python -I` (no repo on the path) and gives the same configs."""
    module = tmp_path / "elsewhere" / "tuned_configs.py"
    module.parent.mkdir()
    assert cli.main(["export", "--format", "python", "--db", source, "--out", str(module)]) == 0
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(module.parent)!r})\n"
        "import tuned_configs as t\n"
        "assert 'autotune' not in sys.modules\n"
        "print(json.dumps([t.lookup('hopper_matmul', {'m': 256, 'n': 256, 'k': 256}, 'bf16'),\n"
        "                  t.lookup('softmax', {'rows': 64, 'cols': 1024}, 'float16'),\n"
        "                  t.lookup('softmax', {'rows': 1, 'cols': 1}, 'float16')]))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          cwd=module.parent.parent, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [M2, S1, None]


def test_csv_export_has_a_row_per_best(source, capsys):
    """csv export writes a header and one row per (problem, device)."""
    assert cli.main(["export", "--format", "csv", "--kernel", "hopper_matmul", "--device", "gpu",
                     "--db", source]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kernel,shape,dtype,device") and len(lines) == 2
    assert "k=256,m=256,n=256" in lines[1]


def test_bad_import_files_exit_2(tmp_path, capsys):
    """A missing, non-JSON or foreign file is rejected with exit 2 and a clear message."""
    db = f"sqlite:///{tmp_path}/x.db"
    assert cli.main(["import", str(tmp_path / "nope.json"), "--db", db]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["import", str(bad), "--db", db]) == 2
    bad.write_text(json.dumps({"records": []}))
    assert cli.main(["import", str(bad), "--db", db]) == 2
    assert "not an autotune JSON export" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["export", "--format", "yaml"])
    assert e.value.code == 2


# --------------------------------------------------------------------------- import checks


def _record(**changes) -> dict:
    """A good export record of MATMUL on the GPU, with ``changes``."""
    record = {"kernel": "hopper_matmul", "shape": dict(MATMUL.dims), "dtype": "bfloat16",
              "device": "NVIDIA H200", "device_kind": "gpu", "compute_capability": "9.0",
              "driver": "570.86", "median_us": 70.0, "jax_version": "0.11.2",
              "software": dict(SOFTWARE), "config": dict(M1)}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()

# (record, the rule the message must name, a piece of the offending value it must show)
BAD_RECORDS = [
    (_record(kernel="no_such_kernel"), "kernel_known", "no_such_kernel"),
    (_record(kernel="evil.module:KERNEL"), "kernel_known", "--allow-import"),
    (_record(shape={"m": 256, "n": 256}), "shape", "'k'"),
    (_record(shape={"m": 256, "n": 256, "k": 256, "q": 1}), "shape", "'q'"),
    (_record(shape={"m": -256, "n": 256, "k": 256}), "shape", "-256"),
    (_record(dtype="float64"), "dtype", "float64"),
    (_record(dtype="int4"), "dtype", "int4"),
    (_record(config={**M1, "tile_m": 192}), "config_valid", "m_divisible"),
    (_record(config={**M1, "bogus": 1}), "config_valid", "bogus"),
    (_record(config={"tile_m": 128}), "config_valid", "missing"),
    (_record(config=[1, 2]), "config", "[1, 2]"),
    (_record(median_us=float("inf")), "median_us", "inf"),
    (_record(median_us=float("nan")), "median_us", "nan"),
    (_record(median_us=-1.0), "median_us", "-1.0"),
    (_record(median_us=0), "median_us", "0"),
    (_record(median_us="fast"), "median_us", "fast"),
    (_record(median_us=1e300), "median_us", "plausible"),
    (_record(median_us=1e-9), "median_us", "plausible"),
    (_record(median_us=True), "median_us", "True"),
    (_record(device="x" * 10_000), "text", "10000 characters"),
    (_record(device="GPU\x1b[2J"), "text", "control"),
    (_record(driver="\x00"), "text", "control"),
    (_record(software={"jax": "0.11\n2"}), "text", "control"),
    (_record(device_kind="quantum"), "device_kind", "quantum"),
    (_record(median_us=_DROP), "record", "median_us"),
    (_record(extra_key=1), "record", "extra_key"),
    ("not a record", "record", "not a record"),
]


def _export_file(tmp_path, records: list, name: str = "in.json") -> str:
    path = tmp_path / name
    # allow_nan: the file a careless tool (or an attacker) writes, not one of ours
    path.write_text(json.dumps({"format": "autotune-export", "version": 1, "records": records}))
    return str(path)


def _trial_count(url: str) -> int:
    with Store(url) as store:
        return len(store.trials())


def test_import_refuses_the_whole_file_naming_each_bad_record(db_url, tmp_path, capsys, campaign):
    """One file holding good records and every kind of bad one: exit 2, each bad record named
    by index, rule and value, and nothing at all written (SQLite and PostgreSQL)."""
    campaign.add(bad_inputs=len(BAD_RECORDS))
    good = [_record(), _record(config=dict(M2), median_us=80.0)]
    records = [good[0], *(r for r, _, _ in BAD_RECORDS), good[1]]
    path = _export_file(tmp_path, records)
    assert cli.main(["import", path, "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nothing was imported" in err
    assert f"{len(BAD_RECORDS)} of {len(records)} record(s)" in err
    for i, (_, rule, value) in enumerate(BAD_RECORDS[:20], start=1):
        lines = [line for line in err.splitlines() if line.strip().startswith(f"record {i}: ")]
        assert any(f"[{rule}]" in line and value in line for line in lines), (i, rule, value, lines)
    assert "... and" in err  # more bad records than the message lists
    assert _trial_count(db_url) == 0
    for i, (record, rule, _) in enumerate(BAD_RECORDS):  # alone, each is refused too
        assert cli.main(["import", _export_file(tmp_path, [good[0], record], f"{i}.json"),
                         "--db", db_url]) == 2, rule
        assert _trial_count(db_url) == 0
    capsys.readouterr()
    assert cli.main(["import", _export_file(tmp_path, good, "good.json"), "--db", db_url]) == 0
    assert _trial_count(db_url) == 2


@pytest.mark.parametrize("device", [None, "", "   ", _DROP])
def test_import_refuses_a_record_without_a_device(device, tmp_path, capsys, campaign):
    """A record whose device is null, blank or missing is refused naming its index, the field
    and the value; nothing of the file is imported (no database is even created)."""
    campaign.add(bad_inputs=1)
    path = _export_file(tmp_path, [_record(), _record(config=dict(M2), device=device)])
    db = tmp_path / "x.db"
    assert cli.main(["import", path, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nothing was imported" in err
    (line,) = [line for line in err.splitlines() if line.strip().startswith("record 1: ")]
    assert "'device'" in line if device is _DROP else f"[device] device = {device!r}" in line, line
    assert not db.exists()


def test_unknown_device_filter_exits_2_naming_the_stored_devices(source, tmp_path, capsys, campaign):
    """`results --device X` and `export --device X` where X matches no stored device exit 2
    with one line naming X and the stored devices (instead of printing nothing); a kind, a
    name, part of a name, and a database that does not exist yet still answer."""
    campaign.add(bad_inputs=2)
    for command in (["results"], ["export"]):
        assert cli.main([*command, "--db", source, "--device", "a100"]) == 2
        out, err = capsys.readouterr()
        (line,) = err.splitlines()
        assert not out and line.startswith("autotune: error: ") and "'a100'" in line
        assert "'NVIDIA H200'" in line and "'cpu-interpret (x86_64)'" in line, line
        for device in ("gpu", "interpret", "h200", "NVIDIA H200"):
            assert cli.main([*command, "--db", source, "--device", device]) == 0, device
        assert cli.main([*command, "--db", f"sqlite:///{tmp_path}/none.db", "--device", "a100"]) == 0
        capsys.readouterr()


def test_a_device_kind_with_nothing_stored_exits_2_naming_the_stored_devices(tmp_path, capsys,
                                                                             campaign):
    """`results --device gpu` (and `export`) on a database holding interpret results only
    exit 2 with one line naming the kind and the stored devices (it said "no results stored",
    exit 0, against docs/cli.md)."""
    campaign.add(bad_inputs=2)
    url = f"sqlite:///{tmp_path}/cpu.db"
    with Store(url) as store:
        store.record_trial(MATMUL, Config(M3), timed(5.0), device=INTERPRET, software=SOFTWARE)
    for command in (["results"], ["export"]):
        assert cli.main([*command, "--db", url, "--device", "gpu"]) == 2
        out, err = capsys.readouterr()
        (line,) = err.splitlines()
        assert not out and "'gpu'" in line and "'cpu-interpret (x86_64)' (interpret)" in line
        assert cli.main([*command, "--db", url, "--device", "interpret"]) == 0
        capsys.readouterr()


def test_export_names_the_database_on_stderr_only(source, capsys):
    """`export` to stdout names the database it read on stderr; stdout is the export alone."""
    assert cli.main(["export", "--db", source]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["format"] == "autotune-export"
    assert f"autotune: database {source}" in err


def test_import_is_one_transaction(db_url, tmp_path, monkeypatch, campaign):
    """A database error on the third record of an import keeps none of the first two
    (SQLite and PostgreSQL): the import is all or nothing."""
    import sqlalchemy.exc

    from autotune.errors import StorageError
    from autotune.storage import schema, writing

    path = _export_file(tmp_path, [_record(config=c, median_us=50.0 + i)
                                   for i, c in enumerate((M1, M2, M3))])
    with Store(db_url):
        pass  # the schema exists: only the import's own writes are counted
    real = writing.get_or_create  # what the store's writes call
    calls = {"trials": 0}

    def failing(session, model, key, **extra):
        if model is schema.Configs:
            calls["trials"] += 1
            if calls["trials"] == 3:
                raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))
        return real(session, model, key, **extra)

    monkeypatch.setattr(writing, "get_or_create", failing)
    campaign.add(faults=1)
    with pytest.raises(StorageError):
        import_json(path, db_url)
    assert calls["trials"] == 3
    monkeypatch.setattr(writing, "get_or_create", real)
    assert _trial_count(db_url) == 0
    assert import_json(path, db_url) == (3, 0)


@pytest.mark.parametrize("shape", ["deep_list", "deep_object", "too_big", "nan_literal"])
def test_absurd_json_is_refused_with_a_clear_message(shape, tmp_path, monkeypatch, capsys, campaign):
    """Absurdly nested JSON (no RecursionError traceback), files over the size limit and
    non-finite literals are refused with exit 2 and a message saying why; nothing is written."""
    from autotune.queries import exchange
    campaign.add(bad_inputs=1)
    path = tmp_path / "absurd.json"
    if shape == "deep_list":
        path.write_text('{"format": "autotune-export", "version": 1, "records": '
                        + "[" * 200_000 + "]" * 200_000 + "}")
    elif shape == "deep_object":
        path.write_text('{"format": "autotune-export", "version": 1, "records": [' + '{"a":' * 60
                        + "1" + "}" * 60 + "]}")
    elif shape == "too_big":
        monkeypatch.setattr(exchange, "MAX_IMPORT_BYTES", 1000)
        path.write_text(json.dumps({"format": "autotune-export", "version": 1,
                                    "records": [_record()] * 20}))
    else:
        path.write_text(json.dumps({"format": "autotune-export", "version": 1, "records": [
            _record()]}).replace('"median_us": 70.0', '"median_us": NaN'))
    db = tmp_path / "db.sqlite"
    assert cli.main(["import", str(path), "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err
    expected = {"deep_list": "nested", "deep_object": "nested", "too_big": "larger than",
                "nan_literal": "[median_us] median_us must be a positive, finite number of "
                             "microseconds, got nan"}[shape]
    assert expected in err, err
    assert not db.exists()


def test_non_finite_times_are_never_stored_or_exported(db_url, tmp_path, campaign):
    """The store refuses a non-finite time; a row already holding one (written by another
    tool) is left out of exports, which are strict JSON and a python table that loads."""
    import math

    import sqlalchemy as sa

    campaign.add(bad_inputs=2)
    with Store(db_url) as store:
        with pytest.raises(ValueError, match="finite"):
            store.record_trial(MATMUL, Config(M1), timed(float("inf")), device=GPU, software=SOFTWARE)
        row = store.record_trial(MATMUL, Config(M1), timed(70.0), device=GPU, software=SOFTWARE)
        store.record_trial(SOFTMAX, Config(S1), timed(12.0), device=GPU, software=SOFTWARE)
        with store.engine.begin() as conn:  # another tool writes Infinity behind our back
            conn.execute(sa.text("UPDATE at_trials SET median_us = :v WHERE id = :id"),
                         {"v": math.inf, "id": row.id})
    records = export_records(db_url)
    assert [r["kernel"] for r in records] == ["softmax"]
    doc = json.loads(render(records, "json"), parse_constant=lambda name: pytest.fail(name))
    assert doc["records"][0]["median_us"] == 12.0
    namespace: dict = {}
    exec(compile(render(records, "python"), "tuned.py", "exec"), namespace)  # noqa: S102
    assert namespace["lookup"]("softmax", SOFTMAX.dims, "float16") == S1
    with pytest.raises(ValueError):  # strict JSON even if a caller hands render a bad record
        render([{**records[0], "median_us": math.inf}], "json")
def test_interpret_results_are_exported_only_when_asked_for(source, monkeypatch):
    """On a machine with a GPU, export leaves interpret-mode rows out by default;
    device='interpret' exports them."""
    from autotune.queries import best as best_queries

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    assert {r["device_kind"] for r in export_records(source)} == {"gpu"}
    (record,) = export_records(source, device="interpret")
    assert record["device_kind"] == "interpret" and record["config"] == dict(M3)


def test_without_a_gpu_export_includes_interpret_only_problems_labelled(tmp_path, monkeypatch,
                                                                        capsys):
    """On a machine without a GPU, `export` includes the interpret-mode results of problems
    with no GPU result (labelled device_kind "interpret", and said on stderr); a problem with
    GPU results exports those only; on a machine with a GPU they are left out, as before."""
    from autotune.queries import best as best_queries

    url = f"sqlite:///{tmp_path}/cpu.db"
    with Store(url) as store:
        store.record_trial(MATMUL, Config(M3), timed(5.0), device=INTERPRET, software=SOFTWARE)
        store.record_trial(SOFTMAX, Config(S1), timed(12.0), device=GPU, software=SOFTWARE)
        store.record_trial(SOFTMAX, Config(S1), timed(9.0), device=INTERPRET, software=SOFTWARE)
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    kinds = {(r["kernel"], r["device_kind"]) for r in export_records(url)}
    assert kinds == {(MATMUL.kernel, "interpret"), (SOFTMAX.kernel, "gpu")}
    assert cli.main(["export", "--db", url]) == 0
    err = capsys.readouterr().err
    assert "exported 1 interpret-mode result(s)" in err and "left out 1" in err
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    assert {r["device_kind"] for r in export_records(url)} == {"gpu"}


def test_exports_and_results_carry_the_policy_the_confirmed_speedup_and_the_ties(tmp_path, capsys):
    """After a confirmation round, `export` (json, csv) and `results --json` give the cache
    policy, the crowned config, the confirmed speedup with its spread and the tie marks; an
    import keeps the policy."""
    from autotune.tuning.tuner import run_job
    from tests.tuning.test_tuner import PICK_PROBLEM, ConfirmingEngine, _pick_job

    url = f"sqlite:///{tmp_path}/src.db"
    with Store(url) as store:
        run_job(_pick_job(), store=store, engine=ConfirmingEngine("cold"))
    [record] = [r for r in export_records(url) if r["kernel"] == "tuner_pick"]
    assert record["cache_policy"] == "cold" and record["confirmed"] is True
    assert record["config"] == {"v": 1} and [t["config"] for t in record["ties"]] == [{"v": 0}]
    assert record["confirmed_speedup"] == pytest.approx(150 / 99.96, rel=0.005)
    assert 0 <= record["speedup_spread"] < 0.01
    csv_text = render([record], "csv")
    assert "cache_policy" in csv_text.splitlines()[0] and ",cold," in csv_text
    assert cli.main(["results", "--db", url, "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)
    assert summary["cache_policy"] == "cold" and summary["confirmed"] is True
    assert summary["confirmed_speedup"] == pytest.approx(record["confirmed_speedup"])
    marks = {p["config"]["v"]: p["tie"] for p in summary["confirmation"]["programs"]}
    assert marks == {3: False, 0: False, 1: True, 2: False, 4: False}
    path = tmp_path / "export.json"
    path.write_text(render([record], "json"))
    import_json(path, f"sqlite:///{tmp_path}/dst.db")
    with Store(f"sqlite:///{tmp_path}/dst.db") as dst:
        [row] = dst.trials(PICK_PROBLEM)
        assert row.cache_policy == "cold" and row.config == {"v": 1}


# Times another tool (or a broken timer) may have left in the database: none is a time.
NOT_TIMES = [-5.0, 0.0, float("nan"), float("inf"), float("-inf"), 1e-300, 5e-4, 1e300, 2e10]


def test_stored_times_that_are_not_times_are_never_served_exported_or_plotted(
        db_url, tmp_path, capsys, campaign):
    """Trials and a baseline whose stored times are not positive, finite and plausible (the one
    gate, autotune.space.outcomes.plausible_us) rank above a real 100 us trial in SQL order;
    best, the lookup, export (json, csv, python) and report skip them, and the export imports
    back (SQLite and PostgreSQL: NaN sorts first there)."""
    import sqlalchemy as sa

    from autotune.queries import lookup
    from autotune.queries.best import best_result, close_stores
    from autotune.queries.report import write_report

    configs = _valid(MATMUL, len(NOT_TIMES) + 1)
    good, bad = configs[0], configs[1:]
    with Store(db_url) as store:
        store.record_trial(MATMUL, Config(good), timed(100.0), device=GPU, software=SOFTWARE)
        ids = [store.record_trial(MATMUL, Config(c), timed(50.0), device=GPU,
                                  software=SOFTWARE).id for c in bad]
        store.record_baseline(MATMUL, "xla", [80.0], device=GPU, software=SOFTWARE)
        with store.engine.begin() as conn:  # another tool writes them behind our back
            for trial_id, value in zip(ids, NOT_TIMES, strict=True):
                conn.execute(sa.text("UPDATE at_trials SET median_us = :v WHERE id = :id"),
                             {"v": value, "id": trial_id})
            conn.execute(sa.text("UPDATE at_baselines SET median_us = :v"), {"v": -1.0})
    campaign.add(bad_inputs=len(NOT_TIMES) + 1)
    try:
        best = best_result(MATMUL.kernel, MATMUL.dims, MATMUL.dtype, db=db_url)
        assert best is not None and best.config == good and best.median_us == 100.0
        assert best.baseline_us is None and best.ratio is None
        lookup.clear_cache()
        assert lookup.lookup_config(MATMUL.kernel, MATMUL.dims, MATMUL.dtype, db=db_url) == (
            Config(good), "exact")
        records = export_records(db_url)
        assert [(r["config"], r["median_us"]) for r in records] == [(good, 100.0)]
        for fmt in ("json", "csv", "python"):
            out = tmp_path / f"out.{fmt}"
            assert cli.main(["export", "--db", db_url, "--format", fmt, "--out", str(out)]) == 0
            assert "100" in out.read_text()
        fresh = f"sqlite:///{tmp_path}/fresh.db"
        assert cli.main(["import", str(tmp_path / "out.json"), "--db", fresh]) == 0
        assert _bests(fresh) == _bests(db_url)
        index = write_report(db_url, out_dir=tmp_path / "report")
        page = (tmp_path / "report" / "index.html").read_text()
        assert "not plausible times" in page and "100" in page, index
        assert "1e+300" not in page
    finally:
        close_stores()
        lookup.clear_cache()
    capsys.readouterr()


@pytest.mark.parametrize("name", ["=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "-2+3",
                                  "@SUM(1+1)", "\t=1+1", "\r=1+1"])
def test_csv_export_neutralises_spreadsheet_formulas(name, tmp_path, campaign):
    """A device name (or any text cell) from the database that a spreadsheet would run as a
    formula is written with a leading ' in CSV exports; numbers stay numbers."""
    import csv
    import io

    url = f"sqlite:///{tmp_path}/db.sqlite"
    with Store(url) as store:
        store.record_trial(MATMUL, Config(M1), timed(70.0), device=DeviceInfo(name, "gpu"),
                           software={"jax": name})
    campaign.add(bad_inputs=1)
    text = render(export_records(url), "csv")
    (row,) = list(csv.DictReader(io.StringIO(text, newline="")))
    shown = "'" + name.replace("\r", "\\r")  # a lone CR would end the row: escaped
    assert row["device"] == shown and row["jax_version"] == shown
    assert row["median_us"] == "70.0" and row["kernel"] == "hopper_matmul"
    for cell in row.values():
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), row

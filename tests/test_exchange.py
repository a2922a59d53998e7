"""Export and import of best configs: json round trip, python module, csv, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune import cli
from autotune.exchange import export_records, import_json, render
from autotune.problem import Config, Problem
from autotune.storage import Store
from autotune.trial import DeviceInfo, TrialResult

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
MATMUL = Problem("hopper_matmul", {"m": 256, "n": 256, "k": 256}, "bfloat16")
SOFTMAX = Problem("softmax", {"rows": 64, "cols": 1024}, "float16")


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=1.0, rel_error=1e-3, timing="fake")


@pytest.fixture
def source(tmp_path) -> str:
    """A database with GPU and interpret results for two problems."""
    url = f"sqlite:///{tmp_path}/src.db"
    with Store(url) as store:
        for problem, config, us, device in [
            (MATMUL, {"tile_m": 128, "tile_n": 128}, 90.0, GPU),
            (MATMUL, {"tile_m": 128, "tile_n": 256}, 70.0, GPU),
            (MATMUL, {"tile_m": 64, "tile_n": 64}, 5.0, INTERPRET),
            (SOFTMAX, {"block_rows": 2, "approx_math": True}, 12.0, GPU),
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
    assert "imported 3" in capsys.readouterr().out
    assert _bests(target) == _bests(source) and len(_bests(source)) == 3
    record = json.loads(out.read_text())["records"][0]
    assert record["jax_version"] == "0.11.2" and {"kernel", "shape", "dtype", "device"} <= set(record)


def test_import_never_replaces_existing_results(source, tmp_path):
    """Importing into a database that already has the trials keeps them unchanged."""
    out = tmp_path / "export.json"
    out.write_text(render(export_records(source), "json"))
    with Store(source) as store:
        before = store.trials()
    assert import_json(out, source) == (0, 3)
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
    assert json.loads(done.stdout) == [
        {"tile_m": 128, "tile_n": 256}, {"block_rows": 2, "approx_math": True}, None,
    ]


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


def test_exports_and_results_carry_the_policy_the_confirmed_speedup_and_the_ties(tmp_path, capsys):
    """After a confirmation round, `export` (json, csv) and `results --json` give the cache
    policy, the crowned config, the confirmed speedup with its spread and the tie marks; an
    import keeps the policy."""
    from autotune.tuner import run_job
    from tests.test_tuner import PICK_PROBLEM, ConfirmingEngine, _pick_job

    url = f"sqlite:///{tmp_path}/src.db"
    with Store(url) as store:
        run_job(_pick_job(), store=store, engine=ConfirmingEngine("cold"))
    [record] = [r for r in export_records(url) if r["kernel"] == "tuner_pick"]
    assert record["cache_policy"] == "cold" and record["confirmed"] is True
    assert record["config"] == {"v": 1} and [t["config"] for t in record["ties"]] == [{"v": 0}]
    assert record["confirmed_speedup"] == pytest.approx(150 / 100.1, rel=0.005)
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

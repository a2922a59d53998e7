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


def test_interpret_results_are_exported_only_when_asked_for(source):
    """export leaves interpret-mode rows out by default; device='interpret' exports them."""
    assert {r["device_kind"] for r in export_records(source)} == {"gpu"}
    (record,) = export_records(source, device="interpret")
    assert record["device_kind"] == "interpret" and record["config"] == {"tile_m": 64, "tile_n": 64}

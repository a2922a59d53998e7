"""The packaged ground truth (autotune.replay.ground_truth): layout, loader, writer, and the
pack/unpack script that converts per-shape files."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from autotune.replay import ground_truth as gt
from tests.benchmark_scripts import ROOT

PACK = ROOT / "benchmarks" / "pack_ground_truth.py"


def test_the_packaged_data_is_one_file_per_device_and_kernel():
    """Each file sits in its device's folder, names its device and kernel, and holds the
    problems of that pair only: 7 H200 matmul shapes, 2 attention, 2 softmax; the H100's 3
    matmul and 1 softmax."""
    counts = {}
    for path in sorted(gt.DATA_DIR.glob("*/*.json.gz")):
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        assert data["format"] == gt.FORMAT
        assert path == gt.ground_truth_path(data["device"], data["kernel"])
        counts[(data["device"], data["kernel"])] = len(data["problems"])
        assert all(p["name"] == gt.problem_name(data["kernel"], p["shape"], p["dtype"]) for p in data["problems"])
    assert counts == {("NVIDIA H200", "hopper_matmul"): 7, ("NVIDIA H200", "hopper_attention"): 2,
                      ("NVIDIA H200", "softmax"): 2, ("NVIDIA H100 80GB HBM3", "hopper_matmul"): 5,
                      ("NVIDIA H100 80GB HBM3", "softmax"): 1}
    assert gt.devices() == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert sum(p.stat().st_size for p in gt.DATA_DIR.glob("*/*.json.gz")) < 400_000  # compact


def test_the_loader_fills_in_kernel_and_device_and_filters():
    """load_ground_truth gives per-shape dicts with kernel and device, by device and kernel."""
    h200 = gt.load_ground_truth("NVIDIA H200", "hopper_matmul")
    assert len(h200) == 7 and {(p["kernel"], p["device"]) for p in h200} == {("hopper_matmul", "NVIDIA H200")}
    assert all(len(p["results"]) >= 700 and p["results"][0]["status"] for p in h200)
    assert len(gt.load_ground_truth()) == 17
    assert gt.load_ground_truth("No Such GPU") == [] and gt.load_ground_truth("NVIDIA H200", "nope") == []
    h200[0]["results"].clear()  # a copy: the next call reads the file again
    assert gt.load_ground_truth("NVIDIA H200", "hopper_matmul")[0]["results"]
    live = gt.load_live("NVIDIA H200", "hopper_matmul")
    assert len(live) == 4 and all(len(e["times"]) >= 150 for e in live)


def test_recorded_us_prefers_the_median_of_the_retimed_rounds():
    """A record's time is the median of its re-timed rounds when it has any."""
    plain = {"config": {}, "status": "ok", "median_us": 86.5, "min_us": 85.0, "max_us": 90.0}
    assert gt.recorded_us(plain) == 86.5
    assert gt.recorded_samples(plain) == [85.0, 86.5, 90.0]
    retimed = {**plain, gt.RETIMED: [82.0, 81.0, 83.5, 82.5]}
    assert gt.recorded_us(retimed) == 82.25
    assert gt.recorded_samples(retimed) == [82.0, 81.0, 83.5, 82.5]
    assert gt.recorded_us({**plain, gt.RETIMED: []}) == 86.5  # none yet: as recorded


def test_a_problem_is_found_by_shape_and_its_configs_come_fastest_first_per_device(tmp_path):
    """find_problem and fastest_configs answer for one device only: the H100's best configs are
    its own, a device or shape with nothing recorded gets none; the configs are the ok ones,
    ordered by their recorded time (recorded_us: re-timed rounds first)."""
    shape = {"k": 4096, "m": 4096, "n": 4096}
    found = gt.find_problem("NVIDIA H200", "hopper_matmul", shape, "bfloat16")
    assert found is not None and found["name"] == "hopper_matmul__k4096_m4096_n4096__bfloat16"
    assert gt.find_problem("NVIDIA H200", "hopper_matmul", {**shape, "k": 1}, "bfloat16") is None
    h200 = gt.fastest_configs("NVIDIA H200", "hopper_matmul", shape, "bfloat16")
    h100 = gt.fastest_configs("NVIDIA H100 80GB HBM3", "hopper_matmul", shape, "bfloat16")
    assert h200 == [r["config"] for r in sorted(found["results"], key=gt.recorded_us)]
    assert len(h100) > 2 and h100[:2] != h200[:2]
    assert gt.fastest_configs("No Such GPU", "hopper_matmul", shape, "bfloat16") == []
    results = [{"config": {"b": 1}, "status": "ok", "median_us": 5.0},
               {"config": {"b": 2}, "status": "compile_error", "median_us": None},
               {"config": {"b": 3}, "status": "ok", "median_us": 9.0, gt.RETIMED: [4.0, 4.5]}]
    gt.save_ground_truth([{"kernel": "softmax", "device": "X", "shape": {"rows": 1}, "dtype": "f",
                           "results": results}], root=tmp_path)
    assert gt.fastest_configs("X", "softmax", {"rows": 1}, "f", root=tmp_path) == [{"b": 3}, {"b": 1}]


def test_a_per_shape_file_is_read_or_refused_naming_the_file_and_what_it_lacks(tmp_path):
    """read_problem_file gives a per-shape file's dict; a file that is not JSON, or lacks a
    required key, is refused with a ValueError naming it and the keys it lacks."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"kernel": "softmax", "shape": {}, "dtype": "float32", "results": []}))
    assert gt.read_problem_file(good)["kernel"] == "softmax"
    with pytest.raises(ValueError, match=r"good.json: not a ground-truth file \(no device\)"):
        gt.read_problem_file(good, ("kernel", "device"))
    (tmp_path / "notes.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"notes.json: not a ground-truth file \(no kernel, shape"):
        gt.read_problem_file(tmp_path / "notes.json")
    with pytest.raises(ValueError, match="gone.json: not a readable JSON file"):
        gt.read_problem_file(tmp_path / "gone.json")


def test_saving_merges_by_problem_and_writes_the_same_bytes_for_the_same_content(tmp_path):
    """A problem of the same name replaces the old one, others are kept; empty errors and the
    date are dropped; writing twice gives identical bytes (gzip without a timestamp)."""
    one = {"kernel": "softmax", "device": "Some GPU", "shape": {"rows": 8, "cols": 16}, "dtype": "float32",
           "date": "x", "results": [{"config": {"a": 1}, "status": "ok", "median_us": 2.0, "error": ""}]}
    two = {**one, "shape": {"rows": 4, "cols": 16}}
    [path] = gt.save_ground_truth([one, two], root=tmp_path)
    first = path.read_bytes()
    gt.save_ground_truth([one], root=tmp_path)
    assert path.read_bytes() == first
    gt.save_ground_truth([{**one, "results": []}], root=tmp_path)
    loaded = {p["name"]: p for p in gt.load_ground_truth("Some GPU", root=tmp_path)}
    assert list(loaded) == ["softmax__cols16_rows4__float32", "softmax__cols16_rows8__float32"]
    assert loaded["softmax__cols16_rows8__float32"]["results"] == []
    assert loaded["softmax__cols16_rows4__float32"]["results"] == [{"config": {"a": 1}, "status": "ok", "median_us": 2.0}]
    assert "date" not in loaded["softmax__cols16_rows4__float32"]


def test_a_file_of_another_format_and_bad_names_are_refused(tmp_path):
    """A file that is not format 1 names itself and the docs; bad names say the rule."""
    path = gt.ground_truth_path("Some GPU", "softmax", root=tmp_path)
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"problems": []}, f)
    with pytest.raises(ValueError, match="softmax.json.gz: not a ground-truth file of format 1"):
        gt.load_ground_truth("Some GPU", root=tmp_path)
    with pytest.raises(ValueError, match="letters, digits"):
        gt.ground_truth_path("Some GPU", "../x")


def test_unpacking_then_packing_gives_back_the_same_file(tmp_path):
    """pack_ground_truth.py --unpack writes per-shape files; packing them into an empty data
    folder gives the packaged file byte for byte (live entries aside: the H100 has none)."""
    device = "NVIDIA H100 80GB HBM3"
    unpack = subprocess.run([sys.executable, str(PACK), "--unpack", device, str(tmp_path / "gt")],
                            capture_output=True, text=True, timeout=120)
    assert unpack.returncode == 0, unpack.stderr
    files = sorted(str(p) for p in (tmp_path / "gt").glob("*.json"))
    assert len(files) == 6
    pack = subprocess.run([sys.executable, str(PACK), "--root", str(tmp_path / "data"), *files],
                          capture_output=True, text=True, timeout=120)
    assert pack.returncode == 0, pack.stderr
    for kernel in ("hopper_matmul", "softmax"):
        assert (gt.ground_truth_path(device, kernel, root=tmp_path / "data").read_bytes()
                == gt.ground_truth_path(device, kernel).read_bytes())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kernel": "softmax"}))
    refused = subprocess.run([sys.executable, str(PACK), "--root", str(tmp_path / "data"), str(bad)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "bad.json: not a ground-truth file (no shape, dtype" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_data_files_are_installed_with_the_package():
    """pyproject.toml's package-data for autotune.replay names every packaged data file, so an
    installed autotune reads the same ground truth as a checkout."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["autotune.replay"]
    package = gt.DATA_DIR.parent
    covered = {p for pattern in globs for p in package.glob(pattern)}
    assert covered and covered == set(gt.DATA_DIR.rglob("*.json.gz"))

"""benchmarks/cost_model_check.py: the cost model against every GPU measurement recorded."""

from __future__ import annotations

import json
import math

import pytest

from autotune.space.kernel import get_kernel
from autotune.tuning.samplers.ranked import ESTIMATE_TWIN
from tests.benchmark_scripts import load

check_script = load("cost_model_check")


def test_families_are_buckets_of_near_equal_estimates_best_first():
    estimates = [1.0, 1.001, 1.0015, 1.2, 1.0 * math.exp(ESTIMATE_TWIN) * 1.0001, 1.5]
    groups = check_script.families(estimates)
    assert groups[0] == [0, 1, 2]  # within one bucket of 0.5%
    assert groups[-1] == [5]
    assert groups.index([3]) > groups.index([4])  # 1.2 after 1.005: best-estimated first
    for g in groups:  # a family never spans more than ESTIMATE_TWIN (no chaining)
        logs = [math.log(estimates[i]) for i in g]
        assert max(logs) - min(logs) < ESTIMATE_TWIN
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_check_counts_the_families_the_model_ranks_ahead_of_the_fastest():
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    configs = [{"tile": t} for t in (1, 2, 3, 4)]
    # The model ranks tile 1 first, then 2, 3, 4; the fastest is tile 3, tile 1 is 20% slower.
    times = [12.0, 11.0, 10.0, 13.0]
    row = check_script.check(problem, configs, times, lambda p, c: float(c["tile"]))
    assert row["configs"] == 4 and row["families"] == 4
    assert row["families_ahead"] == 2
    assert math.isclose(row["first_family_gap"], 0.2)
    assert row["rho"] < 0.5  # the order is mostly wrong
    perfect = check_script.check(problem, configs, times, lambda p, c: times[c["tile"] - 1])
    assert perfect["families_ahead"] == 0 and perfect["first_family_gap"] == 0.0
    assert math.isclose(perfect["rho"], 1.0)


def test_family_outliers_counts_a_slow_twin_near_the_best():
    """A slow moment on the GPU: one of 24 twins (configs the model estimates alike) measured at
    86.5 us while the others measured 81-83; it is counted, a twin 1% above is not, and a
    config far from the best is not looked at."""
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    twins = [81.0 + 2.0 * i / 22 for i in range(23)] + [86.5]
    configs = [{"twin": i, "estimate": 1.0} for i in range(24)]
    times = list(twins)
    # Another family near the best, all alike; a far one (over 30% above the best) with a
    # member 10% above its family's median.
    configs += [{"twin": 30 + i, "estimate": 1.1} for i in range(3)]
    times += [84.0, 84.5, 84.2]
    configs += [{"twin": 40 + i, "estimate": 2.0} for i in range(3)]
    times += [200.0, 200.0, 220.0]
    row = check_script.check(problem, configs, times, lambda p, c: c["estimate"])
    assert row["family_outliers"] == 1
    times[5] = 82.0 * 1.01  # 1% above the family's median: noise, not counted
    assert check_script.check(problem, configs, times, lambda p, c: c["estimate"])["family_outliers"] == 1
    times[-1] = 86.0  # the far family, now near the best (within 30%), one 5% above its median
    times[-2] = times[-3] = 82.0
    assert check_script.check(problem, configs, times, lambda p, c: c["estimate"])["family_outliers"] == 2


def test_ground_truth_times_are_the_retimed_medians_where_present(tmp_path):
    """A record with re-timed rounds (ground_truth.py --retime) reads as their median."""
    one, two = {"tile_m": 64}, {"tile_m": 128}
    path = tmp_path / "hopper_matmul__k256_m256_n256__bfloat16.json"
    path.write_text(json.dumps({"kernel": "hopper_matmul", "shape": {"m": 256, "n": 256, "k": 256},
                                "dtype": "bfloat16", "results": [
        {"config": one, "status": "ok", "median_us": 86.5, "retimed_us": [82.0, 81.5, 83.0]},
        {"config": two, "status": "ok", "median_us": 84.0}]}))
    (rec,) = check_script.ground_truth([str(path)])
    assert rec["times"] == {json.dumps(one, sort_keys=True): 82.0, json.dumps(two, sort_keys=True): 84.0}


def test_live_runs_are_read_from_both_formats_as_medians_over_runs(tmp_path):
    config = {"tile_m": 64}
    other = {"tile_m": 128}
    shape = {"k": 512, "m": 64, "n": 256}
    lines = [
        {"event": "start", "problem": "x"},
        {"event": "trial", "kernel": "hopper_matmul", "shape": shape, "dtype": "bfloat16",
         "status": "ok", "time_us": 10.0, "config": config},
        {"event": "trial", "kernel": "hopper_matmul", "shape": shape, "dtype": "bfloat16",
         "status": "wrong_result", "time_us": None, "config": other},
    ]
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    runs = tmp_path / "b_live.json"
    name = "hopper_matmul[k=512,m=64,n=256; bfloat16]"
    runs.write_text(json.dumps({
        "cold0": {"table": "", "trials": {name: [{"index": 1, "status": "ok", "median_us": 14.0, "config": config}]}},
        "cold1": {"table": "", "trials": {name: [{"index": 1, "status": "ok", "median_us": 12.0, "config": config},
                                                  {"index": 2, "status": "ok", "median_us": 20.0, "config": other}]}},
    }))
    (rec,) = check_script.live([str(jsonl), str(runs)])
    assert (rec["kernel"], rec["shape"], rec["dtype"]) == ("hopper_matmul", shape, "bfloat16")
    assert rec["times"] == {json.dumps(config, sort_keys=True): 12.0,  # median of 10, 14, 12
                            json.dumps(other, sort_keys=True): 20.0}  # the failure left out


def test_every_recorded_h200_measurement_is_checked():
    """The packaged ground truth and live measurements are all read: 7 ground-truth shapes of
    700+ configs, 4 live shapes of 150+."""
    rows = check_script.run("hopper_matmul")  # the package's H200 ground truth and live runs
    truth = [r for r in rows if r["source"] == "ground truth"]
    live = [r for r in rows if r["source"] == "live"]
    assert len(truth) == 7 and all(r["configs"] >= 700 for r in truth)
    assert len(live) == 4 and all(r["configs"] >= 150 for r in live)
    assert all(r["rho"] >= 0.9 for r in truth)


def test_each_devices_measurements_are_checked_with_that_devices_facts(monkeypatch):
    """The model sees the measured device's facts whatever the machine's default profile (the
    H100's here): the H200's live 64x4096x4096 reads as the H200's model ranks it (its first
    family 27.5% from the fastest; with the H100's facts, before, 10.8%), and ``--device``
    checks the H100's five recorded shapes with the H100's (their first family is the
    fastest at three, 0.7% and 1.5% behind it at the decode shapes)."""
    from autotune import devices

    monkeypatch.delenv(devices.PROFILE_ENV_VAR, raising=False)
    monkeypatch.setattr(devices, "read_device", lambda ordinal=0: None)
    assert devices.current_device().name == "NVIDIA H100 80GB HBM3"
    rows = check_script.run("hopper_matmul")
    (decode,) = [r for r in rows if r["source"] == "live" and "m=64," in r["problem"]]
    assert decode["first_family_gap"] > 0.2
    h100 = check_script.run("hopper_matmul", device="NVIDIA H100 80GB HBM3")
    assert len(h100) == 5 and all(r["first_family_gap"] < 0.02 for r in h100)


def test_a_file_that_is_not_a_measurement_stops_the_check_naming_it(tmp_path):
    missing = str(tmp_path / "gone.json")
    with pytest.raises(SystemExit, match="gone.json: not a ground-truth file"):
        check_script.ground_truth([missing])
    notes = tmp_path / "notes_live.json"
    notes.write_text(json.dumps({"run": {"no trials": []}}))
    with pytest.raises(SystemExit, match="notes_live.json: not a live run's trials"):
        check_script.live([str(notes)])


def test_a_device_without_measurements_stops_the_check_naming_those_with(capsys):
    """``--device`` of a GPU the package holds no measurement of ends in one line naming the
    devices it holds and exit 2, not an empty table (cost_model_fit reads the same)."""
    with pytest.raises(SystemExit) as stop:
        check_script.main(["--device", "NVIDIA A100-SXM4-80GB"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "[measurements] nothing to check" in err and "none of 'NVIDIA A100-SXM4-80GB'" in err
    assert "NVIDIA H100 80GB HBM3, NVIDIA H200" in err
    with pytest.raises(SystemExit) as stop:
        load("cost_model_fit").main(["--device", "NVIDIA A100-SXM4-80GB"])
    assert stop.value.code == 2

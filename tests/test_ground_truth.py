"""benchmarks/ground_truth.py on the fake evaluator: the stages it measures, --extend and --retime;
where a device's ground truth is stored; benchmarks/ranked_live.sh with DEVICE=fake."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from autotune.replay import ground_truth as recorded
from autotune.space.kernel import get_kernel
from autotune.space.problem import Config
from tests.benchmark_scripts import ROOT, load

ground_truth = load("ground_truth")
SHAPE = "m=256,n=256,k=256"
FILE = "hopper_matmul__k256_m256_n256__bfloat16.json"


def _run(out, *args):
    ground_truth.main(["--kernel", "hopper_matmul", "--shape", SHAPE, "--device", "fake",
                       "--iterations", "3", "--out", str(out), *args])
    return json.loads((out / FILE).read_text())


def test_the_estimated_configs_are_the_cost_models_first_choices_minus_those_measured():
    kernel = get_kernel("hopper_matmul")
    space = kernel.valid_space(kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16"))
    first = ground_truth.estimated_configs(kernel, space, 6)
    assert len(first) == 6 and len({c.digest() for c in first}) == 6
    assert all(space.is_valid(c) for c in first)
    estimates = [kernel.cost_model(space.problem, c) for c in first]
    assert estimates == sorted(estimates)
    # No drawn config is estimated better than the first choice: the climb found the best.
    drawn = space.sample(200, seed=1)
    assert min(kernel.cost_model(space.problem, c) for c in drawn) >= estimates[0] * (1 - 1e-9)
    # Those already measured are passed over (a twin of one, the same estimate in another grid
    # order, may take its place); the rest keep their order.
    later = ground_truth.estimated_configs(kernel, space, 4, skip=[dict(first[0]), dict(first[2])])
    assert first[0] not in later and first[2] not in later and first[1] in later
    later_estimates = [kernel.cost_model(space.problem, c) for c in later]
    assert later_estimates == sorted(later_estimates)


def test_grid_measures_every_grid_order_of_the_cost_models_first_choices(tmp_path):
    """``--grid N``: every valid (grid_minor_dim, grid_tile_width) variant of the cost model's N
    first choices, once each, after what the file holds (``"stage": "grid"``)."""
    kernel = get_kernel("hopper_matmul")
    space = kernel.valid_space(kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16"))
    firsts = ground_truth.estimated_configs(kernel, space, 2)
    data = _run(tmp_path, "--max", "3", "--grid", "2")
    grid = [Config(r["config"]) for r in data["results"] if r["stage"] == "grid"]
    held = {Config(r["config"]).digest() for r in data["results"][:3]}
    order = ("grid_minor_dim", "grid_tile_width")
    expected = {Config(c, grid_minor_dim=d, grid_tile_width=w) for c in firsts
                for d in ("M", "N") for w in range(1, 17)}
    expected = {c.digest() for c in expected if space.is_valid(c)} - held
    assert {c.digest() for c in grid} == expected and len(grid) == len(expected) > 2
    assert {tuple(c[n] for n in order) for c in grid} != {tuple(firsts[0][n] for n in order)}


def test_live_measures_what_jobs_stored_of_the_problem_on_this_device(tmp_path):
    """``--live DB ...``: every config that jobs stored in the databases measured of this problem
    on this device, measured here once each after what the file holds (``"stage": "live"``); a
    database that cannot be read stops it before anything is measured."""
    from autotune.engine.dispatcher import Engine
    from autotune.space.outcomes import DeviceInfo, TrialResult
    from autotune.storage.store import Store

    with Engine(mode="fake") as engine:
        here = engine.device_info()
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    configs = kernel.valid_space(problem).sample(5, seed=5)
    dbs = []
    for n, part in enumerate((configs[:3], configs[1:4])):
        db = f"sqlite:///{tmp_path}/job{n}.db"
        with Store(db) as store:
            for c in part:
                store.record_trial(problem, c, TrialResult.timed([1.0], compile_s=0.1, rel_error=0.0,
                                                                 timing="fake"),
                                   device=here, software={"jax": "0.10.2"})
            # another device's result of the problem is not this device's
            store.record_trial(problem, configs[4], TrialResult.timed([1.0], compile_s=0.1, rel_error=0.0,
                                                                       timing="fake"),
                               device=DeviceInfo("NVIDIA H200", "gpu"), software={"jax": "0.10.2"})
        dbs.append(db)
    data = _run(tmp_path, "--max", "2", "--live", *dbs)
    live = [Config(r["config"]).digest() for r in data["results"] if r["stage"] == "live"]
    held = {Config(r["config"]).digest() for r in data["results"][:2]}
    assert sorted(live) == sorted({c.digest() for c in configs[:4]} - held)
    with pytest.raises(SystemExit, match="--live: "):
        _run(tmp_path / "other", "--max", "2", "--live", f"sqlite:///{tmp_path}/missing.db")
    assert not (tmp_path / "other").exists() and not (tmp_path / "missing.db").exists()


def test_extend_keeps_the_file_and_adds_only_configs_not_measured(tmp_path):
    first = _run(tmp_path, "--max", "5")
    assert [r["stage"] for r in first["results"]] == ["uniform"] * 5
    second = _run(tmp_path, "--max", "5", "--estimated", "4", "--extend")
    # The same uniform sample (same seed) is not measured again; the estimated configs are new.
    assert second["results"][:5] == first["results"]
    assert [r["stage"] for r in second["results"][5:]] == ["estimated"] * 4
    digests = [Config(r["config"]).digest() for r in second["results"]]
    assert len(digests) == len(set(digests)) == 9
    assert second["measured"] == 9 and second["uniform_sample"] == 5
    assert second["seconds"] >= first["seconds"]  # the time of both runs
    assert not list(tmp_path.glob("*.partial"))  # written beside, then renamed
    # Without --extend the file is replaced.
    third = _run(tmp_path, "--max", "2")
    assert len(third["results"]) == 2


def test_extend_refuses_a_file_of_another_problem(tmp_path):
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    previous = {"kernel": "hopper_matmul", "shape": {"m": 512, "n": 256, "k": 256}, "dtype": "bfloat16",
                "results": []}
    payload = {"kernel": "hopper_matmul", "shape": problem.dims, "dtype": "bfloat16", "results": []}
    with pytest.raises(SystemExit, match="--extend: the file holds"):
        ground_truth.merge(previous, payload, problem)


def test_negative_counts_are_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="--max and --estimated must be 0 or more"):
        _run(tmp_path, "--estimated", "-1")
    with pytest.raises(SystemExit, match=r"--grid must be 0 or more \(got -2\)"):
        _run(tmp_path, "--grid", "-2")


def test_grid_is_refused_for_a_kernel_without_the_grid_order(tmp_path):
    """``--grid`` walks hopper_matmul's grid order; for another kernel it stops, naming both,
    before anything is measured or written."""
    with pytest.raises(SystemExit, match="--grid: hopper_matmul's grid order, not 'softmax''s"):
        ground_truth.main(["--kernel", "softmax", "--shape", "rows=32,cols=512", "--device", "fake",
                           "--out", str(tmp_path), "--grid", "2"])
    assert not list(tmp_path.iterdir())


def test_a_changed_cost_model_is_followed_and_a_bad_constant_stops_before_measuring(tmp_path):
    kernel = get_kernel("hopper_matmul")
    space = kernel.valid_space(kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16"))
    from search_spaces import hopper_matmul

    changed = hopper_matmul.cost_model(stage_transfer="loaded", l2_latency=2000.0, l2_bytes=128.0)
    firsts = ground_truth.estimated_configs(kernel, space, 3, estimate=changed)
    estimates = [changed(space.problem, c) for c in firsts]
    assert estimates == sorted(estimates)
    data = _run(tmp_path, "--max", "0", "--estimated", "3",
                "--constants", "stage_transfer=loaded,l2_latency=2000,l2_bytes=128")
    assert [Config(r["config"]) for r in data["results"]] == firsts
    for bad, message in ((["--estimated", "2", "--constants", "l2_bites=64"], "unknown Hopper constant"),
                         (["--estimated", "2", "--constants", "stage_transfer=half"], "stage_transfer must be one of"),
                         (["--constants", "l2_bytes=64"], "give --estimated N too")):
        with pytest.raises(SystemExit, match=message):
            _run(tmp_path / "bad", *bad)
        assert not (tmp_path / "bad").exists()  # nothing measured, nothing written


def test_files_extends_each_ground_truth_file_with_one_engine(tmp_path):
    _run(tmp_path, "--max", "3")
    ground_truth.main(["--kernel", "hopper_matmul", "--shape", "m=512,n=256,k=256", "--device", "fake",
                       "--iterations", "3", "--out", str(tmp_path), "--max", "3"])
    files = sorted(str(p) for p in tmp_path.glob("hopper_matmul__*.json"))
    assert len(files) == 2
    before = {f: json.loads(Path(f).read_text()) for f in files}
    ground_truth.main(["--files", *files, "--device", "fake", "--iterations", "3", "--max", "0",
                       "--estimated", "2"])
    for f in files:
        after = json.loads(Path(f).read_text())
        assert after["shape"] == before[f]["shape"]
        assert after["results"][:3] == before[f]["results"]
        assert [r["stage"] for r in after["results"][3:]] == ["estimated"] * 2


def test_files_refuses_a_file_that_is_not_ground_truth_before_measuring(tmp_path):
    first = _run(tmp_path, "--max", "2")
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SystemExit, match="notes.json is not a ground-truth file"):
        ground_truth.main(["--files", str(tmp_path / FILE), str(bad), "--device", "fake", "--max", "0",
                           "--estimated", "2"])
    assert json.loads((tmp_path / FILE).read_text()) == first  # nothing measured or written
    with pytest.raises(SystemExit, match="either --kernel and --shape"):
        ground_truth.main(["--files", str(tmp_path / FILE), "--kernel", "hopper_matmul", "--shape", SHAPE])


def test_retime_appends_the_rounds_medians_to_the_configs_near_the_best(tmp_path):
    data = _run(tmp_path, "--max", "6", "--retime", "0.08", "--rounds", "3", "--retime-max", "4")
    # On the fake device every config measures about 100 us: all are near the best, and the
    # four fastest are re-timed, three rounds each.
    retimed = [r for r in data["results"] if "retimed_us" in r]
    fastest = sorted(data["results"], key=lambda r: r["median_us"])[:4]
    assert [r["config"] for r in retimed] == [r["config"] for r in data["results"] if r in fastest]
    assert all(len(r["retimed_us"]) == 3 and all(t > 0 for t in r["retimed_us"]) for r in retimed)
    assert not any("retime_error" in r for r in data["results"])
    (entry,) = data["retimes"]
    assert (entry["fraction"], entry["rounds"], entry["configs"], entry["failed"]) == (0.08, 3, 4, 0)
    assert not list(tmp_path.glob("*.partial"))


def test_retime_alone_measures_an_earlier_runs_configs_once_first_and_appends(tmp_path, monkeypatch):
    """--files F --max 0 --retime: the file's configs were compiled by another engine, so each
    is submitted once first (the workers then hold its executable, kept_compiled large enough
    for all), then re-timed; a second re-time appends to the first."""
    first = _run(tmp_path, "--max", "3")
    submitted, engines = [], []
    real_engine, real_submit = ground_truth.Engine, ground_truth.Engine.submit

    def engine(*args, **kwargs):
        engines.append(kwargs)
        return real_engine(*args, **kwargs)

    def submit(self, kernel_name, problem, config):
        submitted.append(dict(config))
        return real_submit(self, kernel_name, problem, config)

    monkeypatch.setattr(ground_truth, "Engine", engine)
    monkeypatch.setattr(real_engine, "submit", submit)
    argv = ["--files", str(tmp_path / FILE), "--device", "fake", "--iterations", "3", "--max", "0",
            "--retime", "0.08", "--rounds", "2"]
    ground_truth.main(argv)
    assert engines[0]["keep_compiled"] == 96  # the default --retime-max
    assert sorted(map(str, submitted)) == sorted(str(r["config"]) for r in first["results"])
    ground_truth.main(argv)
    data = json.loads((tmp_path / FILE).read_text())
    assert [{k: v for k, v in r.items() if k != "retimed_us"} for r in data["results"]] == first["results"]
    assert all(len(r["retimed_us"]) == 4 for r in data["results"])  # 2 rounds, twice
    assert len(data["retimes"]) == 2


def test_a_config_whose_retime_fails_gets_retime_error_and_keeps_its_figures(tmp_path, monkeypatch):
    from autotune.space.outcomes import Outcome, TrialResult

    first = _run(tmp_path, "--max", "4")
    broken = Config(first["results"][1]["config"]).digest()
    real_retime = ground_truth.Engine.retime

    def retime(self, kernel_name, problem, config, **kwargs):
        if config is not None and config.digest() == broken:
            return TrialResult.failed(Outcome.CRASHED, "the worker died (SIGSEGV)")
        return real_retime(self, kernel_name, problem, config, **kwargs)

    monkeypatch.setattr(ground_truth.Engine, "retime", retime)
    ground_truth.main(["--files", str(tmp_path / FILE), "--device", "fake", "--iterations", "3",
                       "--max", "0", "--retime", "0.08", "--rounds", "2"])
    data = json.loads((tmp_path / FILE).read_text())
    bad = data["results"][1]
    assert bad["retime_error"] == "the worker died (SIGSEGV)" and "retimed_us" not in bad
    assert {k: v for k, v in bad.items() if k != "retime_error"} == first["results"][1]
    others = [r for i, r in enumerate(data["results"]) if i != 1]
    assert all(len(r["retimed_us"]) == 2 and "retime_error" not in r for r in others)
    assert data["retimes"][0]["failed"] == 1


@pytest.mark.parametrize(("flags", "message"), [
    (["--retime", "0"], "--retime 0.0: the fraction above the file's best"),
    (["--retime", "1.5"], "--retime 1.5: the fraction above the file's best"),
    (["--retime", "0.08", "--rounds", "0"], "--rounds 0: must be at least 1"),
    (["--retime", "0.08", "--retime-max", "-2"], "--retime-max -2: must be at least 1"),
    (["--rounds", "3"], "give --retime FRACTION too"),
])
def test_bad_retime_flags_stop_before_anything_is_measured(tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message):
        _run(tmp_path / "bad", "--max", "2", *flags)
    assert not (tmp_path / "bad").exists()  # nothing measured, nothing written


SCRIPT = ROOT / "benchmarks" / "ranked_live.sh"
MATMUL = "hopper_matmul__k8192_m128_n8192__bfloat16.json"


def _recorded_matmul() -> dict:
    """The H200's recorded problem of MATMUL, as a per-shape file holds it."""
    [problem] = [p for p in recorded.load_ground_truth("NVIDIA H200", "hopper_matmul")
                 if p["name"] == MATMUL.removesuffix(".json")]
    return {k: v for k, v in problem.items() if k != "name"}


def _gpu_script(tmp_path, step, **env):
    """benchmarks/ranked_live.sh STEP on a copy of one recorded problem, small settings."""
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / MATMUL).write_text(json.dumps(_recorded_matmul()))
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "DATA": str(data),
           "ESTIMATED": "2", "RETIME_MAX": "3", "ROUNDS": "2", "GT_SECONDS": "20", **env}
    return subprocess.run(["bash", str(SCRIPT), step], env=env, capture_output=True, text=True, timeout=600)


def test_the_gpu_script_models_step_on_the_fake_device_packs_the_extended_and_retimed_files(tmp_path):
    done = _gpu_script(tmp_path, "models", DEVICE="fake")
    assert done.returncode == 0, done.stdout + done.stderr
    before = _recorded_matmul()["results"]
    assert json.loads((tmp_path / "data" / MATMUL).read_text())["results"] == before  # a copy is extended
    with tarfile.open(tmp_path / "out" / "ranked_live_models.tgz") as tgz:
        after = json.load(tgz.extractfile(f"models/{MATMUL}"))["results"]
        steps = tgz.extractfile("models/steps.txt").read().decode().splitlines()
    # The model's 2 first choices added, then the 3 fastest re-timed (2 rounds each).
    assert [r["stage"] for r in after[len(before):]] == ["estimated"] * 2
    assert [{k: v for k, v in r.items() if k != "retimed_us"} for r in after[:len(before)]] == before
    fastest = sorted((r for r in before if r["status"] == "ok"), key=lambda r: r["median_us"])[:3]
    assert [r["config"] for r in after if "retimed_us" in r] == [r["config"] for r in before if r in fastest]
    assert all(len(r["retimed_us"]) == 2 for r in after if "retimed_us" in r)
    assert [line.split(":")[0] for line in steps] == ["models_estimated", "models_retime"]
    assert all(": exit 0 after" in line for line in steps)


def test_the_gpu_script_packs_what_it_has_when_its_budget_is_spent_and_refuses_bad_input(tmp_path):
    done = _gpu_script(tmp_path, "models", DEVICE="fake", BUDGET_S="0")
    assert done.returncode == 1
    with tarfile.open(tmp_path / "out" / "ranked_live_models.tgz") as tgz:
        steps = tgz.extractfile("models/steps.txt").read().decode()
        assert json.load(tgz.extractfile(f"models/{MATMUL}")) == _recorded_matmul()
    assert steps.count("skipped, the step's budget of 0 s is spent") == 2
    bad = _gpu_script(tmp_path / "bad", "model", DEVICE="fake")
    assert bad.returncode == 2 and "usage:" in bad.stderr and not (tmp_path / "bad" / "out").exists()
    # Another GPU works on its own ground truth: with none recorded, the step says so.
    env = {k: v for k, v in os.environ.items() if k != "DATA"}
    other = subprocess.run(["bash", str(SCRIPT), "models"], capture_output=True, text=True,
                           timeout=120, env={**env, "OUT": str(tmp_path / "gpu" / "out"),
                                             "DEVICE": "fake", "GPU_NAME": "No Such GPU"})
    assert other.returncode == 2, other.stderr
    assert "no ground truth of No Such GPU in" in other.stderr
    assert not (tmp_path / "gpu" / "out").exists()


def test_each_device_has_its_own_folder_and_a_file_of_another_device_is_refused(tmp_path):
    """Every device's ground truth sits in its own folder of the package's data; on a GPU,
    ground_truth.py --out auto stores there, and refuses to extend a file another device
    measured."""
    import argparse

    data = recorded.DATA_DIR
    assert recorded.ground_truth_path("NVIDIA H200", "hopper_matmul") == data / "nvidia-h200" / "hopper_matmul.json.gz"
    assert recorded.ground_truth_path("NVIDIA H100 80GB HBM3", "softmax") == (
        data / "nvidia-h100-80gb-hbm3" / "softmax.json.gz")
    assert {p["device"] for p in recorded.load_ground_truth("NVIDIA H100 80GB HBM3")} == {"NVIDIA H100 80GB HBM3"}
    with pytest.raises(ValueError, match="letter or digit"):
        recorded.device_slug(" -- ")
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    args = argparse.Namespace(out="auto", files=None, extend=False)
    job = (kernel, problem, tmp_path / "x.json", {"device": "NVIDIA H200"}, None)
    with pytest.raises(SystemExit, match="measured on NVIDIA H200, but this device is NVIDIA H100"):
        ground_truth.on_this_device([job], "NVIDIA H100 80GB HBM3",
                                    argparse.Namespace(out=str(tmp_path), files=None,
                                                       extend=True), gpu=True)
    [(_, _, path, previous, _)] = ground_truth.on_this_device(
        [(kernel, problem, tmp_path / "x.json", None, None)], "NVIDIA H100 80GB HBM3", args, gpu=True)
    assert path == recorded.ground_truth_path("NVIDIA H100 80GB HBM3", "hopper_matmul") and previous is None
    with pytest.raises(SystemExit, match="give --out DIR"):
        ground_truth.on_this_device([job], "fake-gpu", args, gpu=False)


def test_a_packaged_file_gets_the_measured_problem_merged_in(tmp_path):
    """ground_truth.py's writer stores into a packaged file by merging the problem in: other
    problems of the file are kept, the same problem is replaced."""
    root = tmp_path / "data"
    target = recorded.ground_truth_path("NVIDIA H200", "hopper_matmul", root=root)
    recorded.save_ground_truth([{**_recorded_matmul(), "device": "NVIDIA H200"}], root=root)
    payload = {"kernel": "hopper_matmul", "shape": {"k": 256, "m": 256, "n": 256}, "dtype": "bfloat16",
               "device": "NVIDIA H200", "results": [{"config": {"tile_m": 64}, "status": "ok", "median_us": 5.0}]}
    ground_truth.write(target, payload)
    ground_truth.write(target, {**payload, "results": payload["results"] * 2})
    names = [p["name"] for p in recorded.load_ground_truth("NVIDIA H200", "hopper_matmul", root=root)]
    assert names == ["hopper_matmul__k256_m256_n256__bfloat16", MATMUL.removesuffix(".json")]
    assert len(recorded.load_ground_truth(root=root)[0]["results"]) == 2

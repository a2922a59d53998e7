"""benchmarks/ground_truth.py on the fake evaluator: the stages it measures and --extend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.space.kernel import get_kernel
from autotune.space.problem import Config
from tests.benchmark_scripts import load

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

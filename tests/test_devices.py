"""Device facts (autotune/devices.py): read from the driver, else a named profile; every
hardware number of the tuner comes from there, and the spaces, persistent grids and cost
model follow the device."""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import json
import operator
import pathlib
import re

import pytest

from autotune import cli, devices
from autotune.devices import DeviceFacts, current_device, profile
from autotune.errors import JobError

REPO = pathlib.Path(__file__).resolve().parents[1]
FOUR = ("h100-sxm", "h100-pcie", "h20", "h200")


@pytest.fixture(autouse=True)
def no_driver(monkeypatch):
    """Every test here runs as on a machine without a GPU (also on one with a GPU)."""
    monkeypatch.setattr(devices, "read_device", lambda ordinal=0: None)
    monkeypatch.setattr(devices, "_DRIVER", {})
    monkeypatch.delenv(devices.PROFILE_ENV_VAR, raising=False)


# -- hardware numbers live in devices.py only -------------------------------------------------

# 132 SMs, 227 KiB per block, 228 KiB per SM, 50 MiB of L2: an H100's facts; 60 MiB: an H200's L2.
HARDWARE_NUMBERS = {132, 232448, 233472, 52428800, 62914560}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Pow: operator.pow, ast.FloorDiv: operator.floordiv, ast.LShift: operator.lshift}


def _constant_value(node: ast.AST) -> object:
    """The value of an expression of integer literals (``50 * 2**20``), else None; evaluated
    here, never compiled."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, int) else None
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _constant_value(node.left), _constant_value(node.right)
        small = type(node.op) not in (ast.Pow, ast.LShift) or (isinstance(right, int) and 0 <= right < 64)
        if isinstance(left, int) and isinstance(right, int) and small:
            return _OPS[type(node.op)](left, right)
    return None


def hardware_literals(path: pathlib.Path) -> list[str]:
    """``file:line what`` for each hardware number or ``H200`` in a module's code (docstrings
    and comments aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    rel = path.relative_to(REPO)  # once per file: per node it was most of the scan's time
    found = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Constant, ast.BinOp)):
            value = _constant_value(node)
            if isinstance(value, int) and not isinstance(value, bool) and value in HARDWARE_NUMBERS:
                found.append(f"{where} {ast.unparse(node)}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if "H200" in node.value:
                found.append(f"{where} {node.value[:60]!r}")
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        found.extend(f"{where} {n}" for n in names if "H200" in n)
    return found


def test_no_hardware_number_outside_the_device_module():
    """No module of autotune/ or search_spaces/ but devices.py holds 132, 232448 (232_448),
    50 * 2**20 (52428800), 60 * 2**20, 228 KiB or ``H200`` in its code (docstrings and comments
    aside)."""
    paths = sorted((REPO / "autotune").rglob("*.py")) + sorted((REPO / "search_spaces").rglob("*.py"))
    bad = [hit for p in paths if p.name != "devices.py" or p.parent.name != "autotune"
           for hit in hardware_literals(p)]
    assert not bad, "\n".join(bad)


def test_the_literal_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: each spelling of a hardware number, and H200 in a name or string."""
    sample = REPO / "tests" / "_devices_scan_sample.py"
    sample.write_text(
        '"""The H200 in a docstring is fine."""\n'
        "A = 132  # the H200 in a comment is fine\n"
        "B = 232_448\n"
        "C = 50 * 2**20\n"
        "D = 'NVIDIA H200'\n"
        "H200_NUM_SMS = 7\n"
    )
    try:
        hits = hardware_literals(sample)
    finally:
        sample.unlink()
    assert [h.split(" ", 1)[1] for h in hits] == ["132", "232448", "50 * 2 ** 20", "'NVIDIA H200'",
                                                  "H200_NUM_SMS"]


# -- the module ------------------------------------------------------------------------------

_READ_DEVICE = devices.read_device  # the real one (the fixture replaces it per test)


def test_profiles_hold_the_datasheet_facts_of_each_hopper_gpu():
    """SMs, shared memory, L2 and compute capability of the Hopper profiles; h100-sxm is the
    default. The H100's L2 is 50 MiB, the H200's 60 MiB as its driver reports it
    (benchmarks/RESULTS.md, the devices under Conventions)."""
    sms = {key: profile(key).num_sms for key in ("h100-sxm", "h100-pcie", "h200", "h20", "h800",
                                                 "gh200")}
    assert sms == {"h100-sxm": 132, "h100-pcie": 114, "h200": 132, "h20": 78, "h800": 132,
                   "gh200": 132}
    for key in sms:
        facts = profile(key)
        assert (facts.compute_capability, facts.arch) == ("9.0", "sm_90a")
        assert (facts.smem_per_block, facts.smem_per_sm) == (227 * 1024, 228 * 1024)
        assert facts.source == f"profile:{key}"
    assert (profile("h100-sxm").l2_bytes, profile("h200").l2_bytes) == (50 * 2**20, 60 * 2**20)
    assert devices.DEFAULT_PROFILE == "h100-sxm"
    assert current_device() == profile("h100-sxm")


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA H20", "h20"), ("NVIDIA H800", "h800"),
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA GeForce RTX 4090", None),
])
def test_a_device_name_matches_its_profile(name, key):
    """H20, H200 and GH200 are told apart, and the PCIe H100 from the SXM one."""
    assert devices.profile_for_name(name) == key


def test_arch_of_a_compute_capability():
    """Hopper and later compile for the architecture-specific target (sm_90a)."""
    assert [devices.arch_of(cc) for cc in ("8.0", "9.0", "10.0")] == ["sm_80", "sm_90a", "sm_100a"]


class _FakeCuda:
    """libcuda.so.1's few entry points, answering as an H100 PCIe does."""

    ATTRS = {13: 1755000, 16: 114, 36: 1593000, 37: 5120, 38: 52428800, 75: 9, 76: 0,
             81: 233472, 97: 232448}

    def __init__(self, name: bytes = b"NVIDIA H100 PCIe", fail_init: bool = False):
        self.name, self.fail_init = name, fail_init

    def cuInit(self, flags):  # noqa: N802 - the driver's names
        return 100 if self.fail_init else 0

    def cuDeviceGet(self, ref, ordinal):  # noqa: N802
        ref._obj.value = ordinal
        return 0 if ordinal == 0 else 101

    def cuDeviceGetName(self, buf, size, device):  # noqa: N802
        buf.value = self.name
        return 0

    def cuDeviceGetAttribute(self, ref, attr, device):  # noqa: N802
        ref._obj.value = self.ATTRS[attr]
        return 0


def test_read_device_asks_the_cuda_driver(monkeypatch):
    """The facts come from cuDeviceGetAttribute (bandwidth = memory clock x bus width x 2) and
    the peaks from the profile the name matches; no driver, a failing cuInit or no such GPU
    give None."""
    def fresh(ordinal):
        monkeypatch.setattr(devices, "_DRIVER", {})
        return _READ_DEVICE(ordinal)

    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: _FakeCuda())
    facts = fresh(0)
    assert facts == DeviceFacts(
        name="NVIDIA H100 PCIe", compute_capability="9.0", arch="sm_90a", num_sms=114,
        smem_per_block=232448, smem_per_sm=233472, l2_bytes=52428800, mem_bandwidth_gbs=2039.0,
        peak_bf16_tflops=756.0, peak_fp32_tflops=51.0, sm_clock_mhz=1755.0, mem_clock_mhz=1593.0,
        source="driver")
    assert fresh(1) is None
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: _FakeCuda(fail_init=True))
    assert fresh(0) is None
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: _FakeCuda(name=b"Some New GPU"))
    assert fresh(0).peak_bf16_tflops is None

    def missing(name):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(devices.ctypes, "CDLL", missing)
    assert fresh(0) is None
    assert isinstance(ctypes.c_int(), ctypes.c_int)  # ctypes itself untouched


def test_the_query_side_never_asks_the_driver(monkeypatch, tmp_path):
    """current_device(ask_driver=False) (the query side: best, results, the lookup) never
    loads libcuda: it uses what this process already read, else the profile."""
    loads = []
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: loads.append(name) or _FakeCuda())
    monkeypatch.setattr(devices, "read_device", _READ_DEVICE)
    assert current_device(ask_driver=False) == profile("h100-sxm") and loads == []
    with devices.using_profile(None):  # what every command without --device-profile does
        assert loads == []
    assert current_device().num_sms == 114 and loads == ["libcuda.so.1"]
    assert current_device(ask_driver=False).num_sms == 114 and len(loads) == 1
    from autotune.queries import lookup
    from autotune.space import validity
    from search_spaces.softmax import KERNEL

    monkeypatch.setattr(devices, "_DRIVER", {})
    problem = KERNEL.problem({"rows": 4096, "cols": 4096}, "bfloat16")
    validity.violations(problem, KERNEL.default_config(problem), kernel=KERNEL)
    lookup.clear_cache()
    assert lookup.lookup_config("softmax", {"rows": 4096, "cols": 4096}, "bfloat16",
                                db=f"sqlite:///{tmp_path}/none.db")[1] == "default"
    assert len(loads) == 1


def test_current_device_prefers_the_driver_then_the_named_profile(monkeypatch):
    """The driver's GPU wins over any profile; else the profile named, else
    $AUTOTUNE_DEVICE_PROFILE, else h100-sxm; an unknown name is an error naming the known."""
    assert current_device("h20").num_sms == 78
    monkeypatch.setenv(devices.PROFILE_ENV_VAR, "h100-pcie")
    assert current_device().num_sms == 114
    assert current_device("h200").name == "NVIDIA H200"
    driver = dataclasses.replace(profile("h20"), source="driver")
    monkeypatch.setattr(devices, "read_device", lambda ordinal=0: driver)
    assert current_device("h100-sxm") is driver
    with pytest.raises(JobError, match=r"Unknown device profile 'h100'.*h100-sxm, h100-pcie"):
        current_device("h100")


def test_using_profile_sets_the_choice_for_the_block_and_its_workers(monkeypatch):
    """Inside, current_device() (and any worker process started, through the environment)
    falls back to the profile; after, the choice is as before; a bad name changes nothing."""
    with devices.using_profile("H20") as facts:
        assert facts.num_sms == 78 and current_device().num_sms == 78
        assert devices.os.environ[devices.PROFILE_ENV_VAR] == "h20"
    assert devices.PROFILE_ENV_VAR not in devices.os.environ
    with pytest.raises(JobError, match="Unknown device profile"), devices.using_profile("h2000"):
        pass
    assert devices.PROFILE_ENV_VAR not in devices.os.environ


def test_facts_round_trip_through_json():
    """The facts stored with a device row read back equal."""
    facts = profile("h20")
    assert DeviceFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts
    with pytest.raises(ValueError, match="num_sms must be a positive integer"):
        dataclasses.replace(facts, num_sms=0)


# -- the spaces, the persistent grids and the cost model follow the device ---------------------


def test_the_smem_rule_reads_the_devices_limit():
    """A space binds the current device's shared memory per block; the four Hopper profiles
    share 227 KiB (same valid set), and a device with less (an A100's 163 KiB) has fewer."""
    from search_spaces.hopper_matmul import KERNEL

    problem = KERNEL.problem({"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
    counts = {}
    for key in (*FOUR, "a100-sxm"):
        with devices.using_profile(key):
            bound = KERNEL.bind(problem)
            assert bound.env.device == profile(key)
            assert bound.env.smem_limit_bytes == profile(key).smem_per_block
            counts[key] = bound.count()
    assert len({counts[k] for k in FOUR}) == 1
    assert counts["a100-sxm"] < counts["h100-sxm"]
    smaller = dataclasses.replace(profile("h100-pcie"), smem_per_block=100 * 1024)
    assert KERNEL.bind(problem, device=smaller).count() < counts["h100-pcie"]


def test_blocks_per_sm_rule_reads_the_devices_smem_per_sm():
    """mosaic_scale's blocks_fit_sm counts the device's shared memory per SM."""
    from search_spaces.mosaic_scale import KERNEL

    problem = KERNEL.problem({"n": 2**24}, "bfloat16")
    full = KERNEL.bind(problem, device=profile("h20")).count()
    half = dataclasses.replace(profile("h20"), smem_per_sm=114 * 1024, smem_per_block=113 * 1024)
    assert KERNEL.bind(problem, device=half).count() < full


def _grid(kernel_name, shape, num_sms=None):
    """The launch grid of a bundled kernel's default config, as traced (no GPU)."""
    import jax

    from autotune.evaluation.lowering import input_specs
    from autotune.space.kernel import BuildOptions, get_kernel

    kernel = get_kernel(kernel_name)
    problem = kernel.problem(shape, "bfloat16")
    config = kernel.default_config(problem)
    fn = kernel.build(problem, config, BuildOptions(num_sms=num_sms))
    text = str(jax.make_jaxpr(fn)(*input_specs(kernel, problem)))
    found = re.search(r"\bgrid=\((\d+),", text) or re.search(
        r"blocks\([^)]*\) in \(%\w+ = %c(\d+)\b", text)
    assert found, text[:2000]
    return int(found.group(1)), config


@pytest.mark.parametrize("key", FOUR)
def test_persistent_grids_are_built_for_the_profiles_sm_count(key):
    """hopper_matmul, softmax and mosaic_scale, built without an SM count on a CPU, launch one
    persistent block (or cluster) per SM of the chosen profile's device."""
    sms = profile(key).num_sms
    with devices.using_profile(key):
        grid, config = _grid("hopper_matmul", {"m": 4096, "n": 4096, "k": 4096})
        assert grid == sms // (2 if config["cluster_dimension"] else 1)
        grid, config = _grid("softmax", {"rows": 65536, "cols": 4096})
        assert grid == sms
        grid, config = _grid("mosaic_scale", {"n": 2**24})
        assert grid == sms * config["blocks_per_sm"]


def test_cross_lowering_builds_for_the_current_devices_sm_count(monkeypatch):
    """``autotune check`` (check_space) and interpret mode's CUDA lowering
    (lower_config_for_cuda) pass the current device's SM count to the kernel's build."""
    from autotune.evaluation import checking, pipeline
    from autotune.evaluation.lowering import LoweringResult
    from search_spaces.softmax import KERNEL

    seen = []
    monkeypatch.setattr(checking, "lower_for_cuda",
                        lambda kernel, problem, config, options: seen.append(options.num_sms)
                        or LoweringResult(ok=True))
    problem = KERNEL.problem({"rows": 4096, "cols": 4096}, "bfloat16")
    checking.check_space(KERNEL, problem, sample=2, device=profile("h20"))
    assert seen == [78, 78]

    built = []
    real_build = KERNEL.build
    kernel = dataclasses.replace(KERNEL, build=lambda p, c, o: built.append(o.num_sms) or real_build(p, c, o))
    with devices.using_profile("h100-pcie"):
        assert pipeline.lower_config_for_cuda(kernel, problem, kernel.default_config(problem)) is None
    assert built == [114]


def test_the_cost_models_waves_follow_the_device():
    """The ranked sampler's waves features use the bound space's device's SMs, and the matmul
    cost model its SMs, clock, peak and bandwidth: the same config costs more on an H100 PCIe
    than an H100 SXM, and most on an H20; the H800 costs as the H100 SXM."""
    from autotune.tuning.samplers.ranked import RankedSampler
    from search_spaces.hopper_matmul import KERNEL, Hopper, estimate_seconds

    problem = KERNEL.problem({"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
    config = KERNEL.default_config(problem)
    waves = {}
    for key in FOUR:
        space = KERNEL.bind(problem, device=profile(key))
        sampler = RankedSampler(space, seed=0, candidates=8)
        assert sampler._features.num_sms == profile(key).num_sms
        waves[key] = {k: v for k, v in sampler._features._row(problem, config)
                      if k.startswith("waves:")}
        assert waves[key]
    assert waves["h100-sxm"] == waves["h200"]
    assert waves["h100-pcie"] != waves["h100-sxm"] != waves["h20"]
    cost = {key: estimate_seconds(problem, config, Hopper.for_device(profile(key)))
            for key in (*FOUR, "h800")}
    assert cost["h100-sxm"] < cost["h100-pcie"] < cost["h20"]
    assert cost["h800"] == cost["h100-sxm"]
    with devices.using_profile("h20"):
        assert estimate_seconds(problem, config) == cost["h20"]
    assert Hopper() == Hopper.for_device(profile("h200"))  # the constants' own device


# -- kernels declare their architectures; every command refuses another in one line -----------


def test_bundled_kernels_support_hopper_only():
    """Every bundled kernel declares sm_90a; on an A100 or B200 it refuses, naming both."""
    from autotune.space.kernel import bundled_kernels, get_kernel

    for name in bundled_kernels():
        kernel = get_kernel(name)
        assert kernel.archs == ("sm_90a",)
        assert kernel.check_device(profile("h20")) == profile("h20")
        for key in ("a100-sxm", "b200"):
            with pytest.raises(devices.UnsupportedDeviceError) as e:
                kernel.check_device(profile(key))
            assert str(e.value).count("\n") == 0
            assert f"supports sm_90a, but the device is {profile(key).name}" in str(e.value)
    anywhere = dataclasses.replace(get_kernel("softmax"), archs=())
    assert anywhere.check_device(profile("b200")).arch == "sm_100a"


def _job(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "bfloat16"\n'
                   'shape = { rows = 4096, cols = 4096 }\n')
    return str(job)


@pytest.mark.parametrize("argv", [
    ["spaces", "softmax", "--shape", "rows=4096,cols=4096"],
    ["check", "softmax", "--shape", "rows=4096,cols=4096", "--sample", "1"],
    ["tune", "JOB", "--dry-run", "--device", "interpret"],
    ["tune", "JOB", "--device", "interpret"],
])
@pytest.mark.parametrize("key", ["a100-sxm", "b200"])
def test_every_command_refuses_another_architecture_in_one_line(argv, key, tmp_path, capsys):
    """spaces, check and tune (dry run or not) on a device of another architecture: exit 2,
    one line naming the kernel's architectures and the device's, nothing written."""
    db = tmp_path / "at.db"
    argv = [a if a != "JOB" else _job(tmp_path) for a in argv]
    code = cli.main([*argv, "--device-profile", key, *(["--db", str(db)] if argv[0] == "tune" else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert f"supports sm_90a, but the device is {profile(key).name} ({profile(key).arch}" in err
    assert not db.exists()


def test_an_unknown_profile_is_bad_input_naming_the_known_ones(tmp_path, capsys):
    """--device-profile with a name no profile has: exit 2, the known names listed."""
    assert cli.main(["spaces", "softmax", "--shape", "rows=4096,cols=4096",
                     "--device-profile", "h1OO-sxm"]) == 2
    err = capsys.readouterr().err
    assert "Unknown device profile 'h1OO-sxm'" in err and "h100-pcie" in err
    assert "Did you mean 'h100-sxm'" in err


def test_spaces_and_check_say_which_device_they_bound_for(capsys):
    """`spaces --json` gives the device's facts; the text output of spaces names it."""
    assert cli.main(["spaces", "softmax", "--shape", "rows=4096,cols=4096", "--json",
                     "--device-profile", "h20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"]["num_sms"] == 78 and out["device"]["source"] == "profile:h20"
    assert cli.main(["spaces", "softmax", "--shape", "rows=4096,cols=4096", "--sample", "0",
                     "--device-profile", "h100-pcie"]) == 0
    assert "on NVIDIA H100 PCIe (sm_90a, 114 SMs, 50 MiB L2; profile:h100-pcie)" in capsys.readouterr().out


def test_tune_takes_a_device_profile(tmp_path):
    """autotune.tune(device_profile=...): an unknown name or another architecture is a
    JobError before the database is created."""
    import autotune

    db = tmp_path / "at.db"
    for bad, match in (("nope", "Unknown device profile 'nope'"), ("b200", "supports sm_90a")):
        with pytest.raises(JobError, match=match):
            autotune.tune("softmax", [{"rows": 4096, "cols": 4096}], db=str(db),
                          device="interpret", device_profile=bad, progress=False)
        assert not db.exists()


def test_trace_clock_comes_from_the_driver(monkeypatch):
    """In-kernel traces convert cycles with the SM clock the driver reports (no nvidia-smi)."""
    from autotune.evaluation import pipeline

    driver = dataclasses.replace(profile("h100-pcie"), source="driver")
    monkeypatch.setattr(devices, "read_device", lambda ordinal=0: driver)
    assert pipeline.sm_clock_ghz() == pytest.approx(1.755)


def test_served_configs_are_checked_against_the_current_devices_rules():
    """The validity check of stored configs binds the current device: a config within an
    H100's shared memory breaks the smem rule of a device with less."""
    from autotune.space import validity
    from search_spaces.hopper_matmul import KERNEL, smem_bytes

    problem = KERNEL.problem({"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
    big = max(KERNEL.bind(problem, device=profile("h100-sxm")).sample(200, seed=0),
              key=lambda c: smem_bytes(c, "bfloat16", k=4096))
    assert validity.violations(problem, big, kernel=KERNEL) == []
    with devices.using_profile("a100-sxm"):
        assert any("smem" in v for v in validity.violations(problem, big, kernel=KERNEL))


def test_interpret_rows_carry_the_profile_and_workers_inherit_it():
    """Interpret mode's device rows carry the facts of the profile it stands in for, and a
    process started inside using_profile (the engine's workers are) sees the same profile."""
    import os
    import subprocess
    import sys

    from autotune.evaluation.pipeline import interpret_device_info

    with devices.using_profile("h20"):
        assert interpret_device_info().facts == profile("h20")
        out = subprocess.run(
            [sys.executable, "-c", "from autotune import devices; devices._DRIVER[0] = None; "
             "print(devices.current_device().source)"],
            capture_output=True, text=True, check=True, env=dict(os.environ), cwd=REPO,
        ).stdout
    assert out.strip() == "profile:h20"

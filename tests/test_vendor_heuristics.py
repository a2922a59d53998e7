"""benchmarks/vendor_heuristics.py: NVIDIA's matmul heuristics mapped onto hopper_matmul (the
mapping both ways, the device names, the missing package, and where installed, ranked configs
valid in the kernel's space); benchmarks/vendor_prior.py's replay on a small budget."""

from __future__ import annotations

import json
import sys

import pytest

from autotune.devices import PROFILES, using_profile
from autotune.space.kernel import get_kernel
from tests.benchmark_scripts import load

vendor_prior = load("vendor_heuristics")
VENDOR_GPUS = vendor_prior.VENDOR_GPUS
VendorModel = vendor_prior.VendorModel
VendorPriorError = vendor_prior.VendorPriorError
from_vendor = vendor_prior.from_vendor
to_vendor = vendor_prior.to_vendor
vendor_available = vendor_prior.vendor_available
vendor_gpu = vendor_prior.vendor_gpu

HAVE_VENDOR = vendor_available()
needs_vendor = pytest.mark.skipif(not HAVE_VENDOR, reason="nvidia-matmul-heuristics not installed")
KERNEL = get_kernel("hopper_matmul")


def bound(shape, profile="h200", dtype="bfloat16"):
    with using_profile(profile):
        return KERNEL.bind(KERNEL.problem(shape, dtype))


def test_a_vendor_tile_maps_to_both_warpgroup_splits_preferred_first():
    """A 128x256x64 CTA tile is two 64x256 warpgroups stacked along M, or two 128x128 along N;
    stages, cluster, raster order and swizzle map to their tunables; the epilogue is upstream's
    64x64 default, canonical (None where it is the whole warpgroup tile)."""
    configs = from_vendor((128, 256, 64), stages=4, cluster=(2, 1), cta_order=0, swizzle=3)
    assert [(c["wg_dimension"], c["tile_m"], c["tile_n"]) for c in configs] == [
        ("M", 64, 256), ("N", 128, 128)]
    for c in configs:
        assert (c["tile_k"], c["max_concurrent_steps"], c["cluster_dimension"]) == (64, 4, "M")
        assert (c["grid_minor_dim"], c["grid_tile_width"]) == ("M", 3)
    assert (configs[0]["epi_tile_m"], configs[0]["epi_tile_n"]) == (None, 64)
    assert (configs[1]["epi_tile_m"], configs[1]["epi_tile_n"]) == (64, 64)
    (col_major,) = from_vendor((64, 128, 128), stages=2, cluster=(1, 2), cta_order=1, swizzle=1)
    assert (col_major["wg_dimension"], col_major["tile_m"], col_major["tile_n"]) == ("N", 64, 64)
    assert (col_major["grid_minor_dim"], col_major["cluster_dimension"]) == ("N", "N")


@pytest.mark.parametrize("kwargs", [
    {"cluster": (2, 2)}, {"cluster": (1, 4)}, {"split_k": 2}, {"cta": (32, 64, 64)},
])
def test_vendor_configurations_without_a_counterpart_map_to_nothing(kwargs):
    """Split K, clusters of more than two blocks and CTA tiles no two 64-row warpgroups make
    have no hopper_matmul config."""
    args = {"cta": (128, 128, 64), "stages": 3, "cluster": (1, 1), "cta_order": 0, "swizzle": 1}
    args.update(kwargs)
    assert from_vendor(args.pop("cta"), **args) == []


@pytest.mark.parametrize("cta,cluster,order", [
    ((128, 256, 64), (1, 1), 0), ((256, 128, 32), (2, 1), 1), ((64, 256, 128), (1, 2), 0)])
def test_to_vendor_inverts_from_vendor(cta, cluster, order):
    """Every config a vendor configuration maps to maps back to it (the fields both have)."""
    for config in from_vendor(cta, stages=5, cluster=cluster, cta_order=order, swizzle=4):
        back = to_vendor(config)
        assert back["cta"] == cta and back["cluster"] == cluster
        assert (back["stages"], back["cta_order"], back["swizzle"], back["split_k"]) == (5, order, 4, 1)
        assert back["warp"][0] == 64 and back["warp"][2] == cta[2]


def test_devices_map_to_the_vendors_gpus_and_others_are_refused():
    """Profiles and driver names find the vendor's GPU; a device without one is refused with
    the profiles that have one."""
    assert vendor_gpu(PROFILES["h200"]) == "H200_SXM"
    assert vendor_gpu("NVIDIA H100 80GB HBM3") == "H100_SXM"
    assert vendor_gpu("NVIDIA H100 PCIe") == "H100_PCIE"
    assert vendor_gpu("h20") == "H20_SXM"
    with pytest.raises(VendorPriorError, match="h100-sxm") as info:
        vendor_gpu(PROFILES["a100-sxm"])
    assert "A100" in str(info.value)


def test_a_missing_package_says_what_to_install(monkeypatch):
    """Without nvidia-matmul-heuristics the model is refused with the pip command, not a
    traceback from ctypes."""
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    vendor_prior._package.cache_clear()
    try:
        assert not vendor_available()
        with pytest.raises(VendorPriorError, match="pip install nvidia-matmul-heuristics"):
            VendorModel("h200")
    finally:
        vendor_prior._package.cache_clear()


@needs_vendor
@pytest.mark.parametrize("profile", ["h200", "h100-sxm"])
@pytest.mark.parametrize("shape", [{"m": 4096, "n": 4096, "k": 4096}, {"m": 128, "n": 8192, "k": 8192}])
def test_ranked_configs_are_valid_distinct_and_best_first(profile, shape):
    """The vendor's first configurations come back as distinct configs the kernel's rules
    accept, its estimate never falling, and the estimate of each is what it ranked by."""
    space = bound(shape, profile)
    model = VendorModel(profile)
    ranked = model.ranked(space, 8)
    assert len(ranked) >= 4
    assert all(space.is_valid(c) for c, _ in ranked)
    assert len({c.digest() for c, _ in ranked}) == len(ranked)
    estimates = [s for _, s in ranked]
    assert all(s > 0 for s in estimates) and estimates == sorted(estimates)
    first, seconds = ranked[0]
    assert model.estimate_seconds(space.problem, first) == pytest.approx(seconds, rel=1e-6)


@needs_vendor
def test_the_estimate_knows_the_device_and_refuses_what_it_cannot_answer():
    """The H100 is estimated slower than the H200 on a memory-bound shape (less bandwidth);
    an unknown dtype and an unknown target are refused by name."""
    space = bound({"m": 128, "n": 8192, "k": 8192})
    config = VendorModel("h200").ranked(space, 1)[0][0]
    h200 = VendorModel("h200").estimate_seconds(space.problem, config)
    h100 = VendorModel("h100-sxm").estimate_seconds(space.problem, config)
    assert h100 > h200 > 0
    assert VendorModel("h200").cost_model()(space.problem, config) == h200
    with pytest.raises(VendorPriorError, match="float32"):
        VendorModel("h200").estimate_seconds(KERNEL.problem({"m": 128, "n": 128, "k": 128}, "float32"),
                                             config)
    with pytest.raises(ValueError, match="CUTLASS3"):
        VendorModel("h200", target="TRITON")
    assert set(VENDOR_GPUS) <= set(PROFILES)


@needs_vendor
def test_ground_truth_measures_the_vendors_first_configurations(tmp_path):
    """benchmarks/ground_truth.py --vendor N measures the vendor's first N configurations for
    the device (on the fake device: the current profile's), marked stage "vendor", and the
    replay's space holds them exactly."""
    ground_truth = load("ground_truth")
    with using_profile("h200"):
        ground_truth.main(["--kernel", "hopper_matmul", "--shape", "m=512,n=512,k=512", "--device",
                           "fake", "--iterations", "3", "--out", str(tmp_path), "--max", "3",
                           "--vendor", "4"])
        data = json.loads((tmp_path / "hopper_matmul__k512_m512_n512__bfloat16.json").read_text())
        space = bound({"m": 512, "n": 512, "k": 512})
        expected = [dict(c) for c, _ in VendorModel("h200").ranked(space, 4)][:4]
    uniform = [r["config"] for r in data["results"][:3]]
    expected = [c for c in expected if c not in uniform]  # measured once, in the first stage
    assert len(expected) >= 2
    assert [r["stage"] for r in data["results"]] == ["uniform"] * 3 + ["vendor"] * len(expected)
    assert [r["config"] for r in data["results"][3:]] == expected


def test_ground_truth_refuses_a_negative_vendor_count(tmp_path):
    """--vendor takes 0 or more, and says so."""
    with pytest.raises(SystemExit, match="--vendor must be 0 or more"):
        load("ground_truth").main(["--kernel", "hopper_matmul", "--shape", "m=256,n=256,k=256",
                                   "--device", "fake", "--out", str(tmp_path), "--vendor", "-1"])


def test_the_cross_device_replay_gives_the_first_gap_of_cold_and_warm():
    """benchmarks/vendor_prior.py replays an H100 problem cold and warm from the H200's results:
    each has a first proposal's gap and trials to within 1%, and the other device's winner is
    a related winner (its gap here is reported)."""
    script = load("vendor_prior")
    h100 = [r for r in script.records(script.H100) if r.problem["m"] == 128]
    h200 = [r for r in script.records(script.H200) if r.problem["m"] == 128]
    (row,) = script.cross_part(h100, h200, seeds=1, budget=4)
    assert row["device"] == script.H100 and row["stored"] == [script.H200]
    for mode in ("cold", "warm"):
        assert row[mode]["first_gap"] >= 0 and 1 <= row[mode]["within_1pct"][0] <= 5
    assert row["other_winner_gap"] is not None


def test_the_cross_device_replay_stores_the_other_devices_live_results():
    """benchmarks/vendor_prior.py's stored device holds its live jobs' results too, labelled
    with the device, for the shapes it has no ground truth of (the H200's 64x4096x4096, which
    leads the H100's first proposal: benchmarks/RESULTS.md §20)."""
    script = load("vendor_prior")
    h200 = script.records(script.H200)
    live = script.live_observations(h200)
    assert {o.device for o in live} == {script.H200}
    shapes = {o.problem for o in live}
    assert not shapes & {r.problem for r in h200}
    assert any(p["m"] == 64 and p["n"] == 4096 and p["k"] == 4096 for p in shapes)

"""benchmarks/gil_contention.py: a store's time on the loop while the ranked samplers climb."""

from __future__ import annotations

from tests import benchmark_scripts


def test_gil_contention_times_stores_with_and_without_the_climbs():
    module = benchmark_scripts.load("gil_contention")
    quiet = module.run_case(0.0005, False, 5)
    assert (quiet["stores"], quiet["climbs"], quiet["climbs_s"]) == (5, False, None)
    busy = module.run_case(0.0005, True, 5, problems=1)  # one climb: the benchmark runs four
    # The stores lasted as long as the climb: the sampler was made ready meanwhile.
    assert busy["climbs"] and busy["stores"] >= 1 and busy["climbs_s"] > 0
    assert 0 < busy["median_ms"] <= busy["p90_ms"] <= busy["max_ms"]

"""The measurement vocabulary of autotune.space.outcomes: cache policies, spread, interleaved rounds."""

from __future__ import annotations

import pytest

from autotune.space import outcomes as m
from autotune.space.outcomes import CachePolicy


def test_public_api():
    """``__all__`` lists exactly the public names."""
    assert sorted(m.__all__) == sorted([
        "Outcome", "TrialResult", "DeviceInfo", "DeviceKind", "DEVICE_KINDS", "CachePolicy", "CACHE_POLICIES", "PROGRAM_METHOD",
        "resolve_cache_policy", "relative_spread", "round_order",
        "time_problem", "plausible_us", "MIN_TIME_US", "MAX_TIME_US",
    ])


@pytest.mark.parametrize("value", [-1.0, 0, 0.0, -0.0, float("nan"), float("inf"), float("-inf"),
                                   1e-300, 5e-4, 2e10, 1e300, True, None, "10", [10]])
def test_a_value_that_is_not_a_plausible_time_is_named_by_the_one_gate(value):
    """time_problem names the rule and the value of anything that is not a positive, finite,
    plausible number of microseconds; plausible_us agrees."""
    why = m.time_problem(value)
    assert why is not None and "median_us" in why and repr(value) in why
    assert not m.plausible_us(value)


@pytest.mark.parametrize("value", [1e-3, 0.5, 1, 12.5, 1e6, 1e10])
def test_plausible_times_pass_the_gate(value):
    """Times from 1 ns to 1e10 us pass."""
    assert m.time_problem(value) is None and m.plausible_us(value)


def test_cache_policy_defaults_cold_on_gpus_and_warm_elsewhere():
    """No policy asked: cold on a GPU, warm in interpret and fake mode; an asked one is kept."""
    assert m.resolve_cache_policy(None, "gpu") is CachePolicy.COLD
    assert m.resolve_cache_policy("auto", "gpu") is CachePolicy.COLD
    assert m.resolve_cache_policy(None, "interpret") is CachePolicy.WARM
    assert m.resolve_cache_policy(None, "fake") is CachePolicy.WARM
    assert m.resolve_cache_policy("warm", "gpu") is CachePolicy.WARM
    assert m.resolve_cache_policy("cold", "fake") is CachePolicy.COLD


def test_cold_is_refused_in_interpret_mode_and_unknown_policies_are_named():
    """Interpret mode has no L2 to flush: cold is refused with the way out; typos are named."""
    with pytest.raises(ValueError, match="needs a GPU.*cache = 'warm'"):
        m.resolve_cache_policy("cold", "interpret")
    with pytest.raises(ValueError, match="one of cold, warm.*'hot'"):
        m.resolve_cache_policy("hot", "gpu")


def test_relative_spread_is_p90_minus_p10_over_the_median():
    """The spread of 0..100 is (90 - 10) / 50; one sample has none; no samples give None."""
    assert m.relative_spread([float(i) for i in range(101)]) == pytest.approx(80 / 50)
    assert m.relative_spread([7.0]) == 0.0
    assert m.relative_spread([]) is None


def test_round_order_interleaves_and_rotates():
    """Each round times every program once; the first program moves along each round."""
    assert m.round_order(3, 4) == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    with pytest.raises(ValueError, match="at least one program"):
        m.round_order(0, 3)


def test_device_kind_is_one_enum_and_a_plain_string_is_converted():
    """The device kind is a StrEnum used everywhere (it still compares and stores as its plain
    string); DeviceInfo converts a string, and refuses an unknown kind."""
    from autotune.space.outcomes import DEVICE_KINDS, DeviceInfo, DeviceKind

    assert DEVICE_KINDS == ("gpu", "interpret", "fake")
    info = DeviceInfo(name="NVIDIA H200", kind="gpu")
    assert info.kind is DeviceKind.GPU and info.is_gpu and info.kind == "gpu"
    assert DeviceInfo(name="x", kind=DeviceKind.INTERPRET).kind is DeviceKind.INTERPRET
    assert f"{DeviceKind.FAKE}" == "fake"
    with pytest.raises(ValueError, match="'tpu' is not a valid DeviceKind"):
        DeviceInfo(name="x", kind="tpu")

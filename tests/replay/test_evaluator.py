"""The replay runner behind the evaluator interface (autotune.replay.evaluator)."""

from __future__ import annotations

import pytest

from autotune.evaluation.contract import EvaluationError, Evaluator
from autotune.replay.evaluator import ReplayEvaluator
from autotune.replay.ground_truth import load_ground_truth, recorded_us
from autotune.space.outcomes import Outcome
from autotune.space.problem import Config

SMALL = "hopper_attention__batch4_causalfalse_head_dim128_heads_kv16_heads_q16_seq_kv2048_seq_q2048__float16"


def _small() -> dict:
    return next(p for p in load_ground_truth("NVIDIA H200", "hopper_attention") if p["name"] == SMALL)


def test_a_recorded_config_measures_its_recorded_time_and_others_fail_as_recorded():
    """An Evaluator: ok configs time at their recorded time, failures keep their outcome, a
    config never recorded is invalid, another problem is an evaluation error."""
    data = _small()
    ev = ReplayEvaluator(data)
    assert isinstance(ev, Evaluator) and ev.device_info().name == "replay (NVIDIA H200)"
    for r in data["results"]:
        result = ev.evaluate(ev.kernel, ev.problem, Config(r["config"]))
        if r["status"] == "ok":
            assert result.ok and result.median_us == recorded_us(r)
        else:
            assert result.outcome == Outcome(r["status"])
    unknown = dict(data["results"][0]["config"], block_q=12345)
    assert ev.evaluate(ev.kernel, ev.problem, Config(unknown)).outcome is Outcome.INVALID
    other = ev.kernel.problem({**ev.problem.dims, "batch": 2}, ev.problem.dtype)
    with pytest.raises(EvaluationError, match="This replay serves"):
        ev.compile(ev.kernel, other, Config(data["results"][0]["config"]))
    assert ev.baseline(ev.kernel, ev.problem).ok == ("median_us" in (data.get("baseline") or {}))


def test_noise_is_seeded_and_bad_noise_is_refused():
    """The same seed sees the same noisy times; noise outside [0, 1) names the rule."""
    data = _small()
    ok = next(Config(r["config"]) for r in data["results"] if r["status"] == "ok")

    def times(seed: int) -> list[float]:
        ev = ReplayEvaluator(data, noise=0.05, seed=seed)
        return [ev.evaluate(ev.kernel, ev.problem, ok).median_us for _ in range(3)]

    assert times(1) == times(1) != times(2)
    assert len(set(times(1))) == 3
    with pytest.raises(ValueError, match="noise is a relative standard deviation"):
        ReplayEvaluator(data, noise=1.5)

"""autotune.evaluation.lowering: the CUDA validity oracle, and lowering again after a race."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from autotune.evaluation import lowering, pipeline
from autotune.evaluation.lowering import RACE_RETRIES, again_after_races, lower_for_cuda
from autotune.space.kernel import BuildOptions, get_kernel
from autotune.space.problem import Config

RACE = "Set changed size during iteration"


def _flaky(races: int):
    """A step that fails ``races`` times with a race's RuntimeError, then returns "done"."""
    calls = []

    def step():
        calls.append(1)
        if len(calls) <= races:
            raise RuntimeError(RACE)
        return "done"

    return step, calls


def test_a_race_is_done_again_and_anything_else_is_raised_at_once(caplog):
    """A step failing with CPython's "changed size during iteration" (another thread changed a
    set or dict it iterated) is done again, its traceback logged, up to RACE_RETRIES times;
    the last race and any other error are raised as they came."""
    step, calls = _flaky(RACE_RETRIES)
    with caplog.at_level(logging.WARNING, logger=lowering.__name__):
        assert again_after_races(step) == "done"
    assert len(calls) == RACE_RETRIES + 1
    assert caplog.text.count("A race in the libraries") == RACE_RETRIES and RACE in caplog.text
    step, calls = _flaky(RACE_RETRIES + 1)
    with pytest.raises(RuntimeError, match=RACE):
        again_after_races(step)
    assert len(calls) == RACE_RETRIES + 1

    def other():
        calls.append(1)
        raise RuntimeError("the config does not fit")

    calls.clear()
    with pytest.raises(RuntimeError, match="does not fit"):
        again_after_races(other)
    assert len(calls) == 1


def _racing_kernel(races: int):
    """softmax, whose built function fails its first ``races`` traces with a race."""
    kernel = get_kernel("softmax")
    problem = kernel.problem({"rows": 32, "cols": 512}, "float32")
    config = Config(kernel.valid_space(problem).sample(1, seed=0)[0])
    traced = []

    def build(problem, config, options):
        fn = kernel.build(problem, config, options)

        def racing(*args):
            traced.append(1)
            if len(traced) <= races:
                raise RuntimeError(RACE)
            return fn(*args)

        return racing

    return dataclasses.replace(kernel, build=build), problem, config


def test_a_config_whose_lowering_met_a_race_is_lowered_again_not_stored_as_failing():
    """The oracle, the interpreter's compile and the CUDA lowering before it do a lowering that
    met a race again: the config lowers (GPU interpret mode once stored a config as a compile
    error for "[lower] RuntimeError: Set changed size during iteration" at a worker's first
    configs). Races beyond RACE_RETRIES are the config's result, as before."""
    kernel, problem, config = _racing_kernel(1)
    assert lower_for_cuda(kernel, problem, config).ok
    kernel, problem, config = _racing_kernel(1)
    assert pipeline.lower_config_for_cuda(kernel, problem, config) is None
    kernel, problem, config = _racing_kernel(1)
    compiled = pipeline.compile_config(kernel, problem, config, BuildOptions(interpret=True))
    assert isinstance(compiled, pipeline.Compiled), compiled
    kernel, problem, config = _racing_kernel(RACE_RETRIES + 1)
    failed = lower_for_cuda(kernel, problem, config)
    assert not failed.ok and RACE in failed.error

"""benchmarks/cost_model_fit.py: the loss per shape and the leave-one-shape-out choice."""

from __future__ import annotations

import math

import pytest

from autotune.space.kernel import get_kernel
from tests.benchmark_scripts import load

fit = load("cost_model_fit")


def _shape():
    problem = get_kernel("hopper_matmul").problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    configs = [{"tile": t} for t in (1, 2, 3, 4)]
    return ("toy", problem, configs, [12.0, 11.0, 10.0, 13.0])  # the fastest is tile 3


def test_the_loss_is_the_first_familys_gap_plus_a_share_per_family_ahead():
    shape = _shape()
    right = fit.losses(lambda p, c: {1: 3.0, 2: 2.0, 3: 1.0, 4: 4.0}[c["tile"]], [shape], 0.01)
    assert right == [0.0]
    wrong = fit.losses(lambda p, c: float(c["tile"]), [shape], 0.01)  # tile 1 first: 20% slower
    assert math.isclose(wrong[0], 0.2 + 2 * 0.01)


def test_the_top5_loss_is_the_best_of_five_first_plus_a_share_per_config_ahead():
    configs = [{"tile": t} for t in range(7)]
    problem = _shape()[1]
    shape = ("toy", problem, configs, [12.0, 11.0, 10.5, 13.0, 14.0, 10.0, 10.05])
    # Ranked 0, 1, ..., 6: the five first's fastest is 10.5 (5% from 10.0); the first within
    # 1% of the fastest is ranked sixth, so five configs are ahead of it.
    assert math.isclose(fit.losses(lambda p, c: float(c["tile"]), [shape], 0.01, "top5")[0],
                        0.05 + 5 * 0.002)
    assert fit.losses(lambda p, c: -float(c["tile"]), [shape], 0.01, "top5") == [0.0]


def test_leave_one_out_picks_for_each_shape_what_is_best_on_the_others():
    # "fits" is perfect on shapes 0 and 1 and bad on 2; "steady" is fair everywhere.
    table = {("fits",): [0.0, 0.0, 0.5], ("steady",): [0.1, 0.1, 0.1]}
    picks = fit.leave_one_out(table)
    assert picks == [(("steady",), 0.1), (("steady",), 0.1), (("fits",), 0.5)]


def test_a_bad_grid_is_refused_by_name():
    with pytest.raises(SystemExit, match="expected NAME=V1/V2"):
        fit.parse_grid(["l2_bytes"])
    assert fit.parse_grid(["wg_step=250/350"])["wg_step"] == [250.0, 350.0]
    with pytest.raises(SystemExit, match="unknown Hopper constant"):
        fit.main(["--grid", "l2_bites=1/2"])

"""benchmarks/startup_cost.py: the path of a fresh worker to its first config, in interpret mode."""

from __future__ import annotations

import json

from tests import benchmark_scripts


def test_startup_cost_reports_every_step_in_order(tmp_path):
    module = benchmark_scripts.load("startup_cost")
    out = tmp_path / "startup.json"
    assert module.main(["--device", "interpret", "--runs", "1", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    steps = list(figures["median"])
    assert steps == ["import jax", "backend up", "import pallas", "import kernel", "inputs",
                     "reference compiled", "config compiled", "first run", "reference first run"]
    times = [figures["median"][s] for s in steps]
    assert times == sorted(times) and times[0] > 0

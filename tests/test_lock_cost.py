"""benchmarks/lock_cost.py: a config's steps under the GPU's lock, in interpret mode."""

from __future__ import annotations

import json

from tests import benchmark_scripts


def test_lock_cost_reports_every_step_for_an_idle_and_a_busy_compile_thread(tmp_path):
    module = benchmark_scripts.load("lock_cost")
    out = tmp_path / "lock_cost.json"
    assert module.main(["--device", "interpret", "--kernel", "softmax", "--shape",
                        "rows=64,cols=512", "--dtype", "float32", "--configs", "1", "--trials",
                        "1", "--switch-intervals", "0.005", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    rows = figures["conditions"]
    assert [(r["switch_interval_s"], r["compile_thread"]) for r in rows] == [
        (0.005, "idle"), (0.005, "busy")]
    for row in rows:
        steps = row["steps"]
        assert set(steps) == set(module.STEPS)
        # Interpret mode spends nothing on timing (one checked run per config): the run and
        # the check are each seen once, the timing steps never.
        assert [steps[s]["n"] for s in module.STEPS] == [1, 1, 0, 0, 1]
        assert steps["total"]["median_s"] >= steps["run->check"]["median_s"] > 0

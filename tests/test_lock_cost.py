"""benchmarks/lock_cost.py: a config's steps under the GPU's lock, in interpret mode."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_lock_cost_reports_every_step_for_an_idle_and_a_busy_compile_thread(tmp_path):
    spec = importlib.util.spec_from_file_location("lock_cost", ROOT / "benchmarks" / "lock_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
        assert all(steps[s]["n"] == 1 for s in module.STEPS)
        assert steps["total"]["median_s"] >= steps["time->done"]["median_s"] > 0

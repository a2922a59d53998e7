"""benchmarks/startup_cost.py: the path of a fresh worker to its first config, in interpret mode."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_startup_cost_reports_every_step_in_order(tmp_path):
    spec = importlib.util.spec_from_file_location("startup_cost", ROOT / "benchmarks" / "startup_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "startup.json"
    assert module.main(["--device", "interpret", "--runs", "1", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    steps = list(figures["median"])
    assert steps == ["import jax", "backend up", "import pallas", "import kernel", "inputs",
                     "reference compiled", "config compiled", "first run", "reference first run"]
    times = [figures["median"][s] for s in steps]
    assert times == sorted(times) and times[0] > 0

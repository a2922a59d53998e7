"""benchmarks/timing_study.py's ``--engine`` mode: every program on every worker of the engine,
in interpret mode on the CPU (the GPU run: benchmarks/RESULTS.md §12)."""

from __future__ import annotations

import json
import math

import pytest

from tests.benchmark_scripts import load

CONFIG = {"tile_m": 64, "tile_n": 128, "tile_k": 64, "max_concurrent_steps": 2,
          "epi_tile_n": None, "epi_tile_m": None, "grid_minor_dim": "N", "grid_tile_width": 1,
          "wg_dimension": "N", "cluster_dimension": None}


def test_engine_mode_times_every_program_on_every_worker_in_rounds(tmp_path, capsys):
    out = tmp_path / "study.json"
    assert load("timing_study").main([
        "--engine", "interpret", "--problem", "hopper_matmul:m=256,n=256,k=128:bfloat16",
        "--rounds", "2", "--iterations", "1", "--best", "0", "--config", json.dumps(CONFIG),
        "--out", str(out)]) == 0
    (study,) = json.loads(out.read_text())["problems"]
    assert study["programs"] == [str(CONFIG), "xla"]
    us = study["us"]  # rounds x programs x workers
    assert len(us) == 2 and all(len(r) == 2 and len(r[0]) >= 1 for r in us)
    assert all(math.isfinite(t) and t > 0 for r in us for p in r for t in p)
    # A line per worker: each program's offset from all workers' median, then the speedup.
    assert "speedup xla/first" in capsys.readouterr().out


def test_engine_mode_without_a_config_to_time_says_how_to_give_one(tmp_path):
    """No config recorded for the shape and none given: a clear exit, not a crash."""
    with pytest.raises(SystemExit, match="no config recorded for .* pass --config JSON"):
        load("timing_study").main([
            "--engine", "interpret", "--problem", "hopper_matmul:m=256,n=256,k=128:bfloat16",
            "--rounds", "1", "--iterations", "1", "--best", "0"])

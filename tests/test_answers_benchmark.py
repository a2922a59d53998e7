"""benchmarks/answers.py: the pieces that read a job's output and the recorded data."""

from __future__ import annotations

import json

from benchmark_scripts import load


def test_confirm_seconds_are_read_from_the_summary_events():
    answers = load("answers")
    lines = "\n".join([
        json.dumps({"event": "trial", "kernel": "k", "shape": {"n": 1}}),
        json.dumps({"event": "summary", "kernel": "k", "shape": {"n": 1}, "confirm_s": 1.5}),
        json.dumps({"event": "summary", "kernel": "k", "shape": {"n": 2}, "confirm_s": 2.5}),
        json.dumps({"event": "summary", "kernel": "k", "shape": {"n": 3}, "confirm_s": None}),
        "not json",
    ])
    assert answers.confirm_seconds(lines) == {'k{"n": 1}': 1.5, 'k{"n": 2}': 2.5}


def test_recorded_best_keeps_each_device_apart():
    """Each device's recorded configs answer for that device only: the H100's best are its
    own, and a device with nothing recorded gets none."""
    answers = load("answers")
    shape = {"k": 4096, "m": 4096, "n": 4096}
    h200 = answers.recorded_best("hopper_matmul", shape, "bfloat16", "NVIDIA H200", 2)
    h100 = answers.recorded_best("hopper_matmul", shape, "bfloat16", "NVIDIA H100 80GB HBM3", 2)
    assert len(h200) == 2 and all("tile_m" in c for c in h200)
    assert len(h100) == 2 and h100 != h200
    assert answers.recorded_best("hopper_matmul", shape, "bfloat16", "No Such GPU", 2) == []

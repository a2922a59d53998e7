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


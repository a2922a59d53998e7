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



def test_runs_take_the_confirm_interleave_ways_in_turn(tmp_path):
    """``--confirm-interleave`` gives each run a job whose [defaults] set its way, in turn;
    without it the job is run as it is."""
    from autotune.tuning.jobs import load_job

    answers = load("answers")
    job = answers.ROOT / "benchmarks" / "answers.toml"
    assert answers.job_of_run(0, job, None, tmp_path) == (job, None)
    ways = []
    for i in range(3):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        path, way = answers.job_of_run(i, job, ["blocks", "calls"], folder)
        ways.append((way, {s.confirm_interleave for s in load_job(path).problems}))
    assert ways == [("blocks", {"blocks"}), ("calls", {"calls"}), ("blocks", {"blocks"})]

"""benchmarks/runtime_choice.py: the decorated call against the faster implementation, per
shape, on the fake device (seconds, no jax)."""

from __future__ import annotations

import json

import pytest

from tests import benchmark_scripts


def test_runtime_choice_runs_the_whole_experiment_on_the_fake_device(tmp_path, capsys):
    """One command measures the stand-ins, stores their confirmation, times the decorated call
    beside both implementations and writes the table and figures under --out: the baseline
    runs where it was confirmed faster and at the tie (the kernel no faster), the kernel where
    it was confirmed faster; a second run reads the stored answers (nothing measured again)."""
    from autotune.queries import lookup

    module = benchmark_scripts.load("runtime_choice")
    out = tmp_path / "out"
    lookup.clear_cache()
    assert module.main(["--out", str(out), "--device", "fake", "--reps", "60", "--batch", "5"]) == 0
    figures = json.loads((out / "runtime_choice.json").read_text())
    assert figures["device"].startswith("fake device")
    rows = {r["shape"]["m"]: r for r in figures["rows"]}
    assert [rows[m]["verdict"] for m in (64, 128, 192)] == ["baseline", "kernel", "tie"]
    assert [rows[m]["chosen"] for m in (64, 128, 192)] == ["baseline", "kernel", "baseline"]
    for r in rows.values():
        assert r["decorated_us"] > 0 and r["kernel_us"] > 0 and r["baseline_us"] > 0
        assert r["ratio_low"] <= r["ratio_to_faster"] <= r["ratio_high"]
        assert r["same_low"] <= r["ratio_to_what_ran"] <= r["same_high"]
        # Against the baseline: a miss is the whole interval above 1.0, and only that.
        assert r["to_baseline_low"] <= r["to_baseline"] <= r["to_baseline_high"]
        assert r["slower_than_baseline"] == (r["chosen"] == "kernel" and r["to_baseline_low"] > 1.0)
        # The decorated call and what it routes to, called directly: the same program twice.
        assert 0.8 < r["ratio_to_what_ran"] < 1.25
    # The routed call costs what the implementation it runs costs, not the slower one: at
    # m=64 the kernel's stand-in spins 60 us and the baseline's 50 us.
    assert rows[64]["decorated_us"] < rows[64]["kernel_us"]
    table = (out / "runtime_choice.md").read_text()
    assert "| fake_matmul | m=64 | float32 |" in table and "fake device" in table
    slower = sum(r["slower_than_baseline"] for r in rows.values())
    assert f"ran the kernel and were slower than the baseline beyond the measured noise: {slower} of 3" in table
    assert table in capsys.readouterr().out
    lookup.clear_cache()
    assert module.main(["--out", str(out), "--device", "fake", "--reps", "5"]) == 0
    again = json.loads((out / "runtime_choice.json").read_text())
    assert [r["verdict"] for r in again["rows"]] == ["baseline", "kernel", "tie"]


@pytest.mark.extended
def test_tune_missing_benchmark_stores_in_one_process_and_serves_in_the_next(tmp_path):
    """benchmarks/tune_missing.py in GPU interpret mode (2 trials, ~30 s): the first process's
    first call tunes the shape and stores it; the next process serves it, tuning nothing."""
    module = benchmark_scripts.load("tune_missing")
    assert module.main(["--out", str(tmp_path), "--device", "interpret"]) == 0
    figures = json.loads((tmp_path / "tune_missing.json").read_text())
    first, nxt = figures["runs"]
    assert first["trials_before"] == 0 and first["trials_after"] == 2
    assert nxt["trials_after"] == nxt["trials_before"] == 2 and nxt["source"] == "exact"
    assert figures["next_tuned_nothing"] is True

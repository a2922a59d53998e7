"""benchmarks/answers.py: the pieces that read a job's output and the recorded data."""

from __future__ import annotations

import json

import pytest

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


def test_the_tail_runs_from_the_last_trial_to_the_last_problem_done():
    """The job's tail: its last rounds (and traces), after its last trial; none without both."""
    answers = load("answers")

    def event(kind: str, second: float) -> str:
        return json.dumps({"event": kind, "time": f"2026-01-01T00:00:{second:06.3f}+00:00"})

    lines = "\n".join([event("trial", 1), event("done", 2.5), event("trial", 3.25),
                       event("done", 4), event("done", 7.75), event("summary", 8), "not json"])
    assert answers.tail_seconds(lines) == 4.5
    assert answers.tail_seconds(event("trial", 1)) is None
    assert answers.tail_seconds("\n".join([event("done", 1), event("trial", 2)])) is None


def test_a_folder_of_an_earlier_call_is_refused_and_a_timed_out_command_is_a_row(
        tmp_path, capsys, monkeypatch):
    """Runs need fresh databases: an ``--out`` holding ``run0`` of an earlier call (a job on
    it would resume, and its confirmation would not be a fresh run's) is a usage error, exit 2,
    with nothing run. A command past its time is rc 124 with what it printed, not a
    traceback."""
    import subprocess
    import sys

    answers = load("answers")
    (tmp_path / "run0").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        answers.main(["--runs", "1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "holds run0 of an earlier call: name an empty folder" in capsys.readouterr().err

    def slow(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], output=b'{"event": "start"}\n')

    monkeypatch.setattr(answers.subprocess, "run", slow)
    got = answers.autotune("sqlite://", "tune", "job.toml", timeout=30)
    assert (got.returncode, got.stdout) == (124, '{"event": "start"}\n')
    assert got.stderr == "stopped after 30 s\n" and got.args[0] == sys.executable


# A hopper_matmul config but for tile_n.
BASE = {"cluster_dimension": None, "epi_tile_m": None, "epi_tile_n": 64, "grid_minor_dim": "N",
        "grid_tile_width": 4, "max_concurrent_steps": 2, "tile_k": 128, "tile_m": 64,
        "wg_dimension": "M"}


def test_the_side_by_side_times_each_winner_the_configs_verify_timed_beside_it_and_the_best_known(
        monkeypatch):
    """Step 2 re-times every run's winner, the configs `verify` timed next to it (so a crown
    can be judged against the round's fastest) and the best recorded, each once, winners first;
    "recorded" counts the recorded ones it added."""
    import argparse

    import autotune.evaluation.independent as independent
    import autotune.replay.ground_truth as ground_truth

    answers = load("answers")
    timed = []

    def time_configs(problem, configs, **kw):
        timed.extend(dict(c) for c in configs)
        return [[[100.0 + c["tile_n"] / 64]] for c in configs], [[99.0]]

    monkeypatch.setattr(independent, "time_configs", time_configs)
    monkeypatch.setattr(ground_truth, "fastest_configs",
                        lambda *a: [{**BASE, "tile_n": 64}, {**BASE, "tile_n": 192}])
    monkeypatch.setattr(answers, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    shape = {"m": 4096, "n": 4096, "k": 4096}

    def verified(tile_n, *others):
        return {"kernel": "hopper_matmul", "shape": shape, "dtype": "bfloat16",
                "config": {**BASE, "tile_n": tile_n},
                "others": [{"config": {**BASE, "tile_n": t}, "median_us": 1.0} for t in others]}

    runs = [{"run": 0, "verified": [verified(256, 128, 32)]},
            {"run": 1, "verified": [verified(128, 256, 64)]}]
    (row,) = answers.side_by_side(runs, argparse.Namespace(device="gpu", rounds=3))
    assert [c["tile_n"] for c in timed] == [256, 128, 64, 192, 32]
    assert row["recorded"] == 2 and row["best_us"] == 100.5
    assert row["winner_us"] == {0: 104.0, 1: 102.0}


@pytest.mark.parametrize("raced", [False, True], ids=["every round", "raced out when stored"])
def test_recrown_crowns_the_stored_rounds_again_both_ways(tmp_path, capsys, raced):
    """``--recrown``: a stored round whose default config tied 0.9% behind the fastest (the
    H100's 2048x14336x4096), crowned by the band open, is crowned again by today's rule (the
    fastest) and by today's rounds replayed (the race), each with its gap in the side by side
    and its speedup against ``verify``'s, the median round's and pooled (a baseline 2% slow in
    three rounds moves the two apart), and the kernel time today's rounds spend."""
    import tarfile

    from autotune.space.kernel import get_kernel
    from autotune.space.outcomes import TrialResult
    from autotune.storage.rows import DeviceInfo
    from autotune.storage.store import Store
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    answers = load("answers")
    kernel = get_kernel("hopper_matmul")
    shape = {"m": 2048, "n": 14336, "k": 4096}
    problem = kernel.problem(shape, "bfloat16")
    default = dict(kernel.default_config(problem))
    fast = {**default, "grid_tile_width": default["grid_tile_width"] % 8 + 1}
    drift = (0.0, -0.01, 0.012, 0.0, -0.006, 0.01, 0.0, 0.004, -0.008)

    def rounds(us, d=(0.0,) * 9):
        return tuple((us * (1 + x), us * (1 + x) * 1.001) for x in d)

    slow = {**fast, "grid_tile_width": fast["grid_tile_width"] % 8 + 1}
    # Stored by the race, the slow config has its first five rounds only.
    cands = [Candidate(fast, rounds(303.0)), Candidate(default, rounds(305.7, drift)),
             Candidate(slow, rounds(320.0)[:5] if raced else rounds(320.0))]
    base = rounds(300.0, (0.0, 0.02, 0.0) * 3)
    stored = analyse_confirmation(cands, base, default_config=default,
                                  crown_band=float("inf"))
    assert stored.winner.config == default
    (tmp_path / "run0").mkdir()
    gpu = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")
    software = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
    with Store(f"sqlite:///{tmp_path / 'run0' / 'answers.db'}") as store:
        ids = [store.record_trial(problem, c.config, TrialResult.timed(
            [300.0], compile_s=0.1, rel_error=0.0, timing="fake"), device=gpu,
            software=software).id for c in cands]
        store.record_confirmation(problem, stored, trial_ids=ids, device=gpu, software=software,
                                  cache="cold", iterations=2, baseline_name="xla")
    with tarfile.open(tmp_path / "answers.tgz", "w:gz") as tar:
        tar.add(tmp_path / "run0" / "answers.db", arcname="run0/answers.db")
    (tmp_path / "answers.json").write_text(json.dumps({
        "runs": [{"run": 0, "verified": [{"kernel": "hopper_matmul", "shape": shape,
                                          "dtype": "bfloat16", "speedup": 0.995}]}],
        "side_by_side": [{"problem": str(problem), "configs": [fast, default],
                          "medians_us": [303.56, 305.78], "best_us": 303.56}]}))
    assert answers.main(["--recrown", "--out", str(tmp_path)]) == 0
    line, spent = capsys.readouterr().out.strip().splitlines()
    # The speedup: the median round, 300.15 / 303.1515; pooled: 300.3 / 303.1515 us.
    pooled, median = 300.3 / 303.1515 / 0.995 - 1, 300.15 / 303.1515 / 0.995 - 1
    assert f"{100 * pooled:+.2f}" != f"{100 * median:+.2f}"
    cell = f"t{ids[0]} +0.00% vs verify {100 * median:+.2f}% (pooled {100 * pooled:+.2f}%)"
    assert line == f"run0 {problem}: crowned {cell}; today {cell}"
    # Replayed by today's rounds, the slow config (5.6% behind in every round) is raced out
    # after five of the nine stored rounds; the default, whose rounds cross the fastest's, is
    # not.
    stored_us = sum(t for r in (*cands, Candidate({}, base)) for rr in r.rounds_us
                    for t in rr)
    today_us = stored_us - sum(t for rr in cands[2].rounds_us[5:] for t in rr)
    assert spent == f"today's rounds: {100 * today_us / stored_us:.1f}% of the stored kernel time"
    assert (spent == "today's rounds: 100.0% of the stored kernel time") == raced
    # Capped at 7 rounds, the replay stops there; under five is no confirmation: exit 2.
    assert answers.main(["--recrown", "--max-rounds", "7", "--out", str(tmp_path)]) == 0
    capped = stored_us - sum(t for c in (*cands[:2], Candidate({}, base))
                             for rr in c.rounds_us[7:] for t in rr)
    capped -= sum(t for rr in cands[2].rounds_us[5:] for t in rr)
    assert capsys.readouterr().out.strip().splitlines() == [
        line, f"today's rounds: {100 * capped / stored_us:.1f}% of the stored kernel time"]
    with pytest.raises(SystemExit) as exit_info:
        answers.main(["--recrown", "--max-rounds", "4", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--max-rounds must be at least 5, got 4" in capsys.readouterr().err


def test_the_tarball_keeps_each_runs_files_and_xlas_autotune_picks(tmp_path):
    """answers.tgz holds each run's own files and the XLA autotune folder its jobs and `verify`
    pinned (the GEMM each run timed as the baseline), its subfolders too, not the rest of the
    compilation cache. (Reading only its top level, the H200's answers.tgz held no pick.)"""
    import tarfile

    answers = load("answers")
    picks = tmp_path / "run0" / "jax_cache" / "xla_gpu_per_fusion_autotune_cache_dir"
    picks.mkdir(parents=True)
    (picks / "fusion.textproto").write_text("nvjet")
    (picks / "v2").mkdir()
    (picks / "v2" / "dot.textproto").write_text("cublas")
    (tmp_path / "run0" / "jax_cache" / "jit_matmul-cache").write_text("executable")
    (tmp_path / "run0" / "answers.db").write_text("db")
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "tune.err").write_text("")
    answers.pack(tmp_path)
    with tarfile.open(tmp_path / "answers.tgz") as tar:
        assert sorted(tar.getnames()) == [
            "run0/answers.db",
            "run0/jax_cache/xla_gpu_per_fusion_autotune_cache_dir/fusion.textproto",
            "run0/jax_cache/xla_gpu_per_fusion_autotune_cache_dir/v2/dot.textproto",
            "run1/tune.err"]


def test_recrown_names_what_it_lacks_and_skips_a_problem_with_no_round(tmp_path, capsys):
    """``--recrown`` on a folder without answers.json and answers.tgz: a usage error naming
    both, exit 2. A run with no confirmation stored (GPU interpret mode confirms nothing) says
    so for its problem instead of failing."""
    import tarfile

    from autotune.space.kernel import get_kernel
    from autotune.storage.store import Store

    answers = load("answers")
    with pytest.raises(SystemExit) as exit_info:
        answers.main(["--recrown", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "reads answers.json and answers.tgz" in capsys.readouterr().err
    (tmp_path / "run0").mkdir()
    Store(f"sqlite:///{tmp_path / 'run0' / 'answers.db'}").close()
    with tarfile.open(tmp_path / "answers.tgz", "w:gz") as tar:
        tar.add(tmp_path / "run0" / "answers.db", arcname="run0/answers.db")
    shape = {"m": 256, "n": 256, "k": 256}
    (tmp_path / "answers.json").write_text(json.dumps({
        "runs": [{"run": 0, "verified": [{"kernel": "hopper_matmul", "shape": shape,
                                          "dtype": "bfloat16"}]}], "side_by_side": []}))
    assert answers.main(["--recrown", "--out", str(tmp_path)]) == 0
    problem = get_kernel("hopper_matmul").problem(shape, "bfloat16")
    assert capsys.readouterr().out.strip() == f"run0 {problem}: no confirmation round stored"

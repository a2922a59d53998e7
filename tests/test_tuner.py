"""The job runner: budgets, resume, orphans, wrong results, and several runners on one database.

An in-process fake engine stands in for the GPU (the process engine has its own tests), so
these tests exercise the runner's bookkeeping: what it asks, stores, tells and skips.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import Future

import optuna
import pytest
from optuna.trial import TrialState

from autotune.jobs import Budget, Job, ProblemSpec
from autotune.kernel import Kernel, get_kernel, register
from autotune.problem import Config
from autotune.space import Aligned, Choice, Constraint, PowerOfTwo, Space
from autotune.storage import Store
from autotune.trial import DeviceInfo, Outcome, TrialResult
from autotune.tuner import WORKER_ATTR, run_job, study_name

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _unused(*args, **kwargs):
    raise AssertionError("the fake engine never builds kernels")


SPACE = Space(
    params=(
        Aligned("bm", unit=64, low=64, high=256, divides="m"),
        Aligned("bn", unit=64, low=64, high=256, divides="n"),
        PowerOfTwo("stages", low=1, high=4),
        Choice("order", ("M", "N")),
    ),
    constraints=(
        Constraint("smem", ("bm", "bn", "stages"), lambda c, e: (c["bm"] + c["bn"]) * 64 * 2 * c["stages"] <= 120_000, "fits"),
    ),
)
TOY = Kernel(
    name="tuner_toy",
    space=SPACE,
    shape_keys=("m", "n"),
    dtypes=("bfloat16",),
    build=_unused,
    make_inputs=_unused,
    reference=_unused,
    flops=lambda p: 2 * p["m"] * p["n"] * 64,
    baseline=lambda p: _unused,
    default_config=lambda p: {"bm": 128, "bn": 128, "stages": 2, "order": "N"},
)
register(TOY)
PROBLEM = TOY.problem({"m": 1024, "n": 1024}, "bf16")


def fake_time(config) -> float:
    """A smooth landscape with a unique optimum at bm=256, bn=128, stages=2, order=M."""
    return (
        100.0
        + abs(config["bm"] - 256) / 8
        + abs(config["bn"] - 128) / 8
        + 5 * abs(config["stages"] - 2)
        + (0 if config["order"] == "M" else 3)
    )


class FakeEngine:
    """Completes every submission at once, with a time from ``fake_time``."""

    parallelism = 3

    def __init__(self, *, wrong=lambda c: False, device="fake-gpu", measured=None):
        self._wrong = wrong
        self._device = DeviceInfo(name=device, kind="fake")
        self.measured = measured if measured is not None else []

    def device_info(self):
        return self._device

    def submit(self, kernel_name, problem, config):
        self.measured.append(config)
        future: Future = Future()
        if self._wrong(config):
            future.set_result(TrialResult.failed(Outcome.WRONG_RESULT, "mismatch"))
        else:
            t = fake_time(config)
            future.set_result(TrialResult.timed([t, t + 1, t - 1], compile_s=0.1, rel_error=0.0, timing="fake"))
        return future

    def baseline(self, kernel_name, problem):
        return TrialResult.timed([150.0, 151.0], compile_s=0.0, rel_error=None, timing="fake")

    def trace(self, *args, **kwargs):
        return {}

    def close(self):
        pass


def _job(trials, *, sampler="tpe", seconds=None, problem=PROBLEM) -> Job:
    return Job("t", (ProblemSpec(problem, Budget(trials=trials, seconds=seconds), sampler=sampler, seed=0),))


def test_job_stores_budget_and_finds_best(tmp_path):
    """A job measures exactly its budget of distinct valid configs and reports the best."""
    url = f"sqlite:///{tmp_path}/t.db"
    engine = FakeEngine()
    with Store(url) as store:
        (report,) = run_job(_job(20), store=store, engine=engine)
        rows = store.trials(PROBLEM)
    assert len(rows) == 20 == report.measured_now
    assert len({Config(r.config).digest() for r in rows}) == 20
    bound = TOY.valid_space(PROBLEM)
    assert all(bound.is_valid(r.config) for r in rows)
    assert report.best_us == min(r.median_us for r in rows)
    assert report.baseline_us == 150.5 and report.speedup == pytest.approx(150.5 / report.best_us)
    assert report.invalid == 0
    # The default config is proposed first.
    assert engine.measured[0] == Config(TOY.default_config(PROBLEM))


def test_rerun_measures_nothing_new_and_study_is_loadable(tmp_path):
    """Re-running a finished job measures nothing; the Optuna study loads from the same URL."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_job(10), store=store, engine=FakeEngine())
        again = FakeEngine()
        (report,) = run_job(_job(10), store=store, engine=again)
    assert again.measured == [] and report.skipped
    device = DeviceInfo(name="fake-gpu", kind="fake")
    study = optuna.load_study(study_name=study_name(PROBLEM, device), storage=url)
    assert len([t for t in study.trials if t.state == TrialState.COMPLETE]) == 10


def test_larger_budget_resumes_without_repeats(tmp_path):
    """Raising the budget continues the study and never re-measures a stored config."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        first = FakeEngine()
        run_job(_job(8), store=store, engine=first)
        second = FakeEngine()
        run_job(_job(16), store=store, engine=second)
        rows = store.trials(PROBLEM)
    assert len(second.measured) == 8
    assert not {c.digest() for c in first.measured} & {c.digest() for c in second.measured}
    assert len(rows) == 16


def test_exhausting_the_space_stops_cleanly(tmp_path):
    """A budget above the valid count stops when every valid config is measured."""
    url = f"sqlite:///{tmp_path}/t.db"
    count = TOY.valid_space(PROBLEM).count()
    with Store(url) as store:
        (report,) = run_job(_job(count + 50, sampler="random"), store=store, engine=FakeEngine())
        assert len(store.trials(PROBLEM)) == count
    assert "every valid config" in report.stop_reason


def test_wrong_results_never_win(tmp_path):
    """Configs whose output is wrong are stored as wrong_result and never reported best."""
    url = f"sqlite:///{tmp_path}/t.db"
    wrong = lambda c: c["order"] == "M"  # noqa: E731 - includes the true optimum
    with Store(url) as store:
        (report,) = run_job(_job(30, sampler="random"), store=store, engine=FakeEngine(wrong=wrong))
        rows = store.trials(PROBLEM)
    assert any(r.status == Outcome.WRONG_RESULT.value for r in rows)
    assert report.best_config is not None and report.best_config["order"] == "N"


def test_orphaned_running_trials_are_closed(tmp_path):
    """A RUNNING trial left by a dead process is released (or told from the store)."""
    url = f"sqlite:///{tmp_path}/t.db"
    device = DeviceInfo(name="fake-gpu", kind="fake")
    with Store(url) as store:
        run_job(_job(4), store=store, engine=FakeEngine())
        study = optuna.load_study(study_name=study_name(PROBLEM, device), storage=url)
        dead = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
        dead.start()
        dead.join()
        orphan = study.ask({"bm": optuna.distributions.IntDistribution(64, 256, step=64)})
        orphan.set_user_attr(WORKER_ATTR, f"{os.uname().nodename}:{dead.pid}")
        run_job(_job(6), store=store, engine=FakeEngine())
    study = optuna.load_study(study_name=study_name(PROBLEM, device), storage=url)
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_time_budget_stops(tmp_path):
    """A seconds budget stops the problem even when trials remain."""
    url = f"sqlite:///{tmp_path}/t.db"

    class Slow(FakeEngine):
        parallelism = 1

        def submit(self, *args):
            time.sleep(0.3)
            return super().submit(*args)

    with Store(url) as store:
        (report,) = run_job(_job(None, seconds=1.0), store=store, engine=Slow())
    assert "time budget" in report.stop_reason and 1 <= report.measured_now <= 6


def _worker(url: str, trials: int, out: mp.Queue) -> None:
    try:
        kernel = get_kernel("tests.test_tuner:TOY", allow_import=True)
        problem = kernel.problem({"m": 1024, "n": 1024}, "bf16")
        engine = FakeEngine()
        with Store(url) as store:
            run_job(_job(trials, problem=problem), store=store, engine=engine, allow_import=True)
        out.put([c.to_json() for c in engine.measured])
    except BaseException as e:  # report, so the parent fails fast with the cause
        out.put(f"{type(e).__name__}: {e}")
        raise


@pytest.mark.parametrize("workers", [3])
def test_several_runners_share_one_job(db_url, workers):
    """N runner processes on one database: every config measured once, all results stored."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(db_url, 24, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    measured = [out.get(timeout=240) for _ in procs]
    errors = [m for m in measured if isinstance(m, str)]
    assert not errors, errors
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    flat = [c for m in measured for c in m]
    assert len(flat) == len(set(flat)), "a config was measured twice"
    kernel = get_kernel("tests.test_tuner:TOY", allow_import=True)
    with Store(db_url) as store:
        rows = store.trials(kernel.problem({"m": 1024, "n": 1024}, "bf16"))
    assert len(rows) == len(flat) and len(rows) >= 24


def test_stale_trial_of_a_dead_host_is_failed_and_its_config_redone(tmp_path, monkeypatch):
    """A RUNNING trial whose host stopped sending heartbeats is failed; its config is measured anew."""
    import autotune.tuner as tuner

    url = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setattr(tuner, "GRACE_S", 1)
    device = DeviceInfo(name="fake-gpu", kind="fake")
    storage = tuner._optuna_storage(url)
    study = optuna.create_study(study_name=study_name(PROBLEM, device), storage=storage)
    stale_config = {"bm": 256, "bn": 128, "stages": 2, "order": "M"}  # the optimum
    dists = tuner.distributions(TOY.valid_space(PROBLEM))
    study.enqueue_trial(stale_config)
    other = study.ask(dists)
    other.set_user_attr(WORKER_ATTR, "another-host:1234")
    storage.record_heartbeat(other._trial_id)
    time.sleep(2.5)  # past the grace period: the other host is dead
    engine = FakeEngine()
    count = TOY.valid_space(PROBLEM).count()
    with Store(url) as store:
        (report,) = run_job(_job(count, sampler="random"), store=store, engine=engine)
    study = optuna.load_study(study_name=study_name(PROBLEM, device), storage=url)
    assert study.trials[other.number].state == TrialState.FAIL
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    assert engine.measured.count(Config(stale_config)) == 1  # freed, then measured once
    assert report.best_config == Config(stale_config) and report.measured_now == count


def test_patience_stops_early_with_the_reason(tmp_path):
    """Once `patience` measured configs in a row miss the best, the problem stops, saying why;
    without patience the same job spends its whole budget."""
    url = f"sqlite:///{tmp_path}/t.db"
    job = Job("t", (ProblemSpec(PROBLEM, Budget(trials=60, patience=5), sampler="tpe", seed=0),))
    with Store(url) as store:
        (report,) = run_job(job, store=store, engine=FakeEngine())
        rows = store.trials(PROBLEM)
    times = [r.median_us for r in sorted(rows, key=lambda r: r.id)]
    best_at = times.index(min(times))
    assert report.stop_reason == "no better config in the last 5 trials (patience)"
    # Stopped within the configs already in flight (parallelism 3) of the fifth miss.
    assert 5 <= len(times) - 1 - best_at <= 5 + FakeEngine.parallelism
    with Store(f"sqlite:///{tmp_path}/u.db") as store:
        (full,) = run_job(_job(60), store=store, engine=FakeEngine())
    assert full.measured_now == TOY.valid_space(PROBLEM).count() == 40  # the whole space
    assert len(times) < 40


def test_known_good_off_skips_the_default_config(tmp_path):
    """``known_good = false``: the kernel's default config is not proposed first."""
    engine = FakeEngine()
    job = Job("t", (ProblemSpec(PROBLEM, Budget(trials=3), sampler="tpe", seed=0, known_good=False),))
    with Store(f"sqlite:///{tmp_path}/k.db") as store:
        run_job(job, store=store, engine=engine)
    assert Config(TOY.default_config(PROBLEM)) not in engine.measured[:3]


def test_auto_is_the_ranked_sampler_once_other_shapes_are_stored(tmp_path, caplog):
    """A job on a new shape, with another shape of the kernel already tuned in the database,
    runs the ranked sampler under ``auto`` and still measures only distinct valid configs."""
    import logging

    other = TOY.problem({"m": 2048, "n": 1024}, "bf16")
    url = f"sqlite:///{tmp_path}/w.db"
    with Store(url) as store:
        run_job(_job(12, problem=other), store=store, engine=FakeEngine())
        engine = FakeEngine()
        job = Job("t", (ProblemSpec(PROBLEM, Budget(trials=10), sampler="auto", seed=0, known_good=False),))
        with caplog.at_level(logging.INFO, logger="autotune.tuner"):
            (report,) = run_job(job, store=store, engine=engine)
        rows = store.trials(PROBLEM)
    assert any("sampler ranked (auto)" in r.getMessage() for r in caplog.records)
    assert len(rows) == 10 == len({Config(r.config).digest() for r in rows})
    assert report.best_us == min(r.median_us for r in rows)

"""The job runner: budgets, resume, orphans, wrong results, and several runners on one database.

An in-process fake engine stands in for the GPU (the process engine has its own tests), so
these tests exercise the runner's bookkeeping: what it asks, stores, tells and skips.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import Future

import optuna
import pytest
from optuna.trial import TrialState

from autotune.space.kernel import Kernel, get_kernel, register
from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config
from autotune.space.search_space import Aligned, Choice, Constraint, PowerOfTwo, Space
from autotune.storage.store import Store
from autotune.tuning import optuna_adapter, studies
from autotune.tuning.confirmation import sized_iterations
from autotune.tuning.jobs import Budget, Job, ProblemSpec
from autotune.tuning.sampling import distributions
from autotune.tuning.studies import WORKER_ATTR, study_name
from autotune.tuning.trial_index import OUTCOME_ATTR
from autotune.tuning.tuner import run_job

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


@pytest.mark.parametrize("sequential", [False, True])
def test_a_job_runs_at_the_short_switch_interval_and_restores_it(tmp_path, sequential):
    """While a job runs, its process switches threads every JOB_SWITCH_INTERVAL_S (the loop's
    database statements wait for the GIL behind threads that climb in Python); after the job,
    and after one that fails, the interval is what it was."""
    import sys

    from autotune.tuning import tuner

    seen: list[float] = []

    class Recording(FakeEngine):
        def submit(self, kernel_name, problem, config):
            seen.append(sys.getswitchinterval())
            return super().submit(kernel_name, problem, config)

    before = sys.getswitchinterval()
    assert before > tuner.JOB_SWITCH_INTERVAL_S  # Python's default, 5 ms
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        run_job(_job(4), store=store, engine=Recording(), sequential=sequential)
        assert seen and set(seen) == {tuner.JOB_SWITCH_INTERVAL_S}
        assert sys.getswitchinterval() == before

        class Failing(FakeEngine):
            def submit(self, kernel_name, problem, config):
                raise RuntimeError("engine broke")

        with pytest.raises(RuntimeError, match="engine broke"):
            run_job(_job(8, problem=TOY.problem({"m": 2048, "n": 64}, "bf16")), store=store,
                    engine=Failing(), sequential=sequential)
    assert sys.getswitchinterval() == before


def test_overlapping_jobs_in_one_process_restore_the_switch_interval_once_both_end():
    """Two jobs on threads of one process: the first to end leaves the short interval to the
    other, the last restores the one from before."""
    import sys

    from autotune.tuning.tuner import JOB_SWITCH_INTERVAL_S, job_switch_interval

    before = sys.getswitchinterval()
    first, second = job_switch_interval(), job_switch_interval()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == JOB_SWITCH_INTERVAL_S
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before


def test_a_gpu_engines_clocks_are_read_while_its_first_worker_starts(tmp_path, monkeypatch):
    """An engine that says up front it times on a GPU: the clocks before the job are read
    while its device is awaited (NVML's start and stop held the first submission back), not
    after; the snapshot is the run's "before". An engine that does not say reads them after."""
    import threading

    from autotune.evaluation.clocks import ClockSnapshot
    from autotune.tuning import tuner

    read = threading.Event()
    order: list[str] = []

    def fake_read_clocks(gpu=0, **kwargs):
        order.append("clocks")
        read.set()
        return ClockSnapshot(available=True, gpu=gpu, taken_at="t", sm_clock_mhz=1980,
                             sm_clock_max_mhz=1980)

    class Gpu(FakeEngine):
        mode = "gpu"

        def device_info(self):
            read.wait(5)  # the first worker starting
            order.append("device")
            return DeviceInfo(name="fake-h200", kind="gpu")

    class Unsaid(Gpu):
        mode = None

        def device_info(self):
            order.append("device")
            return DeviceInfo(name="fake-h200", kind="gpu")

    monkeypatch.setattr(tuner, "read_clocks", fake_read_clocks)
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        run_job(_job(2), store=store, engine=Gpu())
        assert order[:2] == ["clocks", "device"]
        (run,) = store.runs()
        assert run.clocks_before["sm_clock_mhz"] == 1980
        read.clear()
        order.clear()
        run_job(_job(2, problem=TOY.problem({"m": 2048, "n": 64}, "bf16")), store=store,
                engine=Unsaid())
    assert order[:2] == ["device", "clocks"]


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


@pytest.mark.parametrize("sequential", [False, True])
def test_a_skipped_problem_reports_its_stored_best(tmp_path, sequential):
    """The skip event of a finished problem carries its stored best (the report's), in both
    runners."""
    url = f"sqlite:///{tmp_path}/t.db"
    events = []
    with Store(url) as store:
        run_job(_job(6), store=store, engine=FakeEngine(), sequential=sequential)
        (report,) = run_job(_job(6), store=store, engine=FakeEngine(), on_event=events.append,
                            sequential=sequential)
    (skip,) = [e for e in events if e.kind == "skip"]
    assert report.skipped and report.best_us is not None
    assert skip.best_us == report.best_us


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


def _worker(url: str, trials: int, out: mp.Queue, poll_s: float | None = None) -> None:
    try:
        if poll_s is not None:  # look again at a problem held by the others' trials this often
            from autotune.tuning import scheduler

            scheduler.POLL_S = scheduler.MAX_POLL_S = poll_s
        kernel = get_kernel("tests.tuning.test_tuner:TOY", allow_import=True)
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
    # The runners finish one budget: each looks again at it every 0.2 s while the others'
    # last trials hold it (scheduler.POLL_S, 2 s and backing off, kept them waiting).
    procs = [ctx.Process(target=_worker, args=(db_url, 24, out, 0.2)) for _ in range(workers)]
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
    kernel = get_kernel("tests.tuning.test_tuner:TOY", allow_import=True)
    with Store(db_url) as store:
        rows = store.trials(kernel.problem({"m": 1024, "n": 1024}, "bf16"))
    assert len(rows) == len(flat) and len(rows) >= 24


def test_stale_trial_of_a_dead_host_is_failed_and_its_config_redone(tmp_path, monkeypatch):
    """A RUNNING trial whose host stopped sending heartbeats is failed; its config is measured anew."""
    url = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setattr(studies, "GRACE_S", 1)
    device = DeviceInfo(name="fake-gpu", kind="fake")
    storage = studies.optuna_storage(url)
    study = optuna.create_study(study_name=study_name(PROBLEM, device), storage=storage)
    stale_config = {"bm": 256, "bn": 128, "stages": 2, "order": "M"}  # the optimum
    dists = distributions(TOY.valid_space(PROBLEM))
    study.enqueue_trial(stale_config)
    other = study.ask(dists)
    other.set_user_attr(WORKER_ATTR, "another-host:1234")
    storage.record_heartbeat(optuna_adapter.trial_id(other))
    time.sleep(1.5)  # past the grace period (1 s): the other host is dead
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


# -- the confirmation round and cache policies (issue 19) ---------------------------------------

# v=1 (the default) and v=0 tie: the fake's rounds put v=1 0.06-0.08% behind, inside the
# crown band (CONFIRM_CROWN_BAND), so the order crowns the default.
TRUE_US = {0: 100.0, 1: 99.96, 2: 103.0, 3: 110.0, 4: 120.0, 5: 130.0}
LUCKY = {3: 95.0}  # v=3 read 95 us in its search trial: a lucky moment; it takes 110 us
PICK = Kernel(
    name="tuner_pick",
    space=Space(params=(Choice("v", tuple(TRUE_US)),)),
    shape_keys=("m",),
    dtypes=("bfloat16",),
    build=_unused,
    make_inputs=_unused,
    reference=_unused,
    baseline=lambda p: _unused,
    default_config=lambda p: {"v": 1},
)
register(PICK)
PICK_PROBLEM = PICK.problem({"m": 64}, "bf16")


class ConfirmingEngine(FakeEngine):
    """Searches with the lucky times, confirms with the true ones (0.5% noise, cold +10%)."""

    def __init__(self, cache="warm", drift=0.0, kernel_call_us=2.0, base_call_us=0.0,
                 program_fails=False, program_swing=0.0, **kwargs):
        super().__init__(**kwargs)
        # The program check's kernel times alternate by +-program_swing from round to round.
        self.program_swing = program_swing
        # A call's cost beyond its kernel time, which only the program check sees.
        self.kernel_call_us, self.base_call_us = kernel_call_us, base_call_us
        self.program_fails = program_fails
        self.cache_policy = cache
        self.scale = 1.1 if cache == "cold" else 1.0
        self.drift = drift  # the baseline's round medians alternate by +-drift (a noisy program)
        self.confirmed = []
        self.iterations: list[list[int]] = []  # per confirmation, the runs per program and round
        self.rounds = 0  # rounds timed in all
        self.program_checks = []  # (configs, calls per block, rounds) of each program check
        self.how = []  # per confirm() call: (program, the keyword arguments beyond those)
        self.asked: list[tuple[int, list[int]]] = []  # per confirmation call: (first round, v's)

    def _samples(self, center, n, seed):
        rng = __import__("random").Random(seed)
        return [center * self.scale * (1 + 0.005 * rng.gauss(0, 1)) for _ in range(n)]

    def submit(self, kernel_name, problem, config):
        self.measured.append(config)
        future: Future = Future()
        t = LUCKY.get(config["v"], TRUE_US[config["v"]])
        future.set_result(TrialResult.timed(self._samples(t, 20, config["v"]), compile_s=0.1,
                                            rel_error=0.0, timing="fake", cache=self.cache_policy))
        return future

    def baseline(self, kernel_name, problem):
        return TrialResult.timed(self._samples(150.0, 20, 99), compile_s=0.0, rel_error=None,
                                 timing="fake", cache=self.cache_policy)

    def confirm(self, kernel_name, problem, configs, *, rounds, iterations, baseline=True,
                medians_us=None, first_round=0, program=False, **how):
        self.how.append((program, how))
        counts = ([iterations] * (len(configs) + baseline) if isinstance(iterations, int)
                  else list(iterations))
        asked = counts
        if how.get("interleaved"):  # as Engine.confirm: every program the mean of the counts
            counts = [math.ceil(sum(counts) / len(counts))] * len(counts)
        if program:  # the program check after a confirmation: its own record
            self.program_checks.append(([c["v"] for c in configs], counts, rounds))
            if self.program_fails:
                return [[TrialResult.failed(Outcome.CRASHED, "fake: the worker died")]
                        * (len(configs) + baseline)] * rounds
            swing = [1 + self.program_swing * (1 if r % 2 else -1)
                     for r in range(first_round, first_round + rounds)]
            return [[TrialResult.timed(self._samples((TRUE_US[c["v"]] + self.kernel_call_us)
                                                     * swing[i], 3, 10 * r + c["v"]),
                                       compile_s=0.1, rel_error=None, timing=PROGRAM_METHOD,
                                       cache=self.cache_policy) for c in configs]
                    + [TrialResult.timed(self._samples(150.0 + self.base_call_us, 3, 10 * r + 9),
                                         compile_s=0.0, rel_error=None, timing=PROGRAM_METHOD,
                                         cache=self.cache_policy)] * baseline
                    for i, r in enumerate(range(first_round, first_round + rounds))]
        self.asked.append((first_round, [c["v"] for c in configs]))
        if first_round == 0:
            self.confirmed.append([c["v"] for c in configs])
            self.iterations.append(asked)
        self.rounds += rounds
        table = []
        for r in range(first_round, first_round + rounds):
            row = [TrialResult.timed(self._samples(TRUE_US[c["v"]], n, 10 * r + c["v"]),
                                     compile_s=0.1, rel_error=None, timing="fake",
                                     cache=self.cache_policy) for c, n in zip(configs, counts, strict=False)]
            if baseline:
                base_us = 150.0 * (1 + self.drift * (1 if r % 2 else -1))
                row.append(TrialResult.timed(self._samples(base_us, counts[-1], 10 * r + 9),
                                             compile_s=0.0, rel_error=None, timing="fake",
                                             cache=self.cache_policy))
            table.append(row)
        return table


def _pick_job(**spec) -> Job:
    return Job("pick", (ProblemSpec(PICK_PROBLEM, Budget(trials=6), sampler="brute", seed=0,
                                    **spec),))


@pytest.mark.parametrize("interleave, how", [(None, {}), ("blocks", {}),
                                             ("calls", {"interleaved": True})])
def test_a_jobs_confirm_interleave_reaches_the_engine(tmp_path, interleave, how):
    """``confirm_interleave = "calls"`` asks the engine for rounds timed call by call
    (``Engine.confirm(interleaved=True)``); "blocks" and the default ask for nothing more,
    so an engine that does not know the argument still confirms. The program check is never
    interleaved."""
    engine = ConfirmingEngine()
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        (report,) = run_job(_pick_job(confirm_interleave=interleave), store=store,
                            engine=engine)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
    assert report.confirmation is not None
    rounds = [h for program, h in engine.how if not program]
    checks = [h for program, h in engine.how if program]
    assert rounds and checks
    assert all(h == how for h in rounds) and all(h == {} for h in checks)
    # The row's count of runs is what a program was timed for: the largest sized count, or,
    # interleaved call by call, their mean.
    (sized,) = engine.iterations
    assert conf.iterations == (math.ceil(sum(sized) / len(sized)) if how else max(sized))
    assert len(set(sized)) > 1


def test_a_job_that_interleaves_by_calls_confirms_one_task_a_round_on_the_engine(tmp_path):
    """End to end on the engine (fake evaluator in a worker process): a problem whose job says
    ``confirm_interleave = "calls"`` is confirmed in rounds that are one task each, and the
    confirmation is stored."""
    from autotune.engine.dispatcher import Engine
    from autotune.tuning.confirming import confirm_best

    kernel = get_kernel("tests.kernels_for_tests:FAKE", allow_import=True)
    problem = kernel.problem({"n": 7}, "float32")
    configs = [Config(mode="ok", stage=s) for s in ("run", "check", "time")]
    software = {"jax": "1", "jaxlib": "1"}
    spec = ProblemSpec(problem, Budget(trials=3), confirm_rounds=3, confirm_interleave="calls")
    with Engine("fake", allow_import=True, cache="cold") as engine, \
            Store(f"sqlite:///{tmp_path}/t.db") as store:
        device = engine.device_info()
        for c in configs:
            store.record_trial(problem, c, engine.submit(kernel.name, problem, c).result(),
                               device=device, software=software, cache="cold")
        before = {e.task_id for e in engine.timeline()}
        seconds = confirm_best(kernel, problem, spec, store=store, engine=engine,
                               device=device, software=software)
        kinds = [e.kind for e in engine.timeline() if e.task_id not in before
                 and e.stage == "done"]
        (confirmation,) = store.confirmations(problem, device_kind=None, cache="cold")
    assert seconds is not None and kinds == ["round"] * 3
    assert sorted(dict(p.config)["stage"] for p in confirmation.programs) == ["check", "run",
                                                                              "time"]


def test_the_confirmation_round_crowns_past_a_lucky_search_and_marks_ties(tmp_path):
    """The search's fastest (v=3, a lucky 95 us) re-times at 110 us and is not crowned; v=0
    and the default v=1 are within the noise of each other: tied, and the default is crowned.
    The round is stored as rows of its own; the search trials are unchanged."""
    url = f"sqlite:///{tmp_path}/t.db"
    engine = ConfirmingEngine()
    with Store(url) as store:
        (report,) = run_job(_pick_job(), store=store, engine=engine)
        rows = store.trials(PICK_PROBLEM)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
        store_baseline_us = store.baseline(PICK_PROBLEM, device_kind=None).median_us
    assert engine.confirmed == [[3, 0, 1, 2, 4]]  # the search's best five, fastest first
    assert len(rows) == 6 and min(rows, key=lambda r: r.median_us).config == {"v": 3}
    assert report.best_config == {"v": 1} and report.confirmation is not None
    assert report.best_us == pytest.approx(99.96, rel=0.003)
    assert report.speedup == pytest.approx(150 / 99.96, rel=0.005)
    assert report.speedup_spread is not None and report.speedup_spread < 0.01
    assert report.ties == 1 and report.cache_policy == "warm"
    marks = {p.config["v"]: (p.tie, p.crowned) for p in conf.programs}
    assert marks == {3: (False, False), 0: (False, False), 1: (True, True), 2: (False, False),
                     4: (False, False)}
    # Runs per round sized by each program's search median (the baseline's last): about 4 ms
    # of GPU time each; the stored count is the largest.
    (counts,) = engine.iterations
    by_v = {r.config["v"]: r.median_us for r in rows}
    assert counts == [sized_iterations(by_v[v]) for v in (3, 0, 1, 2, 4)] + [
        sized_iterations(store_baseline_us)]
    assert counts[0] == math.ceil(4000 / by_v[3]) and 20 <= min(counts)
    # A clear result (the speedup's spread under 0.25%): the adaptive round stops at 5.
    assert report.speedup_spread < 0.0025 and engine.rounds == 5
    assert conf.rounds == 5 and conf.iterations == max(counts) and conf.baseline_name == "xla"


def test_a_stored_config_that_todays_rules_refuse_is_neither_confirmed_nor_crowned(tmp_path):
    """The search's fastest stored config (v=3, a lucky 95 us) is one that a rule added since
    refuses (the same kernel, a later version): the confirmation round leaves it out and
    re-times the five best valid configs; nothing crowned or tied breaks today's rules."""
    from autotune.tuning.confirming import confirm_best
    from autotune.tuning.provenance import software_versions

    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_pick_job(confirm_top=0), store=store, engine=ConfirmingEngine())
        assert min(store.trials(PICK_PROBLEM), key=lambda r: r.median_us).config == {"v": 3}
    stricter = dataclasses.replace(PICK, space=Space(
        params=PICK.space.params,
        constraints=(Constraint("not_three", ("v",), lambda c, e: c["v"] != 3, "v is not 3"),)))
    register(stricter)
    try:
        engine = ConfirmingEngine()
        with Store(url) as store:
            confirm_best(stricter, PICK_PROBLEM, _pick_job().problems[0], store=store,
                         engine=engine, device=engine.device_info(), software=software_versions())
            (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
    finally:
        register(PICK)
    assert engine.confirmed == [[0, 1, 2, 4, 5]]
    assert {p.config["v"] for p in conf.programs} == {0, 1, 2, 4, 5}
    assert conf.crowned.config["v"] != 3


def test_a_confirmation_is_followed_by_a_program_check_tied_to_it(tmp_path, capsys):
    """After the confirmation, its crowned config and the baseline are timed as a program
    calls them (``confirm(..., program=True)``): PROGRAM_CHECK_ROUNDS rounds, calls per block
    sized by each one's confirmed time, stored as a verification row of PROGRAM_METHOD tied to
    that confirmation. Here a kernel call costs 60 us beyond its kernel time: the confirmation
    finds the kernel 1.5x faster, the program check finds the baseline faster."""
    from autotune.tuning.confirmation import PROGRAM_CHECK_ROUNDS, program_calls

    engine = ConfirmingEngine(kernel_call_us=60.0)
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        (report,) = run_job(_pick_job(), store=store, engine=engine)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
        (check,) = store.verifications(PICK_PROBLEM)
    crowned = next(p for p in conf.programs if p.crowned)
    assert engine.program_checks == [  # clear after the first rounds: no more
        ([1], [program_calls(crowned.median_us), program_calls(conf.baseline_median_us)],
         PROGRAM_CHECK_ROUNDS)]
    assert check.method == PROGRAM_METHOD and check.confirmation_id == conf.id
    assert check.config == crowned.config and check.rounds == PROGRAM_CHECK_ROUNDS
    assert check.stored_speedup == pytest.approx(conf.speedup) and conf.speedup > 1.4
    truth = 150 / (TRUE_US[1] + 60.0)  # the median round's ratio, within its samples' noise
    assert check.speedup == pytest.approx(truth, rel=0.01)
    assert check.speedup_low <= truth <= check.speedup_high
    assert check.speedup_high < 1.0 and check.baseline_name == "xla"
    assert report.confirmation is not None  # the report's figures are the confirmation's
    # The job's table shows both: the confirmation's speedup and the program check's.
    assert report.program_check is not None and report.program_check.id == check.id
    from autotune import cli

    cli._print_reports([report])
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert "as called" in header and f"{check.speedup:.3f} (slower)" in line


def test_an_unclear_program_check_times_more_rounds_up_to_its_maximum(tmp_path):
    """A program check whose verdict is unclear after PROGRAM_CHECK_ROUNDS (the kernel's calls
    swing +-8% from round to round about the baseline's time: the interval holds 1.0 and is
    wide) goes on one round at a time, with the rotation, up to PROGRAM_MAX_ROUNDS; the stored
    check has them all."""
    from autotune.tuning.confirmation import PROGRAM_CHECK_ROUNDS, PROGRAM_MAX_ROUNDS

    engine = ConfirmingEngine(kernel_call_us=150.0 - TRUE_US[1], program_swing=0.08)
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        run_job(_pick_job(), store=store, engine=engine)
        (check,) = store.verifications(PICK_PROBLEM)
    rounds = [n for _, _, n in engine.program_checks]
    assert rounds == [PROGRAM_CHECK_ROUNDS] + [1] * (PROGRAM_MAX_ROUNDS - PROGRAM_CHECK_ROUNDS)
    assert check.rounds == PROGRAM_MAX_ROUNDS
    assert check.speedup_low <= 1.0 <= check.speedup_high


def test_a_failed_program_check_stores_nothing_and_the_confirmation_stands(tmp_path, caplog):
    """A program check whose timing fails leaves no verification row (logged); the
    confirmation is stored as without it."""
    engine = ConfirmingEngine(program_fails=True)
    with caplog.at_level("INFO"), Store(f"sqlite:///{tmp_path}/t.db") as store:
        run_job(_pick_job(), store=store, engine=engine)
        assert len(store.confirmations(PICK_PROBLEM, device_kind=None)) == 1
        assert store.verifications(PICK_PROBLEM) == []
    assert len(engine.program_checks) == 1
    assert "no program check (crashed" in caplog.text


def test_an_unclear_confirmation_times_more_rounds_up_to_the_default_and_a_fixed_count_wins(
        tmp_path):
    """Adaptive rounds (no confirm_rounds in the job): 5, then one more at a time while the
    confirmed speedup's spread is over 0.25%, up to DEFAULT_CONFIRM_ROUNDS; a baseline whose
    rounds differ by 2% gets all 9, each going on with the rotation. A job's confirm_rounds is
    what it gets."""
    from autotune.tuning.confirmation import DEFAULT_CONFIRM_ROUNDS

    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        engine = ConfirmingEngine(drift=0.01)
        run_job(_pick_job(), store=store, engine=engine)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
    assert engine.rounds == conf.rounds == DEFAULT_CONFIRM_ROUNDS == 9
    with Store(f"sqlite:///{tmp_path}/fixed.db") as store:
        engine = ConfirmingEngine(drift=0.01)
        run_job(_pick_job(confirm_rounds=4), store=store, engine=engine)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
    assert engine.rounds == conf.rounds == 4
    assert engine.asked == [(0, [3, 0, 1, 2, 4])]
    assert {len(p.rounds_us) for p in conf.programs} == {4}


def test_adaptive_rounds_race_configs_that_can_no_longer_win_out_of_later_rounds(tmp_path):
    """From the fifth round on, a config separated from the fastest and not tied with it is
    timed no more (raced_out): the baseline's 2% swing asks for 9 rounds, and rounds 6-9 time
    only the two configs 0.04% apart (v=0, the default v=1) and the baseline, not v=2, 3, 4
    (3-20% slower in every round). The stored round keeps each config's rounds: 5 for those
    raced out, 9 for the rest; the crown and the speedup are those of the full race."""
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        engine = ConfirmingEngine(drift=0.01)
        (report,) = run_job(_pick_job(), store=store, engine=engine)
        (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
    assert engine.asked == [(0, [3, 0, 1, 2, 4])] + [(r, [0, 1]) for r in range(5, 9)]
    rounds = {p.config["v"]: len(p.rounds_us) for p in conf.programs}
    assert rounds == {3: 5, 0: 9, 1: 9, 2: 5, 4: 5}
    assert len(conf.baseline_rounds_us) == conf.rounds == 9
    assert conf.crowned.config == {"v": 1} and report.best_config == {"v": 1}
    marks = {p.config["v"]: (p.tie, p.crowned) for p in conf.programs}
    assert marks == {3: (False, False), 0: (False, False), 1: (True, True), 2: (False, False),
                     4: (False, False)}


def test_a_second_run_does_not_confirm_again_unless_the_best_changed(tmp_path):
    """Re-running a finished job measures nothing and confirms nothing: the newest round
    already covers the best configs."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_pick_job(), store=store, engine=ConfirmingEngine())
        again = ConfirmingEngine()
        (report,) = run_job(_pick_job(), store=store, engine=again)
        assert len(store.confirmations(PICK_PROBLEM, device_kind=None)) == 1
    assert again.confirmed == [] and again.measured == []
    assert report.skipped and report.best_config == {"v": 1}


def test_only_a_baseline_that_passed_its_check_is_confirmed_against(tmp_path, caplog):
    """The rounds time the baseline only once it is stored, after its output passed the
    kernel's check. One whose output is off the reference (always here) is stored nowhere, and
    the round confirms the configs without it: no speedup, the kernel's config served. One that
    failed only in the search's measurement is timed and checked again by the confirmation,
    stored, and confirmed against."""
    from autotune.evaluation.contract import wrong_result

    class Baseline(ConfirmingEngine):
        def __init__(self, fails: int, **kw):
            super().__init__(**kw)
            self.fails, self.asked_baselines = fails, 0

        def baseline(self, kernel_name, problem):
            self.asked_baselines += 1
            if self.asked_baselines <= self.fails:
                return wrong_result(0.5, 0.02, 0.0, when=" of the baseline")
            return super().baseline(kernel_name, problem)

    for fails, confirmed in ((99, False), (1, True)):
        engine = Baseline(fails)
        with Store(f"sqlite:///{tmp_path}/t{fails}.db") as store:
            (report,) = run_job(_pick_job(), store=store, engine=engine)
            (conf,) = store.confirmations(PICK_PROBLEM, device_kind=None)
            stored = store.baseline(PICK_PROBLEM, device_kind=None)
        assert engine.asked_baselines == 2  # the search's, then the confirmation's
        assert (stored is not None) == confirmed
        assert (conf.baseline_name == "xla") == confirmed
        assert (report.speedup is not None) == confirmed
        assert report.best_config == {"v": 1} and engine.confirmed == [[3, 0, 1, 2, 4]]
    assert "the baseline xla failed (wrong_result): [check] relative error 0.5 of the " \
           "baseline exceeds the tolerance 0.02" in caplog.text
    assert "; the confirmation has no baseline." in caplog.text


def test_cache_policies_are_stored_and_kept_apart(tmp_path):
    """A cold job after a warm one measures every config again (cold), in rows of its own;
    each policy's best, baseline, study and confirmation use only its own rows, and the
    lookup answers from the cold ones."""
    from autotune.queries.best import best_result, close_stores

    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        (warm,) = run_job(_pick_job(), store=store, engine=ConfirmingEngine("warm"))
        cold_engine = ConfirmingEngine("cold")
        (cold,) = run_job(Job("pick", _pick_job().problems, cache="cold"), store=store,
                          engine=cold_engine)
        assert len(cold_engine.measured) == 6 and cold.measured_now == 6
        for policy, scale in (("warm", 1.0), ("cold", 1.1)):
            rows = store.trials(PICK_PROBLEM, cache=policy)
            assert len(rows) == 6 and {r.cache_policy for r in rows} == {policy}
            [best] = store.best(PICK_PROBLEM, device_kind=None, cache=policy)
            assert best.median_us == pytest.approx(95 * scale, rel=0.01)
            base = store.baseline(PICK_PROBLEM, device_kind=None, cache=policy)
            assert base.median_us == pytest.approx(150 * scale, rel=0.01)
        assert store.preferred_policy(PICK_PROBLEM, device_kind=None) == "cold"
        studies = {s.study_name for s in optuna.get_all_study_summaries(url)}
        assert {study_name(PICK_PROBLEM, DeviceInfo("fake-gpu", "fake")),
                study_name(PICK_PROBLEM, DeviceInfo("fake-gpu", "fake"), "cold")} <= studies
        [run_warm, run_cold] = store.runs()
        assert (run_warm.cache_policy, run_cold.cache_policy) == ("warm", "cold")
        assert run_cold.clocks_before["available"] is False and run_cold.finished_at is not None
    assert warm.best_us == pytest.approx(99.96, rel=0.005)
    assert cold.best_us == pytest.approx(110.11, rel=0.005) and cold.cache_policy == "cold"
    try:
        answer = best_result("tuner_pick", {"m": 64}, "bf16", device="fake", db=url)
        warm_answer = best_result("tuner_pick", {"m": 64}, "bf16", device="fake", db=url,
                                  cache="warm")
    finally:
        close_stores()
    assert answer.cache_policy == "cold" and answer.confirmed and answer.config == {"v": 1}
    assert answer.median_us == pytest.approx(110.11, rel=0.005)
    assert [t["config"] for t in answer.ties] == [{"v": 0}]
    assert warm_answer.cache_policy == "warm" and warm_answer.median_us == pytest.approx(99.96, rel=0.005)


def test_a_job_and_an_engine_of_different_policies_are_refused(tmp_path):
    """A job asking for cold on an engine that times warm stops before measuring anything."""
    from autotune.errors import JobError

    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        with pytest.raises(JobError, match="cache = 'cold' but the engine times 'warm'"):
            run_job(Job("pick", _pick_job().problems, cache="cold"), store=store,
                    engine=ConfirmingEngine("warm"))
        assert store.trials() == []


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
        with caplog.at_level(logging.INFO, logger="autotune"):
            (report,) = run_job(job, store=store, engine=engine)
        rows = store.trials(PROBLEM)
    assert any("sampler ranked (auto)" in r.getMessage() for r in caplog.records)
    assert len(rows) == 10 == len({Config(r.config).digest() for r in rows})
    assert report.best_us == min(r.median_us for r in rows)


def test_software_versions_do_not_import_jax():
    """The versions stored with every result come from package metadata: the job's process
    does not import jax (seconds) on its way to the first trial, and they are the versions
    the lookup compares with."""
    import subprocess
    import sys

    code = ("import sys; from autotune.tuning.provenance import software_versions; v = software_versions(); "
            "from autotune.queries.best import running_versions; r = running_versions(); "
            "assert v['jax'] == r['jax'] and v['jaxlib'] == r['jaxlib'], (v, r); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


INTERPRET_TOY = dataclasses.replace(
    TOY,
    name="tuner_toy_interpret",
    space=dataclasses.replace(SPACE, constraints=SPACE.constraints + (
        Constraint("interpret_small", ("bm",), lambda c, e: not e.interpret or e["m"] <= 512,
                   "m must be at most 512 in interpret mode", kind="interpret"),
    )),
)
register(INTERPRET_TOY)


def test_an_interpret_job_checks_every_problem_for_interpret_rules_before_tuning_any(tmp_path):
    """In GPU interpret mode, a problem that only the interpret-only rules leave without a valid
    config stops the job before its first problem is tuned (the job file was checked for the
    GPU's rules alone): nothing is measured or stored, and the message names the problem, the
    rule and the fix."""
    from autotune.errors import NoValidConfigError

    small = INTERPRET_TOY.problem({"m": 256, "n": 256}, "bf16")
    large = INTERPRET_TOY.problem({"m": 1024, "n": 256}, "bf16")
    assert INTERPRET_TOY.valid_space(large).count() > 0  # valid on a GPU
    job = Job("t", tuple(ProblemSpec(p, Budget(trials=4), sampler="random", seed=0)
                         for p in (small, large)))
    engine = FakeEngine(device="interpret-cpu")
    engine._device = DeviceInfo(name="interpret-cpu", kind="interpret")
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        with pytest.raises(NoValidConfigError, match=r"interpret_small.*--device gpu"):
            run_job(job, store=store, engine=engine)
        assert store.trials(small) == [] and store.trials(large) == []
    assert engine.measured == []


@pytest.mark.parametrize("sequential", [False, True])
def test_interpret_mode_times_no_baseline(tmp_path, sequential):
    """In GPU interpret mode no baseline is timed or stored: a CPU XLA time says nothing beside
    an interpreted kernel's wall-clock time (both runners)."""

    class InterpretEngine(FakeEngine):
        def __init__(self):
            super().__init__()
            self._device = DeviceInfo(name="cpu-interpret (test)", kind="interpret")

            self.baselines = 0

        def baseline(self, kernel_name, problem):
            self.baselines += 1
            return super().baseline(kernel_name, problem)

    url = f"sqlite:///{tmp_path}/t.db"
    engine = InterpretEngine()
    with Store(url) as store:
        (report,) = run_job(_job(4), store=store, engine=engine, sequential=sequential)
        assert store.baseline(PROBLEM, device_kind="interpret") is None
    assert engine.baselines == 0
    assert report.measured_now == 4 and report.baseline_us is None and report.speedup is None


def test_related_winners_add_other_gpus_winner_of_this_problem(tmp_path):
    """On a GPU, the winner of this very problem on each other GPU follows the nearest shapes'
    winners of this GPU (a seed from another device, never counted as measured here);
    interpret-mode runs do not take GPU results."""
    from autotune.tuning.seeding import related_winners

    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 256, "n": 256, "k": 256}, "bfloat16")
    near = kernel.problem({"m": 512, "n": 256, "k": 256}, "bfloat16")
    a, b = list(kernel.bind(problem).sample(2, seed=0))
    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570")
    h200 = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570")
    ok = TrialResult.timed([5.0], compile_s=0.1, rel_error=0.0, timing="fake")
    with Store(f"sqlite:///{tmp_path}/r.db") as store:
        store.record_trial(problem, a, ok, device=h200, software={})
        store.record_trial(near, b, ok, device=h100, software={})
        assert related_winners(store, problem, h100) == [b, a]
        assert related_winners(store, problem, h200) == []  # its own result is measured, not related
        assert related_winners(store, problem, DeviceInfo("cpu-interpret", "interpret")) == []


# -- dead runners (issue 30) --------------------------------------------------------------------


def test_a_runner_is_named_by_host_pid_and_start_time_and_told_dead_at_once():
    """worker_id records host, pid and the process's start time; a process of this host is
    dead when its pid is gone, or runs a process of another start time (the pid was reused);
    another host's process is never judged from here."""
    import socket
    import subprocess
    import sys

    host, pid = socket.gethostname(), os.getpid()
    assert studies.worker_id() == f"{host}:{pid}:{studies.process_start(pid)}"
    assert not studies.owner_dead_here(studies.worker_id())
    assert studies.owner_dead_here(f"{host}:{pid}:1")  # this pid, but not this process: reused
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    assert studies.owner_dead_here(f"{host}:{gone.stdout.strip()}")  # an older runner's form
    assert not studies.owner_dead_here(f"another-host:{pid}:1")
    assert studies.parse_owner(f"{host}:12:345") == (host, 12, "345")


def _orphan(url: str, owner: str, config: dict | None = None):
    """A study of PROBLEM with one RUNNING trial owned by ``owner`` (a fresh heartbeat)."""
    device = DeviceInfo(name="fake-gpu", kind="fake")
    storage = studies.optuna_storage(url)
    study = optuna.create_study(study_name=study_name(PROBLEM, device), storage=storage,
                                load_if_exists=True)
    if config is not None:
        study.enqueue_trial(config)
    trial = study.ask(distributions(TOY.valid_space(PROBLEM)))
    trial.set_user_attr(WORKER_ATTR, owner)
    storage.record_heartbeat(optuna_adapter.trial_id(trial))
    return study, trial, device


def test_a_dead_runners_trial_is_reclaimed_at_once_even_when_its_pid_was_reused(tmp_path):
    """A RUNNING trial of a process of this host whose pid now runs another process (another
    start time) is reclaimed at once, its heartbeat still fresh, and `status` counts it as
    dead, not in flight (both used to wait for the 2-minute grace)."""
    import socket

    from autotune.queries.status import job_status

    url = f"sqlite:///{tmp_path}/t.db"
    owner = f"{socket.gethostname()}:{os.getpid()}:1"
    study, trial, device = _orphan(url, owner)
    assert studies.running_owners(study) == [(owner, True)]
    with Store(url) as store:
        (status,) = job_status(_job(4), store).problems
        assert (status.in_flight, status.stale) == (0, 1)
        assert job_status(_job(4), store).hosts == {}
        studies.close_orphans(study, store, PROBLEM, device)
    assert study.trials[trial.number].state == TrialState.FAIL


def _unmeasured(store) -> Config:
    """A valid config of PROBLEM that no stored trial holds."""
    taken = {Config(r.config) for r in store.trials(PROBLEM)}
    bound = TOY.valid_space(PROBLEM)
    return next(c for c in map(bound.config_of, bound.valid_tuples()) if c not in taken)


def test_a_finished_problem_closes_the_trial_a_killed_runner_left_running(tmp_path):
    """A runner killed after storing its problem's last trial (before telling Optuna) leaves
    it RUNNING with a live-looking heartbeat; the next run finds the budget spent and closes it
    from the store, instead of leaving it RUNNING and "stale" forever."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_job(3, sampler="random"), store=store, engine=FakeEngine())
        last = _unmeasured(store)
    study, trial, device = _orphan(url, "another-host:1234:5", dict(last))
    with Store(url) as store:  # the killed runner's last act: its result stored under its trial
        result = TrialResult.timed([90.0, 91.0], compile_s=0.1, rel_error=0.0, timing="fake")
        store.record_trial(PROBLEM, last, result, device=device, software={"jax": "0"},
                           study_name=study.study_name, optuna_trial_number=trial.number)
        (report,) = run_job(_job(4, sampler="random"), store=store, engine=FakeEngine())
    assert report.skipped
    study = optuna.load_study(study_name=study.study_name, storage=url)
    assert study.trials[trial.number].state == TrialState.COMPLETE
    assert study.trials[trial.number].value == 90.5
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_a_finished_problem_releases_a_trial_over_its_budget_a_killed_runner_left_running(tmp_path):
    """A runner killed between asking a trial its budget did not admit and releasing it leaves
    that trial RUNNING with a live-looking heartbeat (of another host: not known dead). No
    process may measure it (its owner, alive, would release it), so the run that finds the
    budget spent releases it at once, its config free; it used to stay RUNNING for good when
    the job ended within GRACE_S (tests/tuning/test_scheduler.py's killed runner, on CI)."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_job(4, sampler="random"), store=store, engine=FakeEngine())
        study, trial, _ = _orphan(url, "another-host:1234:5", dict(_unmeasured(store)))
        assert studies.never_admitted(study.get_trials(), 4) == {trial.number}
        assert studies.never_admitted(study.get_trials(), 5) == set()
        (report,) = run_job(_job(4, sampler="random"), store=store, engine=FakeEngine())
    assert report.skipped
    study = optuna.load_study(study_name=study.study_name, storage=url)
    closed = study.trials[trial.number]
    assert closed.state == TrialState.FAIL and OUTCOME_ATTR not in closed.system_attrs
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_a_dead_runners_twin_of_a_measured_config_is_released_not_told_the_others_result(tmp_path):
    """A runner that dies between asking a config another trial holds (a twin) and releasing
    it leaves a RUNNING trial whose config is stored, but by the other trial: it is released,
    not told that trial's result, so the study does not count one measured config twice."""
    import socket

    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_job(4, sampler="random"), store=store, engine=FakeEngine())
        held = store.trials(PROBLEM)[-1]
        dead = f"{socket.gethostname()}:{os.getpid()}:1"  # this pid, another start: gone
        study, trial, device = _orphan(url, dead, dict(held.config))
        assert held.optuna_trial_number != trial.number
        studies.close_orphans(study, store, PROBLEM, device)
    study = optuna.load_study(study_name=study.study_name, storage=url)
    assert study.trials[trial.number].state == TrialState.FAIL
    assert len([t for t in study.trials if t.state == TrialState.COMPLETE]) == 4


def test_a_finished_problem_releases_a_trial_over_its_budget_still_being_sampled(tmp_path):
    """A trial over the budget that is still without params (its owner sampling it, or killed
    while it did) is released at once too, and one within the budget is not (its owner's side:
    test_a_trial_closed_while_its_owner_samples_it_is_asked_again)."""
    url = f"sqlite:///{tmp_path}/t.db"
    with Store(url) as store:
        run_job(_job(4, sampler="random"), store=store, engine=FakeEngine())
        device = FakeEngine().device_info()
        study = optuna.load_study(study_name=study_name(PROBLEM, device), storage=url)
        trial = study.ask()  # no params yet
        trial.set_user_attr(WORKER_ATTR, "another-host:1234:5")
        studies.close_finished(studies.optuna_storage(url), store, PROBLEM, device, admits=5)
        assert study.trials[trial.number].state == TrialState.RUNNING  # within that budget
        studies.close_finished(studies.optuna_storage(url), store, PROBLEM, device, admits=4)
    study = optuna.load_study(study_name=study.study_name, storage=url)
    assert study.trials[trial.number].state == TrialState.FAIL


def test_a_trial_closed_while_its_owner_samples_it_is_asked_again(tmp_path, monkeypatch):
    """The owner's side: the third trial of a job is closed by another process while it is
    sampled; the run asks again and stores exactly its budget, the closed trial FAIL without
    an outcome and nothing left RUNNING."""
    url = f"sqlite:///{tmp_path}/t.db"
    suggest_all, calls, closed = optuna_adapter.suggest_all, [], []

    def closing(trial, dists, **kw):
        calls.append(trial.number)
        if len(calls) == 3:
            other = optuna.load_study(study_name=trial.study.study_name, storage=url)
            other.tell(trial.number, state=TrialState.FAIL)
            closed.append(trial.number)
        suggest_all(trial, dists, **kw)

    monkeypatch.setattr(optuna_adapter, "suggest_all", closing)
    with Store(url) as store:
        (report,) = run_job(_job(5, sampler="random"), store=store, engine=FakeEngine())
        assert len(store.trials(PROBLEM)) == 5 == report.measured_now
    study = optuna.load_study(study_name=study_name(PROBLEM, FakeEngine().device_info()),
                              storage=url)
    (number,) = closed
    assert study.trials[number].state == TrialState.FAIL
    assert OUTCOME_ATTR not in study.trials[number].system_attrs
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]

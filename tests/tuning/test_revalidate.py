"""Revalidation: stale winners are re-measured under the running versions, old rows kept."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from autotune import cli
from autotune.queries import best as queries
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store
from autotune.tuning.revalidate import revalidate, stale_configs

DEVICE = DeviceInfo("fake-gpu", "fake")
OTHER = DeviceInfo("other-gpu", "fake")
OLD = {"jax": "0.0.1", "jaxlib": "0.0.1", "autotune": "0.1.0"}
NEW = {"jax": "9.9.9", "jaxlib": "9.9.9", "autotune": "0.1.0"}
P1 = Problem("toy", {"n": 1024}, "float32")
P2 = Problem("toy", {"n": 2048}, "float32")
A, B, C, D = (Config(block=b) for b in (64, 128, 256, 512))


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=0.1, rel_error=0.0, timing="fake")


class FakeEngine:
    """Measures each config at the time ``times`` gives it (or fails it when None)."""

    def __init__(self, times: dict[Config, float | None]) -> None:
        self.times = times
        self.submitted: list[tuple[Problem, Config]] = []

    def device_info(self) -> DeviceInfo:
        return DEVICE

    def submit(self, kernel_name: str, problem: Problem, config: Config) -> Future[TrialResult]:
        self.submitted.append((problem, config))
        future: Future[TrialResult] = Future()
        us = self.times[config]
        future.set_result(timed(us) if us is not None else
                          TrialResult.failed(Outcome.COMPILE_ERROR, "no longer compiles"))
        return future

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def db(db_url: str) -> str:
    """P1: A (10 us) beats B (20) and C (30) under OLD, D failed; P2: already measured under NEW."""
    with Store(db_url) as store:
        for config, us in ((A, 10.0), (B, 20.0), (C, 30.0)):
            store.record_trial(P1, config, timed(us), device=DEVICE, software=OLD)
        store.record_trial(P1, D, TrialResult.failed(Outcome.COMPILE_ERROR, "smem"),
                           device=DEVICE, software=OLD)
        store.record_trial(P1, A, timed(1.0), device=OTHER, software=OLD)  # another device
        store.record_trial(P2, A, timed(5.0), device=DEVICE, software=OLD)
        store.record_trial(P2, A, timed(6.0), device=DEVICE, software=NEW)
    return db_url


def test_stale_configs_are_the_fastest_old_ok_ones_of_the_device(db: str):
    """Old ok configs of the engine's device, fastest first, at most top."""
    with Store(db) as store:
        assert [r.config for r in stale_configs(store, P1, DEVICE, NEW, top=2)] == [A, B]
        assert [r.config for r in stale_configs(store, P1, DEVICE, NEW, top=9)] == [A, B, C]
        assert [r.median_us for r in stale_configs(store, P2, DEVICE, NEW, top=3)] == [5.0]
        assert stale_configs(store, P1, DEVICE, OLD, top=3) == []  # nothing is stale under OLD


def test_revalidate_reports_a_changed_winner_and_keeps_old_rows(db: str):
    """A got slower than B under NEW: the winner does not hold; new rows are added, none replaced."""
    engine = FakeEngine({A: 25.0, B: 21.0, C: None})
    with Store(db) as store:
        before = {r.id: r for r in store.trials()}
        [report] = revalidate(store, engine, top=3, software=NEW)
        after = store.trials()
    assert engine.submitted == [(P1, A), (P1, B), (P1, C)]  # P2's A was measured under NEW
    assert report.problem == P1 and report.device == DEVICE.name
    old = report.old_winner
    assert (old.config, old.old_us, old.new_us, old.ratio) == (A, 10.0, 25.0, 2.5)
    assert old.old_software["jax"] == "0.0.1"
    assert (report.winner, report.winner_us, report.holds, report.changed) == (B, 21.0, False, True)
    assert report.measured[2].result.outcome is Outcome.COMPILE_ERROR and report.measured[2].ratio is None
    assert len(after) == len(before) + 3
    for row in after:
        if row.id in before:
            assert row == before[row.id]  # untouched
        else:
            assert row.software == NEW and row.device == DEVICE and row.study_name is None


def test_revalidate_holds_and_is_idempotent(db: str):
    """A still wins within 5%: holds, not changed; a second run has nothing left to measure,
    and a wider one measures only what is new, reporting the earlier result of the winner."""
    engine = FakeEngine({A: 10.3, B: 20.0, C: 30.0})
    with Store(db) as store:
        [report] = revalidate(store, engine, top=1, software=NEW)
        assert (report.holds, report.changed, len(report.measured)) == (True, False, 1)
        assert revalidate(store, engine, top=1, software=NEW) == []
        assert len(engine.submitted) == 1
        [wider] = revalidate(store, engine, top=2, software=NEW)
    assert engine.submitted[1:] == [(P1, B)]
    assert [(m.config, m.new_us, m.fresh) for m in wider.measured] == [(A, 10.3, False), (B, 20.0, True)]
    assert wider.holds


def test_revalidate_kernel_filter_and_bad_top(db: str):
    """--kernel limits the problems; top must be positive."""
    with Store(db) as store:
        assert revalidate(store, FakeEngine({}), kernel="other", software=NEW) == []
        with pytest.raises(ValueError, match="top must be a positive integer"):
            revalidate(store, FakeEngine({}), top=0, software=NEW)


def test_revalidated_rows_become_what_queries_answer(tmp_path, monkeypatch):
    """After revalidation under the running versions, best_result answers with a fresh row."""
    url = f"sqlite:///{tmp_path}/r.db"
    running = {**queries.running_versions(), "autotune": "0.1.0"}
    with Store(url) as store:
        store.record_trial(P1, A, timed(10.0), device=DEVICE, software=OLD)
        store.record_trial(P1, B, timed(20.0), device=DEVICE, software=OLD)
    assert queries.best_result("toy", P1.dims, "float32", device="fake", db=url).stale
    with Store(url) as store:
        revalidate(store, FakeEngine({A: 30.0, B: 15.0}), software=running)
    result = queries.best_result("toy", P1.dims, "float32", device="fake", db=url)
    assert (result.config, result.median_us, result.stale) == ({"block": 128}, 15.0, False)


def test_cli_revalidate_prints_the_table(db: str, monkeypatch, capsys):
    """`autotune revalidate` prints old time, new time, ratio and whether the winner holds."""
    import autotune.api
    import autotune.tuning.provenance

    monkeypatch.setattr(autotune.api, "open_engine", lambda *a, **k: FakeEngine({A: 25.0, B: 21.0, C: 30.0}))
    monkeypatch.setattr(autotune.tuning.provenance, "software_versions", lambda: dict(NEW))
    assert cli.main(["revalidate", "--db", db, "--device", "interpret"]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split() == ["problem", "device", "old", "us", "old", "jax", "new", "us", "ratio",
                              "winner", "changed"]
    assert "10.0" in row and "25.0" in row and "2.500" in row and '"block": 128' in row
    assert row.split()[-1] == "yes"
    assert cli.main(["revalidate", "--db", db]) == 0
    assert "nothing to revalidate" in capsys.readouterr().out


def test_revalidate_through_the_process_engine(tmp_path):
    """The real engine (fake evaluator in worker processes) re-measures stale winners: one got
    slower, one no longer compiles; both are stored as new trials next to the old rows."""
    from autotune.engine.dispatcher import Engine

    kernel = "tests.kernels_for_tests:FAKE"
    problem = Problem(kernel, {"n": 1}, "float32")
    fast = Config(mode="ok", stage="run", cost_us=250)
    broken = Config(mode="raise", stage="compile")
    url = f"sqlite:///{tmp_path}/e.db"
    with Engine("fake", allow_import=True, iterations=3) as engine, Store(url) as store:
        device = engine.device_info()
        store.record_trial(problem, fast, timed(100.0), device=device, software=OLD)
        store.record_trial(problem, broken, timed(200.0), device=device, software=OLD)
        [report] = revalidate(store, engine, software=NEW)
        rows = store.trials(problem)
    winner, failed = report.measured
    assert (winner.config, winner.old_us, winner.ratio) == (fast, 100.0, pytest.approx(2.5, rel=0.01))
    assert failed.result.outcome is Outcome.COMPILE_ERROR and failed.new_us is None
    assert report.holds and report.changed
    assert sorted((r.software["jax"], r.status.value) for r in rows) == [
        ("0.0.1", "ok"), ("0.0.1", "ok"), ("9.9.9", "compile_error"), ("9.9.9", "ok")]


def test_best_command_says_when_its_answer_is_stale(db: str, capsys):
    """`autotune best` names the old versions of a stale answer and points at revalidate."""
    assert cli.main(["best", "toy", "--shape", "n=1024", "--dtype", "f32", "--device", "fake",
                     "--db", db]) == 0
    out = capsys.readouterr().out
    assert "measured with jax 0.0.1, jaxlib 0.0.1, not the running versions" in out
    assert "autotune revalidate" in out

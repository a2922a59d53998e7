"""``autotune verify``: stored winners and baselines re-timed by the second method, stored as
rows of their own (autotune.tuning.verify, autotune.evaluation.independent)."""

from __future__ import annotations

import statistics

import pytest

from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store
from autotune.tuning import verify as m
from autotune.tuning.confirmation import Candidate, analyse_confirmation

DEVICE = DeviceInfo("fake-gpu", "gpu")
SOFTWARE = {"jax": "9.9.9", "jaxlib": "9.9.9", "autotune": "0.1.0"}
P1 = Problem("toy", {"n": 1024}, "float32")  # a confirmation stored
P2 = Problem("toy", {"n": 2048}, "float32")  # trials and a baseline only
A, B, C = (Config(block=b) for b in (64, 128, 256))


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=0.1, rel_error=0.0, timing="fake", cache="cold")


@pytest.fixture
def db(db_url: str) -> str:
    with Store(db_url) as store:
        ids = [store.record_trial(P1, c, timed(us), device=DEVICE, software=SOFTWARE).id
               for c, us in ((A, 100.0), (B, 101.0), (C, 104.0))]
        cands = [Candidate(dict(c), ((us,) * 5,) * 3, trial_id=i)
                 for c, us, i in zip((A, B, C), (100.0, 101.0, 104.0), ids, strict=True)]
        confirmation = analyse_confirmation(cands, ((110.0,) * 5,) * 3)
        store.record_confirmation(P1, confirmation, trial_ids=ids, device=DEVICE,
                                  software=SOFTWARE, cache="cold", iterations=5,
                                  baseline_name="xla")
        for c, us in ((A, 50.0), (B, 55.0)):
            store.record_trial(P2, c, timed(us), device=DEVICE, software=SOFTWARE)
        store.record_baseline(P2, "xla", [45.0], device=DEVICE, software=SOFTWARE, cache="cold")
    return db_url


def fake_timing(times: dict[tuple[Problem, Config | None], float]):
    """A time_target that reads every program at the time ``times`` gives it, each round."""
    def time_target(target, rounds, calls):
        def r(config):
            return [(times[(target.problem, config)],)] * rounds

        base = r(None) if target.baseline_name else None
        return r(target.winner), base, [r(c) for c in target.others]

    return time_target


def test_targets_are_the_confirmed_winner_else_the_fastest_trial(db: str):
    """P1 re-times its confirmation's crowned config against its stored speedup; P2, without a
    confirmation, its fastest trial against the stored baseline over it."""
    with Store(db) as store:
        targets = {t.problem: t for t in m.targets(store, DEVICE, others=2)}
    assert targets[P1].winner == A and targets[P1].others == (B, C)
    assert targets[P1].stored_speedup == pytest.approx(1.1)
    assert targets[P1].confirmation_id is not None and targets[P1].baseline_name == "xla"
    assert targets[P2].winner == A and targets[P2].others == (B,)
    assert targets[P2].stored_speedup == pytest.approx(0.9)
    assert targets[P2].confirmation_id is None


def test_verify_stores_the_retimed_speedup_its_difference_and_whether_the_winner_holds(db: str):
    """P1 re-times at 100 vs 112 us (1.12 against the stored 1.10: +1.8%), B now faster than A by
    2%: the stored winner no longer wins. P2 holds. Rows of their own; trials untouched."""
    times = {(P1, A): 100.0, (P1, B): 98.0, (P1, C): 104.0, (P1, None): 112.0,
             (P2, A): 50.0, (P2, B): 55.0, (P2, None): 46.0}
    with Store(db) as store:
        before = [r.id for r in store.best(P1, device_name="fake-gpu", n=5)]
        results = {r.problem: r for r in m.verify(
            store, DEVICE, SOFTWARE, time_target=fake_timing(times), method="fake", rounds=3,
            calls=7)}
        rows = {r.problem: r for r in store.verifications(device_name="fake-gpu")}
        assert [r.id for r in store.best(P1, device_name="fake-gpu", n=5)] == before
    one = results[P1]
    assert one.speedup == pytest.approx(1.12) and one.difference == pytest.approx(1.12 / 1.1 - 1)
    assert one.still_wins is False
    assert one.words() == "12.0% faster than xla"
    assert results[P2].still_wins is True and results[P2].speedup == pytest.approx(0.92)
    assert "slower than xla" in results[P2].words()
    stored = rows[P1]
    assert (stored.config, stored.rounds, stored.calls, stored.method) == (A, 3, 7, "fake")
    assert stored.speedup == pytest.approx(1.12) and stored.stored_speedup == pytest.approx(1.1)
    assert stored.still_wins is False and stored.confirmation_id == one.confirmation_id
    assert [o["median_us"] for o in stored.others] == [98.0, 104.0]


def test_a_problem_the_method_cannot_time_is_left_out_and_nothing_is_stored_for_it(db: str):
    """A differenced time at or below zero (a program shorter than the host's dispatch) is no
    time: that problem is reported, not stored; the others go on."""
    times = {(P1, A): 100.0, (P1, B): 98.0, (P1, C): 104.0, (P1, None): 112.0,
             (P2, A): -3.0, (P2, B): 55.0, (P2, None): 46.0}
    failed = []
    with Store(db) as store:
        done = m.verify(store, DEVICE, SOFTWARE, time_target=fake_timing(times), method="fake",
                        on_result=lambda r, t, why: why and failed.append((t.problem, why)))
        assert [r.problem for r in store.verifications()] == [P1]
    assert [r.problem for r in done] == [P1]
    assert failed and failed[0][0] == P2 and "positive finite" in failed[0][1]


def test_analyse_interval_holds_the_speedup_and_refuses_bad_rounds():
    target = m.VerifyTarget(P1, A, (), 1.0, 100.0, 100.0, "xla", None)
    v = m.analyse(target, [(100.0,), (101.0,), (99.0,)], [(100.0,), (103.0,), (101.0,)],
                  method="fake", calls=1)
    assert v.speedup_low <= v.speedup <= v.speedup_high
    # Ratios 1.0, 1.0198, 1.0202: the median round is the second.
    assert v.speedup == pytest.approx(103.0 / 101.0)
    with pytest.raises(ValueError, match="same number of rounds"):
        m.analyse(target, [(1.0,)], [(1.0,), (1.0,)], method="fake", calls=1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        m.verify(None, DEVICE, SOFTWARE, time_target=None, method="x", rounds=0)


def test_the_speedup_and_the_times_beside_it_are_the_median_rounds():
    """As a confirmation's (docs/measurement.md): the program check and `verify` give the
    median round's ratio and that round's two medians, so the three figures agree and rounds
    whose clock moved between the two programs do not pull them. Here the clock drops in round
    3 between the two programs (the kernel 10% slower from then, the baseline from round 4):
    pooled medians read 99 / 110 = 0.90, every round but the third reads 0.99."""
    target = m.VerifyTarget(P1, A, (), 0.99, 100.0, 99.0, "xla", None)
    kernel = [(100.0,) * 3, (100.0,) * 3, (110.0,) * 3, (110.0,) * 3, (110.0,) * 3]
    base = [(99.0,) * 3, (99.0,) * 3, (99.0,) * 3, (108.9,) * 3, (108.9,) * 3]
    v = m.analyse(target, kernel, base, method="fake", calls=1)
    pooled = statistics.median(t for r in base for t in r) / statistics.median(
        t for r in kernel for t in r)
    assert pooled == pytest.approx(0.90)
    assert v.speedup == pytest.approx(0.99)
    assert (v.winner_median_us, v.baseline_median_us) == (100.0, 99.0)
    assert v.speedup == pytest.approx(v.baseline_median_us / v.winner_median_us)
    assert v.speedup_low <= v.speedup <= v.speedup_high < 1.0
    assert v.words().startswith("slower than xla")
    assert v.difference == pytest.approx(0.0)


def test_whether_the_winner_still_wins_is_judged_round_by_round():
    """Another config 1% faster than the winner in four rounds of five still beats it, though
    the clock's drop (the winner's last two rounds 20% slower, the other's from the third on)
    leaves the other's pooled median above the winner's: the per-round ratios decide."""
    target = m.VerifyTarget(P1, A, (B,), None, None, None, None, None)
    winner = [(100.0,), (100.0,), (100.0,), (120.0,), (120.0,)]
    other = [(99.0,), (99.0,), (118.8,), (118.8,), (118.8,)]
    v = m.analyse(target, winner, None, [other], method="fake", calls=1)
    assert v.others[0].median_us > v.winner_median_us  # pooled: the winner looks ahead
    assert v.still_wins is False
    level = m.analyse(target, winner, None, [[(t * 0.997,) for (t,) in winner]], method="fake",
                      calls=1)
    assert level.still_wins is True  # 0.3% faster: within STILL_WINS_BAND, the same answer


def test_each_programs_retimed_over_stored_time_says_which_one_the_methods_read_apart():
    """Set 10's -3.38% (benchmarks/RESULTS.md §12, 128x8192x8192): the confirmation stored the
    winner at 55.74 us and XLA at 62.30, `verify` re-timed them at 54.50 and 58.85. The winner
    moved -2.2%, the baseline -5.5%, and their ratio is the difference: the baseline's figure
    is the one the two methods read apart. Without a baseline re-timed, no baseline figure."""
    target = m.VerifyTarget(P1, A, (), 62.30 / 55.74, 55.74, 62.30, "xla", 1)
    v = m.analyse(target, [(54.50,)] * 3, [(58.85,)] * 3, method="fake", calls=1)
    assert v.winner_moved == pytest.approx(54.50 / 55.74 - 1)
    assert v.baseline_moved == pytest.approx(58.85 / 62.30 - 1)
    assert v.difference == pytest.approx(-0.0338, abs=5e-4)
    assert (1 + v.baseline_moved) / (1 + v.winner_moved) - 1 == pytest.approx(v.difference)
    alone = m.analyse(target, [(54.50,)] * 3, None, method="fake", calls=1)
    assert alone.baseline_moved is None and alone.winner_moved == pytest.approx(v.winner_moved)
    assert alone.to_dict()["baseline_moved"] is None


def test_the_wall_clock_timer_measures_the_work_not_the_flush():
    """The real method on the CPU: a program doing 16x the matrix products of another reads
    several times longer, and its time is positive. Each program is judged by its median
    round: one round's time is a difference of two host-clock spans, which a busy
    machine (a parallel test worker) can push either way, while the work is large enough
    beside the flush that the median stays on its side."""
    import jax
    import jax.numpy as jnp

    from autotune.evaluation.independent import WallClockTimer

    x = jax.random.normal(jax.random.key(0), (384, 384), jnp.float32)
    small = jax.jit(lambda a: a @ a)
    big = jax.jit(lambda a: jax.lax.fori_loop(0, 16, lambda i, b: (b @ a) * 0.01, a))
    table = WallClockTimer().rounds([(small, (x,)), (big, (x,))], rounds=5, calls=4)
    assert len(table) == 5 and all(len(row) == 2 for row in table)
    small_us, big_us = (statistics.median(row[i] for row in table) for i in (0, 1))
    assert small_us > 0, table
    assert big_us > 3 * small_us, table


def test_split_at_flush_splits_a_flushed_record_per_call():
    """cupti-flushed's split: a call begins where the flush's launches do; every launch up to
    the next flush is the call's. A record that does not begin with the flush, or splits into
    another number of calls, is refused by name."""
    from autotune.evaluation.independent import split_at_flush

    record = [("xor", 0.1), ("gemm", 0.05), ("fusion", 0.02)] * 3
    assert split_at_flush(record, ["xor"], 3) == pytest.approx([70.0] * 3)
    two = [("xor", 0.1), ("xor2", 0.1), ("gemm", 0.04)] * 2
    assert split_at_flush(two, ["xor", "xor2"], 2) == pytest.approx([40.0] * 2)
    with pytest.raises(ValueError, match="begin with 'gemm'"):
        split_at_flush(record[1:], ["xor"], 3)
    with pytest.raises(ValueError, match="split into 3 call"):
        split_at_flush(record, ["xor"], 4)
    with pytest.raises(ValueError, match="not 2 that each launch"):
        split_at_flush([("xor", 0.1), ("xor", 0.1), ("gemm", 0.05)], ["xor"], 2)


def test_the_flushed_timer_times_flush_then_program_back_to_back(monkeypatch):
    """CuptiFlushedTimer: the flush's names from two sessions of it alone, then per round and
    program one session of ``calls`` x (flush, program), split per call; the round's time is
    the median call. CUPTI is stood in for by a recorder of what ran (no GPU here)."""
    import autotune._jax_compat as compat
    from autotune.evaluation import independent

    ran: list[str] = []
    cost = {"flush": 0.1, "a": 0.03, "b": 0.05}  # ms per launch

    def session(run):
        ran.clear()
        run()
        return [(name, cost[name]) for name in ran]

    monkeypatch.setattr(compat, "cupti_session", session)
    monkeypatch.setattr(independent, "_flush_program",
                        lambda nbytes: (lambda buf: ran.append("flush") or buf, 0, 4))
    timer = independent.CuptiFlushedTimer()
    programs = [(lambda x, n=n: ran.append(n) or x, (1,)) for n in ("a", "b")]
    table = timer.rounds(programs, rounds=2, calls=3)
    assert timer.flush_names() == ("flush",)
    assert table == [pytest.approx([30.0, 50.0])] * 2
    assert independent.make_timer("cupti-flushed").method == "cupti-flushed"


def test_time_configs_compiles_checks_and_times_a_real_kernel_in_interpret_mode():
    """The real time_target's core on the CPU: a softmax config in GPU interpret mode is
    compiled, checked against the reference and timed by the second method."""
    from autotune.evaluation.independent import WallClockTimer, time_configs
    from autotune.space.kernel import get_kernel

    kernel = get_kernel("softmax")
    problem = kernel.problem({"rows": 16, "cols": 256}, "float32")
    config = Config(kernel.default_config(problem))
    per_config, base = time_configs(problem, [config], baseline=False, rounds=1, calls=1,
                                    interpret=True, timer=WallClockTimer(blocks=1))
    assert base is None and len(per_config) == 1 and len(per_config[0]) == 1
    assert per_config[0][0][0] > 0

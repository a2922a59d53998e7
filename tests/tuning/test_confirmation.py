"""The confirmation round's rules: the winner, the paired speedup, ties and the preference."""

from __future__ import annotations

import random
import statistics
from typing import Any

import pytest

from autotune.tuning import confirmation as m
from autotune.tuning.confirmation import Candidate, analyse_confirmation


def _timed(us: float) -> Any:
    """A stand-in for one of ``Engine.confirm``'s results: 20 runs of ``us``."""
    from autotune.space.outcomes import TrialResult

    return TrialResult.timed([us] * 20, compile_s=0.0, rel_error=None, timing="fake")


def rounds(center: float, *, noise: float = 0.0, n_rounds: int = 5, n: int = 50, seed: int = 0,
           drift: tuple[float, ...] = ()) -> tuple[tuple[float, ...], ...]:
    """Per-round samples around ``center`` (relative gaussian ``noise``, per-round ``drift``)."""
    rng = random.Random(seed)
    out = []
    for r in range(n_rounds):
        scale = 1 + (drift[r] if r < len(drift) else 0.0)
        out.append(tuple(center * scale * (1 + noise * rng.gauss(0, 1)) for _ in range(n)))
    return tuple(out)


def test_public_api():
    """``__all__`` lists exactly the public names."""
    assert sorted(m.__all__) == sorted([
        "DEFAULT_CONFIRM_TOP", "DEFAULT_CONFIRM_ROUNDS", "DEFAULT_CONFIRM_ITERATIONS",
        "Candidate", "ProgramSummary", "Confirmation", "preference_key", "analyse_confirmation",
        "sized_iterations", "needs_another_round", "raced_out", "timed_rounds",
        "analyse_rounds", "AnalysedRounds", "MAX_CONFIRM_ROUNDS", "CONFIRM_TIE_BAND", "CONFIRM_JOIN_MAX", "median_interval",
        "median_error", "CONFIRM_TIE_FLOOR", "CONFIRM_CROWN_BAND",
        "speedup_words", "joining_configs", "program_calls", "PROGRAM_CHECK_ROUNDS",
        "program_unclear", "PROGRAM_MAX_ROUNDS", "paired_ratios", "paired_interval", "median_round",
    ])


def test_a_program_check_is_unclear_while_its_interval_holds_one_and_is_wide():
    """program_unclear: the paired ratios' interval holds 1.0 and is wider than the tie band;
    a clear winner, or a tie known to within the band, is an answer."""
    kernel = [(100.0,)] * 5
    assert m.program_unclear(kernel, [(97.0,), (103.0,), (101.0,), (99.0,), (100.0,)])
    assert not m.program_unclear(kernel, [(103.0,), (104.0,), (102.0,), (103.0,), (103.5,)])
    assert not m.program_unclear(kernel, [(99.8,), (100.2,), (100.1,), (99.9,), (100.0,)])
    assert not m.program_unclear([], [])


def test_a_program_checks_blocks_hold_about_four_ms_of_calls():
    """program_calls: ~PROGRAM_TARGET_US of calls a block, clamped; the least when unknown."""
    assert m.program_calls(100.0) == 40
    assert m.program_calls(1.0) == m.PROGRAM_MAX_CALLS
    assert m.program_calls(10_000.0) == m.PROGRAM_MIN_CALLS
    assert m.program_calls(None) == m.program_calls(float("nan")) == m.PROGRAM_MIN_CALLS


def test_a_table_of_rounds_leaves_out_what_failed_in_any_round():
    """analyse_rounds (the tuner's): a config that failed in one round is
    left out, a failed baseline gives no speedup, and with every config failed nothing is
    confirmed."""
    from autotune.space.outcomes import Outcome, TrialResult

    def ok(us):
        return TrialResult.timed([us, us], compile_s=0.0, rel_error=None, timing="fake")

    bad = TrialResult(outcome=Outcome.CRASHED, error="died")
    configs = [{"t": 1}, {"t": 2}, {"t": 3}]
    table = [[ok(100.0), ok(110.0), ok(120.0), ok(200.0)],
             [ok(101.0), bad, ok(121.0), ok(201.0)]]
    analysed = m.analyse_rounds(table, configs, search_us=[100.0, 110.0, 120.0],
                                trial_ids=[7, 8, 9], baseline=True)
    assert analysed.kept == [0, 2] and analysed.failed == [1]
    assert analysed.base_rounds == [(200.0, 200.0), (201.0, 201.0)]
    assert analysed.confirmation.winner.config == {"t": 1}
    assert analysed.confirmation.speedup is not None
    no_base = m.analyse_rounds([row[:3] + [bad] for row in table], configs,
                               search_us=[100.0, 110.0, 120.0], baseline=True)
    assert no_base.base_rounds is None and no_base.confirmation.speedup is None
    none = m.analyse_rounds([[bad, bad, bad]], configs, search_us=[None] * 3, baseline=False)
    assert none.confirmation is None and none.failed == [0, 1, 2]


def test_confirmation_runs_are_sized_by_each_programs_time():
    """About CONFIRM_TARGET_US of GPU time per program and round: a short kernel (the noisiest)
    gets more runs, a long one fewer, never under the search's 20 nor over the cap; a job's
    fixed count wins; a program of unknown time gets the old default."""
    assert m.sized_iterations(50.0) == 80
    assert m.sized_iterations(172.0) == 24
    assert m.sized_iterations(630.0) == m.CONFIRM_MIN_ITERATIONS == 20
    assert m.sized_iterations(5.0) == m.CONFIRM_MAX_ITERATIONS == 400
    assert m.CONFIRM_TARGET_US == 4000.0
    assert m.sized_iterations(50.0, fixed=7) == 7
    assert m.sized_iterations(None) == m.sized_iterations(float("nan")) == 50


def test_configs_within_the_noise_are_ties_and_the_default_is_crowned():
    """A config 0.1% slower than the fastest, with 0.5% noise, ties; the default one among the
    tied is crowned, and a config 5% slower is not a tie."""
    default = {"tile": 128, "steps": 2}
    cands = [
        Candidate({"tile": 256, "steps": 4}, rounds(100.0, noise=0.005, seed=1), trial_id=1),
        Candidate(default, rounds(100.1, noise=0.005, seed=2), trial_id=2),
        Candidate({"tile": 64, "steps": 2}, rounds(105.0, noise=0.005, seed=3), trial_id=3),
    ]
    c = analyse_confirmation(cands, rounds(120.0, noise=0.005, seed=4), default_config=default)
    assert c.fastest == 0
    assert [p.tie for p in c.configs] == [False, True, False]
    assert c.crowned == 1 and c.winner.config == default and c.winner.crowned
    assert c.configs[2].diff == pytest.approx(0.05, abs=0.003)
    assert c.speedup == pytest.approx(120.0 / 100.1, rel=0.003)


def test_a_lucky_search_measurement_is_not_crowned():
    """A config whose search trial read 95 us but which re-times at 101 us loses to the one at
    100 us: the confirmation, not the lucky moment, decides."""
    cands = [
        Candidate({"tile": 64}, rounds(101.0, noise=0.001, seed=1), trial_id=1, search_us=95.0),
        Candidate({"tile": 128}, rounds(100.0, noise=0.001, seed=2), trial_id=2, search_us=100.0),
    ]
    c = analyse_confirmation(cands, rounds(110.0, noise=0.001, seed=3))
    assert c.winner.config == {"tile": 128}
    assert not c.configs[0].tie and c.configs[0].diff == pytest.approx(0.01, abs=0.002)


def test_a_noisy_fast_config_ties_and_the_simpler_one_is_crowned():
    """A config whose samples spread 10% ties with a quiet, simpler one (smaller tiles and
    fewer stages, no default given): where the rounds put the simpler within a tenth of a
    percent (CONFIRM_CROWN_BAND), the simpler is crowned; where they put it 0.2% behind, the
    fastest is, and the simpler stays a marked tie."""
    simple = {"tile": 64, "steps": 2}
    for fast_us, crowned in ((99.95, simple), (99.7, {"tile": 256, "steps": 4})):
        cands = [
            Candidate({"tile": 256, "steps": 4}, rounds(fast_us, noise=0.04, seed=5), trial_id=1),
            Candidate(simple, rounds(100.0, noise=0.001, seed=6), trial_id=2),
        ]
        c = analyse_confirmation(cands, rounds(150.0, noise=0.001, seed=7))
        assert c.fastest == 0 and c.configs[1].tie
        assert c.winner.config == crowned


def test_a_tie_behind_the_crown_band_is_marked_and_the_fastest_crowned():
    """The H100's 2048x14336x4096 (benchmarks/RESULTS.md §12): the default-nearest config 0.9%
    behind the fastest tied for a 1% noise and was crowned; the second method put it 0.73%
    behind. A tie further than CONFIRM_CROWN_BAND behind is marked, and the fastest crowned;
    with the band open (the old rule) the order crowns the default."""
    default = {"width": 4}
    cands = [
        Candidate({"width": 1}, rounds(303.0, noise=0.01, n_rounds=9, n=27, seed=1), trial_id=1),
        Candidate(default, rounds(305.7, noise=0.01, n_rounds=9, n=27, seed=2,
                                  drift=(0.0, -0.01, 0.012, 0.0, -0.006, 0.01, 0.0, 0.004, -0.008)),
                  trial_id=2),
    ]
    base = rounds(300.0, noise=0.01, n_rounds=9, n=27, seed=3)
    c = analyse_confirmation(cands, base, default_config=default)
    assert c.configs[1].tie and c.configs[1].diff > m.CONFIRM_CROWN_BAND
    assert c.winner.config == {"width": 1} and c.crowned == c.fastest == 0
    old = analyse_confirmation(cands, base, default_config=default, crown_band=float("inf"))
    assert old.winner.config == default
    with pytest.raises(ValueError, match="crown_band must be a fraction >= 0"):
        analyse_confirmation(cands, base, crown_band=-0.001)


def test_a_config_slower_in_every_round_does_not_tie_for_being_noisy():
    """The H200's decode-like matmul: the default-like config was 3-4% slower than the fastest
    in every round, but its samples spread 10%; half a spread (5%) made it a tie and it was
    crowned as the preferred config. Its median is known far better than one sample: not a
    tie, and the fastest is crowned."""
    default = {"minor": "N", "epi": 32}
    cands = [
        Candidate({"minor": "M", "epi": 32}, rounds(41.0, noise=0.02, n_rounds=3, n=196, seed=1),
                  trial_id=1),
        Candidate(default, rounds(42.4, noise=0.04, n_rounds=3, n=196, seed=2), trial_id=2),
    ]
    c = analyse_confirmation(cands, rounds(44.6, noise=0.02, n_rounds=3, n=196, seed=3),
                             default_config=default)
    assert c.configs[1].diff == pytest.approx(0.034, abs=0.01)
    assert not c.configs[1].tie
    assert c.winner.config == {"minor": "M", "epi": 32}


def test_median_error_is_the_spread_in_sigmas_over_the_root_of_the_samples():
    s = m._summary(None, rounds(100.0, noise=0.05, n_rounds=4, n=100, seed=4), trial_id=None,
                   search_us=None, what="x")
    sigma = s.spread / 2.563
    assert m.median_error(s) == pytest.approx(1.2533 * sigma / 20)
    assert sigma == pytest.approx(0.05, rel=0.15)


def test_drift_between_rounds_cancels_in_the_paired_speedup():
    """A clock drifting by 3% between rounds moves both programs alike: the paired speedup
    stays exact, and its spread stays small."""
    drift = (0.0, 0.01, 0.02, 0.03, 0.0)
    cand = Candidate({"tile": 64}, rounds(100.0, drift=drift), trial_id=1)
    c = analyse_confirmation([cand], rounds(150.0, drift=drift))
    assert c.speedup == pytest.approx(1.5)
    assert c.speedup_spread == pytest.approx(0.0, abs=1e-9)
    assert (c.speedup_low, c.speedup_high) == (pytest.approx(1.5), pytest.approx(1.5))


def test_preference_key_counts_differences_from_the_default_then_resources():
    """Fewer parameters off the default first; then the smaller log-product of the values."""
    default = {"tile": 128, "steps": 2, "swizzle": False}
    assert m.preference_key(default, default)[0] == 0
    one_off = m.preference_key({"tile": 256, "steps": 2, "swizzle": False}, default)
    two_off = m.preference_key({"tile": 64, "steps": 4, "swizzle": False}, default)
    assert one_off[0] == 1 and two_off[0] == 2
    assert m.preference_key({"tile": 64}) < m.preference_key({"tile": 128})
    assert m.preference_key({"on": False}) < m.preference_key({"on": True})


def test_bad_confirmation_input_is_refused_with_the_rule():
    """No candidate, rounds of different counts, empty rounds and bad times are refused."""
    with pytest.raises(ValueError, match="at least one candidate"):
        analyse_confirmation([])
    with pytest.raises(ValueError, match="same number of rounds"):
        analyse_confirmation([Candidate({}, ((1.0,), (1.0,)))], ((1.0,),))
    with pytest.raises(ValueError, match="samples in every round"):
        analyse_confirmation([Candidate({}, ((1.0,), ()))])
    with pytest.raises(ValueError, match="positive finite"):
        analyse_confirmation([Candidate({}, ((float("nan"),),))])
    with pytest.raises(ValueError, match="tie_floor"):
        analyse_confirmation([Candidate({}, ((1.0,),))], tie_floor=-1)


def test_the_speedup_is_the_ratio_of_the_two_times_shown_beside_it():
    """Winner time, baseline time and speedup come from one measurement: the median round's two
    medians and their ratio, even where a swinging baseline (172, 178.7, 175.4, 178.6, 178.9 us:
    the swing seen on an H100 beside a config that held 176.0-176.5 us) puts the pooled medians'
    ratio elsewhere; its interval holds it."""
    base = tuple((t,) * 20 for t in (172.0, 178.7, 175.4, 178.6, 178.9))
    cand = Candidate({"tile": 64}, tuple((t,) * 20 for t in (176.0, 176.5, 176.2, 176.1, 176.3)))
    c = analyse_confirmation([cand], base)
    assert c.speedup == pytest.approx(c.baseline.median_us / c.winner.median_us)
    assert (c.winner.median_us, c.baseline.median_us) == (176.5, 178.7)  # round 2 of 5
    assert c.speedup_low <= c.speedup <= c.speedup_high
    assert c.speedup_low < 1.0 < c.speedup_high
    assert "no faster than xla" in m.speedup_words(c.speedup, c.speedup_low, c.speedup_high, "xla")


def test_rounds_throttled_between_the_two_programs_do_not_pull_the_speedup():
    """An H100 4096^3 confirmation (benchmarks/RESULTS.md §12): in its first 8 of 15 rounds the
    power cap moved the clock within a round, so the kernel and XLA ran at different clocks
    (XLA 191.0 beside the kernel's 177.4 us); the 7 steady rounds read 0.991-0.994. Pooled,
    its round medians give 1.0065 (its samples gave 1.0026; the second method 0.9945); the
    median round gives 0.9938, and the times shown are that round's."""
    w = (175.87, 179.20, 177.06, 177.44, 190.11, 187.07, 183.65, 193.73,
         177.02, 173.63, 173.89, 173.92, 173.82, 173.98, 174.05)
    b = (180.56, 178.18, 181.31, 191.02, 191.39, 188.99, 190.37, 192.50,
         174.05, 172.42, 172.50, 172.72, 172.61, 172.91, 172.43)
    c = analyse_confirmation([Candidate({"tile": 64}, tuple((t,) * 24 for t in w))],
                             tuple((t,) * 24 for t in b))
    pooled = statistics.median(b) / statistics.median(w)
    assert pooled == pytest.approx(1.0065, abs=1e-4)
    assert c.speedup == pytest.approx(172.91 / 173.98)  # the 14th round's ratio, 0.9938
    assert (c.winner.median_us, c.baseline.median_us) == (173.98, 172.91)
    assert c.speedup_low < 1.0 < c.speedup_high  # 8 of 15 rounds disagree: no verdict


def test_median_round_is_the_middle_ratio_and_the_upper_of_two():
    """Equal ratios are ordered by round, so the choice is one round every time."""
    assert m.median_round([1.02, 0.99, 1.00]) == 2
    assert m.median_round([1.0, 3.0, 2.0, 4.0]) == 1  # the upper middle: 3.0
    assert m.median_round([2.0, 2.0, 1.0]) == 0  # the earlier of two equal middles
    rng = random.Random(7)
    for n in range(1, 31):  # the speedup's interval holds it, at every round count
        ratios = [rng.uniform(0.9, 1.1) for _ in range(n)]
        low, high = m.median_interval(ratios)
        assert low <= ratios[m.median_round(ratios)] <= high
    assert m.median_round([0.5]) == 0
    with pytest.raises(ValueError, match="at least one round"):
        m.median_round([])


def test_speedup_words_say_faster_no_faster_or_slower():
    """Faster only where the interval lies above 1.0; slower where it lies below."""
    assert m.speedup_words(1.021, 1.015, 1.03, "xla") == "2.1% faster than xla"
    assert m.speedup_words(1.004, 0.998, 1.01, "xla").startswith("no faster than xla")
    assert m.speedup_words(0.98, 0.975, 0.985, "cudnn") == (
        "slower than cudnn: cudnn is 2.0% faster")
    assert m.speedup_words(None, None, None, "xla") == ""


def test_median_interval_is_the_range_up_to_eight_rounds_then_order_statistics():
    """Up to 8 values no interval narrower than the range reaches 95%; at 9 the 2nd and 8th
    order statistics do (binomial tail 2.0%), at 15 the 4th and 12th (1.8%), so one wild round
    no longer sets the width."""
    assert m.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert m.median_interval([5, 1, 4, 2, 3]) == (1.0, 5.0)
    assert m.median_interval([float(v) for v in range(1, 9)]) == (1.0, 8.0)
    assert m.median_interval([float(v) for v in range(1, 10)]) == (2.0, 8.0)
    values = [float(v) for v in range(1, 16)]
    assert m.median_interval(values) == (4.0, 12.0)
    assert m.median_interval(values[:-1] + [1000.0]) == (4.0, 12.0)
    with pytest.raises(ValueError, match="at least one value"):
        m.median_interval([])


def test_unsettled_configs_get_more_rounds_up_to_the_cap_and_clear_ones_stop_at_five():
    """Two configs 0.6% apart whose round medians swing by 3% cross each other: unsettled, the
    adaptive confirmation adds rounds up to MAX_CONFIRM_ROUNDS. Configs 5% apart (separated) or
    0.1% apart with steady rounds (equal within the band) stop after CONFIRM_MIN_ROUNDS, five:
    the fewest whose range holds the median 94% of the time."""
    def run(center_b: float, noise: float) -> int:
        rng = random.Random(1)

        def time_rounds(n: int, first: int, skip: frozenset[int]) -> list[list[Any]]:
            return [[None if i in skip else _timed(c * (1 + noise * rng.gauss(0, 1)))
                     for i, c in enumerate((100.0, center_b, 120.0))] for _ in range(n)]

        def analyse(rows: list[list[Any]]) -> m.AnalysedRounds:
            return m.analyse_rounds(rows, [{"t": 0}, {"t": 1}], search_us=[None, None],
                                    baseline=True)

        return len(m.timed_rounds(time_rounds, analyse, None))

    assert run(100.6, 0.03) == m.MAX_CONFIRM_ROUNDS
    assert run(105.0, 0.001) == m.CONFIRM_MIN_ROUNDS == 5
    assert run(100.1, 0.0005) == m.CONFIRM_MIN_ROUNDS


def test_a_speedup_is_not_clear_before_five_rounds_and_a_wide_one_gets_nine():
    """Three rounds whose ratios agree by chance (a 75% interval) ask for more; at five rounds a
    spread within 0.25% is clear. A speedup still wide at five goes on to DEFAULT_CONFIRM_ROUNDS,
    nine (the first count whose interval is narrower than the range), and no further when every
    config is settled."""
    def confirmation(ratios: list[float]) -> m.Confirmation:
        base = tuple((100.0 * r,) * 20 for r in ratios)
        return analyse_confirmation([Candidate({"t": 0}, tuple((100.0,) * 20 for _ in ratios))],
                                    base)

    steady = confirmation([1.060, 1.061, 1.0605])
    assert steady.speedup_spread <= m.CONFIRM_CLEAR_SPREAD
    assert m.needs_another_round(steady, 3)
    assert not m.needs_another_round(confirmation([1.060, 1.061, 1.0605, 1.0602, 1.0608]), 5)
    wide = [1.055, 1.066, 1.060, 1.052, 1.068, 1.061, 1.057, 1.064, 1.059]
    assert all(m.needs_another_round(confirmation(wide[:n]), n) for n in range(5, 9))
    assert not m.needs_another_round(confirmation(wide), 9)
    assert m.DEFAULT_CONFIRM_ROUNDS == 9 < m.MAX_CONFIRM_ROUNDS


def test_a_separated_or_tied_config_is_settled_and_a_straddling_one_is_not():
    """Slower in every round: separated; within half a percent either way: settled as equal;
    1% apart with rounds that cross: unsettled."""
    fast = Candidate({"t": 0}, tuple((100.0,) for _ in range(3)))
    slow = Candidate({"t": 1}, tuple((t,) for t in (103.0, 102.0, 104.0)))
    equal = Candidate({"t": 2}, tuple((t,) for t in (100.2, 99.9, 100.3)))
    cross = Candidate({"t": 3}, tuple((t,) for t in (99.5, 101.5, 102.0)))
    c = analyse_confirmation([fast, slow, equal, cross])
    assert [p.settled for p in c.configs] == [True, True, True, False]
    assert not c.settled


def test_configs_the_search_could_not_tell_from_the_fastest_join_the_round():
    """Below the top five, a config within half a percent of the fastest's search time (or half
    its spread, if larger) joins, at most CONFIRM_JOIN_MAX; one 2% slower does not."""
    top = [(100.0, 0.004), (100.3, 0.004)]
    below = [(100.4, None), (102.0, None), (100.45, None), (100.2, None), (100.1, None)]
    assert m.joining_configs(top, below) == [0, 2, 3]
    assert m.joining_configs([(100.0, 0.03)], [(101.4, None)]) == [0]
    assert m.joining_configs([], below) == []


def test_the_join_band_and_count_are_parameters_with_todays_defaults():
    """``band`` and ``most`` (the replay's rules, benchmarks/search_efficiency.py --confirm)
    default to CONFIRM_JOIN_BAND and CONFIRM_JOIN_MAX: a config 2% behind the fastest joins
    with a 3% band, not with today's half percent; ``most`` caps the count."""
    top = [(100.0, None)]
    below = [(100.3, None), (102.0, None), (102.9, None), (103.5, None)]
    assert m.joining_configs(top, below) == m.joining_configs(
        top, below, band=m.CONFIRM_JOIN_BAND, most=m.CONFIRM_JOIN_MAX) == [0]
    assert m.joining_configs(top, below, band=0.03) == [0, 1, 2]
    assert m.joining_configs(top, below, band=0.03, most=1) == [0]
    assert m.joining_configs(top, below, most=0) == []


def test_a_config_the_search_could_not_tell_from_the_last_one_in_joins_the_round():
    """The H100's 4096^3 (benchmarks/RESULTS.md §12): the best config known read 176.47 us in
    the search, the same as the fifth in, 1.9% behind a lucky fastest, and was left out by rank
    alone. Within a quarter percent (CONFIRM_TIE_FLOOR) of the slowest top config joins; half a
    percent behind it does not."""
    top = [(173.25, 0.02), (175.33, 0.01), (175.48, 0.01), (175.86, 0.01), (176.47, 0.01)]
    assert m.joining_configs(top, [(176.47, 0.01), (176.8, 0.01), (177.4, 0.01)]) == [0, 1]
    assert m.joining_configs(top[:1], [(176.47, 0.01)]) == []


def test_a_config_raced_out_is_judged_on_its_rounds_and_is_never_the_fastest():
    """Raced out after 5 rounds (3% slower in each), a config keeps them: it is compared with
    the fastest on those 5, marked separated and settled, and it is neither the fastest nor
    crowned, even where the later rounds' drift (every program 5% slower from round 6 of 11)
    puts its pooled median under the others'. The baseline must have every round."""
    drift = (0.0,) * 5 + (0.05,) * 6
    fast = Candidate({"t": 0}, rounds(100.0, noise=0.001, n_rounds=11, n=20, seed=1, drift=drift))
    equal = Candidate({"t": 1}, rounds(100.05, noise=0.001, n_rounds=11, n=20, seed=2,
                                       drift=drift))
    raced = Candidate({"t": 2}, rounds(103.0, noise=0.001, n_rounds=5, n=20, seed=3))
    base = rounds(110.0, noise=0.001, n_rounds=11, n=20, seed=4, drift=drift)
    c = analyse_confirmation([raced, fast, equal], base)
    assert c.configs[0].median_us < min(c.configs[1].median_us, c.configs[2].median_us)
    assert c.fastest in (1, 2) and c.crowned in (1, 2)
    assert c.configs[0].diff == pytest.approx(0.03, abs=0.002)
    assert c.configs[0].settled and not c.configs[0].tie
    assert m.raced_out(c) == [0]
    assert len(c.baseline.rounds_us) == 11
    with pytest.raises(ValueError, match="the baseline has 5 and a config 11"):
        analyse_confirmation([raced, fast], base[:5])


def test_raced_out_names_the_settled_configs_that_cannot_tie():
    """Separated (slower in every round) or settled as unequal within the band: raced out.
    A tie, a config whose rounds straddle the fastest's, and the fastest itself: not."""
    fast = Candidate({"t": 0}, tuple((100.0,) for _ in range(5)))
    slow = Candidate({"t": 1}, tuple((t,) for t in (103.0, 102.0, 104.0, 103.5, 102.5)))
    tie = Candidate({"t": 2}, tuple((t,) for t in (100.1, 99.9, 100.2, 100.0, 100.1)))
    cross = Candidate({"t": 3}, tuple((t,) for t in (99.5, 101.5, 102.0, 99.0, 101.0)))
    c = analyse_confirmation([tie, slow, fast, cross])
    assert c.fastest == 2 and m.raced_out(c) == [1]


def test_adaptive_rounds_stop_timing_what_failed_or_raced_out():
    """timed_rounds asks each later round without the configs raced out and those that
    failed: here config 1 crashes in round 2 and config 2 is 10% slower; rounds 6 on (the
    baseline's swing keeps the speedup's interval wide) time config 0 and the baseline."""
    from autotune.space.outcomes import Outcome, TrialResult

    asked: list[frozenset[int]] = []
    bad = TrialResult(outcome=Outcome.CRASHED, error="died")

    def time_rounds(n: int, first: int, skip: frozenset[int]) -> list[list[Any]]:
        asked.extend([skip] * n)
        out = []
        for r in range(first, first + n):
            swing = 1 + 0.02 * (1 if r % 2 else -1)
            cells = [_timed(100.0), bad if r >= 1 else _timed(101.0), _timed(110.0)]
            out.append([None if i in skip else c for i, c in enumerate(cells)]
                       + [_timed(150.0 * swing)])
        return out

    def analyse(rows: list[list[Any]]) -> m.AnalysedRounds:
        return m.analyse_rounds(rows, [{"t": 0}, {"t": 1}, {"t": 2}], search_us=[None] * 3,
                                baseline=True)

    table = m.timed_rounds(time_rounds, analyse, None)
    assert len(table) == m.DEFAULT_CONFIRM_ROUNDS
    assert asked == [frozenset()] * 5 + [frozenset({1, 2})] * 4
    analysed = analyse(table)
    assert analysed.failed == [1] and analysed.kept == [0, 2]
    assert [len(p.rounds_us) for p in analysed.confirmation.configs] == [9, 5]


def test_the_fastest_failing_after_the_race_leaves_a_confirmation_of_the_rounds_kept():
    """Config 1 raced out after round 5, then the fastest (config 0) crashes in round 7: the
    confirmation is config 1's, on its 5 rounds and the baseline's first 5, not an error."""
    from autotune.space.outcomes import Outcome, TrialResult

    bad = TrialResult(outcome=Outcome.CRASHED, error="died")
    table = [[_timed(100.0), _timed(110.0), _timed(150.0)] for _ in range(5)]
    table += [[_timed(100.0), None, _timed(150.0)], [bad, None, _timed(150.0)]]
    analysed = m.analyse_rounds(table, [{"t": 0}, {"t": 1}], search_us=[None, None],
                                baseline=True)
    assert analysed.failed == [0] and analysed.kept == [1]
    assert analysed.base_rounds is not None and len(analysed.base_rounds) == 5
    assert analysed.confirmation.winner.config == {"t": 1}
    assert analysed.confirmation.speedup == pytest.approx(150.0 / 110.0)

"""The confirmation round: which of a problem's best configs wins, by how much, and which tie.

Pure functions and values: no jax, no database. When a problem's search ends, its best few
configs (default :data:`DEFAULT_CONFIRM_TOP`) and the baseline are re-timed in interleaved rounds
(:func:`autotune.space.outcomes.round_order`, ``Engine.confirm``), with more iterations;
:func:`analyse_confirmation` turns those timings into the winner, the speedup and the tie marks:

* per program, the pooled median and spread (:func:`autotune.space.outcomes.relative_spread`) of all its
  samples, and the median of each round;
* the *fastest* config has the lowest pooled median. For every other config ``c``, the
  per-round ratios ``r_i = median_i(c) / median_i(fastest)`` (paired: drift between rounds
  cancels) give its difference ``diff = median(r_i) - 1``;
* ``c`` **ties** with the fastest when ``diff <= noise``, where ``noise`` is the largest of:
  two standard errors of the difference of the two pooled medians (:func:`median_error`:
  each from its program's spread and sample count), half the range of the ``r_i`` (how much
  the comparison itself moved between rounds), and ``tie_floor`` (:data:`CONFIRM_TIE_FLOOR`,
  a quarter percent, by default). One sample's deviation (half
  a spread) is no yardstick for medians of hundreds of samples: with it, a config 2.4-4.3%
  slower in every round at 128x8192x8192 on the H200 tied for being noisy (its samples spread
  9-12%) and was crowned as the simpler one (benchmarks/RESULTS.md §11);
* among the fastest and its ties within ``crown_band`` (:data:`CONFIRM_CROWN_BAND`, a tenth
  of a percent) of it, the **crowned** config is the one nearest to the kernel's default
  config, then the simplest (:func:`preference_key`), then the fastest; a tie further behind
  is marked, not crowned;
* the **speedup** is the median of the per-round paired ratios
  ``median_i(baseline) / median_i(crowned)``, taken as one round's (:func:`median_round`: the
  upper middle one for an even count), and the crowned config's and the baseline's times are
  that round's medians: the two times shown beside it, so the three figures always agree, and
  rounds whose clock moved between the two programs (a power cap's throttled rounds) do not
  pull them as they pull pooled medians (benchmarks/RESULTS.md §12). Its interval is the
  distribution-free confidence interval of the median of those ratios
  (:func:`median_interval`: their range up to 8 rounds, order statistics at about 95% beyond);
  its spread is half the interval's width, relative to it. :func:`speedup_words` says in words
  whether the crowned config is faster than the baseline, no faster (the interval holds 1.0),
  or slower (the interval lies below 1.0);
* a config is **settled** against the fastest when the interval of its paired ratios lies above
  1.0 (slower in the rounds: separated) or is narrower than ``2 x`` :data:`CONFIRM_TIE_BAND`
  (equal within half a percent: a tie cannot move the answer by more). Adaptive rounds
  (:func:`timed_rounds`) go on while a config is unsettled or the speedup's interval is wide,
  up to :data:`MAX_CONFIRM_ROUNDS`; what is still unsettled then is decided by the tie rule.
  They race: from :data:`CONFIRM_MIN_ROUNDS` on, a config settled and not tied
  (:func:`raced_out`) is timed no more, and is judged on the rounds it has; the fastest, the
  baseline and every config that can still tie go on.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.space.outcomes import relative_spread

__all__ = [
    "DEFAULT_CONFIRM_TOP",
    "DEFAULT_CONFIRM_ROUNDS",
    "DEFAULT_CONFIRM_ITERATIONS",
    "MAX_CONFIRM_ROUNDS",
    "CONFIRM_TIE_BAND",
    "CONFIRM_TIE_FLOOR",
    "CONFIRM_JOIN_MAX",
    "CONFIRM_CROWN_BAND",
    "median_interval",
    "median_error",
    "median_round",
    "speedup_words",
    "joining_configs",
    "sized_iterations",
    "program_calls",
    "program_unclear",
    "paired_ratios",
    "paired_interval",
    "PROGRAM_CHECK_ROUNDS",
    "PROGRAM_MAX_ROUNDS",
    "needs_another_round",
    "raced_out",
    "timed_rounds",
    "analyse_rounds",
    "AnalysedRounds",
    "Candidate",
    "ProgramSummary",
    "Confirmation",
    "preference_key",
    "analyse_confirmation",
]

# The best configs of a problem that the confirmation round re-times, its rounds, and the timed
# iterations of each program in each round (the search times 20 per config).
DEFAULT_CONFIRM_TOP = 5
# Without a job's confirm_rounds: CONFIRM_MIN_ROUNDS rounds, then one more at a time while the
# result is not clear (needs_another_round): up to DEFAULT_CONFIRM_ROUNDS while only the
# speedup's interval is wide, up to MAX_CONFIRM_ROUNDS while a config is unsettled. Five rounds
# are the fewest whose range holds the median 94% of the time (three: 75%; a 3-round range
# narrow by chance stored a speedup 0.67% off `verify`'s, benchmarks/RESULTS.md §12); up to 8
# the interval is the range, which only widens, and from 9 order statistics trim it.
CONFIRM_MIN_ROUNDS = 5
DEFAULT_CONFIRM_ROUNDS = 9
MAX_CONFIRM_ROUNDS = 15
CONFIRM_CLEAR_SPREAD = 0.0025  # a confirmed speedup's spread (half its interval) that is clear
# Two configs whose paired ratio is known to within this (either way) are settled: whichever is
# crowned, the answer moves by less than the goal's 0.5%.
CONFIRM_TIE_BAND = 0.005
# Differences below this are ties however well measured: no two runs reproduce them (on the
# H100 the second method's own rounds agreed within 0.2-0.4%, benchmarks/RESULTS.md §12).
CONFIRM_TIE_FLOOR = 0.0025
# Among ties, the preference order (preference_key) crowns only a config whose difference from
# the fastest is at most this; a tie further behind is marked but not crowned. Crowned by the
# order from the whole tie band, 6 of 15 H100 confirmations put a config 0.11-0.73% behind the
# round's fastest by the second method, which ranked the fastest ahead all 6 times; with this
# band, 1 (benchmarks/RESULTS.md §12).
CONFIRM_CROWN_BAND = 0.001
# Configs ranked below the top ones join the round when their search time is within this
# fraction (or half the fastest's own spread, if larger) of the fastest's, or within
# CONFIRM_TIE_FLOOR of the slowest top one's: at most CONFIRM_JOIN_MAX of them. (The second:
# on the H100 the best config known for 4096^3 was left out of a round at the same search
# time as the fifth, benchmarks/RESULTS.md §12.)
CONFIRM_JOIN_BAND = 0.005
CONFIRM_JOIN_MAX = 3
# How a confirmation round interleaves its programs (a job's confirm_interleave): "blocks",
# each program timed for its runs, one after another, on the worker that kept it; "calls", the
# round one task on one worker, its programs call by call in one timed session under the cold
# policy (Engine.confirm's interleaved): a clock that moves within the round moves them all
# (benchmarks/RESULTS.md §12).
CONFIRM_INTERLEAVES = ("blocks", "calls")
DEFAULT_CONFIRM_INTERLEAVE = "blocks"
DEFAULT_CONFIRM_ITERATIONS = 50  # a program whose time is not known yet (sized_iterations)
# Without a job's confirm_iterations, each program is timed for about CONFIRM_TARGET_US of GPU
# time per round, within [CONFIRM_MIN_ITERATIONS, CONFIRM_MAX_ITERATIONS] runs: a 50 us
# kernel, the noisiest, gets 80 runs, and a 600 us one 20. A round's median moves less with
# more runs than the rounds move apart: the 38 H100 rounds of benchmarks/RESULTS.md §12, each
# cut to its first half (half of an 8 ms target), stored the same speedup within 0.5% of
# `verify`'s 38 times and spent 36% less GPU time.
CONFIRM_TARGET_US = 4000.0
CONFIRM_MIN_ITERATIONS = 20  # the search's own count: a confirmation never times fewer
CONFIRM_MAX_ITERATIONS = 400
# The program check after a confirmation (autotune.tuning.confirming): the crowned config and
# the baseline timed as a program calls them, in this many interleaved rounds, each program in
# blocks of about PROGRAM_TARGET_US of calls back to back (program_calls); then one more round
# at a time, up to PROGRAM_MAX_ROUNDS, while the verdict is unclear (program_unclear). Up to 8
# rounds the interval is their whole range, so one disturbed round (a host-bound call's
# batches on a busy host) can hold 1.0 in it; from 9, rounds trim the extremes.
PROGRAM_CHECK_ROUNDS = 5
PROGRAM_MAX_ROUNDS = 11
PROGRAM_TARGET_US = 4000.0
PROGRAM_MIN_CALLS = 10
PROGRAM_MAX_CALLS = 400


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One config of a confirmation round: its per-round samples in microseconds.

    ``trial_id`` is the search trial that measured it first; ``search_us`` that trial's median.
    """

    config: Mapping[str, Any] = dataclasses.field(hash=False)
    rounds_us: tuple[tuple[float, ...], ...]
    trial_id: int | None = None
    search_us: float | None = None


@dataclasses.dataclass(frozen=True)
class ProgramSummary:
    """What the confirmation round measured for one config (or the baseline: ``config`` None)."""

    config: Mapping[str, Any] | None = dataclasses.field(hash=False)
    trial_id: int | None
    rounds_us: tuple[tuple[float, ...], ...]
    median_us: float  # pooled; the crowned config's and the baseline's: the median round's
    spread: float  # relative_spread of the pooled samples
    round_medians_us: tuple[float, ...]
    diff: float = 0.0  # median paired ratio to the fastest config, minus 1 (configs only)
    noise: float = 0.0  # the tie threshold used for this config
    tie: bool = False  # within the noise of the fastest (the fastest itself: False)
    settled: bool = True  # separated from the fastest, equal within the tie band, or raced out
    crowned: bool = False
    search_us: float | None = None


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The outcome of a confirmation round (see the module docstring)."""

    configs: tuple[ProgramSummary, ...]  # in the order given
    baseline: ProgramSummary | None
    fastest: int  # index into configs
    crowned: int  # index into configs
    speedup: float | None  # baseline / crowned in the median round: the two times shown
    # Half the width of the interval (of the median of the paired round ratios), relative to the
    # speedup.
    speedup_spread: float | None
    speedup_low: float | None
    speedup_high: float | None

    @property
    def winner(self) -> ProgramSummary:
        return self.configs[self.crowned]

    @property
    def settled(self) -> bool:
        """Whether every config is settled against the fastest (see the module docstring)."""
        return all(c.settled for c in self.configs)

    @property
    def ties(self) -> tuple[ProgramSummary, ...]:
        return tuple(c for c in self.configs if c.tie)


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values`` (at least 95% where
    the count allows it): the order statistics ``(k, n + 1 - k)`` with the largest ``k`` whose
    binomial tail ``P(Bin(n, 1/2) < k)`` is at most 2.5%; the range (min, max) for up to 8
    values, where no narrower interval reaches that confidence (up to 5, not even the range).

    Raises:
      ValueError: no value.
    """
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_interval needs at least one value.")
    k, tail = 1, 0.0
    while True:  # the tail below k + 1: P(Bin(n, 1/2) <= k)
        tail += math.comb(n, k - 1) / 2**n
        if tail + math.comb(n, k) / 2**n > 0.025 or k + 1 > (n + 1) / 2:
            break
        k += 1
    return ordered[k - 1], ordered[n - k]


def median_round(ratios: Sequence[float]) -> int:
    """The round whose paired ratio is the median of ``ratios`` (the upper of the two middle
    ones for an even count; equal ratios in the order of their rounds): the round the confirmed
    speedup and the two times shown beside it come from.

    Raises:
      ValueError: no ratio.
    """
    if not ratios:
        raise ValueError("median_round needs at least one round's ratio.")
    return sorted(range(len(ratios)), key=lambda r: (ratios[r], r))[len(ratios) // 2]


def speedup_words(speedup: float | None, low: float | None, high: float | None,
                  baseline: str | None) -> str:
    """The verdict on a speedup in words: faster than the baseline (the interval lies above
    1.0), no faster (it holds 1.0) or slower (it lies below); "" without a speedup."""
    if speedup is None:
        return ""
    name = baseline or "the baseline"
    low = speedup if low is None else low
    high = speedup if high is None else high
    if low > 1.0:
        return f"{100 * (speedup - 1):.1f}% faster than {name}"
    if high < 1.0:
        return f"slower than {name}: {name} is {100 * (1 / speedup - 1):.1f}% faster"
    return f"no faster than {name} (within the measured noise)"


def joining_configs(
    top: Sequence[tuple[float, float | None]],
    below: Sequence[tuple[float, float | None]],
    *,
    band: float = CONFIRM_JOIN_BAND,
    most: int = CONFIRM_JOIN_MAX,
) -> list[int]:
    """Which configs ranked below the top ones join the confirmation round: the indices into
    ``below`` (``(search median, spread)`` each, fastest first) whose median is within
    ``band`` (:data:`CONFIRM_JOIN_BAND`) of the fastest top config's (or half its spread, if
    larger), or within :data:`CONFIRM_TIE_FLOOR` of the slowest top config's, at most ``most``
    (:data:`CONFIRM_JOIN_MAX`). A config the search could not tell from the fastest, or from
    the last one in, gets its chance in the interleaved rounds instead of being left out by
    rank alone."""
    if not top:
        return []
    fastest, spread = top[0]
    band = max(band, (spread or 0.0) / 2)
    limit = max(fastest * (1 + band), max(m for m, _ in top) * (1 + CONFIRM_TIE_FLOOR))
    joined = [i for i, (median, _) in enumerate(below) if median <= limit]
    return joined[:most]


def _complexity(config: Mapping[str, Any]) -> float:
    total = 0.0
    for value in config.values():
        if isinstance(value, bool):
            total += 1.0 if value else 0.0
        elif isinstance(value, int | float) and value > 0:
            total += math.log2(value)
    return total


def preference_key(
    config: Mapping[str, Any], default: Mapping[str, Any] | None = None
) -> tuple[int, float]:
    """How much to prefer ``config`` among tied configs: lower is preferred.

    1. *Default-nearest*: the number of parameters whose value differs from the kernel's
       default config for the problem (0 without a default): the default is JAX's known-good
       config, the least surprising one to ship.
    2. *Simpler*: the sum over numeric parameters of ``log2(value)`` (booleans: 1 when set),
       i.e. the log of the product of tile sizes, stages, warpgroups and the like: the config
       that asks for fewer resources (smaller tiles and buffers, fewer stages and warpgroups,
       fewer optional features) when its time is no different.
    """
    distance = 0
    if default is not None:
        keys = set(config) | set(default)
        distance = sum(1 for k in keys if config.get(k) != default.get(k))
    return distance, round(_complexity(config), 9)


def _round_medians(rounds_us: Sequence[Sequence[float]], what: str) -> tuple[float, ...]:
    if not rounds_us or any(not r for r in rounds_us):
        raise ValueError(f"{what} needs samples in every round, but got {rounds_us!r}.")
    for r in rounds_us:
        for s in r:
            if not (isinstance(s, int | float) and math.isfinite(s) and s > 0):
                raise ValueError(f"{what}: every time must be a positive finite number, got {s!r}.")
    return tuple(statistics.median(r) for r in rounds_us)


def _summary(
    config: Mapping[str, Any] | None,
    rounds_us: Sequence[Sequence[float]],
    *,
    trial_id: int | None,
    search_us: float | None,
    what: str,
) -> ProgramSummary:
    medians = _round_medians(rounds_us, what)
    pooled = [float(s) for r in rounds_us for s in r]
    return ProgramSummary(
        config=config,
        trial_id=trial_id,
        rounds_us=tuple(tuple(float(s) for s in r) for r in rounds_us),
        median_us=statistics.median(pooled),
        spread=relative_spread(pooled) or 0.0,
        round_medians_us=medians,
        search_us=search_us,
    )


# For normally distributed samples, p90 - p10 is 2.563 standard deviations, and the standard
# error of a median of n samples is 1.2533 standard deviations over sqrt(n).
_SPREAD_SIGMAS = 2.563
_MEDIAN_SE_FACTOR = 1.2533


def median_error(summary: ProgramSummary) -> float:
    """The standard error of ``summary``'s pooled median, relative to it: its spread
    (p90 - p10 over the median) read as standard deviations, times 1.2533 over the square root
    of its sample count."""
    n = sum(len(r) for r in summary.rounds_us)
    if n == 0:
        return 0.0
    return _MEDIAN_SE_FACTOR * (summary.spread / _SPREAD_SIGMAS) / math.sqrt(n)


def sized_iterations(median_us: float | None, fixed: int | None = None) -> int:
    """Timed runs per round for a program whose search median is ``median_us``: ``fixed`` when
    the job sets ``confirm_iterations``, else about :data:`CONFIRM_TARGET_US` of GPU time,
    clamped to [:data:`CONFIRM_MIN_ITERATIONS`, :data:`CONFIRM_MAX_ITERATIONS`];
    :data:`DEFAULT_CONFIRM_ITERATIONS` for a program whose time is unknown."""
    if fixed is not None:
        return fixed
    if median_us is None or not math.isfinite(median_us) or median_us <= 0:
        return DEFAULT_CONFIRM_ITERATIONS
    wanted = math.ceil(CONFIRM_TARGET_US / median_us)
    return int(min(CONFIRM_MAX_ITERATIONS, max(CONFIRM_MIN_ITERATIONS, wanted)))


def program_calls(median_us: float | None) -> int:
    """Calls per block of a program check for a program of ``median_us``: about
    :data:`PROGRAM_TARGET_US` of them back to back, within [:data:`PROGRAM_MIN_CALLS`,
    :data:`PROGRAM_MAX_CALLS`] (the least for a program whose time is unknown)."""
    if median_us is None or not math.isfinite(median_us) or median_us <= 0:
        return PROGRAM_MIN_CALLS
    return int(min(PROGRAM_MAX_CALLS, max(PROGRAM_MIN_CALLS, math.ceil(PROGRAM_TARGET_US / median_us))))


def program_unclear(kernel_rounds_us: Sequence[Sequence[float]],
                    baseline_rounds_us: Sequence[Sequence[float]]) -> bool:
    """Whether a program check's rounds so far leave its verdict unclear: the interval of the
    paired per-round ratios (baseline over kernel, :func:`median_interval`) holds 1.0 and is
    wider than ``2 x`` :data:`CONFIRM_TIE_BAND` (a tie within the band is an answer)."""
    if not kernel_rounds_us:
        return False
    low, high = paired_interval(baseline_rounds_us, kernel_rounds_us)
    return low <= 1.0 <= high and high - low > 2 * CONFIRM_TIE_BAND


def paired_ratios(over_rounds_us: Sequence[Sequence[float]],
                  under_rounds_us: Sequence[Sequence[float]]) -> list[float]:
    """The per-round ratios of two programs timed in the same rounds: each round's median of
    ``over_rounds_us`` over that of ``under_rounds_us`` (drift between rounds cancels).

    Raises:
      ValueError: rounds of different counts.
    """
    return [statistics.median(o) / statistics.median(u)
            for o, u in zip(over_rounds_us, under_rounds_us, strict=True)]


def paired_interval(over_rounds_us: Sequence[Sequence[float]],
                    under_rounds_us: Sequence[Sequence[float]]) -> tuple[float, float]:
    """The :func:`median_interval` of the :func:`paired_ratios` of two programs.

    Raises:
      ValueError: no round, or rounds of different counts.
    """
    return median_interval(paired_ratios(over_rounds_us, under_rounds_us))


def needs_another_round(confirmation: Confirmation, rounds: int = CONFIRM_MIN_ROUNDS) -> bool:
    """Whether an adaptive confirmation of ``rounds`` rounds so far times one more: below
    :data:`CONFIRM_MIN_ROUNDS` always (fewer rounds' range is no interval to trust); while a
    config is unsettled (up to :data:`MAX_CONFIRM_ROUNDS`), or while the confirmed speedup's
    spread (half its interval; without a baseline, half the crowned config's own spread) is
    above :data:`CONFIRM_CLEAR_SPREAD` (up to :data:`DEFAULT_CONFIRM_ROUNDS`)."""
    if rounds < CONFIRM_MIN_ROUNDS:
        return True
    if not confirmation.settled and rounds < MAX_CONFIRM_ROUNDS:
        return True
    if rounds >= DEFAULT_CONFIRM_ROUNDS:
        return False
    if confirmation.speedup_spread is not None:
        return confirmation.speedup_spread > CONFIRM_CLEAR_SPREAD
    return confirmation.winner.spread / 2 > CONFIRM_CLEAR_SPREAD


def raced_out(confirmation: Confirmation) -> list[int]:
    """The configs (indices into ``confirmation.configs``) that need no more rounds: settled
    against the fastest and not tied with it, so neither more rounds nor the tie rule can crown
    them. Adaptive rounds (:func:`timed_rounds`) stop timing them from
    :data:`CONFIRM_MIN_ROUNDS` on: replayed over the 38 H100 rounds of
    benchmarks/RESULTS.md §12 this dropped 14% of their GPU time and never a crowned config."""
    return [i for i, c in enumerate(confirmation.configs)
            if i != confirmation.fastest and c.settled and not c.tie]


def timed_rounds(
    time_rounds: Callable[[int, int, frozenset[int]], list[list[Any]]],
    analyse: Callable[[list[list[Any]]], AnalysedRounds],
    rounds: int | None,
) -> list[list[Any]]:
    """The rounds of a confirmation: ``rounds`` when a job fixes them, every program in every
    round; else (None) :data:`CONFIRM_MIN_ROUNDS`, then one more at a time while
    :func:`needs_another_round`, up to :data:`MAX_CONFIRM_ROUNDS`, without the configs
    :func:`raced_out` or failed so far (a race: only what can still move the answer is timed).

    ``time_rounds(n, first, skip)`` times ``n`` rounds starting at round ``first``
    (``Engine.confirm``), one row per round with one cell per config and then the baseline's,
    leaving out the configs (columns) in ``skip``: their cells are None. ``analyse`` turns the
    rows so far into :class:`AnalysedRounds` (:func:`analyse_rounds`; no confirmation: nothing
    to confirm, which stops the rounds).
    """
    table = time_rounds(rounds or CONFIRM_MIN_ROUNDS, 0, frozenset())
    skip: frozenset[int] = frozenset()
    while rounds is None and len(table) < MAX_CONFIRM_ROUNDS:
        analysed = analyse(table)
        confirmation = analysed.confirmation
        if confirmation is None or not needs_another_round(confirmation, len(table)):
            break
        skip |= {*analysed.failed, *(analysed.kept[i] for i in raced_out(confirmation))}
        table += time_rounds(1, len(table), skip)
    return table


@dataclasses.dataclass(frozen=True)
class AnalysedRounds:
    """What :func:`analyse_rounds` made of a table of rounds."""

    confirmation: Confirmation | None  # None: every config failed
    kept: list[int]  # the configs (indices) that never failed
    failed: list[int]
    base_rounds: list[tuple[float, ...]] | None  # None: no baseline, or it failed


def analyse_rounds(
    table: Sequence[Sequence[Any]],
    configs: Sequence[Mapping[str, Any]],
    *,
    search_us: Sequence[float | None],
    trial_ids: Sequence[int | None] | None = None,
    baseline: bool,
    default_config: Mapping[str, Any] | None = None,
) -> AnalysedRounds:
    """The confirmation of ``table`` (per round, one result per config of ``configs``, then the
    baseline's when ``baseline``; results as ``Engine.confirm`` returns them, None for a config
    no longer timed, :func:`timed_rounds`): configs that failed in any round are left out, and
    so is a failed baseline; a config with None cells has the rounds before them."""
    n = len(configs)

    def timed(i: int) -> list[Any]:
        return [row[i] for row in table if row[i] is not None]

    failed = [i for i in range(n) if not all(r.ok for r in timed(i))]
    kept = [i for i in range(n) if i not in failed]
    base_rounds = None
    if baseline and all(row[n] is not None and row[n].ok for row in table):
        base_rounds = [row[n].samples_us for row in table]
    if not kept:
        return AnalysedRounds(None, kept, failed, base_rounds)
    candidates = [
        Candidate(config=configs[i], rounds_us=tuple(r.samples_us for r in timed(i)),
                  trial_id=None if trial_ids is None else trial_ids[i], search_us=search_us[i])
        for i in kept
    ]
    # The fastest failing after the others were raced out leaves rounds that time no kept
    # config: the baseline's are cut to the rounds the kept configs have.
    if base_rounds is not None:
        base_rounds = base_rounds[:max(len(c.rounds_us) for c in candidates)]
    confirmation = analyse_confirmation(candidates, base_rounds, default_config=default_config)
    return AnalysedRounds(confirmation, kept, failed, base_rounds)


def analyse_confirmation(
    candidates: Sequence[Candidate],
    baseline_rounds_us: Sequence[Sequence[float]] | None = None,
    *,
    default_config: Mapping[str, Any] | None = None,
    tie_floor: float = CONFIRM_TIE_FLOOR,
    crown_band: float = CONFIRM_CROWN_BAND,
) -> Confirmation:
    """The winner, speedup and ties of a confirmation round (rules in the module docstring).

    A candidate with fewer rounds than the longest was raced out (:func:`raced_out`): it is
    compared with the fastest on its rounds, and is neither the fastest nor crowned.

    Raises:
      ValueError: no candidate, a baseline whose rounds are not the longest candidate's, an
        empty round, a time that is not a positive finite number, or a negative ``tie_floor``
        or ``crown_band``.
    """
    if not candidates:
        raise ValueError("a confirmation needs at least one candidate config.")
    if not (isinstance(tie_floor, int | float) and tie_floor >= 0):
        raise ValueError(f"tie_floor must be a fraction >= 0, such as 0.002, but got {tie_floor!r}.")
    if not (isinstance(crown_band, int | float) and crown_band >= 0):
        raise ValueError(
            f"crown_band must be a fraction >= 0, such as 0.001, but got {crown_band!r}.")
    full = max(len(c.rounds_us) for c in candidates)
    if baseline_rounds_us is not None and len(baseline_rounds_us) != full:
        raise ValueError(
            f"every program of a confirmation must have the same number of rounds (a config "
            f"raced out may have fewer), but the baseline has {len(baseline_rounds_us)} and a "
            f"config {full}."
        )
    summaries = [
        _summary(c.config, c.rounds_us, trial_id=c.trial_id, search_us=c.search_us,
                 what=f"candidate {i}")
        for i, c in enumerate(candidates)
    ]
    # A config raced out (fewer rounds: raced_out) is compared on the rounds it has; only a
    # config timed in every round can be the fastest or crowned.
    fastest = min((i for i, c in enumerate(candidates) if len(c.rounds_us) == full),
                  key=lambda i: (summaries[i].median_us, i))
    f = summaries[fastest]
    marked = []
    for i, s in enumerate(summaries):
        if i == fastest:
            marked.append(s)
            continue
        ratios = [c / w for c, w in zip(s.round_medians_us, f.round_medians_us)]
        diff = statistics.median(ratios) - 1.0
        ratio_low, ratio_high = median_interval(ratios)
        noise = max(2 * math.hypot(median_error(f), median_error(s)),
                    (ratio_high - ratio_low) / 2, tie_floor)
        # A config raced out gets no more rounds: what it has decides it.
        settled = (ratio_low > 1.0 or ratio_high - ratio_low <= 2 * CONFIRM_TIE_BAND
                   or len(s.rounds_us) < full)
        marked.append(dataclasses.replace(s, diff=diff, noise=noise, tie=diff <= noise,
                                          settled=settled))
    # The order decides only where the rounds cannot: among ties within crown_band.
    pool = [i for i, s in enumerate(marked)
            if i == fastest or (s.tie and s.diff <= crown_band and len(s.rounds_us) == full)]
    crowned = min(
        pool,
        key=lambda i: (*preference_key(marked[i].config or {}, default_config),
                       marked[i].median_us, i),
    )
    marked[crowned] = dataclasses.replace(marked[crowned], crowned=True)

    baseline = None
    speedup: float | None = None
    spread: float | None = None
    low: float | None = None
    high: float | None = None
    if baseline_rounds_us is not None:
        baseline = _summary(None, baseline_rounds_us, trial_id=None, search_us=None,
                            what="the baseline")
        ratios = [
            b / w
            for b, w in zip(baseline.round_medians_us, marked[crowned].round_medians_us,
                            strict=True)
        ]
        # The median round's two medians are the times shown beside the speedup, their ratio.
        k = median_round(ratios)
        baseline = dataclasses.replace(baseline, median_us=baseline.round_medians_us[k])
        marked[crowned] = dataclasses.replace(
            marked[crowned], median_us=marked[crowned].round_medians_us[k])
        speedup = ratios[k]
        low, high = median_interval(ratios)  # which holds the median round's ratio
        spread = (high - low) / 2 / speedup
    return Confirmation(
        configs=tuple(marked),
        baseline=baseline,
        fastest=fastest,
        crowned=crowned,
        speedup=speedup,
        speedup_spread=spread,
        speedup_low=low,
        speedup_high=high,
    )

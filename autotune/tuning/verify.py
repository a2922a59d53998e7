"""``autotune verify``: stored winners and their baselines re-timed by a second method.

The search and its confirmation round time with CUPTI (:mod:`autotune.evaluation.timing`,
:mod:`autotune.evaluation.cold_timing`); a bias of that path would show in both. Verification
times the same programs with a method that shares none of its timing code
(:mod:`autotune.evaluation.independent`: each call alone in its own CUPTI session after a flush
and a sync, or, without CUPTI, the host's clock, flush-differenced), on this machine, in
interleaved rounds:

1. per problem stored for this device, the winner (the newest confirmation's crowned config,
   else the fastest stored trial), up to ``others`` next configs (the confirmation's other
   programs, fastest first, else the next stored trials) and the baseline are compiled in this
   process (the baseline's XLA autotuning pinned as the job's workers pin it:
   :mod:`autotune.evaluation.xla_autotune`), on fresh random inputs, checked against the
   reference, then timed in ``rounds`` rounds;
2. :func:`analyse` gives the re-timed speedup as a confirmation gives its own: the per-round
   paired ratios (each round's baseline median over the winner's), the speedup the median
   round's (:func:`autotune.tuning.confirmation.median_round`) and the two times it prints that
   round's medians, with the interval of the ratios
   (:func:`autotune.tuning.confirmation.median_interval`), its difference from the stored
   speedup, whether the stored winner still wins (no other re-timed config is faster by more
   than :data:`STILL_WINS_BAND`: the median of its per-round ratios to the winner's), and each
   program's re-timed time over its stored one (:attr:`Verification.winner_moved`,
   :attr:`Verification.baseline_moved`): the difference is their ratio, so they say which
   program the two methods read differently;
3. each result is stored as a row of its own (``at_verifications``); nothing stored before
   changes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.space.outcomes import DeviceInfo
from autotune.space.problem import Config, Problem
from autotune.tuning.confirmation import (
    median_interval,
    median_round,
    paired_ratios,
    speedup_words,
)

__all__ = [
    "ROUNDS",
    "STILL_WINS_BAND",
    "Retimed",
    "Verification",
    "VerifyTarget",
    "analyse",
    "targets",
    "verify",
    "timing_on_this_machine",
]

log = logging.getLogger(__name__)

# The stored winner still wins unless another re-timed config is faster than it by more than
# this: the goal's half percent, within which two configs are the same answer.
STILL_WINS_BAND = 0.005
# Interleaved rounds by default. On the H100 the stored speedup agreed with verify's within 0.5%
# on 21 of 36 problems at 5 rounds and on 37 of 45 at 15, where verify's own interval narrowed
# to 0.1-0.2% at the large shapes (benchmarks/RESULTS.md §12).
ROUNDS = 15


@dataclasses.dataclass(frozen=True)
class Retimed:
    """One re-timed config other than the winner: its per-round times and their median."""

    config: Mapping[str, Any] = dataclasses.field(hash=False)
    rounds_us: tuple[tuple[float, ...], ...]
    median_us: float


@dataclasses.dataclass(frozen=True)
class VerifyTarget:
    """What to re-time for one problem: its stored winner, others, and what was stored."""

    problem: Problem
    winner: Config
    others: tuple[Config, ...]
    stored_speedup: float | None
    stored_winner_us: float | None
    stored_baseline_us: float | None
    baseline_name: str | None
    confirmation_id: int | None


@dataclasses.dataclass(frozen=True)
class Verification:
    """The outcome for one problem (see the module docstring)."""

    problem: Problem
    config: Mapping[str, Any] = dataclasses.field(hash=False)
    confirmation_id: int | None
    method: str
    calls: int
    baseline_name: str | None
    winner_rounds_us: tuple[tuple[float, ...], ...]
    baseline_rounds_us: tuple[tuple[float, ...], ...]
    others: tuple[Retimed, ...]
    winner_median_us: float
    baseline_median_us: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    stored_speedup: float | None
    still_wins: bool | None
    stored_winner_us: float | None = None
    stored_baseline_us: float | None = None

    @property
    def difference(self) -> float | None:
        """The re-timed speedup over the stored one, minus 1 (None without both)."""
        if self.speedup is None or not self.stored_speedup:
            return None
        return self.speedup / self.stored_speedup - 1.0

    @property
    def winner_moved(self) -> float | None:
        """The winner's re-timed median over its stored time, minus 1 (None without one)."""
        return _moved(self.winner_median_us, self.stored_winner_us)

    @property
    def baseline_moved(self) -> float | None:
        """The baseline's re-timed median over its stored time, minus 1 (None without one).
        With both, ``(1 + baseline_moved) / (1 + winner_moved) - 1`` is :attr:`difference`
        where the stored speedup is the stored times' ratio (a confirmation's is: both
        medians of its rounds): a difference the baseline's figure carries alone is the
        baseline read differently by the two methods (benchmarks/RESULTS.md §12)."""
        return _moved(self.baseline_median_us, self.stored_baseline_us)

    def words(self) -> str:
        return speedup_words(self.speedup, self.speedup_low, self.speedup_high,
                             self.baseline_name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.problem.kernel, "shape": dict(self.problem.dims),
            "dtype": self.problem.dtype, "config": dict(self.config), "method": self.method,
            "rounds": len(self.winner_rounds_us), "calls": self.calls,
            "winner_us": self.winner_median_us, "baseline": self.baseline_name,
            "baseline_us": self.baseline_median_us, "speedup": self.speedup,
            "speedup_low": self.speedup_low, "speedup_high": self.speedup_high,
            "stored_speedup": self.stored_speedup, "difference": self.difference,
            "still_wins": self.still_wins, "verdict": self.words(),
            "stored_winner_us": self.stored_winner_us,
            "stored_baseline_us": self.stored_baseline_us,
            "winner_moved": self.winner_moved, "baseline_moved": self.baseline_moved,
            "others": [{"config": dict(o.config), "median_us": o.median_us} for o in self.others],
        }


def _moved(retimed_us: float | None, stored_us: float | None) -> float | None:
    if retimed_us is None or not stored_us:
        return None
    return retimed_us / stored_us - 1.0


def _checked(rounds_us: Sequence[Sequence[float]], what: str) -> tuple[tuple[float, ...], ...]:
    out = tuple(tuple(float(t) for t in r) for r in rounds_us)
    if not out or any(not r for r in out):
        raise ValueError(f"{what} needs times in every round, but got {rounds_us!r}.")
    for r in out:
        for t in r:
            if not (math.isfinite(t) and t > 0):
                raise ValueError(
                    f"{what}: every time must be a positive finite number, but got {t!r} (a "
                    "program shorter than the host's dispatch time reads so: the method cannot "
                    "time it)."
                )
    return out


def analyse(
    target: VerifyTarget,
    winner_rounds_us: Sequence[Sequence[float]],
    baseline_rounds_us: Sequence[Sequence[float]] | None,
    others_rounds_us: Sequence[Sequence[Sequence[float]]] = (),
    *,
    method: str,
    calls: int,
) -> Verification:
    """The verification of ``target`` from its re-timed rounds (module docstring, step 2).

    Raises:
      ValueError: rounds of different counts, or a time that is not a positive finite number.
    """
    winner = _checked(winner_rounds_us, "the winner")
    base = None if baseline_rounds_us is None else _checked(baseline_rounds_us, "the baseline")
    others = [_checked(o, f"config {i + 1}") for i, o in enumerate(others_rounds_us)]
    counts = {len(winner), *(len(o) for o in others)} | ({len(base)} if base else set())
    if len(counts) != 1:
        raise ValueError(f"every program needs the same number of rounds, but got {sorted(counts)}.")
    w_median = statistics.median(t for r in winner for t in r)
    speedup = low = high = b_median = None
    if base is not None:
        # The median round's ratio and its two medians, as a confirmation's speedup and times.
        ratios = paired_ratios(base, winner)
        k = median_round(ratios)
        speedup = ratios[k]
        w_median, b_median = statistics.median(winner[k]), statistics.median(base[k])
        low, high = median_interval(ratios)
    retimed = tuple(
        Retimed(config=dict(c), rounds_us=o, median_us=statistics.median(t for r in o for t in r))
        for c, o in zip(target.others, others, strict=True)
    )
    still_wins = None
    if retimed:  # each other config over the winner, round by round (drift cancels)
        still_wins = all(statistics.median(paired_ratios(other.rounds_us, winner))
                         >= 1 - STILL_WINS_BAND for other in retimed)
    return Verification(
        problem=target.problem, config=dict(target.winner),
        confirmation_id=target.confirmation_id, method=method, calls=int(calls),
        baseline_name=target.baseline_name if base is not None else None,
        winner_rounds_us=winner, baseline_rounds_us=base or (), others=retimed,
        winner_median_us=w_median, baseline_median_us=b_median, speedup=speedup,
        speedup_low=low, speedup_high=high, stored_speedup=target.stored_speedup,
        still_wins=still_wins, stored_winner_us=target.stored_winner_us,
        stored_baseline_us=target.stored_baseline_us if base is not None else None,
    )


def targets(
    store: Any,
    device: DeviceInfo,
    *,
    kernel: str | None = None,
    others: int = 2,
) -> list[VerifyTarget]:
    """What ``verify`` re-times: per problem stored for ``device`` (of ``kernel``), newest
    confirmation first, else the stored trials (module docstring, step 1)."""
    out = []
    seen: set[str] = set()
    for summary in store.summaries(kernel=kernel, device_name=device.name,
                                   device_kind=device.kind):
        problem = summary.problem
        if problem.digest() in seen:
            continue
        seen.add(problem.digest())
        confirmation = summary.confirmation
        if confirmation is not None:
            crowned = confirmation.crowned
            rest = sorted((p for p in confirmation.programs if not p.crowned),
                          key=lambda p: p.median_us)
            out.append(VerifyTarget(
                problem=problem, winner=Config(crowned.config),
                others=tuple(Config(p.config) for p in rest[:others]),
                stored_speedup=confirmation.speedup, stored_winner_us=crowned.median_us,
                stored_baseline_us=confirmation.baseline_median_us,
                baseline_name=confirmation.baseline_name, confirmation_id=confirmation.id,
            ))
            continue
        best = store.best(problem, device_name=device.name, device_kind=device.kind,
                          n=1 + others, cache=summary.cache_policy)
        if not best:
            continue
        baseline = store.baseline(problem, device_name=device.name, device_kind=device.kind,
                                  cache=summary.cache_policy)
        base_us = getattr(baseline, "median_us", None)
        out.append(VerifyTarget(
            problem=problem, winner=Config(best[0].config),
            others=tuple(Config(r.config) for r in best[1:]),
            stored_speedup=None if base_us is None else base_us / best[0].median_us,
            stored_winner_us=best[0].median_us, stored_baseline_us=base_us,
            baseline_name=getattr(baseline, "name", None), confirmation_id=None,
        ))
    return out


# time_target(target, rounds, calls) -> (winner rounds, baseline rounds or None, others' rounds)
TimeTarget = Callable[[VerifyTarget, int, int], tuple[Any, Any, Any]]


def verify(
    store: Any,
    device: DeviceInfo,
    software: Mapping[str, str],
    *,
    time_target: TimeTarget,
    method: str,
    kernel: str | None = None,
    rounds: int = ROUNDS,
    calls: int = 20,
    others: int = 2,
    on_result: Callable[[Verification | None, VerifyTarget, str | None], None] | None = None,
) -> list[Verification]:
    """Re-times and stores every target (:func:`targets`); returns the verifications.

    ``time_target`` times one target (the real one: :func:`autotune.api.time_target`; tests
    pass a fake). A target whose timing fails or reads times the method cannot give is left out,
    with ``on_result(None, target, why)``; stored rows are never touched.
    """
    if rounds < 1 or calls < 1 or others < 0:
        raise ValueError(
            f"verify needs rounds >= 1, calls >= 1 and others >= 0, but got rounds={rounds}, "
            f"calls={calls}, others={others}."
        )
    done = []
    for target in targets(store, device, kernel=kernel, others=others):
        try:
            winner, base, rest = time_target(target, rounds, calls)
            result = analyse(target, winner, base, rest, method=method, calls=calls)
        except ValueError as e:
            log.info("%s: not verified: %s", target.problem, e)
            if on_result is not None:
                on_result(None, target, str(e))
            continue
        store.record_verification(target.problem, result, device=device, software=software)
        done.append(result)
        if on_result is not None:
            on_result(result, target, None)
    return done


def timing_on_this_machine(*, interpret: bool, method: str,
                           allow_import: bool = False) -> TimeTarget:
    """The real ``time_target``: :func:`autotune.evaluation.independent.time_configs` with the
    timer of ``method`` (the winner first, then the others, and the baseline when one was
    stored)."""
    from autotune.evaluation.independent import make_timer, time_configs

    timer: list[Any] = []  # made once, at the first target (it compiles its flush)

    def time_target(target: VerifyTarget, rounds: int, calls: int) -> tuple[Any, Any, Any]:
        configs = [target.winner, *target.others]
        if not timer:
            timer.append(make_timer(method))
        per_config, base = time_configs(
            target.problem, configs, baseline=target.baseline_name is not None, rounds=rounds,
            calls=calls, interpret=interpret, allow_import=allow_import, timer=timer[0],
        )
        return per_config[0], base, per_config[1:]

    return time_target

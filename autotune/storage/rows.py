"""Row values: frozen snapshots of what the store holds, handed to callers instead of ORM objects.

No jax, no database session: a row is read once and never changes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any, NamedTuple

from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config, Problem

__all__ = [
    "RecordedTrial",
    "TrialRow",
    "BaselineRow",
    "TraceRegionRow",
    "ProblemSummary",
    "RESULT_FIELDS",
    "RunRow",
    "ConfirmationRow",
    "ConfirmedProgram",
    "Observed",
    "TrialTable",
]


@dataclasses.dataclass(frozen=True)
class RecordedTrial:
    """What :meth:`Store.record_trial` did: the row's id, and whether it already existed."""

    id: int
    duplicate: bool


class Observed(NamedTuple):
    """One measured config of a problem, as :meth:`Store.observations` reads it: its median
    time in microseconds, or None where it failed. A tuple, not a :class:`TrialRow`: a
    kernel's history is read by the thousand."""

    problem: Problem
    config: Config
    time_us: float | None


@dataclasses.dataclass(frozen=True)
class TrialTable:
    """Stored trials as columns (:meth:`Store.trial_table`), oldest first: what a table of a
    million trials needs without a :class:`TrialRow` per trial (7 KB each: issue 36).

    ``columns`` maps each of :data:`TABLE_COLUMNS` to one value per trial: times and the other
    numbers as ``array('d')`` (NaN where missing), ``optuna_trial_number`` as floats too (NaN
    where none), datetimes as ``array('q')`` of microseconds since the epoch, UTC
    (:data:`NO_TIME` where missing), ``traced`` as a list of bools, and the string columns
    (status, timing, ...: few distinct values) as ``array('q')`` indexes into
    ``strings[column]``, their distinct values (None included). ``problem_id``, ``config_id``,
    ``device_id`` and ``software_id`` index ``problems``, ``config_json``, ``devices`` and
    ``software``; a config is kept as its canonical JSON (:meth:`Config.from_json` reads one):
    a million trials may name 300,000 configs.
    """

    columns: dict[str, Any]
    problems: dict[int, Problem]
    config_json: dict[int, str]
    devices: dict[int, DeviceInfo]
    software: dict[int, dict[str, str]]
    strings: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["trial_id"])


# TrialTable: its columns (STRING_COLUMNS held as indexes into TrialTable.strings), and the
# stand-in for a missing datetime.
TABLE_COLUMNS = (
    "trial_id", "problem_id", "config_id", "device_id", "software_id", "status", "median_us",
    "min_us", "max_us", "compile_s", "rel_error", "timing", "cache_policy", "spread",
    "study_name", "optuna_trial_number", "worker", "host", "started_at", "finished_at", "traced",
    "error",
)
STRING_COLUMNS = ("status", "timing", "cache_policy", "study_name", "worker", "host", "error")
NO_TIME = -(2**63)


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One stored trial. Times in microseconds, compile time in seconds, datetimes in UTC."""

    id: int
    problem: Problem
    config: Config
    device: DeviceInfo
    software: dict[str, str] = dataclasses.field(hash=False)
    status: Outcome
    median_us: float | None
    min_us: float | None
    max_us: float | None
    samples_us: tuple[float, ...]
    compile_s: float | None
    rel_error: float | None
    timing: str
    error: str
    study_name: str | None
    optuna_trial_number: int | None
    worker: str
    host: str
    started_at: dt.datetime | None
    finished_at: dt.datetime
    traced: bool = False  # trace regions are stored for this trial
    cache_policy: str = "warm"  # "cold" | "warm": how the L2 was treated between iterations
    stored_spread: float | None = None  # as stored (NULL on rows from before revision 0003)

    @property
    def ok(self) -> bool:
        return self.status is Outcome.OK

    @property
    def spread(self) -> float | None:
        """``(p90 - p10) / median`` of the samples: as stored, else computed from them."""
        if self.stored_spread is not None:
            return self.stored_spread
        from autotune.space.outcomes import relative_spread

        return relative_spread(self.samples_us)

    def result(self) -> TrialResult:
        """The :class:`TrialResult` this row was recorded from."""
        return TrialResult(
            outcome=self.status,
            samples_us=self.samples_us,
            compile_s=self.compile_s,
            error=self.error,
            rel_error=self.rel_error,
            timing=self.timing,
            cache=self.cache_policy,
        )


@dataclasses.dataclass(frozen=True)
class BaselineRow:
    """One stored baseline measurement (e.g. ``"xla"``) of a problem on a device."""

    id: int
    problem: Problem
    device: DeviceInfo
    software: dict[str, str] = dataclasses.field(hash=False)
    name: str
    median_us: float
    min_us: float
    max_us: float
    samples_us: tuple[float, ...]
    measured_at: dt.datetime
    cache_policy: str = "warm"
    spread: float | None = None


@dataclasses.dataclass(frozen=True)
class RunRow:
    """One job run with the GPU's clocks before and after (``autotune.evaluation.clocks`` JSON dicts)."""

    id: int
    job: str
    device: DeviceInfo
    host: str
    cache_policy: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    clocks_before: dict[str, Any] = dataclasses.field(hash=False)
    clocks_after: dict[str, Any] | None = dataclasses.field(hash=False)
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ConfirmedProgram:
    """One config of a confirmation round, as stored (``autotune.tuning.confirmation.ProgramSummary``)."""

    trial_id: int
    config: Config
    position: int  # its rank among the search's best when the round began
    rounds_us: tuple[tuple[float, ...], ...]
    median_us: float
    spread: float
    diff: float  # median paired ratio to the fastest config of the round, minus 1
    noise: float  # the tie threshold
    tie: bool
    crowned: bool


@dataclasses.dataclass(frozen=True)
class ConfirmationRow:
    """One stored confirmation round of a problem: its crowned config and confirmed speedup."""

    id: int
    problem: Problem
    device: DeviceInfo
    software: dict[str, str] = dataclasses.field(hash=False)
    cache_policy: str
    rounds: int
    iterations: int
    crowned_trial_id: int
    fastest_trial_id: int
    baseline_name: str | None
    baseline_median_us: float | None
    baseline_spread: float | None
    baseline_rounds_us: tuple[tuple[float, ...], ...]
    speedup: float | None
    speedup_spread: float | None
    speedup_low: float | None
    speedup_high: float | None
    created_at: dt.datetime
    run_id: int | None
    programs: tuple[ConfirmedProgram, ...] = dataclasses.field(hash=False, default=())

    @property
    def crowned(self) -> ConfirmedProgram:
        return next(p for p in self.programs if p.crowned)

    def tied_with_winner(self) -> tuple[ConfirmedProgram, ...]:
        """The configs tied with the crowned one: the round's fastest and the configs within
        its noise, the crowned one left out (none when the fastest had no tie)."""
        group = [p for p in self.programs if p.tie or p.trial_id == self.fastest_trial_id]
        return tuple(p for p in group if not p.crowned) if len(group) > 1 else ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the confirmed winner, speedup and spread, and the tie marks."""
        crowned = self.crowned
        return {
            "confirmation_id": self.id,
            "cache_policy": self.cache_policy,
            "rounds": self.rounds,
            "iterations": self.iterations,
            "crowned_trial_id": self.crowned_trial_id,
            "fastest_trial_id": self.fastest_trial_id,
            "config": dict(crowned.config),
            "median_us": crowned.median_us,
            "spread": crowned.spread,
            "baseline_name": self.baseline_name,
            "baseline_us": self.baseline_median_us,
            "baseline_spread": self.baseline_spread,
            "speedup": self.speedup,
            "speedup_spread": self.speedup_spread,
            "speedup_low": self.speedup_low,
            "speedup_high": self.speedup_high,
            "programs": [
                {"trial_id": p.trial_id, "config": dict(p.config), "median_us": p.median_us,
                 "spread": p.spread, "diff": p.diff, "noise": p.noise, "tie": p.tie,
                 "crowned": p.crowned}
                for p in self.programs
            ],
            "created_at": self.created_at.isoformat(),
        }


@dataclasses.dataclass(frozen=True)
class TraceRegionRow:
    """The time one named region of a traced trial took (median over ``count`` occurrences)."""

    trial_id: int
    region: str
    median_us: float
    count: int
    trace_path: str


# The fields every result carries, under these names, in ``autotune best --json``,
# ``autotune results --json`` and ``autotune export --format json`` alike.
RESULT_FIELDS = ("kernel", "shape", "dtype", "device", "device_kind", "config", "median_us",
                 "trial_id")


@dataclasses.dataclass(frozen=True)
class ProblemSummary:
    """What is stored for one problem on one device (name and kind)."""

    problem: Problem
    device: str
    device_kind: str
    by_status: dict[str, int] = dataclasses.field(hash=False)  # outcome value -> trials
    best_us: float | None
    best_config: dict[str, Any] | None = dataclasses.field(hash=False)
    best_trial_id: int | None
    baseline_name: str | None  # the fastest baseline on this device
    baseline_us: float | None
    cache_policy: str = "warm"  # every figure of a summary is of this one policy
    # The newest confirmation round of this policy, when there is one (revision 0003).
    confirmation: ConfirmationRow | None = dataclasses.field(default=None, hash=False)
    # The newest program check (a verification row of method PROGRAM_METHOD) of that very
    # confirmation round, when there is one: it decides the verdict (:func:`pick_verdict`).
    program_check: VerificationRow | None = dataclasses.field(default=None, hash=False)

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def problem_text(self) -> str:
        return str(self.problem)

    @property
    def speedup(self) -> float | None:
        """``baseline_us / best_us``: above 1 the tuned kernel is faster."""
        if self.best_us is None or self.baseline_us is None:
            return None
        return self.baseline_us / self.best_us

    @property
    def confirmed_speedup(self) -> float | None:
        """The speedup of the confirmation round (interleaved, paired), when there was one."""
        return None if self.confirmation is None else self.confirmation.speedup

    @property
    def verdict_figures(self) -> Verdict:
        """The figures that say which implementation runs (:func:`pick_verdict`): the program
        check of the summary's confirmation where there is one, else the confirmation's."""
        return summary_verdict(self.confirmation, self.program_check)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict. The best trial's fields carry the names every result uses
        (:data:`RESULT_FIELDS`: ``config``, ``median_us``, ``trial_id``, as in ``autotune best``
        and ``autotune export``), plus ``by_status``, ``total`` and the confirmation round."""
        confirmation = self.confirmation
        verdict = self.verdict_figures
        check = current_check(confirmation, self.program_check)
        return {
            "cache_policy": self.cache_policy,
            "confirmed": confirmation is not None,
            "confirmed_speedup": None if confirmation is None else confirmation.speedup,
            "confirmed_speedup_spread": None if confirmation is None else confirmation.speedup_spread,
            "confirmation": None if confirmation is None else confirmation.to_dict(),
            "kernel": self.problem.kernel,
            "shape": self.problem.dims,
            "dtype": self.problem.dtype,
            "device": self.device,
            "device_kind": self.device_kind,
            "by_status": dict(self.by_status),
            "total": self.total,
            "median_us": self.best_us,
            "config": self.best_config,
            "trial_id": self.best_trial_id,
            "baseline_name": self.baseline_name,
            "baseline_us": self.baseline_us,
            "speedup": self.speedup,
            "program_speedup": None if check is None else check.speedup,
            "program_speedup_low": None if check is None else check.speedup_low,
            "program_speedup_high": None if check is None else check.speedup_high,
            "verdict_source": verdict.source,
        }


@dataclasses.dataclass(frozen=True)
class VerificationRow:
    """One stored ``autotune verify`` of a problem: its winner and baseline re-timed by the
    independent method (autotune.tuning.verify), beside the stored speedup."""

    id: int
    problem: Problem
    device: DeviceInfo
    software: dict[str, str] = dataclasses.field(hash=False)
    confirmation_id: int | None
    config: Config = dataclasses.field(hash=False)
    method: str
    rounds: int
    calls: int
    baseline_name: str | None
    winner_rounds_us: tuple[tuple[float, ...], ...]
    baseline_rounds_us: tuple[tuple[float, ...], ...]
    others: tuple[dict[str, Any], ...] = dataclasses.field(hash=False)
    winner_median_us: float
    baseline_median_us: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    stored_speedup: float | None
    still_wins: bool | None
    created_at: dt.datetime


# Where a verdict's figures come from (:class:`Verdict`): the problem's program check, or its
# confirmation round.
PROGRAM_CHECK = "program-check"
CONFIRMATION = "confirmation"
VERDICT_SOURCES = (PROGRAM_CHECK, CONFIRMATION)

Figures = tuple[float | None, float | None, float | None]  # speedup, its interval's low, high


class Verdict(NamedTuple):
    """The speedup (baseline time over kernel time) and its interval that decide which
    implementation runs, and where they come from (:data:`VERDICT_SOURCES`; all None where
    nothing compared the two); ``other``, where the program check decides, the confirmation's
    speedup (CUPTI kernel times; positive and finite, else None), which a tie's route also
    asks (``best.runs_of``)."""

    speedup: float | None
    low: float | None
    high: float | None
    source: str | None
    other: float | None = None


def _positive(value: float | None) -> bool:
    return isinstance(value, int | float) and 0 < value < math.inf


def pick_verdict(confirmed: Figures | None, program: Figures | None) -> Verdict:
    """The one rule that picks a problem's verdict figures, used by every answer (``autotune
    best``, the run-time lookup and ``tuned``'s route, ``autotune export``, the report).

    ``program`` (the program check of the confirmation round: the two implementations timed as
    a program calls them) decides where it has a speedup and an interval of positive finite
    numbers: CUPTI's kernel times, which ``confirmed`` holds, leave out what a call costs the
    GPU beyond its kernels (benchmarks/RESULTS.md §19). Else ``confirmed`` decides where it has
    a positive finite speedup (its interval as stored); else nothing does.
    """
    if program is not None and all(_positive(v) for v in program):
        other = confirmed[0] if confirmed is not None and _positive(confirmed[0]) else None
        return Verdict(*program, PROGRAM_CHECK, other)
    if confirmed is not None and _positive(confirmed[0]):
        return Verdict(*confirmed, CONFIRMATION)
    return Verdict(None, None, None, None)


def current_check(confirmation: ConfirmationRow | None,
                  program_check: VerificationRow | None) -> VerificationRow | None:
    """``program_check`` where it is a program check (:data:`PROGRAM_METHOD`) of that very
    confirmation round, else None: an older round's check never answers for a newer one."""
    if confirmation is None or program_check is None:
        return None
    if program_check.method != PROGRAM_METHOD or program_check.confirmation_id != confirmation.id:
        return None
    return program_check


def summary_verdict(confirmation: ConfirmationRow | None,
                    program_check: VerificationRow | None) -> Verdict:
    """:func:`pick_verdict` of a confirmation round and its program check
    (:func:`current_check`); nothing without a confirmation round."""
    if confirmation is None:
        return Verdict(None, None, None, None)
    check = current_check(confirmation, program_check)
    program = None if check is None else (check.speedup, check.speedup_low, check.speedup_high)
    return pick_verdict(
        (confirmation.speedup, confirmation.speedup_low, confirmation.speedup_high), program)

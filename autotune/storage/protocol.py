"""What the tuning side needs from the results database: :class:`TrialStore`.

:class:`autotune.storage.store.Store` is the one implementation; the runner, the scheduler and
revalidation are typed against this protocol so that what they rely on is written down in one
place (and a store for a test needs only these methods). The query side reads more of the
store (trace regions, its SQLAlchemy engine) and takes the :class:`Store` itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.rows import (
    BaselineRow,
    ConfirmationRow,
    Observed,
    ProblemSummary,
    RecordedTrial,
    TrialRow,
)

__all__ = ["TrialStore"]


class TrialStore(Protocol):
    """Records trials, baselines, traces, runs and confirmation rounds, and reads them back.
    See :class:`autotune.storage.store.Store` for what each method does and raises."""

    @property
    def url(self) -> str: ...

    def record_trial(
        self,
        problem: Problem,
        config: Config,
        result: TrialResult,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        study_name: str | None = None,
        optuna_trial_number: int | None = None,
        worker: str = "",
        started_at: dt.datetime | None = None,
        cache: str | None = None,
    ) -> RecordedTrial: ...

    def record_baseline(
        self,
        problem: Problem,
        name: str,
        samples_us: Sequence[float],
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        cache: str = "warm",
    ) -> int: ...

    def record_trace_regions(
        self, trial_id: int, regions: Mapping[str, tuple[float, int]], trace_path: str
    ) -> None: ...

    def trials(
        self,
        problem: Problem | None = None,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        status: Outcome | str | None = None,
        device_kind: str | None = None,
        dtype: str | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]: ...

    def observations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = None,
    ) -> list[Observed]: ...

    def best(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        n: int = 1,
        versions: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]: ...

    def baseline(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> BaselineRow | None: ...

    def problems(self, kernel: str | None = None) -> list[Problem]: ...

    def devices(self) -> list[DeviceInfo]: ...

    def summaries(
        self,
        *,
        kernel: str | None = None,
        dtype: str | None = None,
        device_name: str | None = None,
        device_kind: str | None = None,
    ) -> list[ProblemSummary]: ...

    def start_run(
        self,
        job: str,
        *,
        device: DeviceInfo,
        cache: str,
        clocks_before: Mapping[str, Any],
    ) -> int: ...

    def finish_run(
        self, run_id: int, *, clocks_after: Mapping[str, Any], warnings: Sequence[str] = ()
    ) -> None: ...

    def record_confirmation(
        self,
        problem: Problem,
        confirmation: Any,
        *,
        trial_ids: Sequence[int],
        device: DeviceInfo,
        software: Mapping[str, str],
        cache: str,
        iterations: int,
        baseline_name: str | None,
        run_id: int | None = None,
    ) -> int: ...

    def program_checks(self, confirmation_ids: Sequence[int]) -> dict[int, Any]: ...

    def record_verification(
        self,
        problem: Problem,
        verification: Any,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
    ) -> int: ...

    def confirmations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        cache: str | None = None,
        limit: int | None = None,
    ) -> list[ConfirmationRow]: ...

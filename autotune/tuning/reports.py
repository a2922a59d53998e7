"""What a job run tells its caller: progress events (:class:`Event`) for an observer while it
runs, and one :class:`ProblemReport` per problem when it ends, built from the store (this
run's results and earlier ones together)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.space.kernel import Kernel
from autotune.space.outcomes import DeviceInfo, Outcome
from autotune.space.problem import Config, Problem
from autotune.storage.protocol import TrialStore

__all__ = ["Event", "ProblemReport", "build_report"]

@dataclasses.dataclass(frozen=True)
class Event:
    """Progress, for an observer (``autotune.progress``) to draw: ``kind`` is "start",
    "trial", "skip" or "done". A "trial" event also says how the trial ended (``status``, an
    :class:`Outcome` value), its median time, its Optuna trial number, its config, and for a
    crash the worker's log."""

    kind: str
    problem: Problem
    done: int = 0
    total: int | None = None
    best_us: float | None = None
    message: str = ""
    status: str = ""
    time_us: float | None = None
    number: int | None = None
    config: Mapping[str, Any] | None = None
    log_path: str = ""


@dataclasses.dataclass(frozen=True)
class ProblemReport:
    """How tuning one problem went (this run and earlier ones together)."""

    problem: Problem
    device: str
    best_config: Config | None
    best_us: float | None
    baseline_name: str | None
    baseline_us: float | None
    flops: int | None
    bytes_moved: int | None
    by_status: Mapping[str, int]
    measured_now: int
    repaired: int
    skipped: bool = False
    stop_reason: str = ""
    device_kind: str = ""  # "gpu" | "interpret" | "fake": interpret-mode times are not GPU timings
    cache_policy: str = "warm"
    # The confirmation round (None when there was none): best_config, best_us and
    # baseline_us are then its crowned config and medians, and speedup its paired speedup.
    confirmation: Any = None  # autotune.storage.rows.ConfirmationRow
    confirm_s: float | None = None  # wall time the confirmation round took in this run
    # The confirmation's program check (autotune.storage.rows.VerificationRow), when stored:
    # the two timed as a program calls them, which decides the route.
    program_check: Any = None

    @property
    def speedup(self) -> float | None:
        """Baseline time over best time (>1: the tuned kernel is faster); the confirmation
        round's (median of per-round ratios) when there was one."""
        if self.confirmation is not None and self.confirmation.speedup is not None:
            return float(self.confirmation.speedup)
        if self.best_us and self.baseline_us:
            return self.baseline_us / self.best_us
        return None

    @property
    def speedup_spread(self) -> float | None:
        """Half the range of the confirmation round's per-round speedups, relative to it."""
        return None if self.confirmation is None else self.confirmation.speedup_spread

    @property
    def ties(self) -> int:
        """Configs the confirmation round found tied with the crowned one (within the noise)."""
        return 0 if self.confirmation is None else len(self.confirmation.tied_with_winner())

    @property
    def tflops(self) -> float | None:
        return self.flops / self.best_us / 1e6 if self.flops and self.best_us else None

    @property
    def gbps(self) -> float | None:
        return self.bytes_moved / self.best_us / 1e3 if self.bytes_moved and self.best_us else None

    @property
    def invalid(self) -> int:
        return int(self.by_status.get(Outcome.INVALID.value, 0))


def build_report(
    kernel: Kernel,
    problem: Problem,
    device: DeviceInfo,
    store: TrialStore,
    *,
    measured_now: int,
    repaired: int,
    skipped: bool = False,
    stop_reason: str = "",
    cache: str = "warm",
    confirm_s: float | None = None,
) -> ProblemReport:
    """The report of ``problem`` on ``device`` from what the store holds under the cache
    policy ``cache``: counts by outcome, the best and the baseline, replaced by the newest
    confirmation round's crowned config and medians when that round is newer than the best."""
    rows = store.trials(problem, device_name=device.name, cache=cache)
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    best = store.best(problem, device_name=device.name, device_kind=device.kind, n=1, cache=cache)
    baseline = store.baseline(problem, device_name=device.name, device_kind=device.kind,
                              cache=cache)
    best_config = Config(best[0].config) if best else None
    best_us = best[0].median_us if best else None
    baseline_name = baseline.name if baseline else None
    baseline_us = baseline.median_us if baseline else None
    confirmations = store.confirmations(problem, device_name=device.name,
                                        device_kind=device.kind, cache=cache)
    confirmation = confirmations[0] if confirmations else None
    if confirmation is not None and best and confirmation.created_at < best[0].finished_at:
        confirmation = None  # the search found a faster config since: not confirmed yet
    program_check = None
    if confirmation is not None:
        program_check = store.program_checks([confirmation.id]).get(confirmation.id)
        best_config, best_us = confirmation.crowned.config, confirmation.crowned.median_us
        if confirmation.baseline_median_us is not None:
            baseline_name = confirmation.baseline_name
            baseline_us = confirmation.baseline_median_us
    return ProblemReport(
        problem=problem,
        device=device.name,
        best_config=best_config,
        best_us=best_us,
        baseline_name=baseline_name,
        baseline_us=baseline_us,
        cache_policy=cache,
        confirmation=confirmation,
        confirm_s=confirm_s,
        program_check=program_check,
        flops=kernel.flops(problem) if kernel.flops else None,
        bytes_moved=kernel.bytes_moved(problem) if kernel.bytes_moved else None,
        by_status=by_status,
        measured_now=measured_now,
        repaired=repaired,
        skipped=skipped,
        stop_reason=stop_reason,
        device_kind=device.kind,
    )



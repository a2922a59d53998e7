"""Budget overrides: a run's ``--trials``, ``--time-budget``, ``--patience`` and ``--effort``
over the budgets of a job's problems (:class:`~autotune.tuning.jobs.Budget`).

Imports nothing heavy: the command line's parser reads :data:`EFFORTS` for its help.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from autotune.errors import JobError

if TYPE_CHECKING:
    from autotune.tuning.jobs import Job

__all__ = ["EFFORTS", "override_budgets"]

# --effort presets, as Helion's autotune_effort: (trials per problem, patience).
EFFORTS: dict[str, tuple[int, int]] = {"quick": (16, 8), "full": (256, 48)}


def override_budgets(
    job: Job, *, trials: int | None = None, seconds: float | None = None,
    patience: int | None = None, effort: str | None = None,
) -> Job:
    """``job`` with every problem's budget overridden where an override is given (None: the
    job's own). ``trials`` replaces the trial budget; ``seconds`` the time budget (without
    ``trials``, it also lifts the trial budget: the time decides); ``patience`` the early stop
    (0: never stop early); ``effort`` (:data:`EFFORTS`) sets trials and patience where those
    are not given. An override out of range is a JobError naming the flag, the value and the
    range."""
    from autotune.tuning.jobs import MAX_TRIALS, Budget

    if trials is not None and not 0 < trials <= MAX_TRIALS:
        raise JobError(f"--trials must be a positive whole number up to {MAX_TRIALS}, got {trials}.")
    if seconds is not None and not 0 < seconds < float("inf"):
        raise JobError(f"--time-budget must be a positive, finite number of seconds, got {seconds}.")
    if patience is not None and patience < 0:
        raise JobError(f"--patience must be a whole number of trials, 0 or more (0: never stop early), "
                       f"got {patience}.")
    if effort is not None:
        if effort not in EFFORTS:
            raise JobError(f"--effort {effort!r} is unknown; expected one of {', '.join(EFFORTS)}.")
        effort_trials, effort_patience = EFFORTS[effort]
        trials = effort_trials if trials is None else trials
        patience = effort_patience if patience is None else patience
    specs = []
    for spec in job.problems:
        budget = spec.budget
        if trials is not None or seconds is not None:
            budget = Budget(
                trials=trials if trials is not None else (budget.trials if seconds is None else None),
                seconds=seconds if seconds is not None else budget.seconds,
                patience=budget.patience,
            )
        if patience is not None:
            budget = dataclasses.replace(budget, patience=patience or None)
        specs.append(dataclasses.replace(spec, budget=budget))
    return dataclasses.replace(job, problems=tuple(specs))

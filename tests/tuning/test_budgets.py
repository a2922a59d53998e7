"""Budget overrides (autotune.tuning.budgets): what --trials, --time-budget, --patience and
--effort do to a job's budgets, and how an out-of-range override is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import JobError
from autotune.tuning.budgets import EFFORTS, override_budgets
from autotune.tuning.jobs import Budget, load_job

REPO = Path(__file__).resolve().parents[2]


def _budgets(job):
    return {spec.budget for spec in job.problems}


def test_overrides_replace_only_what_they_name():
    """trials and patience replace the job's; seconds alone lifts the trial budget (time
    decides); patience 0 is never stopping early; nothing given keeps the job as it is."""
    job = load_job(REPO / "examples/quickstart.toml")
    assert override_budgets(job) == job
    (own,) = _budgets(job)
    assert _budgets(override_budgets(job, trials=5)) == {Budget(5, own.seconds, own.patience)}
    assert _budgets(override_budgets(job, seconds=60.0)) == {Budget(None, 60.0, own.patience)}
    assert _budgets(override_budgets(job, trials=5, seconds=60.0)) == {Budget(5, 60.0, own.patience)}
    assert _budgets(override_budgets(job, patience=0)) == {Budget(own.trials, own.seconds, None)}
    quick_trials, quick_patience = EFFORTS["quick"]
    assert _budgets(override_budgets(job, effort="quick")) == {Budget(quick_trials, own.seconds, quick_patience)}
    assert _budgets(override_budgets(job, effort="quick", patience=3)) == {Budget(quick_trials, own.seconds, 3)}


@pytest.mark.parametrize("kwargs, message", [
    ({"trials": 0}, "--trials must be a positive whole number up to"),
    ({"seconds": float("inf")}, "--time-budget must be a positive, finite number of seconds, got inf"),
    ({"patience": -1}, r"--patience must be a whole number of trials, 0 or more \(0: never stop early\), got -1"),
    ({"effort": "medium"}, "--effort 'medium' is unknown; expected one of quick, full"),
])
def test_an_override_out_of_range_names_the_flag_and_the_value(kwargs, message):
    """A bad override is a JobError naming the flag, the value and the allowed range."""
    job = load_job(REPO / "examples/quickstart.toml")
    with pytest.raises(JobError, match=message):
        override_budgets(job, **kwargs)

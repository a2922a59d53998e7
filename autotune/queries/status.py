"""Where a job stands, read from its database while any number of hosts run it.

``autotune status JOB --db URL [--json]``: per problem of the job, and per device it is tuned
on, the trials stored (done), in flight (RUNNING Optuna trials whose owner's heartbeat is live),
the budget, the best so far; and the hosts whose heartbeat is live, with their trials in flight.
Read-only: nothing is created or migrated, no engine starts, jax is not imported.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from autotune.errors import StorageError
from autotune.tuning.jobs import Job

if TYPE_CHECKING:
    from autotune.storage.store import Store

__all__ = ["ProblemStatus", "JobStatus", "job_status"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProblemStatus:
    """One problem of a job on one device (``device`` is None before any trial)."""

    problem: str
    device: str | None
    done: int  # results stored
    in_flight: int  # trials being measured now, by live processes
    stale: int  # RUNNING trials whose owner stopped (freed by the next runner's check)
    budget: int | None
    best_us: float | None
    best_config: dict[str, Any] | None
    state: str  # "not started", "running", "waiting", "done", "imported" (stored, no study)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class JobStatus:
    job: str
    problems: tuple[ProblemStatus, ...]
    hosts: dict[str, int]  # host -> trials in flight there (live heartbeat)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "problems": [p.to_dict() for p in self.problems],
                "hosts": [{"host": h, "in_flight": n} for h, n in sorted(self.hosts.items())]}


def job_status(job: Job, store: Store) -> JobStatus:
    """The status of every problem of ``job`` in ``store``'s database (and its Optuna studies).

    Raises:
      StorageError: the database cannot be read.
    """
    import optuna

    from autotune.storage.store import failure_reason
    from autotune.tuning.optuna_adapter import has_studies_table
    from autotune.tuning.studies import optuna_storage, running_owners

    summaries = {(s.problem, s.device): s for s in store.summaries()}
    storage: Any = None
    names: set[str] = set()
    try:
        # Without Optuna's tables (a database only `autotune import` wrote) there are no
        # studies, and opening Optuna's storage would try to create its tables.
        if has_studies_table(store.engine):
            storage = optuna_storage(store.url)
            names = set(optuna.get_all_study_names(storage=storage))
    except Exception as e:  # noqa: BLE001 - any database failure, worded once
        raise StorageError(f"Could not read the Optuna studies in {store!r}: {failure_reason(e)}.") from e
    hosts: dict[str, int] = {}
    out: list[ProblemStatus] = []
    for spec in job.problems:
        problem, budget = spec.problem, spec.budget.trials
        # Its studies: readable names (``problem @ device``, ``... | cold``) and the older
        # ``autotune|key|device[|cold]`` ones (autotune.tuning.studies.study_name).
        studies: dict[str, list[str]] = {}
        readable, legacy = f"{problem} @ ", f"autotune|{problem.key()}|"
        for n in names:
            if n.startswith(readable):
                studies.setdefault(n[len(readable):].split(" | ")[0], []).append(n)
            elif n.startswith(legacy):
                studies.setdefault(n[len(legacy):].split("|")[0], []).append(n)
        devices = sorted(set(studies) | {d for (p, d) in summaries if p == problem})
        if not devices:
            out.append(ProblemStatus(str(problem), None, 0, 0, 0, budget, None, None, "not started"))
            continue
        for device in devices:
            summary = summaries.get((problem, device))
            done = summary.total if summary else 0
            in_flight = stale = 0
            for name in studies.get(device, []):
                study = optuna.load_study(study_name=name, storage=storage)
                for owner, is_stale in running_owners(study):
                    if is_stale:
                        stale += 1
                        continue
                    in_flight += 1
                    host = owner.rpartition(":")[0] or "?"
                    hosts[host] = hosts.get(host, 0) + 1
            if budget is not None and done >= budget:
                state = "done"
            elif in_flight:
                state = "running"
            elif done and not studies.get(device):
                state = "imported"  # results stored with no study here: `autotune import`
            else:
                state = "waiting"
            out.append(ProblemStatus(
                str(problem), device, done, in_flight, stale, budget,
                summary.best_us if summary else None,
                dict(summary.best_config) if summary and summary.best_config else None, state))
    if storage is not None:
        storage.engine.dispose()
    return JobStatus(job.name, tuple(out), hosts)

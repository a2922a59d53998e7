"""Writing the results database: trials (one or many in one transaction), baselines, trace
regions, job runs, confirmation rounds and verifications. :class:`StoreWriter` is the
writing part a :class:`~.store.Store` owns; each method is one write transaction."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import socket
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from autotune.errors import StorageError
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult, relative_spread
from autotune.space.problem import Config, Problem
from autotune.storage.connection import Sessions
from autotune.storage.keys import (
    check_aware,
    check_times,
    checked_policy,
    checked_samples,
    device_row_id,
    get_or_create,
    insert_or_stored,
    software_key,
    utc_now,
)
from autotune.storage.rows import (
    RecordedTrial,
)
from autotune.storage.schema import (
    Baselines,
    Configs,
    ConfirmationPrograms,
    Confirmations,
    Kernels,
    Problems,
    Runs,
    Software,
    TraceRegions,
    Trials,
    Verifications,
)

log = logging.getLogger("autotune.storage.store")


class StoreWriter:
    """Every write of one database, through the :class:`~.connection.Sessions` it is
    given (a :class:`~.store.Store` owns one and forwards its public methods to it)."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def _ids(
        self,
        session: Session,
        problem: Problem,
        device: DeviceInfo,
        software: Mapping[str, str],
    ) -> tuple[int, int, int, int]:
        kernel_id = get_or_create(session, Kernels, {"name": problem.kernel})
        problem_id = get_or_create(
            session,
            Problems,
            {"digest": problem.digest()},
            kernel_id=kernel_id,
            shape_json=problem.shape_json,
            dtype=problem.dtype,
        )
        device_id = device_row_id(session, device)
        software_id = get_or_create(session, Software, software_key(software))
        return kernel_id, problem_id, device_id, software_id

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
    ) -> RecordedTrial:
        """Stores one finished trial, in one transaction.

        If a trial of the same (problem, config, device, software, cache policy) is already
        stored, nothing is written: the first result stays, and its id comes back with
        ``duplicate=True``. ``cache``: the cache policy it was timed with (default:
        ``result.cache``, else ``warm``).

        Raises:
          ValueError: a malformed argument (a naive ``started_at``, non-string versions).
          StorageError: the database could not be written.
        """
        check_aware("started_at", started_at)
        software_key(software)  # validates before any write
        check_times(result)
        with self._sessions.write("record a trial") as session:
            return self._record_trial_in(
                session, problem, config, result, device=device, software=software,
                study_name=study_name, optuna_trial_number=optuna_trial_number, worker=worker,
                started_at=started_at, cache=cache,
            )

    def record_trials(
        self, trials: Sequence[tuple[Problem, Config, TrialResult, DeviceInfo, Mapping[str, str]]],
        *, worker: str = "", cache: str | None = None,
        spreads: Sequence[float | None] | None = None,
    ) -> list[RecordedTrial]:
        """Stores many finished trials ``(problem, config, result, device, software)`` in ONE
        transaction: all of them, or (on any error) none. Duplicates are kept as for
        :meth:`record_trial`. ``spreads``: per trial, the spread measured where its samples
        were taken (an import carries the median only); None: computed from the samples.

        Raises:
          ValueError: a malformed argument (checked before anything is written).
          StorageError: the database could not be written; nothing was.
        """
        for _, _, result, _, software in trials:
            software_key(software)
            check_times(result)
        if spreads is not None and len(spreads) != len(trials):
            raise ValueError(f"spreads has {len(spreads)} values for {len(trials)} trials.")
        for spread in spreads or ():
            if spread is not None and not (math.isfinite(spread) and spread >= 0):
                raise ValueError(f"a spread must be a finite number >= 0, got {spread!r}.")
        given = list(spreads) if spreads is not None else [None] * len(trials)
        with self._sessions.write(f"record {len(trials)} trials") as session:
            return [
                self._record_trial_in(session, problem, config, result, device=device,
                                      software=software, worker=worker, cache=cache,
                                      spread=spread)
                for (problem, config, result, device, software), spread in zip(
                    trials, given, strict=True)
            ]

    def _record_trial_in(
        self,
        session: Session,
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
        spread: float | None = None,
    ) -> RecordedTrial:
        outcome = Outcome(result.outcome)
        policy = checked_policy(cache or result.cache or "warm")
        if not isinstance(config, Config):
            config = Config(config)
        kernel_id, problem_id, device_id, software_id = self._ids(
            session, problem, device, software
        )
        config_id = get_or_create(
            session,
            Configs,
            {"kernel_id": kernel_id, "digest": config.digest()},
            config_json=config.to_json(),
        )
        query = sa.select(Trials.id).filter_by(
            problem_id=problem_id, config_id=config_id, device_id=device_id,
            software_id=software_id, cache_policy=policy,
        )
        existing = session.scalar(query)
        if existing is not None:
            log.debug("Trial of %s %s already stored as %d.", problem, config, existing)
            return RecordedTrial(int(existing), duplicate=True)
        row = Trials(
            problem_id=problem_id,
            config_id=config_id,
            device_id=device_id,
            software_id=software_id,
            status=outcome.value,
            median_us=result.median_us,
            min_us=result.min_us,
            max_us=result.max_us,
            samples_us=tuple(result.samples_us),
            compile_s=result.compile_s,
            rel_error=result.rel_error,
            timing=result.timing,
            cache_policy=policy,
            spread=result.spread if spread is None else spread,
            error=result.error,
            study_name=study_name,
            optuna_trial_number=optuna_trial_number,
            worker=worker,
            host=socket.gethostname(),
            started_at=started_at,
            finished_at=utc_now(),
        )
        # Another worker may store the same measurement between our check and insert.
        trial_id, duplicate = insert_or_stored(session, row, query)
        return RecordedTrial(trial_id, duplicate=duplicate)

    def record_baseline(
        self,
        problem: Problem,
        name: str,
        samples_us: Sequence[float],
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
        cache: str = "warm",
    ) -> int:
        """Stores a baseline's timing (e.g. ``name="xla"``) and returns its row id.

        One baseline per (problem, device, software, name, cache policy): a second one is not
        written, and the first one's id comes back.
        """
        policy = checked_policy(cache)
        if not isinstance(name, str) or not name:
            raise ValueError(f"baseline name must be a non-empty string such as 'xla', but got {name!r}.")
        values = checked_samples(samples_us, "baseline samples_us")
        software_key(software)
        with self._sessions.write("record a baseline") as session:
            _, problem_id, device_id, software_id = self._ids(session, problem, device, software)
            return get_or_create(
                session,
                Baselines,
                {
                    "problem_id": problem_id,
                    "device_id": device_id,
                    "software_id": software_id,
                    "name": name,
                    "cache_policy": policy,
                },
                median_us=statistics.median(values),
                min_us=min(values),
                max_us=max(values),
                samples_us=values,
                measured_at=utc_now(),
                spread=relative_spread(values),
            )

    def record_trace_regions(
        self, trial_id: int, regions: Mapping[str, tuple[float, int]], trace_path: str
    ) -> None:
        """Stores per-region times of a traced trial: region -> (median_us, count).

        Regions already stored for the trial are kept as they are.

        Raises:
          StorageError: there is no trial ``trial_id``.
        """
        with self._sessions.write("record trace regions") as session:
            if session.get(Trials, trial_id) is None:
                raise StorageError(
                    f"Cannot record trace regions of trial {trial_id}: {self._sessions.where} has no "
                    "trial with that id. Pass the id record_trial returned."
                )
            for region, (median_us, count) in regions.items():
                get_or_create(
                    session,
                    TraceRegions,
                    {"trial_id": trial_id, "region": region},
                    median_us=float(median_us),
                    count=int(count),
                    trace_path=trace_path,
                )

    def start_run(
        self,
        job: str,
        *,
        device: DeviceInfo,
        cache: str,
        clocks_before: Mapping[str, Any],
    ) -> int:
        """Stores the start of a job run (with the GPU's clocks before it); returns its id."""
        policy = checked_policy(cache)
        with self._sessions.write("record a job run") as session:
            device_id = device_row_id(session, device, fill=True)
            row = Runs(
                job=str(job)[:200], device_id=device_id, host=socket.gethostname(),
                cache_policy=policy, started_at=utc_now(), finished_at=None,
                clocks_before=json.dumps(dict(clocks_before), sort_keys=True),
                clocks_after=None, warnings="[]",
            )
            session.add(row)
            session.flush()
            return int(row.id)

    def finish_run(
        self, run_id: int, *, clocks_after: Mapping[str, Any], warnings: Sequence[str] = ()
    ) -> None:
        """Stores the end of a job run: the clocks after it and the warnings they gave.

        Raises:
          StorageError: there is no run ``run_id``.
        """
        with self._sessions.write("finish a job run") as session:
            row = session.get(Runs, run_id)
            if row is None:
                raise StorageError(f"There is no job run {run_id} in {self._sessions.where}.")
            row.finished_at = utc_now()
            row.clocks_after = json.dumps(dict(clocks_after), sort_keys=True)
            row.warnings = json.dumps(list(warnings))

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
    ) -> int:
        """Stores a confirmation round (an :class:`autotune.tuning.confirmation.Confirmation`) as rows
        of its own, in one transaction; returns its id. ``trial_ids[i]`` is the stored search
        trial of ``confirmation.configs[i]``. Nothing stored before is changed.

        Raises:
          ValueError: ``trial_ids`` does not match the configs, or names a trial of another
            problem.
        """
        policy = checked_policy(cache)
        programs = list(confirmation.configs)
        if len(trial_ids) != len(programs):
            raise ValueError(
                f"trial_ids must name one stored trial per confirmed config ({len(programs)}), "
                f"but got {len(trial_ids)}."
            )
        base = confirmation.baseline
        with self._sessions.write("record a confirmation round") as session:
            _, problem_id, device_id, software_id = self._ids(session, problem, device, software)
            for trial_id in trial_ids:
                trial = session.get(Trials, trial_id)
                if trial is None or trial.problem_id != problem_id:
                    raise ValueError(
                        f"trial {trial_id} is not a stored trial of {problem}: a confirmation "
                        "names the search trials of its own problem."
                    )
            row = Confirmations(
                run_id=run_id, problem_id=problem_id, device_id=device_id,
                software_id=software_id, cache_policy=policy,
                rounds=max(len(p.rounds_us) for p in programs), iterations=int(iterations),
                crowned_trial_id=int(trial_ids[confirmation.crowned]),
                fastest_trial_id=int(trial_ids[confirmation.fastest]),
                baseline_name=baseline_name if base is not None else None,
                baseline_rounds_us=() if base is None else base.rounds_us,
                baseline_median_us=None if base is None else base.median_us,
                baseline_spread=None if base is None else base.spread,
                speedup=confirmation.speedup, speedup_spread=confirmation.speedup_spread,
                speedup_low=confirmation.speedup_low, speedup_high=confirmation.speedup_high,
                created_at=utc_now(),
            )
            session.add(row)
            session.flush()
            for position, (trial_id, p) in enumerate(zip(trial_ids, programs, strict=True)):
                session.add(ConfirmationPrograms(
                    confirmation_id=row.id, trial_id=int(trial_id), position=position,
                    rounds_us=p.rounds_us, median_us=p.median_us, spread=p.spread,
                    diff=p.diff, noise=p.noise, tie=bool(p.tie), crowned=bool(p.crowned),
                ))
            return int(row.id)

    def record_verification(
        self,
        problem: Problem,
        verification: Any,
        *,
        device: DeviceInfo,
        software: Mapping[str, str],
    ) -> int:
        """Stores an independent re-time (an :class:`autotune.tuning.verify.Verification`) as a
        row of its own, in one transaction; returns its id. Nothing stored before changes.

        Raises:
          ValueError: a time that is not a positive finite number.
        """
        v = verification
        for t in [t for r in (*v.winner_rounds_us, *v.baseline_rounds_us) for t in r]:
            if not (isinstance(t, int | float) and t > 0 and t != float("inf")):
                raise ValueError(f"a verification stores positive finite times, but got {t!r}.")
        config = v.config if isinstance(v.config, Config) else Config(v.config)
        with self._sessions.write("record a verification") as session:
            kernel_id, problem_id, device_id, software_id = self._ids(
                session, problem, device, software)
            config_id = get_or_create(
                session, Configs, {"kernel_id": kernel_id, "digest": config.digest()},
                config_json=config.to_json(),
            )
            row = Verifications(
                problem_id=problem_id, device_id=device_id, software_id=software_id,
                confirmation_id=v.confirmation_id, config_id=config_id, method=v.method,
                rounds=len(v.winner_rounds_us), calls=int(v.calls),
                baseline_name=v.baseline_name, winner_rounds_us=v.winner_rounds_us,
                baseline_rounds_us=v.baseline_rounds_us,
                others_json=json.dumps([
                    {"config": dict(o.config), "rounds_us": [list(r) for r in o.rounds_us],
                     "median_us": o.median_us} for o in v.others
                ], sort_keys=True),
                winner_median_us=v.winner_median_us, baseline_median_us=v.baseline_median_us,
                speedup=v.speedup, speedup_low=v.speedup_low, speedup_high=v.speedup_high,
                stored_speedup=v.stored_speedup, still_wins=v.still_wins, created_at=utc_now(),
            )
            session.add(row)
            session.flush()
            return int(row.id)

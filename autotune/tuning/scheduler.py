"""The run loop: ask, submit, store, tell. Every problem of a job in flight together on one
engine (or one after another, ``one_at_a_time``), and one job shared by any number of processes
and hosts through one database (docs/scheduling.md). It is the only loop that asks a study for
trials and tells it results (``tests/test_architecture.py`` checks that no second one appears).

One thread runs the loop: open the problems (one per pass, so the first trial is submitted as
soon as the first problem is open), keep ``engine.parallelism`` configs in flight by asking the
problem that needs workers most, store and tell each result as it arrives, and interleave each
problem's baseline and traces with the trials. Budgets (``trials``, ``seconds``, ``patience``)
are counted in the problem's Optuna study, which every process shares: a trial is admitted only
while fewer than ``trials`` trials numbered before it count (measured or in flight), so N hosts
store exactly the budget. What it builds on sits below it: the study's bookkeeping
(:mod:`.studies`), a problem's sampler and seeds (:mod:`.seeding`), the confirmation round
(:mod:`.confirming`), the reports (:mod:`.reports`); the job's frame around it is
:func:`autotune.tuning.tuner.run_job`.

Why one piece (over 400 lines): one loop (:func:`run_scheduled`) and the per-problem run state
it drives; its steps (open, ask, submit, collect, confirm) share that state and the engine's
futures.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune._paths import LinkRefusedError, default_results_dir, output_dir, safe_path
from autotune.engine.protocol import EngineLike
from autotune.space.kernel import Kernel, get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.protocol import TrialStore
from autotune.tuning import confirming, studies
from autotune.tuning import optuna_adapter as oa
from autotune.tuning.jobs import Job, ProblemSpec
from autotune.tuning.provenance import cache_policy_of, software_versions, utc
from autotune.tuning.reports import Event, ProblemReport, build_report
from autotune.tuning.sampling import (
    ExhaustedError,
    ValidSampler,
    distributions,
)
from autotune.tuning.seeding import problem_sampler
from autotune.tuning.trial_index import TrialIndex

__all__ = ["run_scheduled", "next_to_ask", "POLL_S", "TRACE_PROFILE_SPACE"]

logger = logging.getLogger(__name__)

# How often a process looks again at problems it cannot ask (full: their budget is admitted but
# other processes are still measuring; or exhausted) and closes the trials of dead processes.
POLL_S = 2.0
MAX_POLL_S = 30.0


# How many more configs in flight (over all processes) than the neediest problem has, a problem
# that the engine's next free worker has worked on may have and still be asked first.
AFFINITY_SLACK = 1
# How often the loop looks again while slots are free only because samplers are making ready.
SAMPLER_POLL_S = 0.02
# Trace events per warpgroup in the tracing pass (plgpu.CompilerParams(profile_space=...)).
TRACE_PROFILE_SPACE = 64
# Confirmation rounds of different problems that run at once. A round is a chain of re-time
# tasks, each waiting for the last; on the H100 a task at 4096^3 took 12.3 ms through the
# engine, 8.6 of them timing (docs/measurement.md, "What it costs"): one round leaves the GPU
# idle between its tasks. Rounds one at a time ended an H100 job 3.7 s later than no rounds
# did, three at once 2.0 s (benchmarks/RESULTS.md §12). Beyond a few they would only queue on
# the lock.
CONCURRENT_ROUNDS = 3


@dataclasses.dataclass(eq=False)
class _Run:
    """One problem of the job in this process."""

    index: int
    spec: ProblemSpec
    kernel: Kernel
    space: Any
    sampler: ValidSampler
    study: optuna.Study
    dists: Mapping[str, Any]
    outside: int  # results stored for the problem that its study does not hold (imports)
    best_us: float | None
    done_before: int
    in_flight: dict[Future[TrialResult], tuple[optuna.trial.Trial, Config, float]] = (
        dataclasses.field(default_factory=dict))
    measured_now: int = 0
    stop_reason: str = ""
    full: bool = False  # no room now: look again after POLL_S, or when a result arrives
    looked_at: float = 0.0
    traced: bool = False  # its traces were submitted
    unread_results: int = 0  # results stored since the study was last read
    poll_s: float = POLL_S  # how long until a full problem is looked at again
    orphans_at: float = 0.0  # when dead processes' trials were last looked for
    finished: bool = False
    side: dict[Future[Any], tuple[str, Any]] = dataclasses.field(default_factory=dict)
    baseline_due: bool = False  # its baseline is to be measured (after its first result)
    confirming: bool = False  # its confirmation round was started (on a confirm thread)
    confirm_s: float | None = None

    @property
    def problem(self) -> Problem:
        return self.spec.problem

    @property
    def tally(self) -> TrialIndex:
        """The study's trials over every process (the sampler's index)."""
        return self.sampler.index

    def need(self) -> tuple[int, int, int]:
        """Lower first: fewest in flight over all hosts, then fewest measured, then job order."""
        return (self.tally.running, self.tally.measured + self.outside, self.index)

    def stop_rule(self) -> str:
        """Why no more trials may be admitted, from the shared counts ("" while some may)."""
        budget, index = self.spec.budget, self.tally
        measured = index.measured + self.unread_results + self.outside
        if budget.trials is not None and measured >= budget.trials:
            return f"trial budget ({budget.trials}) spent"
        if budget.patience and index.stagnated(budget.patience):
            return f"no better config in the last {budget.patience} trials (patience)"
        if budget.seconds is not None and index.first_start is not None:
            if studies.age_s(index.first_start) >= budget.seconds:
                return f"time budget ({budget.seconds:g} s) spent"
        return ""

    def room(self) -> bool:
        """Whether the shared counts leave room for one more trial."""
        trials = self.spec.budget.trials
        return trials is None or self.tally.running + self.tally.measured + self.outside < trials

    def refresh(self) -> None:
        self.tally.refresh(oa.read_trials(self.study))
        self.sampler.index_read()  # the next proposal starts from this read (issue 36)
        self.unread_results = 0

    def ask(self) -> tuple[optuna.trial.Trial, Config] | None:
        """One admitted trial and its config; None when the shared budget or the space says
        no (then ``full`` or ``stop_reason`` says which).

        Two processes can be handed the same config at the same moment (each proposes before
        the other's params are stored): a trial that sees an earlier trial holding its config
        (the twin check, on the index) steps back and asks again, so of any two such trials the
        one that checks last sees the other, and never both measure the same config.
        """
        if self._closed():
            return None
        for _ in range(16):
            try:
                trial = studies.new_trial(self.study, self.dists)
            except ExhaustedError:
                trial_id = self.sampler.exhausted_trial_id
                if trial_id is not None:
                    studies.release_trial(self.study, oa.trial_number(self.study, trial_id))
                self.refresh()
                if self.tally.running:
                    self.full = True  # others' configs in flight may yet be freed
                else:
                    self.stop_reason = f"every valid config ({self.space.count()}) measured"
                return None
            except optuna.exceptions.UpdateFinishedTrialError:
                # Closed while it was sampled, by a process that finished the problem: the
                # budget had not admitted it (studies.never_admitted).
                self.refresh()
                if self._closed():
                    return None
                continue
            config = Config(trial.params)
            self.refresh()  # after the ask: every trial numbered before ours is visible
            twins = [n for n in self.tally.holders(self.space.key(config)) if n != trial.number]
            if twins:
                studies.release_trial(self.study, trial)
                self.sampler.diverge(f"{studies.worker_id()}:{trial.number}")
                continue
            if not self._admitted(trial):
                studies.release_trial(self.study, trial)
                self.full = True
                return None
            return trial, config
        return None

    def _closed(self) -> bool:
        """Whether no trial may be asked now, ``stop_reason`` or ``full`` set to say why."""
        self.stop_reason = self.stop_rule()
        if self.stop_reason:
            return True
        if not self.room():
            self.full = True
            return True
        return False

    def _admitted(self, trial: optuna.trial.Trial) -> bool:
        """The budget's exact check: fewer than ``trials`` counting trials numbered before this
        one (Optuna numbers a study's trials one at a time, under a lock on the study)."""
        budget = self.spec.budget
        if self.stop_rule():
            return False
        if budget.trials is None:
            return True
        return self.outside + self.tally.counting_before(trial.number) < budget.trials


def next_to_ask(askable: Sequence[Any], warm: frozenset[Problem]) -> Any:
    """The problem to ask next: the neediest (``need()``: fewest in flight, then fewest
    measured); or, of the problems in ``warm`` (those the engine's next free worker has worked
    on, :meth:`autotune.engine.dispatcher.Engine.warm_problems`), the neediest, where it has at
    most :data:`AFFINITY_SLACK` more configs in flight than the neediest of all. A worker then
    keeps to a few problems, and a job pays each problem's first-use costs in fewer workers."""
    neediest = min(askable, key=lambda r: r.need())
    familiar = [r for r in askable if r.problem in warm
                and r.need()[0] <= neediest.need()[0] + AFFINITY_SLACK]
    return min(familiar, key=lambda r: r.need()) if familiar else neediest


class _Scheduler:
    def __init__(
        self,
        job: Job,
        *,
        store: TrialStore,
        engine: EngineLike,
        storage: optuna.storages.BaseStorage,
        results_dir: str | Path,
        on_event: Callable[[Event], None] | None,
        allow_import: bool,
        run_id: int | None = None,
        one_at_a_time: bool = False,
    ) -> None:
        self.job, self.store, self.engine, self.storage = job, store, engine, storage
        self.run_id = run_id
        self.one_at_a_time = one_at_a_time
        self.policy = cache_policy_of(engine)  # every store read and write keeps to it
        self.results_dir = results_dir
        self.emit = on_event or (lambda e: None)
        self.allow_import = allow_import
        self.device: DeviceInfo | None = None
        # From package metadata (no jax import): stored with every result and baseline.
        self.software = software_versions()
        self.runs: list[_Run] = []
        self.reports: dict[int, ProblemReport] = {}
        # Confirmation rounds run here, so that the loop goes on asking and storing for the
        # other problems meanwhile (a round takes about a second on the H200); up to
        # CONCURRENT_ROUNDS problems' rounds at once, so that one does not queue behind another.
        self._confirms = ThreadPoolExecutor(CONCURRENT_ROUNDS,
                                            thread_name_prefix="autotune-confirm")
        self._sampler_wait = False  # _fill left slots free for a sampler making ready

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> list[ProblemReport]:
        to_open = list(enumerate(self.job.problems))
        try:
            while True:
                # One at a time: the next problem opens once every open one is finished.
                opening = bool(to_open) and not (
                    self.one_at_a_time and any(not r.finished for r in self.runs))
                if opening:
                    if self.device is None:
                        self.device = self.engine.device_info()
                        if not self.one_at_a_time:  # one at a time keeps the job's order
                            to_open = self._neediest_first(to_open)
                    opened = self._open(*to_open.pop(0))
                    if self.one_at_a_time:
                        if opened is not None:  # alone: it makes ready at once, as a last one
                            opened.sampler.prepare()
                    elif not to_open:
                        # Every problem open, the first configs of all but the last one asked for:
                        # the samplers that can make ready ahead (the ranked sampler draws its pool
                        # and climbs on a cost model) do it now, on threads, while the first configs
                        # compile in the workers. Started as each problem opened, they held the
                        # first config back 0.8 s on the H200 (benchmarks/batch_job.py,
                        # benchmarks/RESULTS.md §9).
                        for r in self.runs:
                            r.sampler.prepare()
                self._fill(share=-(-self.engine.parallelism // len(self.job.problems))
                           if to_open and not self.one_at_a_time else None)
                live = [r for r in self.runs if not r.finished]
                if not to_open and not live:
                    break
                futures = [f for r in live for f in (*r.in_flight, *r.side)]
                # No wait while problems are still to be opened (one at a time: once it may).
                timeout = (0.0 if to_open and not (self.one_at_a_time and live)
                           else SAMPLER_POLL_S if self._sampler_wait
                           else min(POLL_S, studies.beat_interval_s()))
                if futures:
                    done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
                else:
                    done = set()
                    # A problem with nothing in flight whose stop the last ask found (or whose
                    # counts, as that ask read them, say stop) ends below at once: no wait for
                    # it (it held the end of each problem up to POLL_S).
                    if timeout and not any(not r.in_flight and (r.stop_reason or r.stop_rule())
                                           for r in live):
                        time.sleep(timeout)
                for r in live:
                    self._collect(r, done)
                    if r.in_flight:
                        studies.send_heartbeats(r.study, [trial for trial, _c, _s in r.in_flight.values()])
                self._look_again()
                for r in live:
                    self._maybe_finish(r)
        finally:
            for r in self.runs:
                for future, (trial, _config, _s) in r.in_flight.items():
                    future.cancel()
                    studies.release_trial(r.study, trial)
                r.in_flight.clear()
            self._confirms.shutdown(wait=True, cancel_futures=True)
        return [self.reports[i] for i in range(len(self.job.problems))]

    def _neediest_first(self, to_open: list[tuple[int, ProblemSpec]]) -> list[tuple[int, ProblemSpec]]:
        """The problems in the order to open them: fewest results stored first (one query), so
        that hosts joining a job under way start where the work is."""
        assert self.device is not None
        stored = {s.problem: s.total for s in self.store.summaries(device_name=self.device.name)
                  if getattr(s, "cache_policy", self.policy) == self.policy}
        return sorted(to_open, key=lambda item: (stored.get(item[1].problem, 0), item[0]))

    def _fill(self, share: int | None = None) -> None:
        """Fills the engine; ``share``: while problems are still to be opened, at most this
        many configs in flight per problem, so the ones opened first do not take every slot."""
        capacity = max(1, self.engine.parallelism)
        self._sampler_wait = False
        while True:
            # Results that came back are stored before the next ask: on the H200 a burst of
            # asks (each slower while samplers make ready on another thread) held the job's
            # first result back 2.5-4.7 s before it was stored. A problem they end goes on to
            # its traces and confirmation round here too: with results back faster than the
            # asks (a loaded host), this loop does not return until the engine is full, and
            # a round waited for the other problems' whole budgets.
            for r in self.runs:
                done = {f for f in (*r.in_flight, *r.side) if f.done()}
                if done:
                    self._collect(r, done)
                    self._maybe_finish(r)
            if sum(len(r.in_flight) for r in self.runs) >= capacity:
                return
            askable = [r for r in self.runs if not r.finished and not r.stop_reason and not r.full
                       and (share is None or len(r.in_flight) < share)]
            if not askable:
                return
            # A problem whose sampler is not ready (the ranked sampler's pool and climb, made on
            # prepare()'s thread, or by the proposal itself before prepare() is called) would
            # hold the asks, and the results waiting to be stored, until it is: other problems
            # are asked meanwhile, and with none, the loop waits for a result or for the sampler
            # (SAMPLER_POLL_S). Only with nothing in flight at all is it asked anyway.
            ready = [r for r in askable if r.sampler.ready()]
            if not ready and any(r.in_flight for r in self.runs):
                self._sampler_wait = True
                return
            askable = ready or askable
            warm = getattr(self.engine, "warm_problems", None)
            self._ask_one(next_to_ask(askable, warm() if warm is not None else frozenset()))

    def _look_again(self) -> None:
        """Closes dead processes' trials and re-reads the shared counts of a problem that
        cannot be asked now (full): after POLL_S, then backing off (x2, up to MAX_POLL_S) while
        nothing changes, so that many hosts waiting on a job's last trials do not load the
        database. Other problems every MAX_POLL_S (their asks read the counts anyway; a dead
        host's trials only hold their configs)."""
        now = time.monotonic()
        for r in self.runs:
            if r.finished or now - r.looked_at < (r.poll_s if r.full else MAX_POLL_S):
                continue
            r.looked_at = now
            assert self.device is not None
            before = (r.tally.measured, r.tally.running)
            r.refresh()
            # Another host's trial goes stale only GRACE_S after its last heartbeat: asking the
            # database for stale trials more often than every GRACE_S / 4 finds nothing new.
            # A dead process of this host is seen at once (its pid is gone).
            if now - r.orphans_at >= studies.GRACE_S / 4 or _dead_here(r.tally.live):
                r.orphans_at = now
                studies.close_orphans(r.study, self.store, r.problem, self.device, self.policy)
                r.refresh()
            r.full = not r.room()
            changed = (r.tally.measured, r.tally.running) != before
            r.poll_s = POLL_S if changed or not r.full else min(MAX_POLL_S, 2 * r.poll_s)

    # -- one problem -----------------------------------------------------------------------

    def _open(self, index: int, spec: ProblemSpec) -> _Run | None:
        """Opens one problem of the job: its run, or None when it is skipped (reported now)."""
        problem = spec.problem
        kernel = get_kernel(problem.kernel, allow_import=self.allow_import)
        if self.device is None:
            self.device = self.engine.device_info()
        device = self.device
        space = kernel.valid_space(problem, interpret=device.kind == DeviceKind.INTERPRET)
        budget = spec.budget
        safe_path(self.results_dir, "traces", problem.kernel)  # before anything is measured

        def skip(why: str, done: int, reason: str) -> None:
            confirm_s = confirming.confirm_best(
                kernel, problem, spec, store=self.store, engine=self.engine, device=device,
                software=self.software, run_id=self.run_id, only_if_missing=True) if done else None
            report = build_report(kernel, problem, device, self.store, measured_now=0,
                                  repaired=0, skipped=True, stop_reason=reason,
                                  cache=self.policy, confirm_s=confirm_s)
            self.reports[index] = report
            # The stored best (the summary's), so a resumed job's skip line does not say "best -".
            self.emit(Event("skip", problem, done, budget.trials, report.best_us, message=why))

        if device.kind == DeviceKind.INTERPRET and not kernel.interpret_ok:
            why = f"does not run in GPU interpret mode: {kernel.interpret_note or 'see the kernel'}"
            skip(why, 0, why)
            return None
        rows = self.store.trials(problem, device_name=device.name, cache=self.policy)
        spent = budget.trials is not None and len(rows) >= budget.trials
        if spent or len(rows) >= space.count():
            # admits: the whole budget (the results stored outside the study are not counted;
            # trials over the budget by them alone are left to the heartbeat).
            studies.close_finished(self.storage, self.store, problem, device, self.policy,
                                   admits=budget.trials)
        if spent:
            skip("already tuned", len(rows), "budget already spent")
            return None
        if rows and len(rows) >= space.count():  # nothing stored: no need to count
            skip("space exhausted", len(rows), "every valid config measured")
            return None

        stored_configs = [r.config for r in rows]
        sampler = problem_sampler(kernel, problem, spec, space, store=self.store, device=device,
                                  policy=self.policy, stored_configs=stored_configs)
        sampler.prefetch = True  # asks come as results arrive: the next proposal is made meanwhile
        study = studies.open_study(problem, device, self.storage, sampler, self.software, self.policy)
        studies.close_orphans(study, self.store, problem, device, self.policy)
        sampler.index.refresh(oa.read_trials(study))
        outside = 0  # results stored that no measured trial of the study holds (imports)
        for row in rows:
            try:
                outside += not sampler.index.measured_by_study(space.key(row.config))
            except KeyError:
                outside += 1
        best_us = min((r.median_us for r in rows if r.median_us is not None and r.status == "ok"),
                      default=None)
        run = _Run(index=index, spec=spec, kernel=kernel, space=space, sampler=sampler, study=study,
                   dists=distributions(space), outside=outside, best_us=best_us,
                   done_before=len(rows), looked_at=time.monotonic())
        run.full = not run.room()
        self.runs.append(run)
        self.emit(Event("start", problem, len(rows), budget.trials, best_us))
        # Its baseline goes to the engine once its first result is in (_baseline_now), so that
        # every worker's first task is a config: a fresh worker's first task pays its first-use
        # costs, and on the H200 baselines queued first held the first compile back 25 s.
        # In interpret mode there is none: a CPU XLA time says nothing beside an interpreted
        # kernel's (docs/measurement.md, "Interpret mode").
        run.baseline_due = device.kind != DeviceKind.INTERPRET and kernel.baseline is not None and self.store.baseline(
            problem, device_name=device.name, device_kind=device.kind, cache=self.policy
        ) is None
        return run

    def _baseline_now(self, r: _Run) -> None:
        """Submits ``r``'s baseline (at the front of the engine's queue) if it is still due."""
        if r.baseline_due:
            r.baseline_due = False
            r.side[_submit_baseline(self.engine, r.problem)] = ("baseline", None)

    def _ask_one(self, r: _Run) -> None:
        """Asks ``r`` for one config and submits it, if the shared budget admits it."""
        asked = r.ask()
        if asked is None:
            return
        trial, config = asked
        studies.send_heartbeats(r.study, [trial])
        future = self.engine.submit(r.problem.kernel, r.problem, config)
        r.in_flight[future] = (trial, config, time.time())

    def _collect(self, r: _Run, done: set[Future[Any]]) -> None:
        assert self.device is not None
        finished = [f for f in r.in_flight if f in done]
        for future in finished:
            trial, config, started = r.in_flight.pop(future)
            result = future.result()
            recorded = self.store.record_trial(
                r.problem, config, result, device=self.device, software=self.software,
                study_name=r.study.study_name, optuna_trial_number=trial.number,
                worker=studies.worker_id(), started_at=utc(started), cache=self.policy,
            )
            studies.tell_result(r.study, trial, result, duplicate=recorded.duplicate)
            r.measured_now += 0 if recorded.duplicate else 1
            if result.ok and result.median_us is not None and (
                    r.best_us is None or result.median_us < r.best_us):
                r.best_us = result.median_us
            r.full = False  # the counts changed: look again before the next ask
            self.emit(Event("trial", r.problem, r.done_before + r.measured_now,
                            r.spec.budget.trials, r.best_us,
                            message=f"{result.outcome.value} {config.to_json()}",
                            status=result.outcome.value, time_us=result.median_us,
                            number=trial.number, config=dict(config),
                            log_path=result.log_path))
        # Counted until the next read of the study (which the next ask makes): so a problem
        # whose budget our own results just completed is not asked again.
        r.unread_results += len(finished)
        if finished:
            self._baseline_now(r)
        for side in [f for f in r.side if f in done]:
            kind, what = r.side.pop(side)
            if kind == "baseline":
                self._store_baseline(r, side)
            elif kind == "confirm":
                r.confirm_s = side.result()  # a database error propagates, as before
            else:
                self._store_trace(r, side, what)

    def _store_baseline(self, r: _Run, future: Future[Any]) -> None:
        assert self.device is not None
        confirming.store_baseline(r.kernel, r.problem, future.result, store=self.store,
                                  device=self.device, software=self.software, cache=self.policy)

    def _store_trace(self, r: _Run, future: Future[Any], what: tuple[int, str]) -> None:
        row_id, out_dir = what
        try:
            regions = future.result()
        except Exception as e:  # noqa: BLE001 - a failed trace must not lose the tuning
            logger.warning("tracing %s failed: %s", r.problem, e)
            return
        if isinstance(regions, TrialResult):
            logger.warning("tracing %s ended %s: %s", r.problem, regions.outcome, regions.error)
        elif regions:
            self.store.record_trace_regions(row_id, regions, out_dir)

    def _maybe_finish(self, r: _Run) -> None:
        if r.finished or r.in_flight:
            return
        if not r.stop_reason:
            r.stop_reason = r.stop_rule()
        if not r.stop_reason and r.full:
            r.refresh()  # others may have finished the budget meanwhile
            r.stop_reason = r.stop_rule()
        if not r.stop_reason:
            return  # more to ask, or other processes hold the rest of the budget: wait
        self._baseline_now(r)  # a problem that ends with no result of this process's
        if not r.traced:
            r.traced = True
            self._submit_traces(r)
        assert self.device is not None
        if not r.confirming and all(kind != "baseline" for kind, _ in r.side.values()):
            # The confirmation round re-times the best configs on the workers that kept them
            # (docs/measurement.md), on a confirm thread, once the baseline is stored (its
            # XLA pick is the one the round times); the traces go on beside it, so a job's last
            # problem does not wait for its traces' compiles and then for its round.
            r.confirming = True
            future = self._confirms.submit(
                confirming.confirm_best, r.kernel, r.problem, r.spec, store=self.store,
                engine=self.engine, device=self.device, software=self.software,
                run_id=self.run_id)
            r.side[future] = ("confirm", None)
        if r.side:
            return
        r.finished = True
        # admits: the whole budget, not less the results stored outside the study (``outside``
        # was counted at the open, and may hold a result stored then but not yet told, whose
        # trial is counted as well): a trial over it was over it when its owner checked it.
        studies.close_orphans(r.study, self.store, r.problem, self.device, self.policy, finished=True,
                              admits=r.spec.budget.trials)
        confirm_s = r.confirm_s
        self.emit(Event("done", r.problem, r.done_before + r.measured_now,
                        r.spec.budget.trials, r.best_us, message=r.stop_reason))
        self.reports[r.index] = build_report(r.kernel, r.problem, self.device, self.store,
                                             measured_now=r.measured_now,
                                             repaired=r.sampler.repaired,
                                             stop_reason=r.stop_reason,
                                             cache=self.policy, confirm_s=confirm_s)

    def _submit_traces(self, r: _Run) -> None:
        """In-kernel traces of the ``trace_top_k`` best configs not traced yet (GPU only)."""
        device, spec, problem = self.device, r.spec, r.problem
        assert device is not None
        if spec.trace_top_k <= 0 or not device.is_gpu:
            return
        submit = getattr(self.engine, "submit_trace", None) or functools.partial(
            _trace_now, self.engine)
        traced_space = r.kernel.bind(problem, profile_space=TRACE_PROFILE_SPACE)
        best = self.store.best(problem, device_name=device.name, device_kind=device.kind,
                               n=4 * spec.trace_top_k, cache=self.policy)
        for row in [row for row in best if traced_space.is_valid(row.config)][: spec.trace_top_k]:
            if getattr(row, "traced", False):
                continue
            config = Config(row.config)
            try:  # never through a link another user left in the results folder
                out_dir = output_dir(self.results_dir, "traces", problem.kernel,
                                     problem.digest(), config.digest())
            except LinkRefusedError as e:
                logger.warning("%s %s: not traced: %s", problem, config.to_json(), e)
                continue
            future = submit(problem.kernel, problem, config, str(out_dir), TRACE_PROFILE_SPACE)
            r.side[future] = ("trace", (row.id, str(out_dir)))


def _dead_here(trials: Sequence[FrozenTrial]) -> bool:
    """Whether one of ``trials`` belongs to a process of this host that is gone (its pid not
    running, or reused by a process of another start time)."""
    return any(studies.owner_dead_here(str(t.user_attrs.get(studies.WORKER_ATTR, ""))) for t in trials)


def _trace_now(engine: EngineLike, *args: Any) -> Future[Any]:
    """``engine.trace`` as a resolved future, for an engine without ``submit_trace`` (a test
    double): the trace is taken at once."""
    future: Future[Any] = Future()
    try:
        future.set_result(engine.trace(*args))
    except Exception as e:  # noqa: BLE001 - reported as the trace's failure
        future.set_exception(e)
    return future


def _submit_baseline(engine: EngineLike, problem: Problem) -> Future[TrialResult]:
    """The engine's baseline without waiting; an engine without ``submit_baseline`` (a test
    double) measures it at once."""
    submit: Callable[[str, Problem], Future[TrialResult]] | None = getattr(
        engine, "submit_baseline", None)
    if submit is not None:
        return submit(problem.kernel, problem)
    future: Future[TrialResult] = Future()
    try:
        future.set_result(engine.baseline(problem.kernel, problem))
    except Exception as e:  # noqa: BLE001 - reported as the baseline's failure
        future.set_exception(e)
    return future


def run_scheduled(
    job: Job,
    *,
    store: TrialStore,
    engine: EngineLike,
    storage: optuna.storages.BaseStorage,
    results_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    allow_import: bool = False,
    run_id: int | None = None,
    one_at_a_time: bool = False,
) -> list[ProblemReport]:
    """Tunes every problem of ``job`` together on ``engine``; one report per problem, in job
    order. Each problem's confirmation round (:func:`autotune.tuning.confirming.confirm_best`)
    runs when its search ends. ``one_at_a_time``: one problem open at a time, in job order (the
    next opens once the last is finished, its confirmation round stored): the same loop, the
    same budgets. Database errors propagate (``run_job`` words them)."""
    return _Scheduler(job, store=store, engine=engine, storage=storage,
                      results_dir=results_dir or default_results_dir(),
                      on_event=on_event, allow_import=allow_import, run_id=run_id,
                      one_at_a_time=one_at_a_time).run()

"""The job runner: problems -> Optuna study -> engine -> store, resumable.

For each problem of a job: bind the kernel's space, open (or resume) the problem's Optuna study
in the same database as the results, measure the baseline once, then ask the
:class:`~autotune.tuning.sampling.ValidSampler` for configs, hand them to the engine (which compiles
in parallel while the GPU times one kernel at a time), and store every result as it arrives.
When the search ends, the confirmation round (:mod:`autotune.space.outcomes`) re-times the best
few configs and the baseline in interleaved rounds; the winner and the speedup come from it,
with their spread and the tie marks, stored as rows of their own. Finally the best configs get
a second, traced pass whose per-region times are stored too.

Every timing of a job uses the engine's cache policy (``engine.cache_policy``: ``cold`` or
``warm``); what the store holds of the other policy is neither resumed from nor compared with.
The GPU's clocks, temperature and throttling are read before and after the job
(:mod:`autotune.evaluation.clocks`) and stored with the job's run; a GPU that throttled or whose clock
moved is logged as a warning.

Resuming is the normal case, not a special one: what the store and the study already hold is
never measured again; a trial left RUNNING by a killed run is closed (from the store when its
result made it there, otherwise released so its config can be proposed again).

Why one piece (over 400 lines): the runner's pieces (study naming, ownership and heartbeats of
trials, asking, telling, orphan handling, the confirmation round) share the study/store
bookkeeping that makes a job resumable by any process; the scheduler reuses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune import __version__ as AUTOTUNE_VERSION
from autotune._paths import default_results_dir, output_dir, safe_path
from autotune.engine.protocol import EngineLike
from autotune.errors import JobError, NoValidConfigError, StorageError
from autotune.evaluation.clocks import ClockSnapshot, clock_warnings, gpu_index, read_clocks
from autotune.space.kernel import Kernel, get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind, Outcome, TrialResult
from autotune.space.problem import Config, Problem
from autotune.space.search_space import BoundSpace
from autotune.storage import connection as storage_connection
from autotune.storage import store as storage_module
from autotune.storage.protocol import TrialStore
from autotune.storage.urls import in_memory
from autotune.tuning import optuna_adapter as oa
from autotune.tuning.confirmation import (
    CONFIRM_JOIN_MAX,
    DEFAULT_CONFIRM_TOP,
    AnalysedRounds,
    analyse_rounds,
    joining_configs,
    sized_iterations,
    timed_rounds,
)
from autotune.tuning.jobs import Job, ProblemSpec
from autotune.tuning.samplers.ranked import stored_history
from autotune.tuning.sampling import (
    OUTCOME_ATTR,
    ExhaustedError,
    ValidSampler,
    distributions,
    reads_history,
    resolve_sampler,
    valid_sampler,
)

__all__ = ["ProblemReport", "run_job", "tune_problem", "study_name", "legacy_study_name", "Event",
           "METRIC_NAME"]
# Also used by autotune.tuning.scheduler (the many-problem runner), and so without an underscore
# though not part of the API above: open_study, worker_id, optuna_storage, send_heartbeats,
# new_trial, release_trial, tell_result, close_orphans, close_finished, age_s, is_alive,
# owner_dead_here,
# parse_owner, process_start, utc, related_winners,
# trace_best, build_report, confirm_best, cache_policy_of, software_versions, and the constants
# WORKER_ATTR, HEARTBEAT_S, GRACE_S, TRACE_PROFILE_SPACE. Everything with an underscore is
# this module's own.

logger = logging.getLogger(__name__)

# "host:pid:start" of the process that asked for the trial; start is the process's start time
# (/proc/PID/stat, clock ticks since boot), so that a pid reused by another process is not taken
# for the owner. Older runners wrote "host:pid".
WORKER_ATTR = "autotune_worker"
# Another host treats a trial as dead (and frees its config) after GRACE_S without a heartbeat:
# two heartbeat intervals (heartbeats are written every HEARTBEAT_S / 3).
HEARTBEAT_S = 30
# Trace events per warpgroup in the tracing pass (plgpu.CompilerParams(profile_space=...)).
TRACE_PROFILE_SPACE = 64
GRACE_S = 2 * HEARTBEAT_S
# Python's GIL switch interval in the job's process while a job runs (Python's default: 5 ms).
# The loop's every database statement lets go of the GIL and must win it back from the threads
# that hold it in Python (the ranked samplers climbing on their cost model, proposals made
# ahead): on the H200 host, storing a result took a median 43.7-58.0 ms instead of 6.8-7.1 ms
# while four hopper_matmul samplers climbed at 5 ms, 7.8-9.2 ms at 0.5 ms
# (benchmarks/gil_contention.py, benchmarks/RESULTS.md §9).
JOB_SWITCH_INTERVAL_S = 0.0005


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


def study_name(problem: Problem, device: DeviceInfo, cache: str = "warm") -> str:
    """One Optuna study per problem, device and cache policy, named to be read in
    optuna-dashboard: ``hopper_matmul[k=4096,m=4096,n=4096; bfloat16] @ NVIDIA H200`` (``warm``)
    or ``... @ NVIDIA H200 | cold``. Studies created before this naming
    (``autotune|<problem key>|<device>``, :func:`legacy_study_name`) keep theirs."""
    base = f"{problem} @ {device.name}"
    return base if cache == "warm" else f"{base} | {cache}"


def legacy_study_name(problem: Problem, device: DeviceInfo, cache: str = "warm") -> str:
    """The study name used before readable names; a database holding it resumes under it."""
    base = f"autotune|{problem.key()}|{device.name}"
    return base if cache == "warm" else f"{base}|{cache}"


def cache_policy_of(engine: object) -> str:
    """The cache policy an engine times with (``warm`` for engines that do not say)."""
    return str(getattr(engine, "cache_policy", "warm"))


METRIC_NAME = "median_us"  # the objective, as optuna-dashboard and Study.metric_names show it


def open_study(
    problem: Problem, device: DeviceInfo, storage: optuna.storages.BaseStorage | str,
    sampler: Any, software: Mapping[str, str], cache: str = "warm",
) -> optuna.Study:
    """Creates or resumes the problem's study, with its metric name and user attributes
    (kernel, shape, dtype, device, software versions) for Optuna's own tools."""
    name = study_name(problem, device, cache)
    legacy = legacy_study_name(problem, device, cache)
    if legacy in optuna.study.get_all_study_names(storage=storage):
        name = legacy
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    attrs: dict[str, Any] = {
        "kernel": problem.kernel, "shape": problem.dims, "dtype": problem.dtype,
        "device": device.name, "device_kind": device.kind,
        "compute_capability": device.compute_capability, "software": dict(software),
        "cache_policy": cache,
    }
    current = study.user_attrs
    for key, value in attrs.items():
        if current.get(key) != value:
            study.set_user_attr(key, value)
    if study.metric_names != [METRIC_NAME]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAME])
    return study


def software_versions() -> dict[str, str]:
    """The jax and jaxlib versions stored with every result, from the installed packages'
    metadata (what the lookup compares with: :func:`autotune.queries.running_versions`), so
    that the main process does not import jax (seconds, while the workers start) before its
    first trial; imported only when a package has no metadata (a source checkout)."""
    from autotune._jax_compat import installed_versions, jax_versions

    versions = installed_versions()
    if not versions.get("jax") or "jaxlib" not in versions:
        versions = jax_versions()
    return {**versions, "autotune": AUTOTUNE_VERSION}


def worker_id() -> str:
    """``host:pid:start`` of this process (``host:pid`` where /proc is not there)."""
    start = process_start(os.getpid())
    return f"{socket.gethostname()}:{os.getpid()}" + ("" if start is None else f":{start}")


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22), or None
    when it does not exist or /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name may hold spaces and ')'
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def parse_owner(owner: str) -> tuple[str, int | None, str | None]:
    """``(host, pid, start)`` of a WORKER_ATTR value; pid None when it names none."""
    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if not pid_text.isdigit():
        return host, None, None
    return host, int(pid_text), start or None


def owner_dead_here(owner: str) -> bool:
    """Whether ``owner`` is a process of this host that is gone: its pid is not running, or
    runs another process (another start time), or is a zombie."""
    host, pid, start = parse_owner(owner)
    if host != socket.gethostname() or pid is None:
        return False
    if not is_alive(pid):
        return True
    now = process_start(pid)
    if start is not None and now is not None and now != start:
        return True  # the pid was reused by a later process
    return now is None and os.path.isdir("/proc/self")  # a zombie (or gone meanwhile)


def optuna_storage(url: str) -> optuna.storages.BaseStorage:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 2 * storage_connection.SQLITE_BUSY_TIMEOUT_S}
    else:
        kwargs["pool_pre_ping"] = True
    # The heartbeat lets other hosts see a dead host's trials as stale and redo them.
    # Several processes opening a fresh database race to create Optuna's tables; the loser
    # sees "already exists" and simply opens again.
    import sqlalchemy.exc

    for attempt in range(5):
        try:
            with warnings.catch_warnings():  # heartbeat_interval is "experimental" since 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
                )
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError,
                sqlalchemy.exc.ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def send_heartbeats(study: optuna.Study, trials: list[optuna.trial.Trial]) -> None:
    """Marks in-flight trials alive, so other hosts' ``fail_stale_trials`` leaves them be."""
    storage = _heartbeat_storage(study)
    if storage is None:
        return
    now = time.monotonic()
    if len(_last_beat) > 10_000:  # forget finished trials
        for key in [k for k, t in _last_beat.items() if now - t > GRACE_S]:
            del _last_beat[key]
    for trial in trials:
        # One write per trial every HEARTBEAT_S / 3 at most, however often the loop wakes.
        key = (id(storage), oa.trial_id(trial))
        if now - _last_beat.get(key, -HEARTBEAT_S) >= _beat_interval_s():
            storage.record_heartbeat(oa.trial_id(trial))
            _last_beat[key] = now


_last_beat: dict[tuple[int, int], float] = {}  # (storage, trial id) -> last heartbeat written


def _beat_interval_s() -> float:
    """A third of the heartbeat interval, and at most a sixth of the grace period after which
    other hosts treat a trial as dead."""
    return min(HEARTBEAT_S, GRACE_S / 2) / 3


def _heartbeat_storage(study: optuna.Study) -> Any:
    """The study's storage if it keeps heartbeats (:func:`optuna_adapter.heartbeat_storage`)."""
    return oa.heartbeat_storage(study)


_SWITCH_LOCK = threading.Lock()
_SWITCH_USERS = 0
_SWITCH_BEFORE = 0.0


@contextlib.contextmanager
def job_switch_interval() -> Any:
    """Python's switch interval at :data:`JOB_SWITCH_INTERVAL_S` while the block runs, then as it
    was; jobs that overlap in one process (threads) share it, and the last one out restores it."""
    global _SWITCH_USERS, _SWITCH_BEFORE
    with _SWITCH_LOCK:
        if _SWITCH_USERS == 0:
            _SWITCH_BEFORE = sys.getswitchinterval()
            sys.setswitchinterval(min(_SWITCH_BEFORE, JOB_SWITCH_INTERVAL_S))
        _SWITCH_USERS += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _SWITCH_USERS -= 1
            if _SWITCH_USERS == 0:
                sys.setswitchinterval(_SWITCH_BEFORE)


def device_while_counting(engine: EngineLike, job: Job, *, allow_import: bool) -> DeviceInfo:
    """The engine's device; while its first worker starts (2-5 s on the H200), the job's
    problems' valid configs are counted, in job order, on this thread.

    Opening a problem counts them (about 0.3 s for a hopper_matmul space), and on the H200
    opening later problems held a first result back 0.9 s before it was stored; counted in a
    thread of their own, they held the GIL against the scheduler's loop. This wait holds
    nothing (the device is awaited on another thread). Only where the engine says its device
    kind up front (its ``mode``); counting stops once the device is known; a problem that
    fails here is left for the tuning to report.
    """
    mode = getattr(engine, "mode", None)
    with ThreadPoolExecutor(1, thread_name_prefix="autotune-device") as waiter:
        device = waiter.submit(engine.device_info)
        if mode in (DeviceKind.GPU, DeviceKind.INTERPRET, DeviceKind.FAKE):
            for spec in job.problems:
                if device.done():
                    break
                with contextlib.suppress(Exception):
                    kernel = get_kernel(spec.problem.kernel, allow_import=allow_import)
                    kernel.valid_space(spec.problem, interpret=mode == DeviceKind.INTERPRET).count()
        return device.result()


def run_job(
    job: Job,
    *,
    store: TrialStore,
    engine: EngineLike,
    results_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    allow_import: bool = False,
    sequential: bool = False,
) -> list[ProblemReport]:
    """Tunes every problem of ``job``; returns one report per problem, in job order.

    The problems are in flight together on ``engine``, and the budgets are shared with every
    other process tuning the same job on the same database (:mod:`autotune.tuning.scheduler`,
    docs/scheduling.md). ``sequential=True`` is the earlier runner: one problem after another,
    each budget counted by this process alone (kept for ``benchmarks/batch_job.py``).

    Raises:
      JobError: the store is an in-memory database, which would keep nothing.
      StorageError: the database could not be read or written (locked for longer than the
        wait, read-only, full, damaged); the trials stored until then stay stored, and running
        the job again resumes it.
    """
    require_persistent(store)
    policy = cache_policy_of(engine)
    if job.cache is not None and job.cache != policy:
        raise JobError(
            f"The job asks for cache = {job.cache!r} but the engine times {policy!r}: open the "
            f"engine with cache={job.cache!r} (the CLI and autotune.tune do)."
        )
    try:
        with job_switch_interval():
            return _run_job(job, store=store, engine=engine,
                            results_dir=results_dir or default_results_dir(),
                            on_event=on_event, allow_import=allow_import, sequential=sequential,
                            policy=policy)
    except StorageError as e:
        raise StorageError(f"{e} {_what_now(str(e))}") from e
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        reason = storage_module.failure_reason(e)
        raise StorageError(
            f"Could not use the Optuna study in {store!r}: {reason}. {_what_now(reason)}"
        ) from e


def _run_job(job: Job, *, store: TrialStore, engine: EngineLike, results_dir: str | Path,
             on_event: Callable[[Event], None] | None, allow_import: bool, sequential: bool,
             policy: str) -> list[ProblemReport]:
    """:func:`run_job` inside its switch interval; database errors are worded there."""
    storage = optuna_storage(store.url)  # already resolved: postgresql:// means psycopg 3
    gpu = gpu_index(getattr(engine, "gpus", None))
    device, before = _device_and_clocks(engine, job, gpu, allow_import=allow_import)
    if device.kind == DeviceKind.INTERPRET:
        require_interpret_configs(job, allow_import=allow_import)
    run_id = store.start_run(job.name, device=device, cache=policy,
                             clocks_before=before.to_dict())
    if not sequential:
        from autotune.tuning.scheduler import run_scheduled

        reports = run_scheduled(job, store=store, engine=engine, storage=storage,
                                results_dir=results_dir, on_event=on_event,
                                allow_import=allow_import, run_id=run_id)
    else:
        reports = []
    for spec in job.problems if sequential else ():
        kernel = get_kernel(spec.problem.kernel, allow_import=allow_import)
        reports.append(
            tune_problem(
                kernel,
                spec,
                store=store,
                engine=engine,
                storage=storage,
                results_dir=results_dir,
                on_event=on_event,
                run_id=run_id,
            )
        )
    after = _clocks(device, gpu)
    warned = clock_warnings(before, after)
    for line in warned:
        logger.warning("%s: the timings of this job may not compare with each other (%s).",
                       job.name, line)
    store.finish_run(run_id, clocks_after=after.to_dict(), warnings=warned)
    return reports


def require_interpret_configs(job: Job, *, allow_import: bool) -> None:
    """Checks, before anything is tuned, that every problem of ``job`` that runs in GPU
    interpret mode has a valid config under the interpret-only rules too (the job file is
    checked for the GPU's rules alone, before the device is known); bound spaces are cached,
    so the tuning does not bind them again.

    Raises:
      NoValidConfigError: a problem has none; the message names it, the rule and the fix.
    """
    for spec in job.problems:
        kernel = get_kernel(spec.problem.kernel, allow_import=allow_import)
        if not kernel.interpret_ok:  # skipped with its reason when its turn comes
            continue
        try:
            kernel.valid_space(spec.problem, interpret=True)
        except NoValidConfigError as e:
            raise NoValidConfigError(
                f"{e} Checked for GPU interpret mode (this job runs on the CPU) before "
                "anything was tuned: tune this problem on a GPU (--device gpu), or leave it out "
                "of the job for interpret mode."
            ) from None


def _device_and_clocks(engine: EngineLike, job: Job, gpu: int, *,
                       allow_import: bool) -> tuple[DeviceInfo, ClockSnapshot]:
    """The engine's device, and its GPU's clocks before the job: read through NVML while the
    first worker starts where the engine says up front that it times on a GPU (on the H200,
    NVML's start and stop took 0.07-0.27 s of the path from the first worker ready to the first
    config submitted), else once the device is known."""
    with ThreadPoolExecutor(1, thread_name_prefix="autotune-clocks") as reader:
        early = (reader.submit(read_clocks, gpu)
                 if getattr(engine, "mode", None) == DeviceKind.GPU else None)
        device = device_while_counting(engine, job, allow_import=allow_import)
        if early is not None and device.is_gpu:
            return device, early.result()
    return device, _clocks(device, gpu)


def _clocks(device: DeviceInfo, gpu: int) -> ClockSnapshot:
    if not device.is_gpu:
        return ClockSnapshot(available=False, reason=f"not a GPU ({device.kind})")
    return read_clocks(gpu)


def require_persistent(store: TrialStore) -> None:
    """Refuses a store that keeps nothing (an in-memory SQLite database) before tuning into it.

    Raises:
      JobError: naming the URL and what to give instead.
    """
    if in_memory(store.url):
        raise JobError(
            f"The database {store!r} is in memory: every result would be lost when the job "
            "ends. Give a file (e.g. --db sqlite:///results/autotune.db) or a server URL."
        )


def _what_now(reason: str) -> str:
    """The way out of a database failure that stopped a job."""
    return (storage_module.damaged_hint(reason)
            or "The trials stored until then are kept; run the job again to resume (re-run).")


def tune_problem(
    kernel: Kernel,
    spec: ProblemSpec,
    *,
    store: TrialStore,
    engine: EngineLike,
    storage: optuna.storages.BaseStorage | str,
    results_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    run_id: int | None = None,
) -> ProblemReport:
    """Tunes one problem until its budget is spent or its valid set is exhausted, then
    confirms its best configs (:func:`confirm_best`)."""
    emit = on_event or (lambda e: None)
    problem = spec.problem
    device = engine.device_info()
    policy = cache_policy_of(engine)
    space = kernel.valid_space(problem, interpret=device.kind == DeviceKind.INTERPRET)
    software = software_versions()
    budget = spec.budget
    results_dir = results_dir or default_results_dir()
    safe_path(results_dir, "traces", problem.kernel)  # before anything is measured
    if device.kind == DeviceKind.INTERPRET and not kernel.interpret_ok:
        # Every config would only fail the same way; say so once instead of storing that.
        why = f"does not run in GPU interpret mode: {kernel.interpret_note or 'see the kernel'}"
        report = build_report(kernel, problem, device, store, measured_now=0, repaired=0,
                              skipped=True, stop_reason=why, cache=policy)
        emit(Event("skip", problem, 0, budget.trials, report.best_us, message=why))
        return report

    rows = store.trials(problem, device_name=device.name, cache=policy)
    stored_configs = [r.config for r in rows]
    done_before = len(rows)
    for done, why, message in (
        (budget.trials is not None and done_before >= budget.trials, "budget already spent",
         "already tuned"),
        # (Counted only when something is stored: a new problem's first proposal need not wait.)
        (done_before > 0 and done_before >= space.count(), "every valid config measured",
         "space exhausted"),
    ):
        if done:
            close_finished(storage, store, problem, device, policy)
            # A run stopped during its confirmation round left it undone: it is done now.
            confirm_s = confirm_best(kernel, problem, spec, store=store, engine=engine,
                                     device=device, software=software, run_id=run_id,
                                     only_if_missing=True)
            report = build_report(kernel, problem, device, store, measured_now=0, repaired=0,
                                  skipped=True, stop_reason=why, cache=policy, confirm_s=confirm_s)
            # The stored best (the summary's), so a resumed job's skip line does not say "best -".
            emit(Event("skip", problem, done_before, budget.trials, report.best_us, message=message))
            return report

    sampler = problem_sampler(kernel, problem, spec, space, store=store, device=device,
                              policy=policy, stored_configs=stored_configs)
    study = open_study(problem, device, storage, sampler, software, policy)
    close_orphans(study, store, problem, device, policy)

    # No baseline in interpret mode: a CPU XLA time says nothing beside an interpreted kernel's.
    if (device.kind != DeviceKind.INTERPRET and kernel.baseline is not None
            and store.baseline(problem, device_name=device.name, device_kind=device.kind,
                               cache=policy) is None):
        result = engine.baseline(problem.kernel, problem)
        if result.ok:
            store.record_baseline(
                problem, kernel.baseline_name, result.samples_us, device=device, software=software,
                cache=policy,
            )
        else:
            logger.warning("baseline %s failed for %s: %s", kernel.baseline_name, problem, result.error)

    dists = distributions(space)
    start = time.monotonic()
    measured_now = 0
    in_flight: dict[Future[TrialResult], tuple[optuna.trial.Trial, Config, float]] = {}
    total = budget.trials
    stop_reason = ""
    best_us = min((r.median_us for r in rows if r.median_us is not None and r.status == "ok"), default=None)
    emit(Event("start", problem, done_before, total, best_us))

    def out_of_budget() -> str:
        done = done_before + measured_now + len(in_flight)
        if total is not None and done >= total:
            return f"trial budget ({total}) spent"
        if budget.seconds is not None and time.monotonic() - start >= budget.seconds:
            return f"time budget ({budget.seconds:g} s) spent"
        return ""

    try:
        while True:
            # Keep the engine fed: as many configs in flight as it can compile at once.
            while len(in_flight) < max(1, engine.parallelism) and not (stop_reason or out_of_budget()):
                asked = _ask(study, dists, space)
                if asked is None:
                    stop_reason = f"every valid config ({space.count()}) measured"
                    break
                trial, config = asked
                send_heartbeats(study, [trial])
                future = engine.submit(problem.kernel, problem, config)
                in_flight[future] = (trial, config, time.time())
            if not in_flight:
                stop_reason = stop_reason or out_of_budget()
                break
            finished, _ = wait(list(in_flight), timeout=HEARTBEAT_S / 2, return_when=FIRST_COMPLETED)
            send_heartbeats(study, [trial for trial, _c, _t in in_flight.values()])
            for future in finished:
                trial, config, started = in_flight.pop(future)
                result = future.result()
                recorded = store.record_trial(
                    problem,
                    config,
                    result,
                    device=device,
                    software=software,
                    study_name=study.study_name,
                    optuna_trial_number=trial.number,
                    worker=worker_id(),
                    started_at=utc(started),
                    cache=policy,
                )
                tell_result(study, trial, result, duplicate=recorded.duplicate)
                measured_now += 0 if recorded.duplicate else 1
                if result.ok and (best_us is None or result.median_us < best_us):
                    best_us = result.median_us
                if budget.patience and not stop_reason and _stagnated(study, budget.patience):
                    stop_reason = f"no better config in the last {budget.patience} trials (patience)"
                emit(Event("trial", problem, done_before + measured_now, total, best_us,
                           message=f"{result.outcome.value} {config.to_json()}",
                           status=result.outcome.value, time_us=result.median_us,
                           number=trial.number, config=dict(config), log_path=result.log_path))
    finally:
        releasing = True
        for future, (trial, _config, _t) in in_flight.items():
            future.cancel()
            releasing = releasing and release_trial(study, trial)

    confirm_s = confirm_best(kernel, problem, spec, store=store, engine=engine, device=device,
                             software=software, run_id=run_id)
    trace_best(kernel, problem, spec, store, engine, device, results_dir, policy)
    emit(Event("done", problem, done_before + measured_now, total, best_us, message=stop_reason))
    return build_report(kernel, problem, device, store, measured_now=measured_now,
                   repaired=sampler.repaired, stop_reason=stop_reason, cache=policy,
                   confirm_s=confirm_s)


def confirm_best(
    kernel: Kernel,
    problem: Problem,
    spec: ProblemSpec,
    *,
    store: TrialStore,
    engine: EngineLike,
    device: DeviceInfo,
    software: Mapping[str, str],
    run_id: int | None = None,
    only_if_missing: bool = False,
) -> float | None:
    """The confirmation round of ``problem``: its ``spec.confirm_top`` best configs (this
    software, this cache policy) and the baseline re-timed in ``spec.confirm_rounds``
    interleaved rounds (None: adaptive, :func:`~autotune.tuning.confirmation.timed_rounds`),
    each program for ``spec.confirm_iterations`` runs a round (None: sized by its time,
    :func:`~autotune.tuning.confirmation.sized_iterations`); stored with the tie marks as rows
    of their own. Returns the seconds it took, or None when there was nothing to confirm (no
    ``confirm`` on the engine, ``confirm_top`` 0, no ok trial) or, with ``only_if_missing``,
    when the newest confirmation already covers the current best configs.
    """
    confirm = getattr(engine, "confirm", None)
    n_top = spec.confirm_top
    if n_top is None:
        n_top = 0 if device.kind == DeviceKind.INTERPRET else DEFAULT_CONFIRM_TOP
    if confirm is None or n_top <= 0:
        return None
    policy = cache_policy_of(engine)
    versions = {k: software[k] for k in ("jax", "jaxlib") if software.get(k)}
    ranked = store.best(problem, device_name=device.name, device_kind=device.kind,
                        n=n_top + CONFIRM_JOIN_MAX, versions=versions, cache=policy)
    if not ranked:
        return None
    # Below the top ones, configs the search could not tell from the fastest join the round.
    top = ranked[:n_top]
    below = ranked[n_top:]
    top += [below[i] for i in joining_configs([(r.median_us, r.spread) for r in top],
                                              [(r.median_us, r.spread) for r in below])]
    if only_if_missing:
        done = store.confirmations(problem, device_name=device.name, device_kind=device.kind,
                                   cache=policy)
        if done and {p.trial_id for p in done[0].programs} == {r.id for r in top}:
            return None
    start = time.monotonic()
    baseline = kernel.baseline is not None
    # Runs per round sized by each program's time (sized_iterations), unless the job fixes them.
    iterations = [sized_iterations(r.median_us, spec.confirm_iterations) for r in top]
    if baseline:
        stored = store.baseline(problem, device_name=device.name, device_kind=device.kind,
                                cache=policy)
        iterations.append(sized_iterations(getattr(stored, "median_us", None),
                                           spec.confirm_iterations))
    configs = [Config(r.config) for r in top]
    default = kernel.default_config(problem) if kernel.default_config is not None else None
    # A job's confirm_rounds is what it gets; else adaptive rounds (timed_rounds).
    medians_us = [r.median_us for r in top]

    def analyse(rows: list[list[TrialResult]]) -> AnalysedRounds:
        return analyse_rounds(rows, [r.config for r in top], search_us=medians_us,
                              trial_ids=[r.id for r in top], baseline=baseline,
                              default_config=default)

    table = timed_rounds(
        lambda n, first: confirm(problem.kernel, problem, configs, rounds=n, first_round=first,
                                 iterations=iterations, baseline=baseline, medians_us=medians_us),
        lambda rows: analyse(rows).confirmation,
        spec.confirm_rounds,
    )
    analysed = analyse(table)
    for i in analysed.failed:
        bad = next(row[i] for row in table if not row[i].ok)
        logger.warning("%s: confirming %s failed (%s): %s; left out of the confirmation.",
                       problem, Config(top[i].config).to_json(), bad.outcome.value, bad.error)
    if baseline and analysed.confirmation is not None and analysed.base_rounds is None:
        logger.warning("%s: the baseline failed in the confirmation round; no confirmed "
                       "speedup.", problem)
    confirmation, kept, base_rounds = analysed.confirmation, analysed.kept, analysed.base_rounds
    if confirmation is None:
        return time.monotonic() - start
    store.record_confirmation(
        problem, confirmation, trial_ids=[top[i].id for i in kept], device=device,
        software=software, cache=policy, iterations=max(iterations),
        baseline_name=kernel.baseline_name if base_rounds is not None else None, run_id=run_id,
    )
    winner = confirmation.winner
    if confirmation.crowned != 0:
        logger.info("%s: the confirmation round crowned %s (%.2f us) over the search's fastest "
                    "%s", problem, Config(winner.config).to_json(), winner.median_us,
                    Config(top[kept[0]].config).to_json())
    return time.monotonic() - start


def _stagnated(study: optuna.Study, patience: int) -> bool:
    """Whether the last ``patience`` measured configs have all failed to beat the best.

    The rule of Optuna's ``BestValueStagnationEvaluator`` (its ``optuna.terminator`` module is
    deprecated since Optuna 4.9), counted over measured trials only.
    """
    values = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.value is not None]
    if len(values) <= patience:
        return False
    best_at = min(range(len(values)), key=values.__getitem__)
    return len(values) - 1 - best_at >= patience


def utc(ts: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, tz=dt.UTC)


def _ask(study: optuna.Study, dists: Mapping, space: Any) -> tuple[optuna.trial.Trial, Config] | None:
    """Asks for a trial whose config no other trial holds; None when the space is used up.

    Two processes can be handed the same config at the same moment (each proposes before the
    other's params are stored). After asking, a trial that sees an earlier-stored twin steps
    back and asks again: of any two such trials, at least the one that checks last sees the
    other, so never both measure the same config.
    """
    for _ in range(16):
        try:
            trial = new_trial(study, dists)
        except ExhaustedError:
            trial_id = study.sampler.exhausted_trial_id
            if trial_id is not None:
                release_trial(study, oa.trial_number(study, trial_id))
            return None
        config = Config(trial.params)
        key = space.key(config)
        names = set(space.names)
        twins = [
            t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL))
            if t.number != trial.number and names <= set(t.params) and space.key(t.params) == key
            and not (t.state == TrialState.FAIL and OUTCOME_ATTR not in t.system_attrs)
        ]
        if not twins:
            return trial, config
        release_trial(study, trial)
    return None


def new_trial(study: optuna.Study, dists: Mapping) -> optuna.trial.Trial:
    """``study.ask(dists)``, with the trial created already tagged with its owner (one
    transaction): a process killed anywhere in between leaves no RUNNING trial of unknown
    owner, which no later run could safely close."""
    import datetime as dt

    template = optuna.trial.FrozenTrial(
        number=-1, state=TrialState.RUNNING, value=None, datetime_start=dt.datetime.now(),
        datetime_complete=None, params={}, distributions={},
        user_attrs={WORKER_ATTR: worker_id()}, system_attrs={}, intermediate_values={},
        trial_id=-1,
    )
    trial = oa.create_trial(study, template)  # as study.ask does: sample from fresh trials
    # Its first heartbeat before its params: a trial of a process killed before it (it has no
    # params) is closed by close_orphans after GRACE_S; one killed after it goes stale.
    send_heartbeats(study, [trial])
    oa.suggest_all(trial, dists)  # its params in one transaction
    return trial


def release_trial(study: optuna.Study, trial: optuna.trial.Trial | int) -> bool:
    """Closes a trial that was not measured, leaving its config free (FAIL without outcome).

    Returns False when the database cannot be written: the trial stays RUNNING until a later
    run closes it as an orphan, and the error that stopped this run is the one reported.
    """
    try:
        study.tell(trial, state=TrialState.FAIL)
    except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        pass  # already finished (by us, or as stale by another host)
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
        logger.warning("could not release trial %s: %s", getattr(trial, "number", trial),
                       storage_module.failure_reason(e))
        return False
    return True


def tell_result(study: optuna.Study, trial: optuna.trial.Trial, result: TrialResult, *, duplicate: bool) -> None:
    """Reports a stored result to the study. The store is the record: if another host already
    closed the trial (its heartbeat looked stale), the result stays stored all the same."""
    try:
        oa.set_trial_system_attr(study, trial, OUTCOME_ATTR, result.outcome.value)
        if result.ok and not duplicate:
            study.tell(trial, result.median_us)
        else:
            study.tell(trial, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        logger.warning("trial %d was closed by another process; its result is stored", trial.number)


def close_orphans(
    study: optuna.Study, store: TrialStore, problem: Problem, device: DeviceInfo, cache: str = "warm",
    *, finished: bool = False,
) -> None:
    """Closes the RUNNING trials of dead processes: of this host, as soon as the owner's
    process is gone (its pid not running, or running a process of another start time); of any
    host, when its heartbeat stopped GRACE_S ago; and trials never tagged with their owner, or
    without params (it died inside ``study.ask``, before the first heartbeat), that started
    GRACE_S ago. ``finished``: the problem's budget is spent, so a RUNNING trial whose result
    is stored is closed from the store whoever owns it (its owner, if alive, finds it closed
    and keeps its stored result), and none is left RUNNING with a "stale" mark forever.

    A trial whose result reached the store is told from the store; one whose did not is
    released (its config was not measured, so it is free again).
    """
    host = socket.gethostname()
    stale = set(_stale_trial_ids(study))
    orphans = []
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        owner = t.user_attrs.get(WORKER_ATTR, "")
        owner_host = parse_owner(owner)[0]
        if oa.trial_id(t) in stale or owner_dead_here(owner):
            pass
        elif finished and t.params:
            pass  # the problem is done: a trial whose result is stored is told from the store
        elif not owner or (not t.params and owner_host != host):
            if age_s(t.datetime_start) < GRACE_S:
                continue  # its owner may still be inside study.ask
        else:
            continue
        orphans.append(t)
    # The store is read only when there are orphans (this runs every scheduler.POLL_S).
    stored = {Config(r.config).digest(): r
              for r in store.trials(problem, device_name=device.name, cache=cache)} if orphans else {}
    if finished:  # a live owner's trial is closed only once its result is stored
        orphans = [t for t in orphans if oa.trial_id(t) in stale or owner_dead_here(
            t.user_attrs.get(WORKER_ATTR, "")) or not t.params
            or Config(t.params).digest() in stored]
    for t in orphans:
        row = stored.get(Config(t.params).digest()) if t.params else None
        if row is None:
            release_trial(study, t.number)
        else:
            try:
                oa.set_trial_system_attr(study, t, OUTCOME_ATTR, row.status)
                if row.status == Outcome.OK.value and row.median_us is not None:
                    study.tell(t.number, row.median_us)
                else:
                    study.tell(t.number, state=TrialState.FAIL)
            except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                pass  # another process closed it meanwhile, from the same stored row
    if stale:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)


def close_finished(storage: Any, store: TrialStore, problem: Problem, device: DeviceInfo,
                   cache: str = "warm") -> None:
    """A finished problem's RUNNING trials of dead owners, or whose results are stored, are
    closed (a process killed after storing its last trial left one RUNNING, and no runner
    opens a finished problem's study again)."""
    try:
        study = optuna.load_study(study_name=study_name(problem, device, cache), storage=storage)
    except KeyError:
        return  # never tuned through a study (imported results)
    close_orphans(study, store, problem, device, cache, finished=True)


def running_owners(study: optuna.Study) -> list[tuple[str, bool]]:
    """The RUNNING trials of ``study``: ``(owner "host:pid:start", dead)`` each; dead when its
    process is known gone on this host (:func:`owner_dead_here`) or its heartbeat stopped more
    than GRACE_S ago (``autotune status``)."""
    stale = set(_stale_trial_ids(study))
    return [(owner, oa.trial_id(t) in stale or owner_dead_here(owner))
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            for owner in [str(t.user_attrs.get(WORKER_ATTR, ""))]]


def _stale_trial_ids(study: optuna.Study) -> list[int]:
    """RUNNING trials whose heartbeat stopped more than GRACE_S ago (Optuna's rule)."""
    return oa.stale_trial_ids(study)


def age_s(start: Any) -> float:
    """Seconds since ``start`` (Optuna's datetimes are naive local time)."""
    import datetime as dt

    if start is None:
        return float("inf")
    now = dt.datetime.now(start.tzinfo) if start.tzinfo else dt.datetime.now()
    return (now - start).total_seconds()


def is_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def problem_sampler(
    kernel: Kernel,
    problem: Problem,
    spec: ProblemSpec,
    space: BoundSpace,
    *,
    store: TrialStore,
    device: DeviceInfo,
    policy: str,
    stored_configs: Sequence[Mapping[str, Any]],
) -> ValidSampler:
    """The sampler a problem is tuned with, as the tuner and the scheduler pick it: the
    known-good default first (unless switched off), then the winners of related problems (the
    ranked sampler scores those with its model instead); ``auto`` resolved from what is stored
    (:func:`~autotune.tuning.sampling.resolve_sampler`), with the kernel's cost model.
    ``stored_configs``: results stored before this run (other studies, other processes), taken;
    this run's own and other hosts' live trials are in the shared study, which the sampler
    reads."""
    seeds: list[Mapping[str, Any]] = []
    if kernel.default_config is not None and spec.known_good:
        seeds.append(kernel.default_config(problem))
    related = related_winners(store, problem, device, policy)
    history = stored_history(store, problem, device) if reads_history(spec.sampler) else []
    # The valid set is counted only where it decides (resolve_sampler calls space.count last):
    # a count of a 10^5-config space takes seconds.
    sampler_name = resolve_sampler(spec.sampler, history=history, problem=problem,
                                   valid_count=space.count,
                                   cost_model=kernel.cost_model is not None)
    logger.info("%s: sampler %s (%s)", problem, sampler_name, spec.sampler)
    return valid_sampler(sampler_name, space, seed=spec.seed, seeds=seeds, related=related,
                         history=history, estimate=kernel.cost_model,
                         taken=lambda: stored_configs)


def related_winners(
    store: TrialStore, problem: Problem, device: DeviceInfo, cache: str = "warm", limit: int = 3
) -> list[Mapping[str, Any]]:
    """Best configs of the nearest tuned problems of the same kernel and dtype on ``device``;
    on a GPU, then the best config of this very problem on each other GPU that has one (a
    prior from another device: proposed or ranked like any related winner, never counted as
    measured here).

    Distance between shapes: :func:`autotune.space.problem.shape_distance` (the sum over size keys
    of |log2(a/b)|; non-size keys such as ``causal`` must match).
    """
    from autotune.space.problem import shape_distance

    candidates = []
    for other in store.problems(problem.kernel):
        if other == problem or other.dtype != problem.dtype:
            continue
        dist = shape_distance(problem.dims, other.dims)
        if dist != float("inf"):
            candidates.append((dist, other))
    candidates.sort(key=lambda t: t[0])
    out: list[Mapping[str, Any]] = []
    for _dist, other in candidates[:limit]:
        best = store.best(other, device_name=device.name, device_kind=device.kind, n=1)
        if best:  # of its own preferred policy: a winner's config is a good seed either way
            out.append(best[0].config)
    if device.kind == DeviceKind.GPU:
        names = sorted({d.name for d in store.devices() if d.kind == device.kind} - {device.name})
        for name in names:
            best = store.best(problem, device_name=name, device_kind=device.kind, n=1)
            if best and best[0].config not in out:
                out.append(best[0].config)
    return out


def trace_best(
    kernel: Kernel,
    problem: Problem,
    spec: ProblemSpec,
    store: TrialStore,
    engine: EngineLike,
    device: DeviceInfo,
    results_dir: str | Path,
    cache: str = "warm",
) -> None:
    """In-kernel traces of the ``trace_top_k`` best configs not traced yet (GPU only)."""
    if spec.trace_top_k <= 0 or not device.is_gpu:
        return
    # The profiler's buffer takes shared memory: trace the best configs that still fit with it.
    traced_space = kernel.bind(problem, profile_space=TRACE_PROFILE_SPACE)
    fits = [
        row for row in store.best(problem, device_name=device.name, device_kind=device.kind,
                                  n=4 * spec.trace_top_k, cache=cache)
        if traced_space.is_valid(row.config)
    ][: spec.trace_top_k]
    for row in fits:
        if getattr(row, "traced", False):
            continue
        config = Config(row.config)
        try:
            # Never through a link another user left in the results folder: refused, logged.
            out_dir = output_dir(results_dir, "traces", problem.kernel, problem.digest(),
                                 config.digest())
            regions = engine.trace(problem.kernel, problem, config, str(out_dir), TRACE_PROFILE_SPACE)
        except Exception as e:  # noqa: BLE001 - a failed trace must not lose the tuning
            logger.warning("tracing %s %s failed: %s", problem, config.to_json(), e)
            continue
        if regions:
            store.record_trace_regions(row.id, regions, str(out_dir))


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
    if confirmation is not None:
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
        flops=kernel.flops(problem) if kernel.flops else None,
        bytes_moved=kernel.bytes_moved(problem) if kernel.bytes_moved else None,
        by_status=by_status,
        measured_now=measured_now,
        repaired=repaired,
        skipped=skipped,
        stop_reason=stop_reason,
        device_kind=device.kind,
    )

"""A job run: the checks before it, the run's record around it, and the scheduler inside it.

:func:`run_job` is the one entry to tuning (``autotune tune`` and :func:`autotune.tune` reach it
through ``autotune.api.run_tuning``): it refuses a store that keeps nothing and a job whose
cache policy is not the engine's, awaits the engine's device while it counts the problems'
valid configs, checks the interpret-only rules up front, records the run with the GPU's clocks
before and after (a GPU that throttled or whose clock moved is logged as a warning), and words
database failures with the way out. The problems themselves are tuned by the one run loop,
:func:`autotune.tuning.scheduler.run_scheduled` (ask, submit, store, tell; every problem in
flight together, or one after another with ``sequential``).

Every timing of a job uses the engine's cache policy (``engine.cache_policy``: ``cold`` or
``warm``); what the store holds of the other policy is neither resumed from nor compared with.
Resuming is the normal case, not a special one: what the store and the study already hold is
never measured again.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import sqlalchemy.exc

from autotune._paths import default_results_dir
from autotune.engine.protocol import EngineLike
from autotune.errors import JobError, NoValidConfigError, StorageError
from autotune.evaluation.clocks import ClockSnapshot, clock_warnings, gpu_index, read_clocks
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind
from autotune.storage import connection as storage_connection
from autotune.storage.protocol import TrialStore
from autotune.storage.urls import in_memory
from autotune.tuning.jobs import Job
from autotune.tuning.provenance import cache_policy_of
from autotune.tuning.reports import Event, ProblemReport
from autotune.tuning.scheduler import run_scheduled
from autotune.tuning.studies import optuna_storage

__all__ = ["run_job", "require_persistent", "require_interpret_configs", "device_while_counting",
           "job_switch_interval", "JOB_SWITCH_INTERVAL_S"]

logger = logging.getLogger(__name__)

# Python's GIL switch interval in the job's process while a job runs (Python's default: 5 ms).
# The loop's every database statement lets go of the GIL and must win it back from the threads
# that hold it in Python (the ranked samplers climbing on their cost model, proposals made
# ahead): on the H200 host, storing a result took a median 43.7-58.0 ms instead of 6.8-7.1 ms
# while four hopper_matmul samplers climbed at 5 ms, 7.8-9.2 ms at 0.5 ms
# (benchmarks/gil_contention.py, benchmarks/RESULTS.md §9).
JOB_SWITCH_INTERVAL_S = 0.0005


# Jobs that overlap on threads of one process share the short interval; the last one out
# restores the one from before.
_SWITCH_LOCK = threading.Lock()
_SWITCH_USERS = 0
_SWITCH_BEFORE = 0.0


@contextlib.contextmanager
def job_switch_interval() -> Iterator[None]:
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
    docs/scheduling.md). ``sequential=True``: the same scheduler with one problem open at a
    time, in job order (``benchmarks/batch_job.py --sequential`` compares the two).

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
        reason = storage_connection.failure_reason(e)
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
    reports = run_scheduled(job, store=store, engine=engine, storage=storage,
                            results_dir=results_dir, on_event=on_event,
                            allow_import=allow_import, run_id=run_id,
                            one_at_a_time=sequential)
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
    return (storage_connection.damaged_hint(reason)
            or "The trials stored until then are kept; run the job again to resume (re-run).")

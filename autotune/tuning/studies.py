"""A problem's Optuna study, shared by every process that tunes it: its name, opening it, who
owns each trial, heartbeats, and closing the trials of dead processes.

One study per (problem, device, cache policy) lives in the results database beside the store
(docs/architecture.md, "Two records"). A trial is created already tagged with its owner
(``host:pid:start``, :data:`WORKER_ATTR`), kept alive by heartbeats while it is measured, and
closed by whoever finds its owner dead: told from the store when its result was stored,
released (its config free again) when not. The queries read studies through this module
(``autotune status``, ``autotune report``), so it imports neither jax, the engine nor the
evaluation.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.space.problem import Config, Problem
from autotune.storage import connection as storage_connection
from autotune.tuning import optuna_adapter as oa
from autotune.tuning.trial_index import OUTCOME_ATTR, is_measured

if TYPE_CHECKING:
    from autotune.space.outcomes import DeviceInfo, TrialResult
    from autotune.storage.protocol import TrialStore

__all__ = [
    "METRIC_NAME", "WORKER_ATTR", "HEARTBEAT_S", "GRACE_S",
    "study_name", "legacy_study_name", "open_study", "optuna_storage",
    "worker_id", "process_start", "parse_owner", "owner_dead_here", "is_alive", "age_s",
    "send_heartbeats", "beat_interval_s", "new_trial", "release_trial", "tell_result",
    "close_orphans", "close_finished", "never_admitted", "running_owners",
]

logger = logging.getLogger(__name__)

# "host:pid:start" of the process that asked for the trial; start is the process's start time
# (/proc/PID/stat, clock ticks since boot), so that a pid reused by another process is not taken
# for the owner. Older runners wrote "host:pid".
WORKER_ATTR = "autotune_worker"


# Another host treats a trial as dead (and frees its config) after GRACE_S without a heartbeat:
# two heartbeat intervals (heartbeats are written every HEARTBEAT_S / 3).
HEARTBEAT_S = 30
GRACE_S = 2 * HEARTBEAT_S


METRIC_NAME = "median_us"  # the objective, as optuna-dashboard and Study.metric_names show it


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


def optuna_storage(url: str) -> optuna.storages.BaseStorage:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 2 * storage_connection.SQLITE_BUSY_TIMEOUT_S}
    else:
        kwargs["pool_pre_ping"] = True
    # The heartbeat lets other hosts see a dead host's trials as stale and redo them.
    # Several processes opening a fresh database race to create Optuna's tables; the loser
    # sees "already exists" and simply opens again.
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


def age_s(start: Any) -> float:
    """Seconds since ``start`` (Optuna's datetimes are naive local time)."""
    if start is None:
        return float("inf")
    now = dt.datetime.now(start.tzinfo) if start.tzinfo else dt.datetime.now()
    return float((now - start).total_seconds())


_last_beat: dict[tuple[int, int], float] = {}  # (storage, trial id) -> last heartbeat written


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
        if now - _last_beat.get(key, -HEARTBEAT_S) >= beat_interval_s():
            storage.record_heartbeat(oa.trial_id(trial))
            _last_beat[key] = now


def beat_interval_s() -> float:
    """A third of the heartbeat interval, and at most a sixth of the grace period after which
    other hosts treat a trial as dead."""
    return min(HEARTBEAT_S, GRACE_S / 2) / 3


def _heartbeat_storage(study: optuna.Study) -> Any:
    """The study's storage if it keeps heartbeats (:func:`optuna_adapter.heartbeat_storage`)."""
    return oa.heartbeat_storage(study)


def new_trial(study: optuna.Study, dists: Mapping[str, Any]) -> optuna.trial.Trial:
    """``study.ask(dists)``, with the trial created already tagged with its owner (one
    transaction): a process killed anywhere in between leaves no RUNNING trial of unknown
    owner, which no later run could safely close."""
    template = optuna.trial.FrozenTrial(
        number=-1, state=TrialState.RUNNING, value=None, datetime_start=dt.datetime.now(),
        datetime_complete=None, params={}, distributions={},
        user_attrs={WORKER_ATTR: worker_id()}, system_attrs={}, intermediate_values={},
        trial_id=-1,
    )
    trial = oa.create_trial(study, template)  # as study.ask does: sample from fresh trials
    # Its first heartbeat is written with its params, in one transaction: a trial of a process
    # killed before it has neither (no params: close_orphans closes it after GRACE_S); one
    # killed after it goes stale. One commit, not two, per ask (issue 36).
    storage = _heartbeat_storage(study)
    oa.suggest_all(trial, dists, heartbeat=storage is not None)
    if storage is not None:
        _last_beat[(id(storage), oa.trial_id(trial))] = time.monotonic()
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
                       storage_connection.failure_reason(e))
        return False
    return True


def tell_result(study: optuna.Study, trial: optuna.trial.Trial, result: TrialResult, *, duplicate: bool) -> None:
    """Reports a stored result to the study. The store is the record: if another host already
    closed the trial (its heartbeat looked stale), the result stays stored all the same."""
    try:
        # The outcome, then the state and value: Optuna's reads of the trial around the tell
        # are answered from the trial as asked (6 statements and 2 commits, not 18 and 4).
        if result.ok and not duplicate:
            oa.tell(study, trial, result.median_us, system_attrs={OUTCOME_ATTR: result.outcome.value})
        else:
            oa.tell(study, trial, state=TrialState.FAIL,
                    system_attrs={OUTCOME_ATTR: result.outcome.value})
    except optuna.exceptions.UpdateFinishedTrialError:
        logger.warning("trial %d was closed by another process; its result is stored", trial.number)


def close_orphans(
    study: optuna.Study, store: TrialStore, problem: Problem, device: DeviceInfo, cache: str = "warm",
    *, finished: bool = False, admits: int | None = None,
) -> None:
    """Closes the RUNNING trials of dead processes: of this host, as soon as the owner's
    process is gone (its pid not running, or running a process of another start time); of any
    host, when its heartbeat stopped GRACE_S ago; and trials never tagged with their owner, or
    without params (it died inside ``study.ask``, before the first heartbeat), that started
    GRACE_S ago. ``finished``: the problem's budget is spent, so a RUNNING trial whose result
    is stored is closed from the store whoever owns it (its owner, if alive, finds it closed
    and keeps its stored result), and none is left RUNNING with a "stale" mark forever.
    ``admits`` (with ``finished``): how many of the study's trials the budget admits; a RUNNING
    trial numbered after that many that count is closed too, whoever owns it, with its params
    or still without them (:func:`never_admitted`; a live owner still sampling it finds it
    closed when it writes the params, and asks no more).

    A trial whose result reached the store (the stored row names its trial number) is told
    from the store; one whose did not is released (its config, unless another trial's result
    holds it, is free again).
    """
    host = socket.gethostname()
    stale = set(_stale_trial_ids(study))
    orphans = []
    trials = study.get_trials(deepcopy=False)  # one read: the running and the budget's count
    running = [t for t in trials if t.state == TrialState.RUNNING]
    over = never_admitted(trials, admits) if finished and admits is not None and running else set()
    for t in running:
        owner = t.user_attrs.get(WORKER_ATTR, "")
        owner_host = parse_owner(owner)[0]
        if oa.trial_id(t) in stale or owner_dead_here(owner) or t.number in over:
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
    if finished:  # a live owner's trial is closed only once its result is stored, or when
        # the budget could never admit it (its owner, if alive, releases it all the same)
        orphans = [t for t in orphans if oa.trial_id(t) in stale or owner_dead_here(
            t.user_attrs.get(WORKER_ATTR, "")) or not t.params
            or Config(t.params).digest() in stored or t.number in over]
    for t in orphans:
        row = stored.get(Config(t.params).digest()) if t.params else None
        if row is None or row.optuna_trial_number not in (None, t.number):
            # Not measured by this trial: never, or by an earlier trial of the same config (a
            # twin whose owner died before releasing it), whose result is the one stored.
            release_trial(study, t.number)
        else:
            try:
                oa.set_trial_system_attr(study, t, OUTCOME_ATTR, row.status)
                if row.ok and row.median_us is not None:
                    study.tell(t.number, row.median_us)
                else:
                    study.tell(t.number, state=TrialState.FAIL)
            except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                pass  # another process closed it meanwhile, from the same stored row
    if stale:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)


def never_admitted(trials: Sequence[optuna.trial.FrozenTrial], admits: int) -> set[int]:
    """Numbers of the RUNNING ``trials`` (a study's) numbered after ``admits`` trials that count
    against the budget (measured, or RUNNING: as ``TrialIndex.counting_before`` counts them).
    The budget's exact check (``scheduler._Run._admitted``) never admitted them, so no process
    measures them: a process killed between asking one and releasing it left it RUNNING.
    Optuna numbers a study's trials under a lock on the study, so every trial numbered before
    one was there when its owner checked it, and the count before a trial never grows after:
    a trial over the budget now was over it then."""
    counted, over = 0, set()
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == TrialState.RUNNING:
            if counted >= admits:
                over.add(t.number)
            counted += 1
        elif is_measured(t):
            counted += 1
    return over


def close_finished(storage: Any, store: TrialStore, problem: Problem, device: DeviceInfo,
                   cache: str = "warm", *, admits: int | None = None) -> None:
    """A finished problem's RUNNING trials of dead owners, whose results are stored, or that
    its budget (``admits`` trials of the study) never admitted, are closed (a process killed
    after storing its last trial, or between asking a trial over the budget and releasing it,
    left one RUNNING, and no runner opens a finished problem's study again)."""
    try:
        study = optuna.load_study(study_name=study_name(problem, device, cache), storage=storage)
    except KeyError:
        return  # never tuned through a study (imported results)
    close_orphans(study, store, problem, device, cache, finished=True, admits=admits)


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



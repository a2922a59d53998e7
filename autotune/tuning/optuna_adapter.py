"""The one place that touches Optuna's private names, pinned to the Optuna versions it is tested on.

autotune relies on a few things Optuna does not export: a trial's storage id, a study's
storage and id, the per-thread cache of a study's trials, ``Trial._suggest``, the heartbeat
base class and its stale-trial query, and, to spare the ask and the tell statements on an RDB
storage (issue 36), the trials ``_CachedStorage`` holds and its bookkeeping of them, a live
trial's frozen copy, the RDB models' tables and session, and ``RDBStorage``'s conversion of a
stored trial. Every use is a function here, and ``tests/tuning/test_optuna_adapter.py`` pins
exactly the behaviour relied on. Importing this module with an Optuna outside
:data:`SUPPORTED` raises ImportError naming the range and the version found; ``pyproject.toml`` declares the same range.

Public Optuna API (``study.tell``, ``study.get_trials``, ``RDBStorage``, ``fail_stale_trials``,
samplers) is used directly by the tuning modules; only private names live here.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import random
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages._rdb import models as _models
from optuna.storages._rdb.storage import _create_scoped_session

__all__ = [
    "SUPPORTED",
    "check_version",
    "trial_id",
    "study_storage",
    "heartbeat_storage",
    "stale_trial_ids",
    "create_trial",
    "suggest",
    "suggest_all",
    "tell",
    "set_trial_system_attr",
    "trial_number",
    "has_studies_table",
    "one_read",
    "read_trials",
]

# The Optuna versions the adapter's tests pass on: >= 5.0, < 5.2 (as in pyproject.toml).
SUPPORTED = ((5, 0), (5, 2))
SUPPORTED_TEXT = "optuna>=5.0,<5.2"


def check_version(found: str) -> None:
    """Raises ImportError unless Optuna ``found`` (a version string) is in :data:`SUPPORTED`."""
    try:
        major_minor = tuple(int(x) for x in found.split(".")[:2])
    except ValueError:
        major_minor = ()
    low, high = SUPPORTED
    if not (len(major_minor) == 2 and low <= major_minor < high):
        raise ImportError(
            f"autotune needs {SUPPORTED_TEXT} (its Optuna adapter, autotune.tuning.optuna_adapter, "
            f"uses private Optuna names tested on that range), but found optuna {found}. "
            f"Install a supported version: pip install '{SUPPORTED_TEXT}'."
        )


check_version(optuna.__version__)


def trial_id(trial: optuna.trial.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial (not its number), for a live or a frozen trial."""
    return trial._trial_id


def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage a study reads and writes through (Optuna's cache around an RDBStorage)."""
    return study._storage


def heartbeat_storage(study: optuna.Study) -> BaseHeartbeat | None:
    """The study's storage if it keeps heartbeats (Optuna's cache around the RDBStorage is a
    BaseHeartbeat too, though not an RDBStorage); None otherwise."""
    storage = study._storage
    if isinstance(storage, BaseHeartbeat) and storage.get_heartbeat_interval():
        return storage
    return None


def stale_trial_ids(study: optuna.Study) -> list[int]:
    """RUNNING trials whose heartbeat stopped more than the grace period ago (Optuna's rule);
    empty when the storage keeps no heartbeats."""
    storage = heartbeat_storage(study)
    return [] if storage is None else list(storage._get_stale_trial_ids(study._study_id))


def create_trial(study: optuna.Study, template: optuna.trial.FrozenTrial) -> optuna.trial.Trial:
    """A new RUNNING trial of ``study`` created from ``template`` in one storage write (its
    user attributes included), as ``study.ask`` creates one; the study's cached trials are
    dropped first so that the sampler proposes from fresh trials.

    ``optuna.trial.Trial`` reads the trial it was just given back from the storage (for a
    RUNNING trial, 6 statements and a commit on an RDB storage); Optuna's cache already holds
    it as created, so it is answered from there (issue 36). On an RDB storage, a template
    without params, values or intermediate values (the scheduler's) is written with plain SQL
    statements, the rows ``RDBStorage`` writes (:func:`_create_rdb_trial`)."""
    study._thread_local.cached_all_trials = None  # as study.ask does
    storage = study._storage
    backend = _rdb_backend(storage)
    if backend is not None and not (template.params or template.values is not None
                                    or template.intermediate_values):
        frozen: optuna.trial.FrozenTrial | None = _create_rdb_trial(
            storage, backend, study._study_id, template)
        assert frozen is not None
        created = frozen._trial_id
    else:
        created = storage.create_new_trial(study._study_id, template_trial=template)
        frozen = _cached_trial(storage, created)
    if frozen is None:
        return optuna.trial.Trial(study, created)
    with _answering(study, copy.deepcopy(frozen)):  # a copy: the Trial's own, as a read gives
        trial = optuna.trial.Trial(study, created)
    trial.storage = storage
    return trial


def _rdb_backend(storage: Any) -> optuna.storages.RDBStorage | None:
    """The RDBStorage behind Optuna's cache (None for any other storage)."""
    backend = getattr(storage, "_backend", None)
    if isinstance(storage, _CachedStorage) and isinstance(backend, optuna.storages.RDBStorage):
        return backend
    return None


_TRIALS = _models.TrialModel.__table__
_STUDIES = _models.StudyModel.__table__
_PARAMS = _models.TrialParamModel.__table__
_VALUES = _models.TrialValueModel.__table__
_USER_ATTRS = _models.TrialUserAttributeModel.__table__
_SYSTEM_ATTRS = _models.TrialSystemAttributeModel.__table__
_INTERMEDIATE = _models.TrialIntermediateValueModel.__table__
_HEARTBEATS = _models.TrialHeartbeatModel.__table__
_RETRIES = 5  # RDBStorage._create_new_trial's
# The ask path's statements, built once (building one costs about as much as running it).
_LOCK_STUDY = sa.select(_STUDIES.c.study_id).where(
    _STUDIES.c.study_id == sa.bindparam("study_id")).with_for_update()
_COUNT_BEFORE = sa.select(sa.func.count(_TRIALS.c.trial_id)).where(
    _TRIALS.c.study_id == sa.bindparam("study_id"), _TRIALS.c.trial_id < sa.bindparam("trial_id"))
_SET_NUMBER = sa.update(_TRIALS).where(_TRIALS.c.trial_id == sa.bindparam("trial_id_")).values(
    number=sa.bindparam("number_"), state=sa.bindparam("state_"))
_TRIAL_STATE = sa.select(_TRIALS.c.state).where(_TRIALS.c.trial_id == sa.bindparam("trial_id"))
_INSERT = {table: sa.insert(table) for table in (_TRIALS, _PARAMS, _USER_ATTRS, _SYSTEM_ATTRS,
                                                 _HEARTBEATS)}


class _TrialRow:
    """A stored trial as ``RDBStorage._build_frozen_trial_from_trial_model`` reads a
    ``TrialModel``: its columns, its child rows, and the model's own datetime conversion
    (naive UTC stored, naive local time read)."""

    datetime_start = vars(_models.TrialModel)["datetime_start"]
    datetime_complete = vars(_models.TrialModel)["datetime_complete"]

    def __init__(self, row: Any) -> None:
        self.trial_id, self.number, self.state = row.trial_id, row.number, row.state
        self._datetime_start_utc = row.datetime_start
        self._datetime_complete_utc = row.datetime_complete
        self.params: list[Any] = []
        self.values: list[Any] = []
        self.user_attributes: list[Any] = []
        self.system_attributes: list[Any] = []
        self.intermediate_values: list[Any] = []


@contextlib.contextmanager
def _transaction(backend: optuna.storages.RDBStorage, *,
                 ignore_integrity_error: bool = False) -> Iterator[sa.Connection]:
    """A connection of the RDB storage's engine in one transaction, committed at the end; its
    errors as ``_create_scoped_session`` gives them (an integrity error as is, or ignored;
    any other database error as ``StorageInternalError``)."""
    try:
        with backend.engine.begin() as conn:
            yield conn
    except sa.exc.IntegrityError:
        if not ignore_integrity_error:
            raise
    except sa.exc.SQLAlchemyError as e:
        raise optuna.exceptions.StorageInternalError(
            "An exception is raised during the commit. This typically happens due to invalid "
            "data in the commit, e.g. exceeding max length. ") from e


def _create_rdb_trial(storage: Any, backend: optuna.storages.RDBStorage, study_id: int,
                      template: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
    """``_CachedStorage.create_new_trial`` for a template without params, values or
    intermediate values: the rows ``RDBStorage._create_new_trial`` writes (the trial, its
    attributes, its number: the count of the study's trials with a lower id), in one
    transaction with the study's row locked, retried as it retries: 5 statements (its 6 less a
    read of the trial) and no ORM session, about 2 ms of CPU, not 4.7 (issue 36). The trial
    then goes into Optuna's cache as there."""
    for attempt in range(1, _RETRIES + 1):
        try:
            with _transaction(backend) as conn:
                if conn.execute(_LOCK_STUDY, {"study_id": study_id}).first() is None:
                    raise KeyError(_models.NOT_FOUND_MSG)
                row = _TrialRow.__new__(_TrialRow)  # the model's setters: naive UTC
                row.datetime_start = template.datetime_start
                row.datetime_complete = template.datetime_complete
                inserted = conn.execute(_INSERT[_TRIALS], {
                    "study_id": study_id, "number": None, "state": optuna.trial.TrialState.RUNNING,
                    "datetime_start": row._datetime_start_utc,
                    "datetime_complete": row._datetime_complete_utc}).inserted_primary_key
                assert inserted is not None
                trial_id: int = inserted[0]
                for table, attrs in ((_USER_ATTRS, template.user_attrs),
                                     (_SYSTEM_ATTRS, template.system_attrs)):
                    if attrs:
                        conn.execute(_INSERT[table], [
                            {"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                            for k, v in attrs.items()])
                number: int = conn.execute(
                    _COUNT_BEFORE, {"study_id": study_id, "trial_id": trial_id}).scalar_one()
                conn.execute(_SET_NUMBER, {"trial_id_": trial_id, "number_": number,
                                           "state_": template.state})
            break
        except optuna.exceptions.StorageInternalError:
            if attempt == _RETRIES:
                raise
            time.sleep(random.random() * 2.0)
    frozen = copy.deepcopy(template)
    frozen.number = number
    frozen.datetime_start = row.datetime_start
    frozen._trial_id = trial_id
    with storage._lock:
        if study_id not in storage._studies:
            storage._studies[study_id] = _StudyInfo()
        storage._add_trials_to_cache(study_id, [frozen])
    return frozen


def tell(
    study: optuna.Study, trial: optuna.trial.Trial, value: float | None = None, *,
    state: optuna.trial.TrialState | None = None, system_attrs: Mapping[str, Any] | None = None,
) -> None:
    """Writes ``system_attrs`` on ``trial`` (one of this process's, from :func:`create_trial`),
    then ``study.tell(trial, value, state=state)``.

    ``study.tell`` reads the trial from the storage before and after it writes the result (on
    an RDB storage, 12 statements and 2 commits of a tell's 18 and 4); both reads are answered
    from the trial as this process holds it (its params as suggested, the attributes written
    here), its state and value as told. Errors are Optuna's: a trial another process closed
    raises ``UpdateFinishedTrialError`` when written, as before."""
    storage = study._storage
    tid = trial._trial_id
    for key, attr in (system_attrs or {}).items():
        storage.set_trial_system_attr(tid, key, attr)
    frozen = copy.deepcopy(trial._cached_frozen_trial)
    frozen.system_attrs = {**frozen.system_attrs, **(system_attrs or {})}
    with _answering(study, frozen):
        study.tell(trial, value, state=state)


def _cached_trial(storage: Any, trial_id: int) -> optuna.trial.FrozenTrial | None:
    """The trial ``trial_id`` as Optuna's cache holds it (None for other storages)."""
    if not isinstance(storage, _CachedStorage):
        return None
    with storage._lock:
        where = storage._trial_id_to_study_id_and_number.get(trial_id)
        if where is None or where[0] not in storage._studies:
            return None
        return storage._studies[where[0]].trials.get(where[1])


@contextlib.contextmanager
def _answering(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> Iterator[None]:
    """Within the block, the study's storage answers ``get_trial`` for ``frozen``'s trial with
    ``frozen`` (updated by the block's ``set_trial_state_values``); every other call goes
    through. The scheduler's thread is the only one that uses a study's storage."""
    storage = study._storage
    study._storage = _Known(storage, frozen)  # type: ignore[assignment]
    try:
        yield
    finally:
        study._storage = storage


class _Known:
    """A study's storage that answers ``get_trial`` for one trial from what this process
    knows of it; every other call goes through."""

    def __init__(self, storage: Any, frozen: optuna.trial.FrozenTrial) -> None:
        self._storage = storage
        self._frozen = frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        if trial_id == self._frozen._trial_id:
            return self._frozen
        result: optuna.trial.FrozenTrial = self._storage.get_trial(trial_id)
        return result

    def set_trial_state_values(
        self, trial_id: int, state: optuna.trial.TrialState, values: Sequence[float] | None = None,
    ) -> bool:
        done: bool = self._storage.set_trial_state_values(trial_id, state, values)
        if done and trial_id == self._frozen._trial_id:
            frozen = copy.copy(self._frozen)
            frozen.state = state
            frozen.values = None if values is None else list(values)
            if state.is_finished():
                frozen.datetime_complete = dt.datetime.now()
            self._frozen = frozen
        return done


def suggest(trial: optuna.trial.Trial, name: str, distribution: Any) -> Any:
    """Asks the study's sampler for parameter ``name`` of ``trial`` (``Trial._suggest``: any
    distribution, relative sampling first, as ``study.ask(fixed_distributions)`` does)."""
    return trial._suggest(name, distribution)


def suggest_all(trial: optuna.trial.Trial, dists: Mapping[str, Any], *, heartbeat: bool = False) -> None:
    """:func:`suggest` for every parameter of ``dists`` in order, the values chosen as
    ``Trial._suggest`` chooses them (relative sampling first), and written to an RDB storage in
    one transaction instead of one per parameter; ``heartbeat``: the trial's first heartbeat
    is written in that transaction too (a new trial, of a storage that keeps heartbeats).

    A dozen commits made each ask of the scheduler's loop cost 30-70 ms on SQLite (most of it
    the commits); one costs a few. Other storages get one write per parameter, as before. If
    the write fails, none of the parameters is stored (nor the heartbeat) and the error
    propagates.
    """
    storage = trial.storage
    batch: Any = _ParamBatch(storage)  # stands in for the storage, for these writes only
    trial.storage = batch  # what Trial._suggest writes through
    try:
        for name, distribution in dists.items():
            trial._suggest(name, distribution)
    finally:
        trial.storage = storage
    batch.flush(trial._trial_id, heartbeat=heartbeat)


class _ParamBatch:
    """A trial's storage that holds back ``set_trial_param`` until :meth:`flush`; every other
    call goes through."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self._params: list[tuple[str, float, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def set_trial_param(self, trial_id: int, name: str, value: float, distribution: Any) -> None:
        self._params.append((name, value, distribution))

    def flush(self, trial_id: int, *, heartbeat: bool = False) -> None:
        storage, params = self._storage, self._params
        backend = getattr(storage, "_backend", None)
        if not (isinstance(storage, _CachedStorage)
                and isinstance(backend, optuna.storages.RDBStorage)):
            for name, value, distribution in params:
                storage.set_trial_param(trial_id, name, value, distribution)
            if heartbeat:
                storage.record_heartbeat(trial_id)
            return
        if not params and not heartbeat:
            return
        # _CachedStorage.set_trial_param for many parameters: the study's known distributions
        # (the compatibility check) under its lock, and RDBStorage's write of each in one
        # transaction. RDBStorage._set_trial_param_without_commit reads the trial again for
        # every parameter (is it still updatable?) and inserts each row on its own: 20 of the
        # ask's statements. One check, then one executemany (issue 36), as plain SQL once the
        # study knows every parameter (its first trial's go through Optuna's own check).
        with storage._lock:
            study_id, _ = storage._trial_id_to_study_id_and_number[trial_id]
            known = storage._studies[study_id].param_distribution
            if all(name in known for name, _v, _d in params):
                rows = []
                for name, value, distribution in params:
                    optuna.distributions.check_distribution_compatibility(known[name], distribution)
                    rows.append({"trial_id": trial_id, "param_name": name, "param_value": value,
                                 "distribution_json": optuna.distributions.distribution_to_json(distribution)})
                with _transaction(backend, ignore_integrity_error=True) as conn:
                    state = conn.scalar(_TRIAL_STATE, {"trial_id": trial_id})
                    if state is None:
                        raise KeyError(_models.NOT_FOUND_MSG)
                    backend.check_trial_is_updatable(trial_id, state)
                    if rows:
                        conn.execute(_INSERT[_PARAMS], rows)
                    if heartbeat:  # as RDBStorage.record_heartbeat writes a trial's first
                        conn.execute(_INSERT[_HEARTBEATS], {"trial_id": trial_id})
                return
            with _create_scoped_session(backend.scoped_session, True) as session, \
                    session.no_autoflush:  # the rows go in together, at the commit
                trial = _models.TrialModel.find_or_raise_by_id(trial_id, session)
                backend.check_trial_is_updatable(trial_id, trial.state)
                rows = []
                for name, value, distribution in params:
                    previous = known.get(name)
                    if previous is None:  # the study's first: Optuna's own check reads it
                        backend._set_trial_param_without_commit(
                            session, trial_id, name, value, distribution, None)
                        continue
                    optuna.distributions.check_distribution_compatibility(previous, distribution)
                    rows.append({"trial_id": trial_id, "param_name": name, "param_value": value,
                                 "distribution_json": optuna.distributions.distribution_to_json(distribution)})
                if rows:
                    session.execute(sa.insert(_PARAMS), rows)
                if heartbeat:  # as RDBStorage.record_heartbeat writes a trial's first
                    session.add(_models.TrialHeartbeatModel(trial_id=trial_id))
            for name, _value, distribution in params:
                known.setdefault(name, distribution)


@contextlib.contextmanager
def one_read(study: optuna.Study) -> Iterator[None]:
    """Within the block, the study's trials are read from its RDB storage once: later
    ``get_trials`` calls (the base sampler's own: TPE reads them twice per proposal) answer
    from the snapshot ``_CachedStorage`` holds, instead of reading again (issue 36). A proposal
    is made from a snapshot anyway; trials another process adds meanwhile are seen at the next
    read. That read is :func:`_read_rdb_trials`'s. Other storages, and a block inside another,
    read as usual."""
    storage = study._storage
    backend = _rdb_backend(storage)
    if (backend is None or not isinstance(storage, _CachedStorage)
            or "_read_trials_from_remote_storage" in vars(storage)):
        yield
        return
    done: set[int] = set()

    def read_once(study_id: int) -> None:
        if study_id not in done:
            _read_rdb_trials(storage, backend, study_id)
            done.add(study_id)

    storage._read_trials_from_remote_storage = read_once  # type: ignore[method-assign]
    try:
        yield
    finally:
        del storage._read_trials_from_remote_storage


def read_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """``study.get_trials(deepcopy=False)``: on an RDB storage, the trials Optuna's cache does
    not hold finished are read by :func:`_read_rdb_trials` (inside :func:`one_read`, its
    snapshot)."""
    with one_read(study):
        return study.get_trials(deepcopy=False)


def _read_rdb_trials(storage: Any, backend: optuna.storages.RDBStorage, study_id: int) -> None:
    """``_CachedStorage._read_trials_from_remote_storage``: the trials of the study with an id
    above the last finished one it holds, and the unfinished ones it holds, read again and
    cached, its bookkeeping kept as there. The rows are those ``RDBStorage._get_trials`` loads
    through its ORM session (the trials, then their params, values, attributes and
    intermediate values), read with plain SQL statements and no commit, and each made a
    FrozenTrial by ``RDBStorage``'s own conversion: the scheduler's read after each ask cost
    4-5 ms of CPU with 2,000 trials in the study (issue 36); the study's row is read only
    when no trial is found (a study deleted since raises KeyError, as there)."""
    with storage._lock:
        if study_id not in storage._studies:
            storage._studies[study_id] = _StudyInfo()
        study = storage._studies[study_id]
        trials = _rdb_trials(backend, study_id, study.unfinished_trial_ids,
                             study.last_finished_trial_id)
        if not trials:
            return
        storage._add_trials_to_cache(study_id, trials)
        for trial in trials:
            if not trial.state.is_finished():
                study.unfinished_trial_ids.add(trial._trial_id)
                continue
            study.last_finished_trial_id = max(study.last_finished_trial_id, trial._trial_id)
            study.unfinished_trial_ids.discard(trial._trial_id)


_IN_LIMIT = 500  # ids bound in one IN (...), as SQLAlchemy's selectin loading chunks them


def _trial_rows_statement(with_ids: bool, cast: bool = True) -> Any:
    """One statement for the rows ``RDBStorage._get_trials`` loads in six (the trials, then
    through its ORM session each kind of child row): a UNION ALL of the trials chosen (those
    of the study with an id above ``high``, and, ``with_ids``, those with an id in ``ids``)
    and their child rows, one row each, in the columns ``kind, trial_id, a, b, state, start,
    complete, name, num, text, vtype, itype`` (the first SELECT's, typed as the models' columns
    so that values are read as there), ordered by kind, trial and row id. A trial's row holds
    its number in ``a`` and its study in ``b``.

    The choice is written so that an index answers each part (on SQLite, the study's index
    and the primary key): ``study_id = ? AND (trial_id > ? OR trial_id IN (...))``, as
    ``RDBStorage._get_trials`` asks, reads every trial of the study (0.13 ms at 2,000 trials,
    per part, six parts). ``cast``: the first SELECT's NULLs are cast to their column's type (a
    UNION on PostgreSQL takes an untyped NULL for text, which its enum types do not match);
    else only typed for reading (MySQL casts to few types, and its UNION needs none)."""
    t, v, i = _TRIALS, _VALUES, _INTERMEDIATE

    def typed_null(column: Any, name: str) -> Any:
        null = sa.cast(sa.null(), column.type) if cast else sa.type_coerce(sa.null(), column.type)
        return null.label(name)

    chosen = sa.and_(t.c.study_id == sa.bindparam("study_id"), t.c.trial_id > sa.bindparam("high"))
    if with_ids:
        chosen = sa.or_(t.c.trial_id.in_(sa.bindparam("ids", expanding=True)), chosen)
    chosen_ids = sa.select(t.c.trial_id).where(chosen).scalar_subquery()
    null = sa.null

    def child(kind: int, table: Any, key: Any, b: Any, name: Any, num: Any, text: Any,
              vtype: Any = None, itype: Any = None) -> Any:
        return sa.select(
            sa.literal_column(str(kind), sa.Integer), table.c.trial_id, key, b, null(), null(),
            null(), name, num, text, null() if vtype is None else vtype,
            null() if itype is None else itype,
        ).where(table.c.trial_id.in_(chosen_ids))

    trials = sa.select(
        sa.literal_column("0", sa.Integer).label("kind"), t.c.trial_id.label("trial_id"),
        t.c.number.label("a"),
        t.c.study_id.label("b"), t.c.state.label("state"),
        t.c.datetime_start.label("start"), t.c.datetime_complete.label("complete"),
        typed_null(_PARAMS.c.param_name, "name"), typed_null(_PARAMS.c.param_value, "num"),
        typed_null(_PARAMS.c.distribution_json, "text"), typed_null(v.c.value_type, "vtype"),
        typed_null(i.c.intermediate_value_type, "itype"),
    ).where(chosen)
    p, u, y = _PARAMS, _USER_ATTRS, _SYSTEM_ATTRS
    union = sa.union_all(
        trials,
        child(1, p, p.c.param_id, null(), p.c.param_name, p.c.param_value, p.c.distribution_json),
        child(2, v, v.c.trial_value_id, v.c.objective, null(), v.c.value, null(), v.c.value_type),
        child(3, u, u.c.trial_user_attribute_id, null(), u.c.key, null(), u.c.value_json),
        child(4, y, y.c.trial_system_attribute_id, null(), y.c.key, null(), y.c.value_json),
        child(5, i, i.c.trial_intermediate_value_id, i.c.step, null(), i.c.intermediate_value,
              null(), None, i.c.intermediate_value_type),
    )
    return union.order_by(sa.text("kind"), sa.text("trial_id"), sa.text("a"))


_TRIAL_ROWS = {(with_ids, cast): _trial_rows_statement(with_ids, cast)
               for with_ids in (False, True) for cast in (False, True)}
_STUDY_EXISTS = sa.select(_STUDIES.c.study_id).where(_STUDIES.c.study_id == sa.bindparam("study_id"))


def _child(kind: int, row: Any) -> Any:
    """A child row of :data:`_TRIAL_ROWS` under the names ``RDBStorage`` reads it by."""
    if kind == 1:
        return types.SimpleNamespace(param_id=row.a, param_name=row.name, param_value=row.num,
                                     distribution_json=row.text)
    if kind == 2:
        return types.SimpleNamespace(objective=row.b, value=row.num, value_type=row.vtype)
    if kind in (3, 4):
        return types.SimpleNamespace(key=row.name, value_json=row.text)
    return types.SimpleNamespace(step=row.b, intermediate_value=row.num,
                                 intermediate_value_type=row.itype)


_CHILDREN = {1: "params", 2: "values", 3: "user_attributes", 4: "system_attributes",
             5: "intermediate_values"}


def _rdb_trials(backend: optuna.storages.RDBStorage, study_id: int, included: set[int],
                greater_than: int) -> list[optuna.trial.FrozenTrial]:
    """``RDBStorage._get_trials(study_id, None, included, greater_than)``, in trial id order:
    one statement (:data:`_TRIAL_ROWS`), and a second only when no trial is found."""
    included = {i for i in included if i <= greater_than}
    many = len(included) > _IN_LIMIT  # read from the lowest and keep those asked for
    high = min(included) - 1 if many else greater_than
    ids = sorted(included) if included and not many else None
    bound: dict[str, Any] = {"study_id": study_id, "high": high}
    if ids is not None:
        bound["ids"] = ids
    rows: dict[int, _TrialRow] = {}
    with backend.engine.connect() as conn:
        cast = conn.dialect.name not in ("mysql", "mariadb")
        for r in conn.execute(_TRIAL_ROWS[ids is not None, cast], bound):
            if r.kind == 0:
                if r.b == study_id and (not many or r.trial_id in included
                                        or r.trial_id > greater_than):
                    rows[r.trial_id] = _TrialRow(types.SimpleNamespace(
                        trial_id=r.trial_id, number=r.a, state=r.state,
                        datetime_start=r.start, datetime_complete=r.complete))
                continue
            row = rows.get(r.trial_id)
            if row is not None:
                getattr(row, _CHILDREN[r.kind]).append(_child(r.kind, r))
        if not rows and conn.execute(_STUDY_EXISTS, {"study_id": study_id}).first() is None:
            raise KeyError(_models.NOT_FOUND_MSG)
    # A _TrialRow reads as the TrialModel the conversion is written for.
    return [backend._build_frozen_trial_from_trial_model(r)  # type: ignore[arg-type]
            for r in rows.values()]


def set_trial_system_attr(
    study: optuna.Study, trial: optuna.trial.Trial | optuna.trial.FrozenTrial | int,
    key: str, value: Any,
) -> None:
    """Stores a system attribute on a trial (given as a trial or its storage id)."""
    tid = trial if isinstance(trial, int) else trial_id(trial)
    study._storage.set_trial_system_attr(tid, key, value)


def trial_number(study: optuna.Study, trial_id_: int) -> int:
    """The number (within its study) of the trial with storage id ``trial_id_``."""
    return study._storage.get_trial_number_from_id(trial_id_)


def has_studies_table(bind: sa.Engine | sa.Connection) -> bool:
    """Whether the database holds Optuna's RDB tables (its ``studies`` table), so that reading
    its studies creates nothing; false for one only ``autotune import`` wrote."""
    return sa.inspect(bind).has_table("studies")

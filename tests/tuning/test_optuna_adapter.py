"""autotune.tuning.optuna_adapter: exactly the private Optuna behaviour autotune relies on.

If an Optuna release breaks one of these, widen or move the range in pyproject.toml and
``optuna_adapter.SUPPORTED`` only once the adapter is fixed and these pass again.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import re
import subprocess
import sys
import time
import warnings

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.tuning import optuna_adapter as oa

REPO = pathlib.Path(__file__).resolve().parents[2]


def _rdb(tmp_path, *, heartbeat: int | None = None, grace: int | None = None):
    kwargs = {} if heartbeat is None else {"heartbeat_interval": heartbeat, "grace_period": grace}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db", **kwargs)


def _template(**user_attrs) -> FrozenTrial:
    return FrozenTrial(
        number=-1, state=TrialState.RUNNING, value=None, datetime_start=dt.datetime.now(),
        datetime_complete=None, params={}, distributions={}, user_attrs=user_attrs,
        system_attrs={}, intermediate_values={}, trial_id=-1,
    )


# -- the version range ----------------------------------------------------------------------------


def test_the_installed_optuna_is_in_the_supported_range_and_pyproject_agrees():
    oa.check_version(optuna.__version__)  # the module imported, so this holds
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"{oa.SUPPORTED_TEXT}"' in pyproject
    low, high = oa.SUPPORTED
    assert oa.SUPPORTED_TEXT == f"optuna>={low[0]}.{low[1]},<{high[0]}.{high[1]}"


@pytest.mark.parametrize("found", ["4.5.0", "5.2.0", "6.0.0", "3.6.1", "nonsense"])
def test_a_version_outside_the_range_is_refused_by_name(found):
    with pytest.raises(ImportError) as info:
        oa.check_version(found)
    message = str(info.value)
    assert oa.SUPPORTED_TEXT in message and f"found optuna {found}" in message


@pytest.mark.parametrize("found", ["5.0.0", "5.1.0", "5.1.3.dev0"])
def test_a_version_inside_the_range_is_accepted(found):
    oa.check_version(found)


def test_importing_the_adapter_with_an_unsupported_optuna_raises_importerror():
    code = (
        "import optuna; optuna.__version__ = '4.0.0'\n"
        "try:\n"
        "    import autotune.tuning.optuna_adapter\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise SystemExit('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert "refused:" in out and oa.SUPPORTED_TEXT in out and "found optuna 4.0.0" in out


# -- ids, storage, attributes ---------------------------------------------------------------------


def test_trial_id_is_the_storage_id_for_live_and_frozen_trials(tmp_path):
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    a, b = study.ask(), study.ask()
    assert oa.trial_id(a) != oa.trial_id(b)
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert oa.trial_id(frozen[a.number]) == oa.trial_id(a)
    assert storage.get_trial(oa.trial_id(b)).number == b.number
    assert oa.trial_number(study, oa.trial_id(b)) == b.number


def test_study_storage_is_what_the_study_writes_through(tmp_path):
    study = optuna.create_study(storage=_rdb(tmp_path), study_name="s")
    trial = study.ask()
    oa.study_storage(study).set_trial_user_attr(oa.trial_id(trial), "k", 1)
    assert study.get_trials(deepcopy=False)[0].user_attrs == {"k": 1}


def test_set_trial_system_attr_by_trial_or_id(tmp_path):
    study = optuna.create_study(storage=_rdb(tmp_path), study_name="s")
    trial = study.ask()
    oa.set_trial_system_attr(study, trial, "outcome", "ok")
    oa.set_trial_system_attr(study, oa.trial_id(trial), "other", 2)
    study.tell(trial, 1.0)
    frozen = study.get_trials(deepcopy=False)[0]
    assert frozen.system_attrs["outcome"] == "ok" and frozen.system_attrs["other"] == 2
    assert frozen.state == TrialState.COMPLETE


# -- creating a trial as study.ask does -----------------------------------------------------------


class _Recording(optuna.samplers.RandomSampler):
    """Random, recording what the study looked like when asked for each parameter."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[int] = []

    def sample_independent(self, study, trial, param_name, param_distribution):
        self.seen.append(len(study._get_trials(deepcopy=False, use_cache=True)))
        return super().sample_independent(study, trial, param_name, param_distribution)


def test_create_trial_writes_the_template_at_once_and_suggest_asks_the_sampler(tmp_path):
    sampler = _Recording()
    study = optuna.create_study(storage=_rdb(tmp_path), study_name="s", sampler=sampler)
    trial = oa.create_trial(study, _template(owner="host:1"))
    assert isinstance(trial, optuna.trial.Trial)
    frozen = study.get_trials(deepcopy=False)
    # One write: the trial exists, RUNNING, owned, with no params yet.
    assert [(t.state, t.user_attrs, t.params) for t in frozen] == [
        (TrialState.RUNNING, {"owner": "host:1"}, {})
    ]
    dists = {"tile": IntDistribution(16, 256, step=16), "swizzle": CategoricalDistribution([32, 64])}
    for name, dist in dists.items():
        oa.suggest(trial, name, dist)
    params = study.get_trials(deepcopy=False)[0].params
    assert set(params) == set(dists) and params["tile"] % 16 == 0 and params["swizzle"] in (32, 64)
    assert trial.params == params
    assert len(sampler.seen) == 2


def test_create_trial_drops_the_study_s_cached_trials(tmp_path):
    """A trial stored by another process after the cache was filled is seen by the sampler."""
    sampler = _Recording()
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s", sampler=sampler)
    other = optuna.load_study(study_name="s", storage=storage)
    assert study._get_trials(deepcopy=False, use_cache=True) == []  # fills the cache
    other.ask()  # another process's trial
    trial = oa.create_trial(study, _template())
    oa.suggest(trial, "x", IntDistribution(0, 3))
    assert sampler.seen == [2]  # the other's trial and its own


def _commits(storage) -> list[int]:
    """A counter of the RDB storage's commits (its SQLAlchemy engine's)."""
    import sqlalchemy

    count = [0]
    sqlalchemy.event.listen(storage.engine, "commit", lambda conn: count.__setitem__(0, count[0] + 1))
    return count


_DISTS = {"tile": IntDistribution(16, 256, step=16), "swizzle": CategoricalDistribution([32, 64]),
          "stages": IntDistribution(2, 5)}


def test_suggest_all_stores_what_suggest_stores_in_one_commit(tmp_path):
    storage = _rdb(tmp_path)
    one_by_one = optuna.create_study(storage=storage, study_name="a",
                                     sampler=optuna.samplers.RandomSampler(seed=3))
    batched = optuna.create_study(storage=storage, study_name="b",
                                  sampler=optuna.samplers.RandomSampler(seed=3))
    commits = _commits(storage)
    trial = oa.create_trial(one_by_one, _template())
    before = commits[0]
    for name, dist in _DISTS.items():
        oa.suggest(trial, name, dist)
    per_param = commits[0] - before
    trial_b = oa.create_trial(batched, _template())
    before = commits[0]
    oa.suggest_all(trial_b, _DISTS)
    assert commits[0] - before == 1 < per_param
    # The same values (the same sampler, seed and order), distributions and cached trial.
    fresh = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    a, = optuna.load_study(study_name="a", storage=fresh).get_trials(deepcopy=False)
    b, = optuna.load_study(study_name="b", storage=fresh).get_trials(deepcopy=False)
    assert b.params == a.params == trial.params == trial_b.params
    assert b.distributions == a.distributions == _DISTS
    assert trial_b.storage is oa.study_storage(batched)  # its own storage again


def test_suggest_all_writes_nothing_when_a_distribution_clashes_with_the_study(tmp_path):
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    oa.suggest_all(oa.create_trial(study, _template()), _DISTS)
    clash = dict(_DISTS, swizzle=IntDistribution(0, 9))  # categorical before
    trial = oa.create_trial(study, _template())
    with pytest.raises(ValueError):
        oa.suggest_all(trial, clash)
    fresh = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    assert optuna.load_study(study_name="s", storage=fresh).trials[1].params == {}


def _statements(storage) -> list[str]:
    """The SQL statements the RDB storage runs from now on."""
    import sqlalchemy

    seen: list[str] = []
    sqlalchemy.event.listen(storage.engine, "before_cursor_execute",
                            lambda conn, cursor, statement, *args: seen.append(statement))
    return seen


def reads_of_trials(statements: list[str]) -> int:
    """Statements among ``statements`` that read rows of the trials table (a count aside)."""
    return sum(1 for s in statements if s.startswith("SELECT") and re.search(r"\bFROM trials\b", s)
               and not s.startswith("SELECT count("))


def test_suggest_all_checks_the_trial_once_and_inserts_the_params_in_one_statement(tmp_path):
    """Once the study knows its parameters, suggest_all reads the trial once and writes every
    parameter with one executemany (issue 36: 20 of an ask's statements), values intact."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    oa.suggest_all(oa.create_trial(study, _template()), _DISTS)
    trial = oa.create_trial(study, _template())
    seen = _statements(storage)
    oa.suggest_all(trial, _DISTS)
    writes = [s for s in seen if "trial_params" in s and s.startswith("INSERT")]
    reads = [s for s in seen if s.startswith("SELECT trials.")]
    assert len(writes) == 1 and len(reads) == 1
    fresh = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    stored = optuna.load_study(study_name="s", storage=fresh).trials[1]
    assert stored.params == trial.params and stored.distributions == _DISTS


def test_one_read_reads_the_study_once_within_the_block(tmp_path):
    """Inside one_read, the study's trials are read from the database once, later get_trials
    answering from that snapshot; outside (and for a study in memory) every call reads."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=3)
    seen = _statements(storage)

    def reads() -> int:
        return reads_of_trials(seen)

    with oa.one_read(study):
        with oa.one_read(study):  # nested: the outer one's snapshot
            assert len(study.get_trials(deepcopy=False)) == 3
        assert len(study.get_trials(deepcopy=False)) == 3
    assert reads() == 1
    study.get_trials(deepcopy=False)
    assert reads() == 2
    memory = optuna.create_study()
    with oa.one_read(memory):
        assert memory.get_trials() == []


def test_create_trial_does_not_read_back_the_trial_it_created(tmp_path):
    """optuna.trial.Trial reads its trial from the storage; create_trial answers that read
    from Optuna's cache (issue 36: 6 statements and a commit of every ask), and the trial it
    gives is the one stored."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    seen = _statements(storage)
    commits = _commits(storage)
    trial = oa.create_trial(study, _template(owner="host:1"))
    assert commits[0] == 1  # the create, nothing more
    assert not [s for s in seen if s.startswith("SELECT trial_values.")]  # no read of the trial
    assert trial.storage is oa.study_storage(study)
    stored = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/optuna.db")).trials[0]
    assert (trial.number, trial.user_attrs, trial.datetime_start) == (
        stored.number, stored.user_attrs, stored.datetime_start)


def _optuna_reads(url: str, name: str) -> list[FrozenTrial]:
    """The study's trials as Optuna itself reads them (a storage of its own, no cache)."""
    fresh = optuna.storages.RDBStorage(url)
    return fresh.get_all_trials(fresh.get_study_id_from_name(name), deepcopy=False)


def _same(ours: list[FrozenTrial], optuna_s: list[FrozenTrial]) -> None:
    def fields(t: FrozenTrial) -> tuple:
        return (t._trial_id, t.number, t.state, t.values, t.datetime_start, t.datetime_complete,
                t.params, t.distributions, t.user_attrs, t.system_attrs, t.intermediate_values)

    assert [fields(t) for t in ours] == [fields(t) for t in optuna_s]


@pytest.mark.parametrize("in_limit", [500, 1])
def test_read_trials_reads_what_optuna_reads_incrementally(db_url, monkeypatch, in_limit):
    """read_trials gives the FrozenTrials Optuna's own read gives (params, values, attributes,
    intermediate values, datetimes, states), first all of them, then, incrementally, the trials
    added and those finished since by another process, on SQLite and PostgreSQL; ``in_limit``
    1: more unfinished trials than one IN (...) takes, read from the lowest."""
    monkeypatch.setattr(oa, "_IN_LIMIT", in_limit)
    storage = optuna.storages.RDBStorage(db_url)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    optuna.create_study(storage=storage, study_name="other").optimize(
        lambda t: t.suggest_int("y", 0, 3), n_trials=2)  # another study's trials, interleaved
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    running = [oa.create_trial(study, _template(owner="me")) for _ in range(3)]
    for t in running:
        oa.suggest_all(t, _DISTS)
    study.tell(running[0], 1.5)
    t = study.ask()
    t.report(0.5, step=1)
    t.set_user_attr("note", {"a": [1, 2]})
    study.tell(t, state=TrialState.PRUNED)
    _same(oa.read_trials(study), _optuna_reads(db_url, "s"))
    other = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(db_url))
    other.tell(running[1].number, 2.5)
    other.tell(running[2].number, state=TrialState.FAIL)
    other.enqueue_trial({"x": 0.25})  # a WAITING trial
    added = other.ask()
    _same(oa.read_trials(study), _optuna_reads(db_url, "s"))
    other.tell(added, 0.1)
    _same(oa.read_trials(study), _optuna_reads(db_url, "s"))


def test_read_trials_after_an_ask_is_one_statement_and_no_commit(tmp_path):
    """The scheduler's read after each ask (issue 36: 6 statements and a commit through
    Optuna's ORM session, each reading every trial of the study) is one statement, no commit;
    and a study deleted meanwhile raises KeyError, as Optuna's read does."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=3)
    oa.read_trials(study)
    trial = oa.create_trial(study, _template())
    oa.suggest_all(trial, _DISTS)
    seen = _statements(storage)
    commits = _commits(storage)
    assert [t.number for t in oa.read_trials(study)] == [0, 1, 2, 3]
    assert len(seen) == 1 and commits[0] == 0
    optuna.delete_study(study_name="s", storage=storage)
    with pytest.raises(KeyError):
        oa.read_trials(study)


def test_create_trial_numbers_as_optuna_in_five_statements_and_one_commit(tmp_path):
    """create_trial writes the trial, its attributes and its number (the study's trials with a
    lower id, other processes' included) in 5 statements and one commit (issue 36: Optuna's
    ORM session, 6 and 2.5 ms more CPU); the trial is the one Optuna reads back."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    other = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/optuna.db"))
    other.ask()
    other.ask()
    seen = _statements(storage)
    commits = _commits(storage)
    trial = oa.create_trial(study, _template(owner="host:1"))
    assert len(seen) == 5 and commits[0] == 1
    stored = _optuna_reads(f"sqlite:///{tmp_path}/optuna.db", "s")[2]
    assert (stored.number, stored.user_attrs, stored.datetime_start, stored.state) == (
        trial.number, {"owner": "host:1"}, trial.datetime_start, TrialState.RUNNING) == (
        2, trial.user_attrs, trial.datetime_start, TrialState.RUNNING)
    optuna.delete_study(study_name="s", storage=storage)
    with pytest.raises(KeyError):
        oa.create_trial(study, _template())


def test_tell_stores_the_attributes_state_and_value_without_reading_the_trial(tmp_path):
    """oa.tell writes what study.tell writes (and the system attributes first) in 2 commits,
    answering study.tell's two reads of the trial from the trial as asked (issue 36)."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    done = oa.create_trial(study, _template())
    oa.suggest_all(done, _DISTS)
    failed = oa.create_trial(study, _template())
    oa.suggest_all(failed, _DISTS)
    seen = _statements(storage)
    commits = _commits(storage)
    oa.tell(study, done, 12.5, system_attrs={"outcome": "ok"})
    assert commits[0] == 2 and not [s for s in seen if s.startswith("SELECT trial_params.")]
    oa.tell(study, failed, state=TrialState.FAIL, system_attrs={"outcome": "compile_error"})
    assert type(oa.study_storage(study)).__name__ == "_CachedStorage"  # its own storage again
    fresh = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/optuna.db")).trials
    assert [(t.state, t.value, t.system_attrs, t.params) for t in fresh] == [
        (TrialState.COMPLETE, 12.5, {"outcome": "ok"}, done.params),
        (TrialState.FAIL, None, {"outcome": "compile_error"}, failed.params)]
    assert fresh[0].datetime_complete is not None


def test_tell_of_a_trial_another_process_closed_raises_update_finished(tmp_path):
    """As study.tell: the result of a trial another host closed (stale) is refused by the
    storage's write, which the caller catches (studies.tell_result keeps the stored result)."""
    storage = _rdb(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    trial = oa.create_trial(study, _template())
    oa.suggest_all(trial, _DISTS)
    other = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/optuna.db"))
    other.tell(trial.number, state=TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        oa.tell(study, trial, 1.0, system_attrs={"outcome": "ok"})


def test_suggest_all_writes_the_first_heartbeat_with_the_params(tmp_path):
    """heartbeat=True: the trial's first heartbeat goes in the params' transaction (one commit);
    a trial whose params could not be written has no heartbeat either."""
    storage = _rdb(tmp_path, heartbeat=60, grace=120)
    study = optuna.create_study(storage=storage, study_name="s",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    oa.suggest_all(oa.create_trial(study, _template()), _DISTS)
    trial = oa.create_trial(study, _template())
    commits = _commits(storage)
    oa.suggest_all(trial, _DISTS, heartbeat=True)
    assert commits[0] == 1
    import sqlalchemy

    with storage.engine.connect() as conn:
        beats = conn.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats")).scalars().all()
    assert beats == [oa.trial_id(trial)]
    clash = oa.create_trial(study, _template())
    with pytest.raises(ValueError):
        oa.suggest_all(clash, dict(_DISTS, swizzle=IntDistribution(0, 9)), heartbeat=True)
    with storage.engine.connect() as conn:
        beats = conn.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats")).scalars().all()
    assert beats == [oa.trial_id(trial)]
    memory = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    oa.suggest_all(oa.create_trial(memory, _template()), _DISTS, heartbeat=False)


def test_suggest_all_on_a_storage_in_memory(tmp_path):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = oa.create_trial(study, _template())
    oa.suggest_all(trial, _DISTS)
    assert study.trials[0].params == trial.params and set(trial.params) == set(_DISTS)


# -- heartbeats -----------------------------------------------------------------------------------


def test_heartbeat_storage_only_when_heartbeats_are_kept(tmp_path):
    (tmp_path / "a").mkdir()
    plain = optuna.create_study(storage=_rdb(tmp_path / "a"), study_name="s")
    assert oa.heartbeat_storage(plain) is None
    assert oa.stale_trial_ids(plain) == []
    assert oa.heartbeat_storage(optuna.create_study()) is None  # in memory
    (tmp_path / "b").mkdir()
    beating = optuna.create_study(storage=_rdb(tmp_path / "b", heartbeat=60, grace=120),
                                  study_name="s")
    storage = oa.heartbeat_storage(beating)
    assert storage is not None and storage.get_heartbeat_interval() == 60
    assert storage is oa.study_storage(beating)  # Optuna's cache around the RDBStorage


def test_stale_trial_ids_are_running_trials_whose_heartbeat_stopped(tmp_path):
    study = optuna.create_study(storage=_rdb(tmp_path, heartbeat=1, grace=1), study_name="s")
    storage = oa.heartbeat_storage(study)
    assert storage is not None
    stopped, beating, never, done = study.ask(), study.ask(), study.ask(), study.ask()
    for t in (stopped, beating, done):
        storage.record_heartbeat(oa.trial_id(t))
    study.tell(done, 1.0)
    time.sleep(2.2)
    storage.record_heartbeat(oa.trial_id(beating))
    stale = oa.stale_trial_ids(study)
    # Only a RUNNING trial with a heartbeat older than the grace period; never a trial that
    # never beat (autotune closes those itself), a live one, or a finished one.
    assert stale == [oa.trial_id(stopped)]
    assert oa.trial_id(never) not in stale


def test_the_adapter_is_the_only_module_that_names_optuna_privates():
    pattern = re.compile(
        r"optuna\.[\w.]*\._\w|\._(storage|study_id|trial_id|thread_local|suggest)\b"
        r"|_get_stale_trial_ids|cached_all_trials"
    )
    offenders = []
    for path in sorted((REPO / "autotune").rglob("*.py")):
        if path.name == "optuna_adapter.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "self._storage" not in code:
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, offenders

"""The incremental index of a study's trials (autotune/tuning/trial_index.py) and the capped model
study the base sampler proposes from past MODEL_TRIALS (autotune/tuning/sampling.py)."""

from __future__ import annotations

import random

import optuna
from optuna.trial import TrialState

from autotune.tuning import optuna_adapter, sampling
from autotune.tuning.sampling import OUTCOME_ATTR, distributions, valid_sampler
from tests.tuning.test_tuner import PROBLEM, TOY, fake_time

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _stagnated(study: optuna.Study, patience: int) -> bool:
    """The patience rule recounted over every trial: whether the last ``patience`` measured
    configs all failed to beat the best (the rule of Optuna's
    ``BestValueStagnationEvaluator``, over measured trials only)."""
    values = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.value is not None]
    if len(values) <= patience:
        return False
    best_at = min(range(len(values)), key=values.__getitem__)
    return len(values) - 1 - best_at >= patience


def test_index_matches_a_full_recount_as_trials_come_and_go():
    """After every step of a study's life (asked, released, measured ok or failed, still
    running), the index's taken set, counts, counting_before, best and patience equal what a
    pass over every trial says."""
    space = TOY.valid_space(PROBLEM)
    dists = distributions(space)
    sampler = valid_sampler("random", space, seed=1)
    study = optuna.create_study(sampler=sampler)
    rng = random.Random(0)
    running = []
    for step in range(40):
        trial = study.ask(dists)
        running.append(trial)
        if rng.random() < 0.7:
            t = running.pop(rng.randrange(len(running)))
            fate = rng.choice(["ok", "ok", "failed", "released"])
            if fate != "released":
                optuna_adapter.set_trial_system_attr(study, t, OUTCOME_ATTR, fate)
            if fate == "ok":
                study.tell(t, fake_time(t.params))
            else:
                study.tell(t, state=TrialState.FAIL)
        trials = study.get_trials(deepcopy=False)
        index = sampler.index
        index.refresh(trials)

        def counts(t):
            return t.state in (TrialState.RUNNING, TrialState.COMPLETE) or (
                t.state == TrialState.FAIL and OUTCOME_ATTR in t.system_attrs)

        measured = [t for t in trials if counts(t) and t.state != TrialState.RUNNING]
        assert index.measured == len(measured), step
        assert index.running == sum(t.state == TrialState.RUNNING for t in trials), step
        for t in trials:
            assert (space.key(t.params) in index) == any(
                counts(u) and space.key(u.params) == space.key(t.params) for u in trials), step
        n = trials[-1].number
        assert index.counting_before(n) == sum(1 for t in trials if t.number < n and counts(t))
        values = [t.value for t in trials if t.state == TrialState.COMPLETE]
        for patience in (1, 3, 5):
            assert index.stagnated(patience) == _stagnated(study, patience), (step, patience)
        if values:
            best = min((t for t in trials if t.state == TrialState.COMPLETE),
                       key=lambda t: (t.value, t.number))
            assert index.best_keys(1) == [space.key(best.params)]


def _asked_and_told(sampler, space, dists, n):
    """Asks ``n`` trials of a new study of ``sampler`` and tells each its fake time, checking
    that every proposal is valid and untaken; yields after each tell."""
    study = optuna.create_study(sampler=sampler)
    seen = set()
    for _ in range(n):
        trial = study.ask(dists)
        key = space.key(trial.params)
        assert space.is_valid(trial.params) and key not in seen
        seen.add(key)
        optuna_adapter.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok")
        study.tell(trial, fake_time(trial.params))
        yield trial


def test_base_sampler_proposes_from_a_capped_model_past_model_trials(monkeypatch):
    """Past MODEL_TRIALS measured trials, TPE proposes from a model study of the best and the
    latest trials (never more than twice MODEL_TRIALS), and its proposals stay valid and
    untaken."""
    monkeypatch.setattr(sampling, "MODEL_TRIALS", 8)
    space = TOY.valid_space(PROBLEM)
    dists = distributions(space)
    sampler = valid_sampler("tpe", space, seed=0)
    for _ in _asked_and_told(sampler, space, dists, 30):
        if sampler._model is not None:
            assert len(sampler._model.get_trials(deepcopy=False)) <= 2 * 8 + 1
    assert sampler._model is not None  # the cap was reached and used


def test_prefetch_makes_the_next_model_proposal_on_a_background_thread(monkeypatch):
    """With ``prefetch`` (the scheduler's setting), past MODEL_TRIALS each proposal but the
    first from the model, and every rebuild of the model but the first, was made on the
    background proposer thread after the previous ask; proposals stay valid and untaken."""
    import threading

    monkeypatch.setattr(sampling, "MODEL_TRIALS", 8)
    space = TOY.valid_space(PROBLEM)
    dists = distributions(space)
    sampler = valid_sampler("tpe", space, seed=0, local=0.0)
    sampler.prefetch = True
    threads = []
    original = sampler._model_proposal

    def spy(model, base):
        threads.append(threading.current_thread().name)
        return original(model, base)

    monkeypatch.setattr(sampler, "_model_proposal", spy)
    builds = []
    build = sampler._new_model

    def build_spy(window):
        builds.append(threading.current_thread().name)
        return build(window)

    monkeypatch.setattr(sampler, "_new_model", build_spy)
    for _ in _asked_and_told(sampler, space, dists, 30):
        assert sampler._model_size <= 2 * 8 + 1  # rebuilt ahead, before it outgrows its cap
    assert threads[0] == threading.current_thread().name  # nothing made ahead yet
    assert threads[1:] and all(name.startswith("autotune-propose") for name in threads[1:])
    # The first model is built when first needed; every rebuild after it is made ahead.
    assert builds[0] == threading.current_thread().name
    assert builds[1:] and all(name.startswith("autotune-propose") for name in builds[1:])

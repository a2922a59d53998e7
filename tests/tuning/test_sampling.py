"""The Optuna integration: only valid configs, never one twice, the study ends when exhausted."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import JobError
from autotune.space.kernel import get_kernel
from autotune.tuning.sampling import (
    DEFAULT_LOCAL_SHARE,
    ExhaustedError,
    ValidSampler,
    distributions,
    make_sampler,
    valid_sampler,
)
from tests.space.test_space import PROBLEM, toy_space

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUNDLED_PROBLEMS = [
    ("hopper_matmul", {"m": 4096, "n": 4096, "k": 4096}, "bfloat16"),
    ("hopper_attention", {"batch": 4, "seq_q": 2048, "seq_kv": 2048, "heads_q": 16, "heads_kv": 16, "head_dim": 128}, "float16"),
    ("softmax", {"rows": 8192, "cols": 32768}, "bfloat16"),
    ("mosaic_scale", {"n": 1 << 24}, "float32"),
]


def _objective(config) -> float:
    # Any deterministic function of the config: the sampler's job here is validity, not speed.
    return float(sum(hash((k, repr(v))) % 997 for k, v in config.items()))


def _drive(bound, sampler_name: str, n: int, seed: int = 0):
    sampler = valid_sampler(sampler_name, bound, seed=seed)
    study = optuna.create_study(sampler=sampler)
    dists = distributions(bound)
    seen = set()
    for _ in range(n):
        try:
            trial = study.ask(dists)
        except ExhaustedError:
            break
        config = dict(trial.params)
        assert bound.validate(config, nearest=False) == [], config
        key = bound.key(config)
        assert key not in seen, f"{config} proposed twice"
        seen.add(key)
        study.tell(trial, _objective(config))
    return seen, sampler


@pytest.mark.parametrize("name", ["auto", "tpe", "random", "qmc", "brute", "cmaes"])
def test_every_proposal_valid_and_new_until_exhausted(name):
    """Each sampler hands out only valid, distinct configs and stops when the set is used up."""
    pytest.importorskip("cmaes") if name == "cmaes" else None
    bound = toy_space().bind(PROBLEM)
    seen, _ = _drive(bound, name, bound.count() + 5)
    assert len(seen) == bound.count()


def test_seed_configs_come_first():
    """Seed configs are proposed first, in order; an invalid seed becomes its nearest valid config."""
    bound = toy_space().bind(PROBLEM)
    good = {"bm": 64, "bn": 128, "width": 2, "order": "N", "flag": False}
    bad = {"bm": 100, "bn": 128, "width": 2, "order": "N", "flag": False}
    sampler = valid_sampler("tpe", bound, seed=0, seeds=[good, bad])
    study = optuna.create_study(sampler=sampler)
    first = study.ask(distributions(bound))
    assert dict(first.params) == good
    study.tell(first, 1.0)
    second = study.ask(distributions(bound))
    assert bound.is_valid(second.params) and dict(second.params) != good
    changed = {k for k in bad if second.params[k] != bad[k]}
    assert changed <= {"bm", "bn"}, second.params  # the repair stays next to the seed


def test_taken_configs_from_the_store_are_skipped():
    """Configs the database already holds are never proposed again."""
    bound = toy_space().bind(PROBLEM)
    stored = [dict(c) for c in bound.sample(bound.count() - 3, seed=0)]
    sampler = valid_sampler("tpe", bound, seed=0, taken=lambda: stored)
    study = optuna.create_study(sampler=sampler)
    keys = set()
    for _ in range(3):
        trial = study.ask(distributions(bound))
        keys.add(bound.key(trial.params))
        study.tell(trial, 1.0)
    assert not keys & {bound.key(c) for c in stored}
    with pytest.raises(ExhaustedError):
        study.ask(distributions(bound))


def test_unknown_sampler_is_a_clear_error():
    """An unknown sampler name lists the known ones."""
    with pytest.raises(JobError, match="expected one of auto, ranked, tpe, random"):
        make_sampler("annealing")


# The default run drives 300 proposals per bundled space; 1,000 in the two spaces larger than
# that (hopper_matmul, mosaic_scale) are the sweep's tail (`-m extended`): TPE's cost per ask
# grows with the trials told, so those two took 6x as long as the 300.
PROPOSALS = [
    pytest.param(*p, n, id=f"{p[0]}-{n}", marks=[pytest.mark.extended] if n > 300 else [])
    for p in BUNDLED_PROBLEMS for n in (300, 1000)
    if n == 300 or p[0] in ("hopper_matmul", "mosaic_scale")
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel_name, shape, dtype, n", PROPOSALS)
def test_thousand_proposals_per_bundled_space(kernel_name, shape, dtype, n):
    """1,000 proposals of the default sampler (TPE and local moves) per bundled space: zero
    invalid, zero repeats (until exhausted).

    The default run keeps 300 per space: each space's startup and model-guided proposals and
    its local moves, zero invalid and zero repeats, and the two small spaces (14 and 64 valid
    configs) driven to exhaustion; exhaustion of every sampler is also
    test_every_proposal_valid_and_new_until_exhausted's. The 1,000 of the two large spaces are
    the tail (``-m extended``)."""
    kernel = get_kernel(kernel_name)
    bound = kernel.valid_space(kernel.problem(shape, dtype))
    seen, _ = _drive(bound, "auto", n)
    assert len(seen) == min(n, bound.count())


def test_local_moves_climb_from_the_best_measured_config():
    """With local=1, every proposal after the seed is the nearest untaken one-tunable neighbour
    of the best config measured so far (of the next best, once its neighbours are all taken;
    TPE's, once the 8 best have none left)."""
    bound = toy_space().bind(PROBLEM)
    start = {"bm": 64, "bn": 128, "width": 2, "order": "N", "flag": False}
    sampler = valid_sampler("tpe", bound, seed=0, seeds=[start], local=1.0)
    study = optuna.create_study(sampler=sampler)
    dists = distributions(bound)

    def value(c) -> float:  # deterministic (str hashes are not), with ties broken by order
        return abs(c["bm"] - 128) + abs(c["bn"] - 64) + 7 * c["width"] + (c["order"] == "M") + 3 * c["flag"]

    measured: list[tuple[float, int, dict]] = []
    taken = set()
    for i in range(min(30, bound.count())):
        trial = study.ask(dists)
        config = dict(trial.params)
        if i:
            expected = None
            for _v, _n, centre in sorted(measured)[:8]:
                free = [n for n in bound.neighbours(centre) if bound.key(n) not in taken]
                if free:
                    expected = dict(free[0])
                    break
            if expected is None:  # the 8 best configs' neighbourhoods are all taken: TPE
                assert bound.key(config) not in taken and bound.is_valid(config)
            else:
                assert config == expected, (i, config, expected)
        taken.add(bound.key(config))
        measured.append((value(config), i, config))
        study.tell(trial, value(config))
    assert min(measured)[0] < value(start)  # it climbed


def test_local_moves_work_out_each_centre_s_neighbours_once(monkeypatch):
    """The neighbours of a centre are worked out once and kept (issue 36: 1-3 ms of CPU per
    local move), the proposals those of a sampler that works them out on every move."""
    bound = toy_space().bind(PROBLEM)
    start = {"bm": 64, "bn": 128, "width": 2, "order": "N", "flag": False}
    dists = distributions(bound)

    def drive(sampler) -> list[dict]:
        study = optuna.create_study(sampler=sampler)
        out = []
        for i in range(20):
            trial = study.ask(dists)
            out.append(dict(trial.params))
            study.tell(trial, abs(trial.params["bm"] - 128) + 7 * trial.params["width"] + i / 100)
        return out

    fresh = valid_sampler("tpe", bound, seed=0, seeds=[start], local=1.0)
    monkeypatch.setattr(fresh, "_neighbours_of", lambda centre: [
        (bound.key(n), n) for n in bound.neighbours(bound._config(centre))])
    expected = drive(fresh)
    centres: list[tuple] = []
    original = type(bound).neighbours
    monkeypatch.setattr(type(bound), "neighbours",
                        lambda self, config, **kw: centres.append(self.key(config))
                        or original(self, config, **kw))
    assert drive(valid_sampler("tpe", bound, seed=0, seeds=[start], local=1.0)) == expected
    assert centres and len(centres) == len(set(centres))


def test_auto_is_tpe_with_local_moves():
    """'auto' (the default) mixes DEFAULT_LOCAL_SHARE local moves into multivariate TPE; a
    share outside [0, 1] is refused."""
    bound = toy_space().bind(PROBLEM)
    auto = valid_sampler("auto", bound, seed=0)
    assert auto._local == DEFAULT_LOCAL_SHARE > 0
    assert isinstance(auto._base, optuna.samplers.TPESampler)
    assert valid_sampler("tpe", bound, seed=0)._local == 0
    assert valid_sampler("auto", bound, seed=0, local=0.0)._local == 0
    with pytest.raises(ValueError, match="local must be a share between 0 and 1, got 1.5"):
        ValidSampler(bound, local=1.5)


def test_the_static_sampler_names_are_the_registry():
    """autotune.tuning.names.SAMPLERS (read by the CLI without Optuna) names exactly the
    samplers the registry makes: each name builds, and an unknown one is refused."""
    from autotune.errors import JobError
    from autotune.tuning import names, sampling

    assert names.SAMPLERS is sampling.SAMPLERS
    space = _space_for_names()
    for name in names.SAMPLERS:
        try:
            sampler = sampling.valid_sampler(name, space, seed=0)
        except JobError as e:  # an optional dependency (cmaes, torch) is missing: named
            assert "pip install" in str(e)
            continue
        assert isinstance(sampler, sampling.ValidSampler)
    with pytest.raises(JobError, match="Unknown sampler"):
        sampling.make_sampler("annealing")


def _space_for_names():
    from autotune.space.problem import Problem
    from autotune.space.search_space import Choice, Space

    space = Space(params=(Choice("a", (1, 2, 4), ordered=True), Choice("b", ("x", "y"))))
    return space.bind(Problem("names", {"n": 1}, "float32"))


def test_after_index_read_the_next_proposal_does_not_read_the_study(tmp_path):
    """The scheduler reads the study after each ask and says so (``index_read``): the next
    proposal starts from that read instead of reading the study's trials again (on SQLite, 6
    statements); without it, every proposal reads. Once only: the one after reads."""
    import sqlalchemy

    from autotune.tuning import optuna_adapter as oa
    from autotune.tuning.sampling import OUTCOME_ATTR
    from tests.tuning.test_optuna_adapter import reads_of_trials

    bound = toy_space().bind(PROBLEM)
    sampler = valid_sampler("random", bound, seed=0)  # draws uniformly: reads nothing itself
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    study = optuna.create_study(storage=storage, sampler=sampler)
    reads: list[str] = []
    sqlalchemy.event.listen(storage.engine, "before_cursor_execute",
                            lambda conn, cursor, statement, *a: reads.extend(
                                [statement] * reads_of_trials([statement])))
    dists = distributions(bound)

    def ask() -> int:
        before = len(reads)
        trial = study.ask(dists)
        oa.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok")
        study.tell(trial, _objective(trial.params))
        return len(reads) - before

    assert ask() >= 1  # reads the study
    sampler.index.refresh(study.get_trials(deepcopy=False))
    sampler.index_read()
    with_read = ask()
    without = ask()
    assert with_read == without - 1  # the one read spared
    keys = [bound.key(t.params) for t in study.get_trials(deepcopy=False)]
    assert len(keys) == len(set(keys)) == 3


def test_a_stale_index_that_leaves_nothing_free_is_read_again(tmp_path):
    """A proposal from the index as the scheduler last read it that finds every config taken
    reads the study before saying the space is used up: a trial released since frees its
    config."""
    from autotune.tuning import optuna_adapter as oa
    from autotune.tuning.sampling import OUTCOME_ATTR

    bound = toy_space().bind(PROBLEM)
    sampler = valid_sampler("random", bound, seed=0)
    study = optuna.create_study(sampler=sampler)
    dists = distributions(bound)
    trials = [study.ask(dists) for _ in range(bound.count())]
    for t in trials[1:]:
        oa.set_trial_system_attr(study, t, OUTCOME_ATTR, "ok")
        study.tell(t, _objective(t.params))
    sampler.index.refresh(study.get_trials(deepcopy=False))  # the first still in flight
    study.tell(trials[0], state=optuna.trial.TrialState.FAIL)  # released: its config is free
    sampler.index_read()
    again = study.ask(dists)
    assert bound.key(again.params) == bound.key(trials[0].params)

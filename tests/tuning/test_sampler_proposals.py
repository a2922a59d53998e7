"""Every registered sampler's seeded proposals, pinned: a refactor of the sampling layer (the
sampler registry, issue 33) must not change what any sampler proposes for a fixed seed.

Each case drives :func:`autotune.tuning.sampling.valid_sampler` for 24 asks over a user kernel's
space, with seed configs, related winners, stored (taken) configs and another shape's history,
telling a deterministic landscape; the sequence of proposed configs is hashed. A deliberate
change of a sampler's proposals regenerates the table with
``python3 -m tests.tuning.test_sampler_proposals`` (and says why in its commit).
"""

from __future__ import annotations

import hashlib
import math

import optuna
import pytest

from autotune.space.problem import Config
from autotune.tuning import optuna_adapter
from autotune.tuning.sampling import OUTCOME_ATTR, ExhaustedError, distributions, valid_sampler
from tests.tuning.test_ranked_sampler import USER_SPACE, Observation, user_problem, user_time

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROBLEM = user_problem(4096, 4096)
OTHER = user_problem(1024, 2048)
ASKS = 24

# (case, sampler name, options of valid_sampler besides the space and the seed)
CASES: dict[str, tuple[str, dict]] = {
    "auto": ("auto", {}),
    "tpe": ("tpe", {}),
    "random": ("random", {}),
    "qmc": ("qmc", {}),
    "brute": ("brute", {}),
    "cmaes": ("cmaes", {}),
    "ranked-numpy": ("ranked", {"ranked": {"model": "numpy"}}),
    "ranked-sklearn": ("ranked", {"ranked": {"model": "sklearn"}}),
    "ranked-estimate": ("ranked", {"ranked": {"model": "numpy"}, "estimate": user_time}),
    "tpe-local": ("tpe", {"local": 0.3}),
}

# Made with optuna 5.1.0, numpy 2.4.6, scikit-learn 1.9.1; cmaes was not installed.
PINNED: dict[str, str] = {
    'auto': 'f9dd38bda2a31012',
    'brute': '8cfd53a66d56aa29',
    'qmc': '5d5938cd73327be4',
    'random': '9490a0cfce429c31',
    'ranked-estimate': '733ee51f143f0ada',
    'ranked-numpy': '54aa64b9a1db2619',
    'ranked-sklearn': 'c82ea16fa03ce023',
    'tpe': '9306f2ffd85e9a8d',
    'tpe-local': 'd6878ec0eb0f8923',
}


def _inputs() -> dict:
    bound_other = USER_SPACE.bind(OTHER)
    other_configs = sorted(bound_other, key=lambda c: user_time(OTHER, c))
    bound = USER_SPACE.bind(PROBLEM)
    every = list(bound)
    return {
        "seeds": [every[len(every) // 2]],
        "related": [dict(c) for c in other_configs[:2]],
        "history": [Observation(OTHER, c, user_time(OTHER, c)) for c in other_configs[::7]],
        "stored": [dict(c) for c in every[::11]],
    }


def proposals(case: str, seed: int = 5) -> list[str]:
    """The digests of the configs case ``case`` proposes in :data:`ASKS` asks."""
    name, options = CASES[case]
    bound = USER_SPACE.bind(PROBLEM)
    inputs = _inputs()
    sampler = valid_sampler(
        name, bound, seed=seed, seeds=inputs["seeds"], related=inputs["related"],
        history=inputs["history"], taken=lambda: inputs["stored"], **options,
    )
    study = optuna.create_study(sampler=sampler)
    dists = distributions(bound)
    out = []
    for i in range(ASKS):
        try:
            trial = study.ask(dists)
        except ExhaustedError:
            break
        config = Config(trial.params)
        out.append(config.digest())
        optuna_adapter.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok")
        if i % 9 == 4:  # a failure now and then, as a compile error would be
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, user_time(PROBLEM, config))
    return out


def fingerprint(case: str) -> str:
    return hashlib.sha256("\n".join(proposals(case)).encode()).hexdigest()[:16]


def _available(case: str) -> bool:
    import importlib.util

    if case == "cmaes":
        return importlib.util.find_spec("cmaes") is not None
    if case == "ranked-sklearn":
        return importlib.util.find_spec("sklearn") is not None
    return True


@pytest.mark.parametrize("case", sorted(CASES))
def test_seeded_proposals_are_pinned(case):
    """A sampler's 24 seeded proposals (seeds, related winners, stored configs, failures) are
    exactly those pinned in PINNED."""
    if not _available(case):
        pytest.skip(f"{case}: its package is not installed")
    if case not in PINNED:
        pytest.skip(f"{case}: not pinned (its package was missing where the table was made)")
    assert fingerprint(case) == PINNED[case]


def test_pinned_proposals_are_valid_and_distinct():
    """The pinned sequences are worth pinning: every proposal distinct (and the walk long)."""
    for case in ("auto", "ranked-numpy", "brute"):
        seq = proposals(case)
        assert len(seq) == ASKS and len(set(seq)) == ASKS, case
    assert math.isfinite(user_time(PROBLEM, dict(USER_SPACE.bind(PROBLEM).sample(1, seed=0)[0])))


if __name__ == "__main__":
    for case in sorted(CASES):
        if _available(case):
            print(f"    {case!r}: {fingerprint(case)!r},")

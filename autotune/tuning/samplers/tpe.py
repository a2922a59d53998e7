"""``tpe``: Optuna's multivariate TPE."""

from __future__ import annotations

import warnings

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["TPE", "SAMPLER", "tpe_sampler"]


def tpe_sampler(seed: int | None) -> optuna.samplers.TPESampler:
    """Multivariate TPE, which models interactions (tile sizes with pipeline depth); group=True
    lets it handle the conditional spaces that repair produces."""
    with warnings.catch_warnings():  # multivariate and group are "experimental" since 2.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=6)


class TPE(Sampler):
    """Multivariate TPE; its proposals are repaired to the nearest valid, untaken config."""

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return tpe_sampler(request.seed)


SAMPLER = TPE()

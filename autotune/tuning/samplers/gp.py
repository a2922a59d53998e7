"""``gp``: Optuna's Gaussian-process sampler (the ``[gp]`` extra: torch and scipy; the registry
checks they are installed)."""

from __future__ import annotations

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["GP", "SAMPLER"]


class GP(Sampler):
    """Bayesian optimisation with a Gaussian process; its proposals are repaired like TPE's."""

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GPSampler(seed=request.seed, n_startup_trials=6)


SAMPLER = GP()

"""``cmaes``: Optuna's CMA-ES (the ``[cmaes]`` extra; the registry checks it is installed)."""

from __future__ import annotations

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["CmaEs", "SAMPLER"]


class CmaEs(Sampler):
    """CMA-ES over the ordered tunables; its proposals are repaired like TPE's."""

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=request.seed, n_startup_trials=6,
                                            warn_independent_sampling=False)


SAMPLER = CmaEs()

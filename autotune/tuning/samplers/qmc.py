"""``qmc``: Optuna's quasi-Monte Carlo sampler (a scrambled Sobol sequence)."""

from __future__ import annotations

import warnings

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["QMC", "SAMPLER"]


class QMC(Sampler):
    """Low-discrepancy points over the raw grid, repaired to valid, untaken configs."""

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():  # "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=request.seed)


SAMPLER = QMC()

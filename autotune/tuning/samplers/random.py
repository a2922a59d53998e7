"""``random``: uniform over the untaken valid configs (random search done right: repairing a
random point of the raw grid would favour configs next to invalid regions)."""

from __future__ import annotations

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["Random", "SAMPLER"]


class Random(Sampler):
    """:class:`~autotune.tuning.sampling.ValidSampler` draws from the valid set itself; the base
    only answers parameters outside the space."""

    mode = "uniform"

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=request.seed)


SAMPLER = Random()

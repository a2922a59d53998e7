"""``brute``: every valid config, in order (Optuna's brute-force sampler does not know the
constraints, so the valid set is walked instead)."""

from __future__ import annotations

import optuna

from autotune.tuning.samplers.base import Request, Sampler

__all__ = ["Brute", "SAMPLER"]


class Brute(Sampler):
    """:class:`~autotune.tuning.sampling.ValidSampler` walks the valid set; the base only
    answers parameters outside the space."""

    mode = "brute"

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=request.seed)


SAMPLER = Brute()

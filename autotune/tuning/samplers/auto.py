"""``auto``, the default: the ranked sampler where the replay over recorded ground truth says
it needs fewer trials, else multivariate TPE with local moves around the best config."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import optuna

from autotune.tuning.samplers.base import Request, Sampler
from autotune.tuning.samplers.tpe import tpe_sampler

if TYPE_CHECKING:
    from autotune.space.problem import Problem
    from autotune.tuning.samplers.ranked import Observation

__all__ = ["Auto", "SAMPLER", "DEFAULT_LOCAL_SHARE", "RANKED_WHEN_WARM", "RANKED_MAX_VALID",
           "RANKED_WITH_COST_MODEL"]

# The share of local moves (around the best so far) in the "auto" sampler's proposals; chosen
# by the replay over recorded ground truth (benchmarks/search_efficiency.py,
# benchmarks/RESULTS.md §4).
DEFAULT_LOCAL_SHARE = 0.5

# Where the replay over recorded ground truth (benchmarks/search_efficiency.py,
# benchmarks/RESULTS.md §4) says the ranked sampler needs fewer trials than TPE with local moves, "auto" picks
# it: when the database holds results of the same kernel and device at other shapes (warm), when
# the whole valid set fits in its candidate pool (the model then ranks every config), or when
# the kernel declares a cost model (it ranks before anything is measured).
RANKED_WHEN_WARM = True
RANKED_MAX_VALID = 1024
RANKED_WITH_COST_MODEL = True


class Auto(Sampler):
    """Multivariate TPE with :data:`DEFAULT_LOCAL_SHARE` of its proposals local moves; resolves
    to ``ranked`` where that pays (:meth:`resolve`)."""

    local_share = DEFAULT_LOCAL_SHARE
    reads_history = True  # to decide whether it is warm

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return tpe_sampler(request.seed)

    def resolve(
        self, *, history: Iterable[Observation], problem: Problem,
        valid_count: int | Callable[[], int] | None, cost_model: bool,
    ) -> str | None:
        """``ranked`` when ``history`` holds results of other shapes or other devices
        (:data:`RANKED_WHEN_WARM`), the kernel has a cost model (:data:`RANKED_WITH_COST_MODEL`)
        or the space has at most :data:`RANKED_MAX_VALID` valid configs (counted last)."""
        warm = any(o.problem != problem or o.device for o in history)
        modelled = cost_model and RANKED_WITH_COST_MODEL
        if (warm and RANKED_WHEN_WARM) or modelled:
            return "ranked"
        count = valid_count() if callable(valid_count) else valid_count
        return "ranked" if count is not None and count <= RANKED_MAX_VALID else None


SAMPLER = Auto()

"""The interface every sampler of the registry implements (:class:`Sampler`).

A sampler here is the recipe the tuner follows for one sampler name: the Optuna sampler that
proposes (:meth:`Sampler.base`), how :class:`~autotune.tuning.sampling.ValidSampler` uses it
(:attr:`Sampler.mode`, :attr:`Sampler.local_share`), what is proposed before it
(:meth:`Sampler.first`), whether it learns from results stored for other shapes
(:attr:`Sampler.reads_history`) and what name it stands for once those are known
(:meth:`Sampler.resolve`: ``auto`` becomes ``ranked`` where that pays). The wrapper then makes
every proposal a valid, untaken config, whatever the sampler.

Imports nothing heavy: the implementations import Optuna (and numpy) themselves.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import optuna

    from autotune.space.problem import Problem
    from autotune.space.search_space import BoundSpace
    from autotune.tuning.samplers.ranked import Observation

__all__ = ["Request", "Sampler", "MODES"]

# How ValidSampler draws: repairs the base sampler's proposals ("base"), draws uniformly from
# the untaken valid configs ("uniform"), or walks the valid set in order ("brute").
MODES = ("base", "uniform", "brute")


@dataclass(frozen=True)
class Request:
    """What the tuner knows when it builds a problem's sampler.

    ``space``: the bound space searched (None only for :func:`~autotune.tuning.sampling.
    make_sampler`, which builds a base sampler alone). ``history``: results of the same kernel
    and device (other shapes, other devices as a prior, this one), read only for a sampler that
    :attr:`~Sampler.reads_history`. ``related``: winners of related problems, nearest first.
    ``estimate``: the kernel's cost model, or None. ``options``: keyword options particular to
    the sampler (the ranked sampler's ``explore``, ``model``...).
    """

    space: BoundSpace | None
    seed: int | None = None
    history: Sequence[Observation] = ()
    related: Sequence[Mapping[str, Any]] = ()
    estimate: Callable[[Any, Mapping[str, Any]], float] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Sampler(abc.ABC):
    """One registered sampler (see the module docstring); a module of
    :mod:`autotune.tuning.samplers` defines one instance as ``SAMPLER``.

    Subclasses override :meth:`base` and, where they differ from the defaults, the class
    attributes and the other methods. Instances hold no state: one serves every study.
    """

    #: How :class:`~autotune.tuning.sampling.ValidSampler` draws (one of :data:`MODES`).
    mode: ClassVar[str] = "base"
    #: The share of proposals that are local moves around the best measured config, unless
    #: the caller gives one.
    local_share: ClassVar[float] = 0.0
    #: Whether the tuner reads the stored results of other shapes for it (``Request.history``).
    reads_history: ClassVar[bool] = False
    #: Its keyword options (``Request.options``) with a parser from text each, for specs such
    #: as the replay's ``ranked+explore=0.2`` (benchmarks/search_efficiency.py).
    options: ClassVar[Mapping[str, Callable[[str], Any]]] = {}

    @abc.abstractmethod
    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        """The Optuna sampler that proposes, seeded with ``request.seed``."""

    def first(self, seeds: Iterable[Mapping[str, Any]], request: Request) -> list[Mapping[str, Any]]:
        """The configs proposed before the base sampler's, in order: by default ``seeds`` (the
        kernel's known-good default), then every related problem's winner."""
        return [*seeds, *request.related]

    def resolve(
        self, *, history: Iterable[Observation], problem: Problem,
        valid_count: int | Callable[[], int] | None, cost_model: bool,
    ) -> str | None:
        """The name of the sampler this one stands for, given what is stored and the space;
        None (the default) for itself. ``valid_count`` may be a function (``space.count``, which
        takes seconds on a large space): call it only where it decides."""
        return None

"""Optuna integration: any registered sampler, made to hand out only valid, unmeasured configs.

:class:`ValidSampler` wraps a base sampler (TPE by default; any of the registry,
:mod:`autotune.tuning.samplers`). It claims the *whole* search space as relative, asks the base
sampler for a proposal (its relative proposal plus independent samples for the rest), and
repairs the proposal to the nearest valid config that no trial of the study (and no stored
result) has taken. So a trial's params are always a valid config before the trial runs: nothing
is wasted on a config that cannot lower, and Optuna's soft constraints (which TPE ignores for
FAIL trials) are not needed. A sampler may instead have the wrapper draw uniformly from the
valid set or walk it in order (:attr:`~autotune.tuning.samplers.base.Sampler.mode`). Seed
configs (JAX's defaults, winners of related problems) are proposed first, when valid and untaken.

:func:`valid_sampler` builds the wrapper for a sampler name through the registry's interface
(:class:`~autotune.tuning.samplers.base.Sampler`); nothing here names a particular sampler.

Why one piece (over 400 lines): the valid-config sampler and its distributions are one contract
with Optuna's ``BaseSampler``: the distributions are what the wrapper claims as relative.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import math
import random
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.space.problem import Config
from autotune.space.search_space import BoundSpace
from autotune.tuning import optuna_adapter as oa
from autotune.tuning import samplers as registry
from autotune.tuning.names import SAMPLERS
from autotune.tuning.samplers.auto import DEFAULT_LOCAL_SHARE, RANKED_MAX_VALID, RANKED_WHEN_WARM
from autotune.tuning.samplers.base import Request
from autotune.tuning.trial_index import OUTCOME_ATTR, TrialIndex  # noqa: F401 - OUTCOME_ATTR re-exported

if TYPE_CHECKING:
    from autotune.tuning.samplers.ranked import Observation

__all__ = [
    "ValidSampler", "SAMPLERS", "DEFAULT_LOCAL_SHARE", "RANKED_WHEN_WARM", "RANKED_MAX_VALID", "make_sampler",
    "valid_sampler", "resolve_sampler", "reads_history", "require_sampler_packages", "distributions",
    "ExhaustedError",
]

logger = logging.getLogger(__name__)

# SAMPLERS: the names job files give (autotune.tuning.names: the registry's, read without
# importing Optuna), re-exported here; DEFAULT_LOCAL_SHARE and the RANKED_* rules of "auto"
# live in autotune.tuning.samplers.auto, re-exported here.
# Past this many measured trials, the base sampler (TPE, CMA-ES, GP: fits that grow with the
# trial count) proposes from a model study holding the MODEL_TRIALS / 2 best and the
# MODEL_TRIALS / 2 latest trials (topped up as trials finish, rebuilt at twice the size), so
# a proposal costs about the same at 10,000 trials as at MODEL_TRIALS (issue 16).
MODEL_TRIALS = 200

# The centres whose neighbours a sampler keeps for its local moves (the 8 best it climbs from,
# and room for those that replace them).
NEIGHBOURS_KEPT = 64

# OUTCOME_ATTR: a trial's system attribute naming the measured outcome (autotune.tuning.trial_index).
DIGEST_ATTR = "autotune_config"

# Raises a JobError naming the extra to install when a sampler's packages are missing.
require_sampler_packages = registry.require_packages


def resolve_sampler(
    name: str, *, history: Iterable[Observation], problem: Any,
    valid_count: int | Callable[[], int] | None = None, cost_model: bool = False,
) -> str:
    """The sampler ``name`` stands for, given the stored ``history`` (results of the same
    kernel and device), the space's ``valid_count`` (a number, or a function called only where
    it decides) and whether the kernel has a cost model: the registered sampler's
    :meth:`~autotune.tuning.samplers.base.Sampler.resolve` (``"auto"`` becomes ``"ranked"``
    where :mod:`~autotune.tuning.samplers.auto` says that pays), else ``name`` itself."""
    return registry.load(name).resolve(
        history=history, problem=problem, valid_count=valid_count, cost_model=cost_model,
    ) or name


def reads_history(name: str) -> bool:
    """Whether sampler ``name`` learns from (or decides by) the results stored for other
    shapes, so that the tuner reads them for it (``valid_sampler(history=...)``)."""
    return registry.load(name).reads_history


def valid_sampler(
    name: str,
    space: BoundSpace,
    *,
    seed: int | None = None,
    seeds: Iterable[Mapping[str, Any]] = (),
    taken: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
    local: float | None = None,
    related: Iterable[Mapping[str, Any]] = (),
    history: Iterable[Observation] = (),
    options: Mapping[str, Any] | None = None,
    ranked: Mapping[str, Any] | None = None,
    estimate: Callable[[Any, Mapping[str, Any]], float] | None = None,
) -> ValidSampler:
    """The :class:`ValidSampler` for registered sampler ``name`` over ``space``.

    The sampler (:class:`~autotune.tuning.samplers.base.Sampler`) gives the base Optuna
    sampler, how the wrapper draws, its default share of local moves (``local`` overrides it;
    ``auto``'s is :data:`DEFAULT_LOCAL_SHARE`) and what goes first: by default ``seeds``, then
    ``related`` (winners of related problems). ``history`` (results of the same kernel and
    device), ``estimate`` (the kernel's cost model,
    :attr:`~autotune.space.kernel.Kernel.cost_model`) and ``options`` (keyword options of the
    sampler: the ranked sampler's ``explore``, ``model``...; ``ranked`` is the same, its older
    name) reach the samplers that use them (``ranked``: docs/ranked_sampler.md); the others
    ignore them. A sampler whose packages are missing is refused by name
    (:func:`require_sampler_packages`).
    """
    registry.require_packages(name)  # first: a module may import its packages
    impl = registry.load(name)
    request = Request(space, seed=seed, history=list(history), related=list(related),
                      estimate=estimate, options={**(ranked or {}), **(options or {})})
    base = impl.base(request)
    first = impl.first(seeds, request)
    if local is None:
        local = impl.local_share
    return ValidSampler(
        space, base, mode=impl.mode, seed=seed, seeds=first, taken=taken, local=local,
    )


_PROPOSER: concurrent.futures.ThreadPoolExecutor | None = None
_PROPOSER_LOCK = threading.Lock()


def _proposer() -> concurrent.futures.ThreadPoolExecutor:
    """The one background thread that makes proposals ahead (``ValidSampler.prefetch``) for
    every study of this process, one at a time."""
    global _PROPOSER
    with _PROPOSER_LOCK:
        if _PROPOSER is None:
            _PROPOSER = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="autotune-propose")
        return _PROPOSER


class ExhaustedError(Exception):
    """Every valid config of the space has been taken: the study is complete."""


def distributions(space: BoundSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions for the tunables of a bound space.

    Ordered integer tunables become ``IntDistribution`` (log-scaled for powers of two, stepped
    for aligned ones) so that TPE, CMA-ES and GP see their order; everything else is
    categorical. A proposal between domain values is snapped back by the repair step.
    """
    out: dict[str, BaseDistribution] = {}
    for param, domain in zip(space.params, space.domains, strict=True):
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in domain)
        if param.ordinal and ints and len(domain) > 1:
            low, high = min(domain), max(domain)
            if param.kind == "pow2":
                out[param.name] = IntDistribution(low, high, log=True)
            else:
                step = math.gcd(*(b - a for a, b in zip(domain, domain[1:], strict=False)))
                out[param.name] = IntDistribution(low, high, step=max(step, 1))
        else:
            out[param.name] = CategoricalDistribution(list(domain))
    return out


def make_sampler(name: str, *, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The base Optuna sampler of registered sampler ``name``, alone (no space: the ranked
    sampler, which needs one, is refused; build it with :func:`valid_sampler`)."""
    registry.require_packages(name)  # first: a module may import its packages
    impl = registry.load(name)
    return impl.base(Request(None, seed=seed))


class ValidSampler(optuna.samplers.BaseSampler):
    """A sampler whose every proposal is a valid config no trial has taken yet.

    Args:
      space: the bound space (kernel + problem) the study searches.
      base: the Optuna sampler that proposes; its proposals are repaired to the nearest valid,
        untaken config.
      mode: ``"base"`` repairs ``base``'s proposals; ``"brute"`` walks the valid set in order;
        ``"uniform"`` draws uniformly from the untaken valid configs (random search done right:
        repairing a random raw-grid point would favour configs next to invalid regions).
      seeds: configs to propose first (in order), where valid and untaken.
      taken: returns extra taken configs, e.g. results already in the database.
      local: the share of proposals (after the seeds) that are local moves: the untaken
        one-tunable neighbour of the best measured config, nearest first
        (:meth:`BoundSpace.neighbours`). The rest come from ``base``.

    ``prefetch`` (off by default; the scheduler turns it on): past :data:`MODEL_TRIALS`
    measured trials, the base's next proposal is computed on a background thread as soon as
    one is handed out, from the model study as it is then, so that the next ask, which comes
    when a result arrives, finds it ready instead of fitting the model (issue 16: a proposal
    in 10 ms at the 99th percentile). Proposals then depend on timing, not only on the seed.
    A base sampler with a ``prefetch`` switch of its own follows this one (the ranked sampler
    finds a stall's family members on its preparer thread).

    Thread safety: as Optuna's samplers; one instance per study and process.
    """

    def __init__(
        self,
        space: BoundSpace,
        base: optuna.samplers.BaseSampler | None = None,
        *,
        mode: str = "base",
        seed: int | None = None,
        seeds: Iterable[Mapping[str, Any]] = (),
        taken: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
        local: float = 0.0,
    ) -> None:
        if not 0.0 <= local <= 1.0:
            raise ValueError(f"local must be a share between 0 and 1, got {local!r}.")
        self._local = local
        self._local_credit = 0.0
        self._space = space
        self._base = base or make_sampler("tpe")
        self._base_template = copy.deepcopy(self._base)  # unused yet: a model study's sampler
        self._model: optuna.Study | None = None
        self._model_base: optuna.samplers.BaseSampler | None = None
        self._model_cursor = 0
        self._model_size = 0
        if mode not in ("base", "brute", "uniform"):
            raise ValueError(f"mode must be 'base', 'brute' or 'uniform', got {mode!r}.")
        self._mode = mode
        self._seed = seed
        self._rng = random.Random(seed)
        self._seeds = [Config(s) for s in seeds]
        self._taken_extra = taken or (lambda: ())
        self._index: TrialIndex | None = None
        self._index_fresh = False  # the next proposal takes the index as it is (index_read)
        self._dists = distributions(space)
        self.exhausted_trial_id: int | None = None
        self.repaired = 0  # proposals the base made that were invalid or taken, then repaired
        self.proposed = 0
        self._brute_pos = 0
        self._prefetch = False
        self._ahead: concurrent.futures.Future[dict[str, Any]] | None = None
        self._neighbours: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], Config]]] = {}

    @property
    def prefetch(self) -> bool:
        """Whether proposals are made ahead on background threads (see the class doc); set on
        the base sampler too where it has the switch (the ranked sampler's family members,
        :attr:`autotune.tuning.samplers.ranked.RankedSampler.prefetch`)."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, on: bool) -> None:
        self._prefetch = on
        if hasattr(self._base, "prefetch"):
            setattr(self._base, "prefetch", on)  # noqa: B010 - any base sampler with the switch

    def diverge(self, salt: str) -> None:
        """Makes this sampler's draws differ from those of other processes that share its seed
        (hosts running one job file propose the same configs in the same order, and every
        such collision costs both an ask). Called on a collision with another process's
        trial, so a process alone keeps its seeded sequence."""
        self._rng = random.Random(f"{self._seed}:{salt}")
        self._base.reseed_rng()

    def prepare(self) -> None:
        """Lets the base sampler make ready ahead of its first proposal, where it can (the
        ranked sampler draws its pool on a background thread)."""
        prepare = getattr(self._base, "prepare", None)
        if callable(prepare):
            prepare()

    def ready(self) -> bool:
        """Whether a proposal now would be quick: a seed goes first without the base sampler;
        else the base's ``ready()`` (the ranked sampler's False until its pool is drawn)."""
        if self._seeds:
            return True
        ready = getattr(self._base, "ready", None)
        return bool(ready()) if callable(ready) else True

    @property
    def base(self) -> optuna.samplers.BaseSampler:
        """The wrapped sampler that proposes."""
        return self._base

    # -- Optuna's sampler interface ----------------------------------------------------------

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        with oa.one_read(study):  # the base sampler's reads answer from the snapshot taken here
            reused = self._index_fresh
            taken = self.taken_keys(study)
            config = self._next(study, trial, taken)
            if config is None and reused:  # configs freed since the index was read: read it
                config = self._next(study, trial, self.taken_keys(study))
        if config is None:
            self.exhausted_trial_id = oa.trial_id(trial)  # the runner closes this empty trial
            raise ExhaustedError(
                f"all {self._space.count()} valid configs of {self._space.problem} are taken"
            )
        self.proposed += 1
        return dict(config)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        # Only reached for a parameter outside the space (user code suggesting extra params).
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._base.after_trial(study, trial, state, values)

    # -- proposals ---------------------------------------------------------------------------

    @property
    def index(self) -> TrialIndex:
        """The study's trials, indexed incrementally (``taken`` is read once, when first
        needed)."""
        if self._index is None:
            self._index = TrialIndex(self._space, self._taken_extra())
        return self._index

    def taken_keys(self, study: optuna.Study) -> TrialIndex:
        """Value tuples of configs no longer free (``key in taken_keys(study)``): measured, or
        being measured now. A trial closed without an outcome (never measured: stale or
        abandoned) leaves its config free. Read from the study, unless :meth:`index_read` said
        the index was just read."""
        index = self.index
        if self._index_fresh:
            self._index_fresh = False
        else:
            index.refresh(study.get_trials(deepcopy=False))
        return index

    def index_read(self) -> None:
        """Says that :attr:`index` was just refreshed from the study: the next proposal takes
        it as it is instead of reading the study's trials again (on an RDB storage, 7
        statements and a commit). The scheduler says so after each ask, whose last step reads
        the study (issue 36); what the index then misses (trials other processes asked since)
        is caught by the scheduler's twin check, which reads after the params are written.
        Base samplers that read the study themselves (TPE under :data:`MODEL_TRIALS`, the
        ranked sampler) still read it, once per proposal."""
        self._index_fresh = True

    def _next(self, study: optuna.Study, trial: FrozenTrial, taken: TrialIndex) -> Config | None:
        space = self._space
        is_taken = taken.__contains__
        while self._seeds:
            # A seed (a known-good config, a related problem's winner) that this problem's
            # rules exclude, or that is taken, is repaired like any proposal: its nearest
            # valid, untaken neighbour keeps most of what made it good.
            seed = self._seeds.pop(0)
            if space.is_valid(seed) and not is_taken(space.key(seed)):
                return seed
            repaired = space.nearest(seed, exclude=is_taken)
            if repaired is not None:
                return repaired
        if self._mode == "uniform":
            return self._uniform(taken)
        if self._mode == "brute":
            valid = space.valid_tuples()
            while self._brute_pos < len(valid):
                t = valid[self._brute_pos]
                self._brute_pos += 1
                if not is_taken(t):
                    return space._config(t)
            return None
        if self._local:
            # Deterministic interleaving: `local` of the proposals, spread evenly.
            self._local_credit += self._local
            if self._local_credit >= 1.0:
                self._local_credit -= 1.0
                move = self._local_move(study, is_taken)
                if move is not None:
                    return move
        proposal = self._base_proposal(study, trial)
        if space.is_valid(proposal) and not is_taken(space.key(proposal)):
            return Config(proposal)
        self.repaired += 1
        return space.nearest(proposal, exclude=is_taken)

    def _local_move(
        self, study: optuna.Study, is_taken: Callable[[tuple[Any, ...]], bool]
    ) -> Config | None:
        """The nearest untaken neighbour of the best measured config (None before any)."""
        # From the best down: when the best's neighbourhood is exhausted, climb from the next.
        for centre in self.index.best_keys(8):
            for key, neighbour in self._neighbours_of(centre):
                if not is_taken(key):
                    return neighbour
        return None

    def _neighbours_of(self, centre: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Config]]:
        """``BoundSpace.neighbours`` of the config ``centre`` (a key), nearest first, with their
        keys: worked out once per centre (the best configs change rarely, and each local move
        of the ask path checked every neighbour's validity again: 1-3 ms of CPU, issue 36).
        At most :data:`NEIGHBOURS_KEPT` centres are kept."""
        found = self._neighbours.get(centre)
        if found is None:
            if len(self._neighbours) >= NEIGHBOURS_KEPT:
                self._neighbours.clear()
            space = self._space
            found = [(space.key(n), n) for n in space.neighbours(space._config(centre))]
            self._neighbours[centre] = found
        return found

    def _uniform(self, taken: TrialIndex) -> Config | None:
        space = self._space
        small = space.count() <= space.MATERIALIZE_LIMIT
        for _ in range(64):  # rejection: cheap while most of the space is untaken
            seed = self._rng.randrange(2**63)
            if small:  # what sample(1, seed=seed) draws, without copying the valid set
                valid = space.valid_tuples()
                if not valid:
                    return None
                key = valid[random.Random(seed).randrange(len(valid))]
                if key not in taken:
                    return space._config(key)
                continue
            (config,) = space.sample(1, seed=seed) or (None,)
            if config is None:
                return None
            if space.key(config) not in taken:
                return config
        free = [t for t in space.valid_tuples() if t not in taken]
        return space._config(self._rng.choice(free)) if free else None

    def _model_study(self) -> tuple[optuna.Study, optuna.samplers.BaseSampler]:
        """The model study (see :data:`MODEL_TRIALS`) and its own base sampler."""
        index = self.index
        if self._model is None or self._model_size >= 2 * MODEL_TRIALS:
            self._new_model(index.window(MODEL_TRIALS // 2, MODEL_TRIALS // 2))
        else:
            for t in index.complete_log[self._model_cursor:]:
                self._model.add_trial(t)
                self._model_size += 1
        self._model_cursor = len(index.complete_log)
        assert self._model is not None and self._model_base is not None
        return self._model, self._model_base

    def _new_model(
        self, window: list[FrozenTrial]
    ) -> tuple[optuna.Study, optuna.samplers.BaseSampler]:
        """A new model study holding ``window``, with a fresh copy of the base sampler."""
        base = copy.deepcopy(self._base_template)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            model = optuna.create_study(direction="minimize", sampler=base)
            model.add_trials(window)
        self._model, self._model_base, self._model_size = model, base, len(window)
        return model, base

    def _base_proposal(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        if self.index.measured > MODEL_TRIALS and self._mode == "base":
            ahead, self._ahead = self._ahead, None
            # Made ahead (prefetch): from the model as it was at the previous proposal.
            proposal = ahead.result() if ahead is not None else None
            model, base = self._model_study()
            if proposal is None:
                proposal = self._model_proposal(model, base)
            if self.prefetch:
                # The model's rebuild (see _model_study) is made ahead too, from the trials
                # seen now, a little before the model would reach its size limit.
                window = (self.index.window(MODEL_TRIALS // 2, MODEL_TRIALS // 2)
                          if self._model_size >= 2 * MODEL_TRIALS - MODEL_TRIALS // 4 else None)
                self._ahead = _proposer().submit(self._propose_ahead, model, base, window)
            return proposal
        return self._propose(self._base, study, trial)

    def _propose_ahead(
        self, model: optuna.Study, base: optuna.samplers.BaseSampler,
        window: list[FrozenTrial] | None,
    ) -> dict[str, Any]:
        if window is not None:
            model, base = self._new_model(window)
        return self._model_proposal(model, base)

    def _model_proposal(
        self, model: optuna.Study, base: optuna.samplers.BaseSampler
    ) -> dict[str, Any]:
        # The proposal is made for a trial of the model study (the base may write to it),
        # closed right after; it counts towards the model's size.
        model.ask()
        (stand_in,) = model.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        try:
            return self._propose(base, model, stand_in)
        finally:
            model.tell(stand_in.number, state=TrialState.FAIL)
            self._model_size += 1

    def _propose(
        self, base: optuna.samplers.BaseSampler, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, Any]:
        relative_space = base.infer_relative_search_space(study, trial)
        relative_space = {k: v for k, v in relative_space.items() if k in self._dists}
        proposal: dict[str, Any] = {}
        if relative_space:
            proposal.update(base.sample_relative(study, trial, relative_space))
        for name, dist in self._dists.items():
            if name not in proposal:
                proposal[name] = base.sample_independent(study, trial, name, dist)
        return proposal

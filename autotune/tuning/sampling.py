"""Optuna integration: any Optuna sampler, made to hand out only valid, unmeasured configs.

:class:`ValidSampler` wraps a base sampler (TPE by default; random, CMA-ES, GP, QMC). It claims
the *whole* search space as relative, asks the base sampler for a proposal (its relative
proposal plus independent samples for the rest), and repairs the proposal to the nearest valid
config that no trial of the study (and no stored result) has taken. So a trial's params are
always a valid config before the trial runs: nothing is wasted on a config that cannot lower,
and Optuna's soft constraints (which TPE ignores for FAIL trials) are not needed.

Optuna's own brute-force sampler does not know the constraints, so ``"brute"`` here walks the
valid set itself, in order. Seed configs (JAX's defaults, winners of related problems) are
proposed first, when valid and untaken.

Why one piece (over 400 lines): the valid-config sampler, its distributions and the sampler
registry (names, seeds) are one contract with Optuna's ``BaseSampler``: the distributions are
what the wrapper claims as relative, and the registry is what job files name.
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

from autotune.errors import JobError
from autotune.space.problem import Config
from autotune.space.search_space import BoundSpace
from autotune.tuning import optuna_adapter as oa
from autotune.tuning.names import SAMPLERS
from autotune.tuning.trial_index import OUTCOME_ATTR, TrialIndex  # noqa: F401 - OUTCOME_ATTR re-exported

if TYPE_CHECKING:
    from autotune.tuning.ranked_sampler import Observation

__all__ = [
    "ValidSampler", "SAMPLERS", "DEFAULT_LOCAL_SHARE", "RANKED_WHEN_WARM", "RANKED_MAX_VALID", "make_sampler",
    "valid_sampler", "resolve_sampler", "distributions", "ExhaustedError",
]

logger = logging.getLogger(__name__)

# SAMPLERS: the names job files give (autotune.tuning.names, a static list the CLI reads
# without importing Optuna), re-exported here.
# Past this many measured trials, the base sampler (TPE, CMA-ES, GP: fits that grow with the
# trial count) proposes from a model study holding the MODEL_TRIALS / 2 best and the
# MODEL_TRIALS / 2 latest trials (topped up as trials finish, rebuilt at twice the size), so
# a proposal costs about the same at 10,000 trials as at MODEL_TRIALS (issue 16).
MODEL_TRIALS = 200
# The share of local moves (around the best so far) in the "auto" sampler's proposals; chosen
# by the replay over recorded ground truth (benchmarks/search_efficiency.py,
# benchmarks/RESULTS.md §4).
DEFAULT_LOCAL_SHARE = 0.5

# OUTCOME_ATTR: a trial's system attribute naming the measured outcome (autotune.tuning.trial_index).
DIGEST_ATTR = "autotune_config"


# Where the replay over recorded ground truth (benchmarks/search_efficiency.py,
# benchmarks/RESULTS.md §4) says the ranked sampler needs fewer trials than TPE with local
# moves, "auto" picks it: when the database holds results of the same kernel and device at other shapes (warm), when
# the whole valid set fits in its candidate pool (the model then ranks every config), or when
# the kernel declares a cost model (it ranks before anything is measured).
RANKED_WHEN_WARM = True
RANKED_MAX_VALID = 1024
RANKED_WITH_COST_MODEL = True


def resolve_sampler(
    name: str, *, history: Iterable[Observation], problem: Any,
    valid_count: int | Callable[[], int] | None = None, cost_model: bool = False,
) -> str:
    """The sampler ``name`` stands for: ``"auto"`` is ``"ranked"`` when ``history`` holds
    results of other shapes or other devices (:data:`RANKED_WHEN_WARM`), the space has at most
    :data:`RANKED_MAX_VALID` valid configs, or the kernel has a cost model
    (:data:`RANKED_WITH_COST_MODEL`), else TPE with local moves. ``valid_count`` may be a
    function (``space.count``), called only when the others do not decide."""
    if name != "auto":
        return name
    warm = any(o.problem != problem or o.device for o in history)
    modelled = cost_model and RANKED_WITH_COST_MODEL
    if (warm and RANKED_WHEN_WARM) or modelled:
        return "ranked"
    count = valid_count() if callable(valid_count) else valid_count
    return "ranked" if count is not None and count <= RANKED_MAX_VALID else "auto"


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
    ranked: Mapping[str, Any] | None = None,
    estimate: Callable[[Any, Mapping[str, Any]], float] | None = None,
) -> ValidSampler:
    """The :class:`ValidSampler` for sampler ``name`` over ``space``.

    ``"auto"`` (the default) is multivariate TPE with :data:`DEFAULT_LOCAL_SHARE` of its
    proposals replaced by local moves around the best measured config; ``local`` overrides
    that share (for any sampler but ``random`` and ``brute``). ``seeds`` are proposed first,
    then ``related`` (winners of related problems).

    ``"ranked"`` is :class:`~autotune.tuning.ranked_sampler.RankedSampler`: a cost model, learnt from
    ``history`` (results of the same kernel and device, other shapes and this one) and the
    study's trials, ranks a pool of valid candidates; ``related`` configs join its pool instead
    of being proposed first. ``ranked`` passes keyword options to it (``explore``, ``model``...);
    ``estimate`` is the kernel's cost model (:attr:`~autotune.space.kernel.Kernel.cost_model`),
    which it ranks with before anything is measured. Other samplers ignore it.
    """
    if local is None:
        local = DEFAULT_LOCAL_SHARE if name == "auto" else 0.0
    mode = {"random": "uniform", "brute": "brute"}.get(name, "base")
    if name == "ranked":
        from autotune.tuning.ranked_sampler import RankedSampler

        related = list(related)
        base: optuna.samplers.BaseSampler = RankedSampler(
            space, seed=seed, history=history, related=related, estimate=estimate,
            **dict(ranked or {}),
        )
        # The nearest related problem's winner first (a strong guess at a near shape) unless the
        # kernel's cost model ranks; the others (all, with a cost model) join the model's pool.
        seeds = [*seeds, *related[:1]] if estimate is None else list(seeds)
    else:
        base = make_sampler(name, seed=seed)
        seeds = [*seeds, *related]
    return ValidSampler(
        space, base, mode=mode, seed=seed, seeds=seeds, taken=taken, local=local,
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
    """The base Optuna sampler called ``name`` (one of :data:`SAMPLERS`).

    ``random`` and ``brute`` return a plain RandomSampler: :class:`ValidSampler` then draws
    or walks the valid set itself (see :func:`valid_sampler`).
    """
    if name in ("tpe", "auto"):
        # Multivariate TPE models interactions (tile sizes with pipeline depth); group=True
        # lets it handle the conditional spaces that repair produces.
        with warnings.catch_warnings():  # multivariate and group are "experimental" since 2.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=6
            )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        require_sampler_packages("cmaes")
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=6, warn_independent_sampling=False)
    if name == "gp":
        require_sampler_packages("gp")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=6)
    if name == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=seed)
    if name == "brute":
        return optuna.samplers.RandomSampler(seed=seed)  # unused: ValidSampler walks the set
    if name == "ranked":
        raise JobError("the ranked sampler needs its space: build it with valid_sampler().")
    raise JobError(f"Unknown sampler {name!r}: expected one of {', '.join(SAMPLERS)}.")


# The samplers that need packages outside autotune's dependencies: the modules, and the extra
# of pyproject.toml that installs them.
SAMPLER_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "cmaes": (("cmaes",), "cmaes"),
    "gp": (("torch", "scipy"), "gp"),
}


def require_sampler_packages(name: str) -> None:
    """Raises a JobError naming the extra to install when sampler ``name`` needs packages that
    are missing; job files, ``--sampler`` and ``autotune.tune`` check it before anything runs
    (``--dry-run`` included). Finds the modules without importing them."""
    import importlib.util

    if name not in SAMPLER_PACKAGES:
        return
    modules, extra = SAMPLER_PACKAGES[name]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise JobError(
            f"sampler {name!r} needs {', '.join(missing)}, which is not installed: "
            f"pip install 'autotune[{extra}]' (or pip install {' '.join(missing)}); or use one "
            "of auto, tpe, random, qmc, brute, ranked."
        )


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
        self._dists = distributions(space)
        self.exhausted_trial_id: int | None = None
        self.repaired = 0  # proposals the base made that were invalid or taken, then repaired
        self.proposed = 0
        self._brute_pos = 0
        self.prefetch = False
        self._ahead: concurrent.futures.Future[dict[str, Any]] | None = None

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
            taken = self.taken_keys(study)
            config = self._next(study, trial, taken)
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
        abandoned) leaves its config free."""
        index = self.index
        index.refresh(study.get_trials(deepcopy=False))
        return index

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
            for neighbour in self._space.neighbours(self._space._config(centre)):
                if not is_taken(self._space.key(neighbour)):
                    return neighbour
        return None

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
        assert self._model_base is not None
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

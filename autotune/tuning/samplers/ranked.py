"""A model-ranked proposal step: score many valid candidates, measure the most promising.

:class:`RankedSampler` is an Optuna sampler (public ``BaseSampler`` API only) for one bound
space. It draws a pool of valid configs cheaply (:meth:`BoundSpace.sample`, uniform over the
valid set), scores every candidate with a cost model, and hands out the best-scored untaken one;
a share of its proposals (``explore``) is a random candidate instead, so a wrong model cannot
lock the search into one corner. After each refit the pool also takes in the one-tunable
neighbours (:meth:`BoundSpace.neighbours`) of the best measured configs, so the model can climb
where the uniform pool is thin.

The model predicts the log of the run time, relative to the problem's typical time:

* **Prior** (transfer across shapes): every result stored for the same kernel and device at
  other shapes (``history``), failures counted as twice as slow as that problem's slowest
  config. Fitted once per sampler (and cached for identical histories).
* **A kernel's cost model** (``estimate``), where it declares one: the prior, cold or warm, after
  a climb on it alone has brought its best configs into the pool; measurements correct it (by
  effects of families and of the values it misjudges, and near where they were made by
  similarity), and it is dropped if they contradict it.
* **Online**: the study's own measured trials (and ``history`` rows of this very problem). With
  a prior, a second model learns the residual of the prior on them; without, it learns the
  times themselves. Refits happen in batches (every trial at first, then every ``n // 8``), so
  a proposal costs a lookup in a sorted pool, not a fit.

Features are derived from the space alone, so any kernel that declares its tunables gets them
(:class:`Features`): each integer tunable's log2 and each choice one-hot, the problem's dims, the
log ratio of every problem dim to every integer tunable, and, for tunables named after a dim
(``tile_m``/``block_m`` with ``m``, ``block_q`` with ``seq_q``: the same last word), the tiles
per dim, the padding wasted, the tiles of every combination of dims in waves over the SM count
(and the tail wave's occupancy), the tile's arithmetic intensity and a footprint proxy
(pipeline-depth-like tunables times the tile's area). A kernel may add its own
(``extra_features``, e.g. its shared-memory estimate).

The model is scikit-learn's ``ExtraTreesRegressor`` (the ``[model]`` extra) when installed, with
the spread of its trees as an uncertainty bonus; else ridge regression on the same features with
``numpy.linalg.lstsq``.

Why one piece (over 400 lines): the features, the two cost-model backends and the sampler that
ranks with them are one model; the stored history is its training data. :data:`SAMPLER` is the
registry's ``ranked`` (:mod:`autotune.tuning.samplers`).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import importlib.util
import itertools
import logging
import math
import queue
import random
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.devices import current_device
from autotune.errors import JobError
from autotune.space.outcomes import DeviceInfo, DeviceKind
from autotune.space.problem import Config, Problem, dtype_bytes
from autotune.space.search_space import Aligned, BoundSpace, Choice, PowerOfTwo
from autotune.storage.protocol import TrialStore
from autotune.tuning.samplers.base import Request, Sampler

__all__ = [
    "Observation",
    "Features",
    "stored_history",
    "RankedSampler",
    "MODELS",
    "model_backend",
    "DEFAULT_CANDIDATES",
    "DEFAULT_EXPLORE",
    "Ranked",
    "SAMPLER",
]

logger = logging.getLogger(__name__)

MODELS = ("auto", "sklearn", "numpy")
# Candidates drawn per study; scoring 1024 takes a few milliseconds.
DEFAULT_CANDIDATES = 1024
# The share of proposals that are a random pool candidate rather than the model's best.
DEFAULT_EXPLORE = 0.1
# A failed config (does not compile, wrong result, timeout, crash) is learnt as this many times
# slower than the slowest config measured for its problem.
FAIL_FACTOR = 2.0
# Best measured configs whose neighbours join the pool at each refit.
CLIMB_FROM = 3
# How many of the study's own results the prior (other shapes) counts as.
PRIOR_WEIGHT = 8.0
# With a kernel's cost model: before the first proposal, a climb on the estimate alone from the
# pool's best candidates (this many at a time, at most this many rounds) through two-tunable
# moves; the best estimated configs it finds (this many) join the pool. 0.2-0.75 s per study.
ESTIMATE_CLIMB_FROM = 8
ESTIMATE_CLIMB_ROUNDS = 3
ESTIMATE_POOL = 64
# Then, at most this many times, a climb from the best estimated config seen, until it is the
# best of its two-tunable neighbourhood: the rounds climb from one config of each family of
# near-twins, so the estimate's best variant can sit two moves from the one they reached (cold,
# the H100 at 4096^3: a grid variant 0.3% behind by estimate, 1.8% by measurement).
ESTIMATE_POLISH_STEPS = 4
# Of configs whose estimates are this close (log), the climb's pool keeps the best one only:
# tunables the cost model ignores or barely weighs (grid order, epilogue tiles) make families of
# near-equal estimates, and on the H200's decode shape 64x4096x4096 one family's variants filled
# the 64 and took 10-16 of a live job's first 24 trials, 20% slower than the best
# (benchmarks/RESULTS.md §6). The measured family's neighbours still join the pool as it climbs.
ESTIMATE_TWIN = math.log(1.005)
# A proposal passes over a config whose estimate a config already taken (measured or in flight)
# shares (within ESTIMATE_TWIN) for the next one of another estimate, while that one scores
# within ESTIMATE_TWIN_MARGIN (log) of it: measuring a twin tells the estimate nothing new, and
# the local moves (``climb``) still try the variants of the best measured configs.
ESTIMATE_TWIN_MARGIN = math.log(1.1)
# With a cost model, a local move (``climb``) is made only where the best untaken neighbour of
# the best measured configs scores within CLIMB_MARGIN (log) of the best untaken candidate;
# else that proposal is the ranked one, and the move waits until the climb is competitive. Live
# on the H200 at 128x8192x8192, with 8 configs asked before the second result, every other one of
# the first 13 climbed from the default, the only config measured (to its tile_n 128 variant,
# then its grid variants, which the estimate puts 1.7-2.5x its best: 68-92 us against 40.3), and
# 4 of 8 runs crowned a family 4.5-4.9% behind the best (benchmarks/RESULTS.md §11).
CLIMB_MARGIN = math.log(1.1)
# The cost model must order the measured configs better than chance (ESTIMATE_TRUST of the pairs
# that differ by more than ESTIMATE_CLEAR in log time, both measured and estimated, once there
# are ESTIMATE_TRUST_PAIRS such pairs), or the sampler stops using it as its prior.
ESTIMATE_CLEAR = 0.1
ESTIMATE_TRUST = 0.5
ESTIMATE_TRUST_PAIRS = 6
# With a cost model, the online correction of the estimate by this problem's measurements, in
# two parts (RankedSampler._refit):
# - additive: the residuals (log time less the estimate's) as a sum of effects, one per family
#   (below) and one per value of each tunable outside the family columns, fitted by ridge
#   regression (RESIDUAL_RIDGE, each result counting 1; residuals clipped to
#   ESTIMATE_SCALE_SLACK): an effect of a value the estimate misjudges (a 2-block cluster at
#   64x4096x4096 on the H100, 7% faster than estimated) reaches every config with that value;
# - local: what is left of each measured config's residual spreads to the pool by similarity,
#   exp(-(LOCAL_DECAY x the other tunables that differ + FAMILY_DECAY x the family tunables that
#   differ)), shrunk towards none by LOCAL_SHRINK where nothing measured is near: one family's
#   error says little of the next family's (at 4096^3 on the H100, 64x256x64 measured 24%
#   slower than estimated with 2 stages and 2% faster with 4).
LOCAL_DECAY = 1.0
FAMILY_DECAY = 2.0
LOCAL_SHRINK = 0.5
RESIDUAL_RIDGE = 1.0
# The estimate's scale on a problem is the median over the measured families of each one's
# smallest residual, among the configs within SCALE_NEAR (log) of the best measured: a family
# counts once however many of its variants were measured, and configs far from the best (an
# exploratory draw 30x slower) say nothing of the scale near it.
SCALE_NEAR = math.log(1.1)
# A cost model in seconds is trusted to be within ESTIMATE_SCALE_SLACK (log) of the measured
# times on a problem; one further off than ESTIMATE_SCALE_OFF is taken to be in other units.
ESTIMATE_SCALE_SLACK = math.log(1.2)
ESTIMATE_SCALE_OFF = math.log(4.0)
# With a cost model, other shapes' winners rank as if this much faster (log): one goes first when
# the estimate puts it within about 3% of its best.
RELATED_BONUS = 0.03
# Family diversity (with a cost model): a family is the configs that share the values of the
# tunables the estimate is sensitive to (a one-tunable move changes it by more than
# ESTIMATE_CLEAR in at least FAMILY_SHARE of the moves from its best configs: for hopper_matmul
# the tiles and the pipeline depth, not the grid order, epilogue tiles or cluster). After
# FAMILY_PATIENCE measured trials in a row without a gain of FAMILY_GAIN on the best, the
# proposals come from families not measured yet that the estimate puts within FAMILY_MARGIN of
# its best candidate, best estimated first (local moves wait meanwhile), and the best estimated
# member of each family two moves from the best measured config joins the pool. Live on the
# H100 at 4096^3, 3 of 5 runs spent 25-30 of 32 trials on the grid-order variants of the
# estimate's first family, 2% slower than a family it ranked 5th (benchmarks/RESULTS.md §12).
FAMILY_PATIENCE = 2
FAMILY_MARGIN = math.log(1.05)
FAMILY_GAIN = 0.005
FAMILY_SHARE = 0.25
FAMILY_FROM = 64
# The feature the cost model's estimate becomes (log seconds).
ESTIMATE_FEATURE = "extra:estimate"

# A trial's system attribute naming the measured outcome (written by the tuner and the replay;
# the same name as ``autotune.tuning.sampling.OUTCOME_ATTR``, repeated to avoid an import cycle).
OUTCOME_ATTR = "autotune_outcome"


@dataclass(frozen=True)
class Observation:
    """One measured config of a problem: its median time, or None when it failed.

    ``device``: ``""`` when measured on the device being tuned, else the name of the other
    device it was measured on (a prior only: never "already measured here")."""

    problem: Problem
    config: Mapping[str, Any]
    time_us: float | None
    device: str = ""


def stored_history(store: TrialStore, problem: Problem, device: DeviceInfo) -> list[Observation]:
    """What ``store`` holds for ``problem``'s kernel on ``device`` (same name and kind), as
    observations (failures with no time): every result of ``problem``, and a bounded summary of
    the nearest other shapes (:meth:`~autotune.storage.store.Store.observations`: their fastest
    configs and an even sample, a few thousand results at most however large the table); on a
    GPU, then the same summary of each other GPU, labelled with its name (the prior learns each
    device's times relative to its own on each problem: a per-device scale)."""
    found = store.observations(problem, device_name=device.name, device_kind=device.kind)
    out = [Observation(o.problem, o.config, o.time_us) for o in found]
    if device.kind == DeviceKind.GPU:
        for other in store.devices():
            if other.kind != DeviceKind.GPU or other.name == device.name:
                continue
            out.extend(
                Observation(o.problem, o.config, o.time_us, device=other.name)
                for o in store.observations(problem, device_name=other.name,
                                            device_kind=other.kind)
            )
    return out


def model_backend(model: str = "auto") -> str:
    """The model library ``model`` resolves to here: ``"sklearn"`` or ``"numpy"``.

    Raises:
      ValueError: ``model`` is not one of :data:`MODELS`.
      ImportError: ``model="sklearn"`` and scikit-learn is not installed; the message says how
        to install it.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}.")
    if model == "numpy":
        return "numpy"
    # Found, not imported: importing scikit-learn takes seconds, which would delay a job's
    # first trial. It is imported in the background (_prefetch) and where the model is fitted.
    if not _sklearn_installed():
        if model == "sklearn":
            raise ImportError(
                "the ranked sampler's model='sklearn' needs scikit-learn: "
                "pip install 'autotune[model]' (or pip install scikit-learn), or use model='numpy'."
            )
        return "numpy"
    _prefetch_sklearn()
    return "sklearn"


def _sklearn_installed() -> bool:
    if "sklearn" in sys.modules:  # imported, or blocked (None)
        return sys.modules["sklearn"] is not None
    try:
        return importlib.util.find_spec("sklearn") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def _prefetch_sklearn() -> None:
    """Imports scikit-learn's trees on a daemon thread, once per process, so that the first
    fit finds them loaded (an import already under way is waited for, not repeated)."""

    def load() -> None:
        with contextlib.suppress(Exception):
            import sklearn.ensemble  # noqa: F401

    threading.Thread(target=load, name="autotune-sklearn-import", daemon=True).start()


# ---------------------------------------------------------------------------------------------
# Features.


def _last_word(name: str) -> str:
    return name.rsplit("_", 1)[-1].lower()


def _log2(v: float) -> float:
    return math.log2(v) if v > 0 else -1.0


class Features:
    """Shape-relative features of (problem, config) pairs, derived from a kernel's tunables.

    Args:
      params: the kernel's tunables (``BoundSpace.params``); values of other problems' configs
        are read by name.
      dims: the problem's shape keys, in a fixed order.
      num_sms: the device's SM count, for waves (default: the current device's,
        :func:`autotune.devices.current_device`).
      extra: ``extra(problem, config) -> {name: float}``, features the kernel knows of itself.
    """

    def __init__(
        self,
        params: Sequence[Any],
        dims: Sequence[str],
        *,
        num_sms: int | None = None,
        extra: Callable[[Problem, Mapping[str, Any]], Mapping[str, float]] | None = None,
    ) -> None:
        self.numeric: list[str] = []
        self.nullable: list[str] = []
        self.categorical: list[tuple[str, tuple[Any, ...]]] = []
        for p in params:
            if isinstance(p, Aligned | PowerOfTwo):
                self.numeric.append(p.name)
            elif isinstance(p, Choice) and any(_is_int(v) for v in p.values) and all(
                _is_int(v) or v is None for v in p.values
            ):
                self.numeric.append(p.name)
                if any(v is None for v in p.values):
                    self.nullable.append(p.name)
            elif isinstance(p, Choice):
                self.categorical.append((p.name, tuple(p.values)))
            else:  # Bool, or anything else with a small set of values
                self.categorical.append((p.name, (False, True)))
        self.dims = list(dims)
        self.num_sms = num_sms if num_sms is not None else current_device().num_sms
        self.extra = extra
        # Tunables named after a dim (same last word): the tiles of that dim.
        self.matched: dict[str, list[str]] = {}
        for d in self.dims:
            names = [t for t in self.numeric if _last_word(t) == _last_word(d) or t == d]
            if names:
                self.matched[d] = names
        self.unmatched = [t for t in self.numeric if not any(t in v for v in self.matched.values())]
        self._names: list[str] | None = None

    def signature(self) -> str:
        return repr((self.numeric, self.nullable, self.categorical, self.dims, self.num_sms,
                     self.extra is not None))

    @property
    def names(self) -> list[str]:
        if self._names is None:
            raise RuntimeError("feature names are known after the first matrix is built")
        return self._names

    def matrix(self, problem: Problem, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The feature matrix (one row per config) for configs of ``problem``."""
        rows = [self._row(problem, c) for c in configs]
        if self._names is None and rows:
            self._names = [k for k, _ in rows[0]]
        return np.array([[v for _, v in r] for r in rows], dtype=np.float64).reshape(
            len(rows), -1 if rows else len(self._names or ())
        )

    def _row(self, problem: Problem, c: Mapping[str, Any]) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        add = out.append
        dims = problem.dims
        dim_values = {d: dims.get(d) for d in self.dims}
        sizes = {d: float(v) for d, v in dim_values.items() if _is_int(v)}
        for d in self.dims:
            dim_value = dim_values[d]
            add((f"dim:{d}", _log2(float(dim_value)) if _is_int(dim_value) else float(bool(dim_value))))
        add(("dtype_bytes", float(dtype_bytes(problem.dtype))))
        values: dict[str, float | None] = {}
        for t in self.numeric:
            raw = c.get(t)
            value = float(raw) if _is_int(raw) else None
            values[t] = value
            add((f"log2:{t}", _log2(value) if value is not None else -1.0))
        for t in self.nullable:
            add((f"none:{t}", float(c.get(t) is None)))
        for name, choices in self.categorical:
            chosen = c.get(name)
            for choice in choices:
                add((f"is:{name}={choice!r}", float(chosen == choice and type(chosen) is type(choice))))
        # Every integer tunable against every dim: where the config sits relative to the shape.
        for t in self.numeric:
            for d, size in sizes.items():
                value = values[t]
                add((f"ratio:{d}/{t}", math.log2(size / value) if value else 0.0))
        # Tunables named after a dim tile it.
        primary: dict[str, float] = {}
        for d, names in self.matched.items():
            if d not in sizes:
                continue
            size = sizes[d]
            for t in names:
                value = values[t]
                tiles = math.ceil(size / value) if value else 1
                add((f"tiles:{d}/{t}", math.log2(tiles)))
                add((f"pad:{d}/{t}", tiles * value / size - 1.0 if value else 0.0))
            present = [x for x in (values[t] for t in names) if x]
            primary[d] = max(present) if present else size
        batch = math.prod(sizes[d] for d in sizes if d not in self.matched) if sizes else 1.0
        keys = sorted(primary)
        for r in range(1, min(3, len(keys)) + 1):
            for combo in itertools.combinations(keys, r):
                tiles = math.prod(math.ceil(sizes[d] / primary[d]) for d in combo)
                for label, count in (("", tiles), ("+batch", tiles * batch)):
                    waves = count / self.num_sms
                    add((f"waves:{'*'.join(combo)}{label}", _log2(waves)))
                    add((f"tail:{'*'.join(combo)}{label}", waves / math.ceil(waves)))
        tile_sizes = [primary[d] for d in keys]
        pairs = sum(a * b for a, b in itertools.combinations(tile_sizes, 2)) if len(tile_sizes) > 1 else (
            tile_sizes[0] if tile_sizes else 1.0)
        area = math.prod(tile_sizes) if tile_sizes else 1.0
        add(("tile_volume", _log2(area)))
        add(("tile_surface", _log2(pairs)))
        for a, b in itertools.combinations(keys, 2):
            x, y = primary[a], primary[b]
            add((f"intensity:{a}*{b}", _log2(x * y / (x + y))))
        for t in self.unmatched:
            value = values[t]
            add((f"footprint:{t}", _log2((value or 1.0) * pairs)))
        if self.extra is not None:
            for k, known in sorted(self.extra(problem, c).items()):
                add((f"extra:{k}", float(known)))
        return out


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------------------------
# Models: fit on (X, y, weights), predict a mean and a spread.


class _Model:
    def fit(self, x: np.ndarray, y: np.ndarray) -> _Model:
        raise NotImplementedError

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class _Trees(_Model):
    """scikit-learn's extremely randomised trees; the spread of the trees is the uncertainty."""

    def __init__(self, *, trees: int, seed: int) -> None:
        from sklearn.ensemble import ExtraTreesRegressor

        self._model = ExtraTreesRegressor(
            n_estimators=trees, min_samples_leaf=1, max_features=0.5, random_state=seed, n_jobs=1
        )

    def fit(self, x: np.ndarray, y: np.ndarray) -> _Trees:
        self._model.fit(x, y)
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # One conversion for all trees (each tree's own input check costs more than its walk).
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        per_tree = np.stack([tree.predict(x32, check_input=False) for tree in self._model.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)


class _Ridge(_Model):
    """Ridge regression on standardised features and their squares (``numpy.linalg.lstsq``);
    no spread."""

    def __init__(self, *, alpha: float = 3.0) -> None:
        self._alpha = alpha

    @staticmethod
    def _expand(x: np.ndarray) -> np.ndarray:
        # Squares let a linear model express "best near some tile size" (a valley, not a slope).
        return np.hstack([x, x * x])

    def fit(self, x: np.ndarray, y: np.ndarray) -> _Ridge:
        x = self._expand(x)
        self._mu = x.mean(axis=0)
        scale = x.std(axis=0)
        self._scale = np.where(scale > 1e-12, scale, 1.0)
        z = (x - self._mu) / self._scale
        self._y0 = float(y.mean())
        n, k = z.shape
        a = np.vstack([z, math.sqrt(self._alpha) * np.eye(k)])
        b = np.concatenate([y - self._y0, np.zeros(k)])
        self._coef = np.linalg.lstsq(a, b, rcond=None)[0]
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = ((self._expand(x) - self._mu) / self._scale) @ self._coef + self._y0
        return mean, np.zeros(len(x))


class _EstimatePrior(_Model):
    """The kernel's cost model as a prior: its log estimate, read from the feature matrix."""

    def __init__(self, column: int) -> None:
        self._column = column

    def fit(self, x: np.ndarray, y: np.ndarray) -> _EstimatePrior:
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x[:, self._column].copy(), np.zeros(len(x))


def _with_estimate(
    extra: Callable[[Problem, Mapping[str, Any]], Mapping[str, float]] | None,
    estimate: Callable[[Problem, Mapping[str, Any]], float] | None,
) -> Callable[[Problem, Mapping[str, Any]], Mapping[str, float]] | None:
    """A kernel's own features plus its cost model's log estimate (:data:`ESTIMATE_FEATURE`)."""
    if estimate is None:
        return extra

    def features(problem: Problem, config: Mapping[str, Any]) -> Mapping[str, float]:
        seconds = float(estimate(problem, config))
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(
                f"a kernel's cost_model must return a positive, finite number of seconds; it "
                f"returned {seconds!r} for {problem} with config {dict(config)}: fix the model "
                "or leave cost_model unset"
            )
        out = dict(extra(problem, config)) if extra is not None else {}
        out[ESTIMATE_FEATURE.removeprefix("extra:")] = math.log(seconds)
        return out

    return features


def _log_seconds(times_us: Sequence[float | None]) -> np.ndarray:
    """Measured times (microseconds) as log seconds; a failure twice the slowest."""
    worst = max((t for t in times_us if t is not None and t > 0), default=1.0) * FAIL_FACTOR
    return np.log([(t if t is not None and t > 0 else worst) * 1e-6 for t in times_us])


def _concordance(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, int]:
    """How often the predicted order of two measured configs is right, over the pairs that
    differ clearly in both (by more than :data:`ESTIMATE_CLEAR` in log time; ``measured`` as
    :func:`_log_seconds` gives it, failures slowest), and how many such pairs there are.
    Near-ties say nothing either way."""
    p = np.asarray(predicted, dtype=np.float64)
    dp, dm = p[:, None] - p[None, :], measured[:, None] - measured[None, :]
    clear = np.triu((np.abs(dp) > ESTIMATE_CLEAR) & (np.abs(dm) > ESTIMATE_CLEAR), k=1)
    pairs = int(clear.sum())
    if pairs == 0:
        return 1.0, 0
    return float(((dp * dm) > 0)[clear].mean()), pairs


def _make_model(backend: str, *, trees: int, seed: int) -> _Model:
    return _Trees(trees=trees, seed=seed) if backend == "sklearn" else _Ridge()


def _targets(times: Sequence[float | None]) -> np.ndarray:
    """Log times centred on the problem's median; failures twice as slow as the slowest."""
    ok = np.log([t for t in times if t is not None and t > 0])
    if len(ok) == 0:
        return np.zeros(len(times))
    centre = float(np.median(ok))
    worst = float(ok.max()) + math.log(FAIL_FACTOR)
    return np.array([math.log(t) - centre if t is not None and t > 0 else worst - centre for t in times])


def climb_estimate(
    space: BoundSpace,
    estimate: Callable[[Problem, Mapping[str, Any]], float],
    start: Iterable[Mapping[str, Any]],
    *,
    keep: int = ESTIMATE_POOL,
    accept: Callable[[dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """The ``keep`` best configs by a kernel's cost model that a climb from ``start`` finds,
    best first, one of each family of twins (estimates within ESTIMATE_TWIN).

    From the ESTIMATE_CLIMB_FROM best configs seen but twins of those climbed from already (one
    tunable apart, estimates within ESTIMATE_TWIN), through their neighbours and their
    neighbours' neighbours in ``space`` (two tunables at a time: a tile's shape changes in both
    dims at once), for ESTIMATE_CLIMB_ROUNDS rounds; then from the best seen until it is the best
    of its neighbourhood (at most ESTIMATE_POLISH_STEPS climbs). A uniform draw rarely holds the few
    configs a good estimate ranks first in a space of 10^5, and a
    milliseconds-cheap estimate can look at thousands. ``accept`` filters what is kept (the
    ranked sampler keeps configs valid in its own space and not in its pool yet); the start
    configs are estimated but kept only if ``accept`` takes them.
    """
    problem = space.problem
    scores = {space.key(c): float(estimate(problem, c)) for c in start}
    # Configs climbed from, and their twins: one tunable apart and estimated within ESTIMATE_TWIN
    # (tunables the model barely weighs, grid order say, make near-ties that would spend the
    # climb on one family's variants).
    covered: set[tuple[Any, ...]] = set()
    # Their log estimates, ascending, and their keys side by side: a twin is looked for only
    # among those within ESTIMATE_TWIN (the window a hair wider; the test itself decides).
    covered_values: list[float] = []
    covered_keys: list[tuple[Any, ...]] = []
    climbed: set[tuple[Any, ...]] = set()

    def climb_from(key: tuple[Any, ...]) -> None:
        """Estimates the configs one and two tunables from ``key``."""
        climbed.add(key)
        for k1 in space.neighbour_keys(dict(zip(space.names, key, strict=True))):
            near = space.config_of(k1)
            if k1 not in scores:
                scores[k1] = float(estimate(problem, near))
            for k2 in space.neighbour_keys(near):
                if k2 not in scores:
                    scores[k2] = float(estimate(problem, space.config_of(k2)))

    for _ in range(ESTIMATE_CLIMB_ROUNDS):
        fresh: list[tuple[Any, ...]] = []
        for key in sorted(scores, key=scores.__getitem__):
            if key in covered:
                continue
            value = math.log(scores[key])
            lo = bisect.bisect_left(covered_values, value - ESTIMATE_TWIN - 1e-12)
            hi = bisect.bisect_right(covered_values, value + ESTIMATE_TWIN + 1e-12)
            twin = any(abs(value - covered_values[j]) < ESTIMATE_TWIN
                       and sum(a != b for a, b in zip(key, covered_keys[j])) <= 1 for j in range(lo, hi))
            covered.add(key)
            at = bisect.bisect_right(covered_values, value)
            covered_values.insert(at, value)
            covered_keys.insert(at, key)
            if not twin:
                fresh.append(key)
                if len(fresh) == ESTIMATE_CLIMB_FROM:
                    break
        for key in fresh:
            climb_from(key)
    for _ in range(ESTIMATE_POLISH_STEPS):
        best = min(scores, key=scores.__getitem__)
        if best in climbed:
            break
        climb_from(best)
    # The best first, one of each family of equal estimates (ESTIMATE_TWIN).
    kept: list[dict[str, Any]] = []
    last = -math.inf
    for key in sorted(scores, key=scores.__getitem__):
        if len(kept) == keep:
            break
        if math.log(scores[key]) - last < ESTIMATE_TWIN:
            continue
        c = dict(zip(space.names, key, strict=True))
        if accept is None or accept(c):
            kept.append(c)
            last = math.log(scores[key])
    return kept


def _family_columns(
    space: BoundSpace,
    estimate: Callable[[Problem, Mapping[str, Any]], float] | None,
    configs: Sequence[Mapping[str, Any]],
) -> list[int]:
    """The tunables (their positions in ``space.names``) a kernel's cost model is sensitive to:
    a one-tunable move from ``configs`` changes its estimate by more than ESTIMATE_CLEAR (log) in
    at least FAMILY_SHARE of the moves. Tunables it ignores or barely weighs (grid order,
    epilogue tiles) vary within a family."""
    if estimate is None:
        return []
    moved: list[list[float]] = [[] for _ in space.names]
    for c in configs:
        here = math.log(float(estimate(space.problem, c)))
        for near in space.neighbours(c):
            differ = [i for i, n in enumerate(space.names) if near[n] != c[n]]
            if len(differ) == 1:
                moved[differ[0]].append(abs(math.log(float(estimate(space.problem, near))) - here))
    return [i for i, m in enumerate(moved)
            if m and sum(v > ESTIMATE_CLEAR for v in m) >= FAMILY_SHARE * len(m)]


def family_members(
    space: BoundSpace,
    estimate: Callable[[Problem, Mapping[str, Any]], float],
    columns: Sequence[int],
    config: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The best estimated valid config of each family (the values of tunables ``columns``, see
    :func:`_family_columns`) two one-tunable moves from ``config``, other than its own family,
    best first. Enumerates every two-move neighbour and estimates each: 0.1-0.5 s for
    hopper_matmul, so the scheduler's samplers run it on the preparer thread
    (:attr:`RankedSampler.prefetch`)."""
    def family(key: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(key[c] for c in columns)

    problem = space.problem
    own = family(space.key(config))
    best: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}
    for near in space.neighbours(config):
        for c in [near, *space.neighbours(near)]:
            f = family(space.key(c))
            if f == own:
                continue
            t = float(estimate(problem, c))
            if f not in best or t < best[f][0]:
                best[f] = (t, dict(c))
    return [c for _, c in sorted(best.values(), key=lambda p: p[0])]


# Priors fitted on identical histories are shared (a replay fits one per problem, not per seed).
_PRIOR_CACHE: dict[str, _Model] = {}
_PRIOR_CACHE_SIZE = 16


# ---------------------------------------------------------------------------------------------
# The sampler.


_PREPARER: queue.SimpleQueue[Callable[[], None]] | None = None
_PREPARER_LOCK = threading.Lock()


def _preparer() -> queue.SimpleQueue[Callable[[], None]]:
    """The queue of the one daemon thread that makes samplers ready (:meth:`RankedSampler.prepare`)
    for this process, one at a time."""
    global _PREPARER
    with _PREPARER_LOCK:
        if _PREPARER is None:
            work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

            def run() -> None:
                while True:
                    work.get()()

            threading.Thread(target=run, name="autotune-ranked-prepare", daemon=True).start()
            _PREPARER = work
        return _PREPARER


class RankedSampler(optuna.samplers.BaseSampler):
    """Proposes the untaken pool candidate the cost model ranks fastest (see the module doc).

    Args:
      space: the bound space the study searches.
      seed: seeds the pool, the exploration and the model.
      history: measured configs of the same kernel and device: at other shapes (the prior) and
        of this problem (already measured: learnt from, never proposed again).
      related: configs to put in the pool besides the uniform draw (e.g. other shapes' winners).
      candidates: pool size drawn from the valid set.
      explore: the share of proposals that are a random pool candidate.
      kappa: the weight of the trees' spread in the score (mean - kappa * spread).
      model: ``"auto"`` (scikit-learn if installed, else numpy), ``"sklearn"`` or ``"numpy"``.
      num_sms: the device's SM count (waves features); default: that of the device the space
        is bound for (``space.env.device``).
      extra_features: a kernel's own features, ``(problem, config) -> {name: float}``.
      draw: ``draw(n, seed) -> configs`` replaces the uniform draw of the pool (the replay
        draws from recorded configs).
      estimate: the kernel's cost model, ``(problem, config) -> seconds``
        (:attr:`~autotune.space.kernel.Kernel.cost_model`). The pool climbs on it before the
        first proposal; it is the prior, cold or warm (other shapes' winners join the pool),
        corrected near measured configs, until measurements contradict it; its log is a
        feature of the models fitted without it as prior.

    Thread safety: as Optuna's samplers; one instance per study and process.
    """

    def __init__(
        self,
        space: BoundSpace,
        *,
        seed: int | None = None,
        history: Iterable[Observation] = (),
        related: Iterable[Mapping[str, Any]] = (),
        candidates: int = DEFAULT_CANDIDATES,
        explore: float = DEFAULT_EXPLORE,
        kappa: float = 0.0,
        climb: float = 0.5,
        clip: bool = True,
        model: str = "auto",
        num_sms: int | None = None,
        extra_features: Callable[[Problem, Mapping[str, Any]], Mapping[str, float]] | None = None,
        draw: Callable[[int, int], Sequence[Mapping[str, Any]]] | None = None,
        estimate: Callable[[Problem, Mapping[str, Any]], float] | None = None,
        estimate_space: BoundSpace | None = None,
    ) -> None:
        if not 0.0 <= explore <= 1.0:
            raise ValueError(f"explore must be a share between 0 and 1, got {explore!r}.")
        if not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"candidates must be a positive whole number, got {candidates!r}.")
        self.backend = model_backend(model)
        self._space = space
        self._problem = space.problem
        self._seed = 0 if seed is None else seed
        self._rng = random.Random(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._explore = explore
        self._explore_credit = 0.0
        self._kappa = kappa
        self._climb = climb
        self._climb_credit = 0.0
        self._around: set[int] = set()
        self._clip = clip
        self._estimate = estimate
        self._estimate_space = estimate_space or space
        self._features = Features(
            space.params, sorted(self._problem.dims),
            num_sms=num_sms if num_sms is not None else space.env.device.num_sms,
            extra=_with_estimate(extra_features, estimate),
        )
        history = list(history)
        self._here = [o for o in history if o.problem == self._problem and not o.device]
        self._others = [o for o in history if o.problem != self._problem or o.device]
        self._related = [Config(c) for c in related]
        self._lead: list[tuple[Any, ...]] = []  # other devices' winners proposed first
        self._n_candidates = candidates
        self._draw = draw
        self._pool: list[tuple[Any, ...]] = []
        self._pool_index: dict[tuple[Any, ...], int] = {}
        self._x = np.zeros((0, 0))
        self._prior_mean = np.zeros(0)
        self._prior_spread = np.zeros(0)
        self._prior: _Model | None = None
        self._order: np.ndarray = np.zeros(0, dtype=np.int64)
        self._score: np.ndarray | None = None  # what _order sorts (lower first), if not random
        self._fitted_on = -1
        self._started = False
        self._pool_codes: np.ndarray | None = None
        self._value_codes: list[dict[str, int]] = [{} for _ in space.names]
        self._start_lock = threading.Lock()
        self._start_error: BaseException | None = None
        self._preparing = False  # prepare() has queued the start
        self._family_columns: list[int] | None = None  # found at the start (with a cost model)
        self._families_from: set[tuple[Any, ...]] = set()  # best configs whose families joined
        # Family members being found (family_members), in the order asked; joined when done.
        self._family_jobs: list[concurrent.futures.Future[list[dict[str, Any]]]] = []
        # On (the scheduler's, through ValidSampler.prefetch): the family members of a stall are
        # found on the preparer thread, and join the pool at the first proposal after they are
        # ready; off (the default): at the stall, on the asking thread, so that proposals depend
        # only on the seed.
        self.prefetch = False
        self.fits = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_start_lock"]  # copies (the valid-set wrapper keeps one) get a lock of their own
        state["_preparing"] = False
        state["_family_jobs"] = []  # a copy finds its own (a future is not copied)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> RankedSampler:
        # The history (frozen observations, never changed after __init__) is shared, not copied:
        # the valid-set wrapper keeps a copy of its base sampler, and copying a history of
        # 100,000 results took 32 of 53 s of a first proposal (issue 36).
        # So is the space (its memoised counts and valid set: 1.7 s of a first proposal to copy),
        # and the function that draws the candidates (the replay's is a method of its recorded
        # problem, whose results a copy would copy: 8% of a replay's time).
        for shared in (self._here, self._others, self._related, self._space, self._estimate_space,
                       self._problem, self._features, self._draw):
            memo[id(shared)] = shared
        copied = RankedSampler.__new__(RankedSampler)
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    # -- Optuna's sampler interface ----------------------------------------------------------

    def reseed_rng(self) -> None:
        self._rng = random.Random()
        self._fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        from autotune.tuning.sampling import distributions

        return distributions(self._space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        config = self.propose(study)
        return {} if config is None else {k: v for k, v in config.items() if k in search_space}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    # -- proposals ---------------------------------------------------------------------------

    def propose(self, study: optuna.Study) -> Config | None:
        """The next config to measure: the best-ranked untaken candidate, or an exploratory
        one; None when the pool holds no untaken candidate."""
        self._ensure_started()
        measured, taken = self._measured(study)
        if len(measured) != self._fitted_on:
            if self._due(len(measured)):
                self._refit(measured)
        stalled = self._stalled(measured)
        free = [i for i in self._order if self._pool[i] not in taken]
        if not free:
            return None
        lead = next((k for k in self._lead if k not in taken), None)
        if lead is not None:
            return Config(dict(zip(self._space.names, lead, strict=True)))
        have_model = self._prior is not None or self._fitted_on >= 2
        self._explore_credit += self._explore
        self._climb_credit += self._climb
        pick = None
        if not have_model or self._explore_credit >= 1.0:
            if have_model:
                self._explore_credit -= 1.0
            pick = free[self._rng.randrange(len(free))]
        elif stalled:
            # Reach: families not measured yet, before local moves (which wait, not pile up).
            pick = self._new_family(free, taken)
            self._climb_credit = min(self._climb_credit, 1.0)
        if pick is None and self._climb_credit >= 1.0 and self._around:
            # A model-ranked local move: the best-scored untaken neighbour of the best configs,
            # where the estimate does not put it far behind the best candidate (CLIMB_MARGIN).
            pick = next((i for i in free if i in self._around), None)
            if pick is not None and not self._climb_competitive(pick, free[0]):
                pick = None
                self._climb_credit = min(self._climb_credit, 1.0)
            else:
                self._climb_credit -= 1.0
        if pick is None:
            pick = self._untwinned(free, taken - {key for key, _ in measured})
        return Config(dict(zip(self._space.names, self._pool[pick], strict=True)))

    def _climb_competitive(self, pick: int, best: int) -> bool:
        """Whether a local move to pool config ``pick`` scores within CLIMB_MARGIN of ``best``
        (the best untaken candidate); always, without the kernel's cost model as the prior (a
        model learnt from a few results is no judge of a climb)."""
        score = self._estimate_scores()
        return score is None or bool(score[pick] - score[best] <= CLIMB_MARGIN)

    def _estimate_scores(self) -> np.ndarray | None:
        """The pool's scores where the kernel's cost model is the prior and every pool config
        is scored; None elsewhere (the rules that lean on the estimate then stand aside)."""
        score = self._score
        if (not isinstance(self._prior, _EstimatePrior) or score is None
                or len(score) != len(self._pool)):
            return None
        return score

    def _rank(self, score: np.ndarray) -> None:
        self._score = score
        self._order = np.argsort(score, kind="stable")

    def _untwinned(self, free: list[int], in_flight: set[tuple[Any, ...]]) -> int:
        """The first of ``free`` (in rank order) that is no twin (an estimate within
        ESTIMATE_TWIN) of a config ``in_flight``, among those that score within
        ESTIMATE_TWIN_MARGIN of the first; of those, one of a family no config in flight belongs
        to while it scores within FAMILY_MARGIN of the first such (a burst before any result
        spans the families the estimate puts near: live on the H100 the first 7 trials at
        2048x14336x4096 had been two families' variants); the first when there is none, or no
        cost model to tell twins by. Once measured, a config's twins are ranked by what it
        measured (a twin of one that measured as estimated may well be the best: the grid's
        order, which the estimate barely weighs, still matters; replay, benchmarks/RESULTS.md
        §4)."""
        score = self._estimate_scores()
        if score is None:
            return free[0]
        twins = [self._pool_index[k] for k in in_flight if k in self._pool_index]
        if not twins:
            return free[0]
        estimate = self._x[:, self._estimate_column()]
        known = np.sort(estimate[twins])
        families = ({self._family_key(self._pool[i]) for i in twins}
                    if self._family_columns else set())
        limit = score[free[0]] + ESTIMATE_TWIN_MARGIN
        first = None  # the first candidate that is no twin, if of a family in flight
        for i in free:
            if score[i] > limit or (first is not None and score[i] > score[first] + FAMILY_MARGIN):
                break
            j = int(np.searchsorted(known, estimate[i]))
            near = min(estimate[i] - known[j - 1] if j else math.inf,
                       known[j] - estimate[i] if j < len(known) else math.inf)
            if near >= ESTIMATE_TWIN:
                if not families or self._family_key(self._pool[i]) not in families:
                    return i
                first = i if first is None else first
        return free[0] if first is None else first

    def _stalled(self, measured: Sequence[tuple[tuple[Any, ...], float | None]]) -> bool:
        """Whether the last FAMILY_PATIENCE measured configs (in order) gained less than
        FAMILY_GAIN on the best before them, with the kernel's cost model as the prior; then the
        best estimated member of each family two moves from the best measured config joins the
        pool (once per best config).

        Finding those members (:func:`family_members`) is the costly part: with
        :attr:`prefetch` on it runs on the preparer thread, and this proposal (and the next,
        until the members are found) goes on without them: the family rule applies from the
        stall on (the family columns are found at the start), over the families in the pool."""
        if not isinstance(self._prior, _EstimatePrior) or self._estimate is None:
            return False
        best, since, best_key = math.inf, 0, None
        for key, t in measured:
            if t is not None and t < best * (1.0 - FAMILY_GAIN):
                best, since, best_key = t, 0, key
            else:
                since += 1
                if t is not None and t < best:
                    best, best_key = t, key
        stalled = since >= FAMILY_PATIENCE and best_key is not None
        if stalled and best_key not in self._families_from:
            assert best_key is not None
            self._families_from.add(best_key)
            self._find_families(dict(zip(self._space.names, best_key, strict=True)))
        self._join_families(measured)
        # Joining refits, and a refit drops an estimate that orders the measured configs no
        # better than chance: then there is no estimate to pick families by.
        return stalled and isinstance(self._prior, _EstimatePrior)

    def _find_families(self, config: dict[str, Any]) -> None:
        """Finds the family members of ``config`` (over the family columns found at the start):
        at once, or queued on the preparer thread with :attr:`prefetch` on. Reads only what is
        given here and what no proposal changes (the space, the estimate, the columns)."""
        estimate, columns, space = self._estimate, self._family_columns, self._space
        assert estimate is not None and columns is not None
        job: concurrent.futures.Future[list[dict[str, Any]]] = concurrent.futures.Future()

        def work() -> None:
            if not job.set_running_or_notify_cancel():
                return
            try:
                job.set_result(family_members(space, estimate, columns, config))
            except BaseException as error:  # raised again by the proposal that joins it
                job.set_exception(error)

        self._family_jobs.append(job)
        if self.prefetch:
            _preparer().put(work)
        else:
            work()

    def _join_families(self, measured: Sequence[tuple[tuple[Any, ...], float | None]]) -> None:
        """The family members found so far join the pool, in the order they were asked for
        (the pool rescored and the model refitted); those still being found wait."""
        while self._family_jobs and self._family_jobs[0].done():
            first = self._extend_pool(self._family_jobs.pop(0).result())
            if first < len(self._pool):
                self._rescore_prior(first)
                self._refit(measured)

    def _family_key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        columns = self._family_columns
        assert columns is not None, "the family columns are found at the start (with a cost model)"
        return tuple(key[c] for c in columns)

    def _new_family(self, free: list[int], taken: set[tuple[Any, ...]]) -> int | None:
        """A config of the family no taken config belongs to that the estimate ranks first,
        among those within FAMILY_MARGIN of its best candidate (of that family, the first of
        ``free`` in rank order); None when there is none. The estimate alone orders the
        families: a measured family's residual says little of another's (at 4096^3 on the H100,
        64x256x64 with 2 stages measured 24% slower than estimated, with 4 stages 2% faster)."""
        prior = self._prior_mean
        limit = float(prior.min()) + FAMILY_MARGIN
        seen = {self._family_key(k) for k in taken}
        first: dict[tuple[Any, ...], tuple[float, int]] = {}
        for i in free:
            if prior[i] > limit:
                continue
            family = self._family_key(self._pool[i])
            if family in seen:
                continue
            if family not in first:
                first[family] = (float(prior[i]), i)
            elif prior[i] < first[family][0]:
                first[family] = (float(prior[i]), first[family][1])
        return min(first.values())[1] if first else None

    def _due(self, n: int) -> bool:
        """Refit in batches: after every result while few, then every n // 8 new ones."""
        if self._fitted_on < 0:
            return True
        return n - self._fitted_on >= max(1, n // 8)

    def prepare(self) -> None:
        """Draws the pool (and climbs on the cost model) on a background thread now, so that
        the first proposal, which would do it, finds it done: the scheduler calls this once
        every problem of its job is open, while the first configs compile.

        One thread makes every sampler of the process ready, one after another in the order
        of these calls: side by side, four climbs (pure Python) each took four times as long
        to finish and held the GIL against the scheduler's loop, whose asks and stores then
        waited behind them (benchmarks/RESULTS.md §9)."""
        if not self._started and not self._preparing:
            self._preparing = True
            _preparer().put(self._prepare_quietly)

    def ready(self) -> bool:
        """Whether a proposal now would neither make the sampler ready (draw its pool, climb
        on the cost model: 0.2-0.75 s for hopper_matmul on the H200 host) nor wait for
        :meth:`prepare`'s thread to do it. A scheduler asks other problems meanwhile."""
        return self._started or self._start_error is not None

    def _prepare_quietly(self) -> None:
        with contextlib.suppress(Exception):  # raised again by the proposal that needs it
            self._ensure_started()

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._start_error is not None:
                raise self._start_error
            if not self._started:
                try:
                    self._start()
                except BaseException as error:
                    self._start_error = error
                    raise

    def _start(self) -> None:
        space = self._space
        seed = self._rng.randrange(2**31)
        drawn = (self._draw or (lambda n, s: space.sample(n, seed=s)))(self._n_candidates, seed)
        # A related problem's winner that this problem's rules refuse is repaired to its nearest
        # valid config, as the valid-set wrapper repairs seeds: it keeps most of what made it
        # good (live at 64x4096x4096 every nearer shape's winner was refused, and dropped).
        self._related = [r for r in map(self._valid_or_nearest, self._related) if r is not None]
        # Configs measured for this problem, here or on another device, join the pool too.
        same = [o.config for o in [*self._here, *self._others] if o.problem == self._problem]
        self._extend_pool(list(self._related) + list(drawn) + same)
        if self._estimate is not None:
            self._lead = self._misjudged_leads()
            self._climb_estimate()
            # The kernel's cost model is the prior, warm or cold: over the recorded shapes it
            # ranked better than a model learnt from the other shapes' results
            # (benchmarks/RESULTS.md §4).
            self._prior = _EstimatePrior(self._estimate_column())
        elif self._others:
            self._prior = self._fit_prior()
        if self._prior is not None:
            self._rescore_prior(0)
        if self._estimate is not None and self._related:
            # Other shapes' winners go first where the estimate puts them near its best.
            for c in self._related:
                i = self._pool_index.get(self._space.key(c)) if self._space.is_valid(c) else None
                if i is not None:
                    self._prior_mean[i] -= RELATED_BONUS
        self._order = np.array(self._rng.sample(range(len(self._pool)), len(self._pool)), dtype=np.int64)
        if self._prior is not None:
            self._rank(self._prior_mean - self._kappa * self._prior_spread)
        if isinstance(self._prior, _EstimatePrior) and self._estimate is not None:
            top = [dict(zip(self._space.names, self._pool[i], strict=True))
                   for i in np.argsort(self._prior_mean, kind="stable")[:FAMILY_FROM]]
            self._family_columns = _family_columns(self._estimate_space, self._estimate, top)
        self._started = True

    def _misjudged_leads(self) -> list[tuple[Any, ...]]:
        """Of each other device (by name) whose results of this very problem show the kernel's
        cost model misjudging it (its first choice among the configs that device measured is
        more than ESTIMATE_CLEAR slower there, in log time, than their best), that device's
        fastest config (repaired to the nearest valid one here, as a related winner is): the
        configs proposed first. The other device's times only pick the config; it is measured
        here like any other.

        On the H100 at 64x4096x4096 the H200's live results put the estimate's first choice 13%
        from their best, and the H200's winner is 0.7% from the H100's best, where the
        estimate's first is 7.0%; where the estimate ranks the other device's results well (its
        first 0.3-4.6% from their best at the shapes both GPUs recorded, either way round),
        nothing changes (benchmarks/RESULTS.md §20)."""
        estimate = self._estimate
        assert estimate is not None
        by_device: dict[str, list[Observation]] = {}
        for o in self._others:
            if o.problem == self._problem and o.device and o.time_us is not None and o.time_us > 0:
                by_device.setdefault(o.device, []).append(o)
        leads: list[tuple[Any, ...]] = []
        for device in sorted(by_device):
            measured = by_device[device]
            best = min(measured, key=lambda o: o.time_us or math.inf)
            estimated = []
            for o in measured:
                try:
                    estimated.append((float(estimate(self._problem, o.config)), o))
                except (KeyError, TypeError, ValueError):  # not a config of this kernel's space
                    continue
            if not estimated:
                continue
            chosen = min(estimated, key=lambda p: p[0])[1]
            assert chosen.time_us is not None and best.time_us is not None
            if math.log(chosen.time_us / best.time_us) <= ESTIMATE_CLEAR:
                continue
            config = self._valid_or_nearest(Config(best.config))
            if config is None:
                continue
            key = self._space.key(config)
            if key not in leads:
                logger.info("%s: the cost model's first choice among %s's results is %.0f%% "
                            "slower there than their best; proposing that device's winner first",
                            self._problem, device, 100 * (chosen.time_us / best.time_us - 1))
                self._extend_pool([config])
                leads.append(key)
        return leads

    def _valid_or_nearest(self, config: Config) -> Config | None:
        """``config`` where it is valid here, else the nearest valid config (None if none, or
        if it names other tunables)."""
        try:
            if self._space.is_valid(config):
                return config
            return self._space.nearest(config)
        except (KeyError, ValueError, TypeError):
            return None

    def _codes(self) -> np.ndarray:
        """The pool as an integer matrix (one column per tunable, one code per value)."""
        codes = self._pool_codes
        have = 0 if codes is None else len(codes)
        if have < len(self._pool):
            lookup = self._value_codes
            new = np.array([[lookup[i].setdefault(repr(v), len(lookup[i])) for i, v in enumerate(key)]
                            for key in self._pool[have:]], dtype=np.int32).reshape(-1, len(self._space.names))
            codes = new if codes is None else np.vstack([codes, new])
            self._pool_codes = codes
        if codes is None:  # only asked for once something of the pool is measured
            raise RuntimeError("the candidate pool is empty: it has no codes")
        return codes

    def _agreement(self, measured: np.ndarray) -> np.ndarray:
        """Which tunables each pool candidate shares with each ``measured`` one (candidates x
        measured x tunables, booleans): what both parts of the correction weigh."""
        codes = self._codes()
        same: np.ndarray = codes[:, None, :] == codes[measured][None, :, :]
        return same

    def _local_residual(self, same: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """The estimate's error near what was measured, for every pool candidate: each measured
        config's residual spread by similarity, exp(-(LOCAL_DECAY x the tunables that differ,
        FAMILY_DECAY for a family tunable)), shrunk towards none (LOCAL_SHRINK) where no
        measured config is near. ``same``: :meth:`_agreement` of the measured configs."""
        cost = np.full(same.shape[2], LOCAL_DECAY)
        cost[self._family_columns or []] = FAMILY_DECAY
        weights = np.exp(-((~same) @ cost))
        local: np.ndarray = (weights @ residual) / (weights.sum(axis=1) + LOCAL_SHRINK)
        return local

    def _additive_residual(self, same: np.ndarray, measured: np.ndarray,
                           residual: np.ndarray) -> np.ndarray:
        """The estimate's error as a sum of effects, for every pool candidate: one effect per
        family and one per value of each tunable outside the family columns, fitted to the
        ``measured`` candidates' ``residual`` (clipped to ESTIMATE_SCALE_SLACK) by ridge
        regression (RESIDUAL_RIDGE). A value no measured config has has no effect.
        ``same``: :meth:`_agreement` of the measured configs.

        Solved in the dual form, whose size is the measured configs' count however many values
        the tunables have: with X the candidates' one-hot effects, X X^T counts the effects two
        configs share (their family, if every family tunable agrees, and each other tunable
        that agrees), and the fit is X X_m^T (X_m X_m^T + RESIDUAL_RIDGE I)^-1 y."""
        columns = self._family_columns or []
        others = np.ones(same.shape[2], dtype=bool)
        others[columns] = False
        shared = (same[:, :, others].sum(axis=2) + same[:, :, columns].all(axis=2)).astype(np.float64)
        y = np.clip(residual, -ESTIMATE_SCALE_SLACK, ESTIMATE_SCALE_SLACK)
        weights = np.linalg.solve(shared[measured] + RESIDUAL_RIDGE * np.eye(len(measured)), y)
        additive: np.ndarray = shared @ weights
        return additive

    def _estimate_scale(self, measured: Sequence[tuple[tuple[Any, ...], float | None]],
                        error: np.ndarray) -> float:
        """The estimate's scale on this problem (log): the median over the families measured
        within SCALE_NEAR of the best of each one's smallest residual (``error``, in the order of
        ``measured``); the median residual where nothing was measured ok."""
        ok = [t for _, t in measured if t is not None and t > 0]
        if not ok:
            return float(np.median(error))
        near = math.log(min(ok)) + SCALE_NEAR
        smallest: dict[tuple[Any, ...], float] = {}
        for (key, t), e in zip(measured, error, strict=True):
            if t is not None and t > 0 and math.log(t) <= near:
                family = self._family_key(key) if self._family_columns else key
                smallest[family] = min(smallest.get(family, math.inf), float(e))
        return float(np.median(list(smallest.values())))

    def _estimate_column(self) -> int:
        return self._features.names.index(ESTIMATE_FEATURE)

    def _climb_estimate(self) -> None:
        """The best estimated configs that the climb on the kernel's cost model finds from the
        pool (:func:`climb_estimate`) join the pool."""
        assert self._estimate is not None
        self._extend_pool(climb_estimate(
            self._estimate_space, self._estimate,
            (dict(zip(self._space.names, key, strict=True)) for key in self._pool),
            accept=lambda c: self._space.is_valid(c) and self._space.key(c) not in self._pool_index,
        ))

    def _extend_pool(self, configs: Iterable[Mapping[str, Any]]) -> int:
        """Adds valid configs not yet in the pool; returns the index of the first added."""
        first = len(self._pool)
        new = []
        for c in configs:
            try:
                key = self._space.key(c)
            except KeyError:
                continue
            if key in self._pool_index or not self._space.is_valid(c):
                continue
            self._pool_index[key] = len(self._pool)
            self._pool.append(key)
            new.append(dict(zip(self._space.names, key, strict=True)))
        if new:
            x = self._features.matrix(self._problem, new)
            self._x = x if len(self._x) == 0 else np.vstack([self._x, x])
        return first

    def _rescore_prior(self, first: int) -> None:
        if self._prior is None or first >= len(self._pool):
            return
        mean, spread = self._prior.predict(self._x[first:])
        self._prior_mean = np.concatenate([self._prior_mean[:first], mean])
        self._prior_spread = np.concatenate([self._prior_spread[:first], spread])

    def _fit_prior(self) -> _Model:
        # Per problem and device: each device's times relative to its own typical time there.
        by_problem: dict[tuple[Problem, str], list[Observation]] = {}
        for o in self._others:
            by_problem.setdefault((o.problem, o.device), []).append(o)
        xs, ys = [], []
        for (problem, _device), obs in by_problem.items():
            xs.append(self._features.matrix(problem, [o.config for o in obs]))
            ys.append(_targets([o.time_us for o in obs]))
        x, y = np.vstack(xs), np.concatenate(ys)
        digest = hashlib.sha256()
        for part in (self._features.signature().encode(), self.backend.encode(), x.tobytes(), y.tobytes()):
            digest.update(part)
        key = digest.hexdigest()
        model = _PRIOR_CACHE.get(key)
        if model is None:
            model = _make_model(self.backend, trees=96, seed=0).fit(x, y)
            if len(_PRIOR_CACHE) >= _PRIOR_CACHE_SIZE:
                _PRIOR_CACHE.pop(next(iter(_PRIOR_CACHE)))
            _PRIOR_CACHE[key] = model
        return model

    def _valid(self, key: tuple[Any, ...]) -> bool:
        """Whether today's rules accept the config ``key``: the pool holds only valid configs,
        and every measured one joins it at the next refit, so few keys are checked again."""
        return key in self._pool_index or self._space.is_valid(
            dict(zip(self._space.names, key, strict=True)))

    def _measured(
        self, study: optuna.Study
    ) -> tuple[list[tuple[tuple[Any, ...], float | None]], set[tuple[Any, ...]]]:
        """This problem's measured configs with their times (None: failed), and the configs
        taken (measured, being measured, or stored). A config today's rules refuse (stored
        before a rule was added, or by a kernel whose constraints have changed since) is no
        measurement of this space and is passed over: it is never in the pool."""
        measured: list[tuple[tuple[Any, ...], float | None]] = []
        taken: set[tuple[Any, ...]] = set()
        for o in self._here:
            try:
                key = self._space.key(o.config)
            except KeyError:
                continue
            if not self._valid(key):
                continue
            measured.append((key, o.time_us))
            taken.add(key)
        for t in study.get_trials(deepcopy=False):
            if not t.params:
                continue
            try:
                key = self._space.key(t.params)
            except KeyError:
                continue
            if not self._valid(key):
                continue
            if t.state == TrialState.COMPLETE and t.value is not None:
                measured.append((key, float(t.value)))
                taken.add(key)
            elif t.state == TrialState.FAIL:
                if OUTCOME_ATTR in t.system_attrs:  # measured and failed; else free again
                    measured.append((key, None))
                    taken.add(key)
            elif t.state == TrialState.RUNNING:
                taken.add(key)
        return measured, taken

    def _refit(self, measured: Sequence[tuple[tuple[Any, ...], float | None]]) -> None:
        """Fits the online model on this problem's results and re-ranks the pool."""
        n = len(measured)
        self._fitted_on = n
        # Climb: the neighbours of the best measured configs join the pool.
        ok = sorted(((t, k) for k, t in measured if t is not None), key=lambda p: p[0])
        around = []
        for _t, key in ok[:CLIMB_FROM]:
            around.extend(self._space.neighbours(dict(zip(self._space.names, key, strict=True))))
        first = self._extend_pool(around + [dict(zip(self._space.names, k, strict=True)) for k, _ in measured])
        self._around = {self._pool_index[self._space.key(c)] for c in around
                        if self._space.key(c) in self._pool_index}
        self._rescore_prior(first)
        if n < 2 or not ok:
            if self._prior is not None:
                self._rank(self._prior_mean - self._kappa * self._prior_spread)
            else:
                self._order = np.array(self._rng.sample(range(len(self._pool)), len(self._pool)), dtype=np.int64)
                self._score = None
            return
        idx = np.array([self._pool_index[k] for k, _ in measured])
        raw = _targets([t for _, t in measured])
        measured_s = _log_seconds([t for _, t in measured])
        right, pairs = (_concordance(self._prior_mean[idx], measured_s)
                        if isinstance(self._prior, _EstimatePrior) else (1.0, 0))
        if pairs >= ESTIMATE_TRUST_PAIRS and right < ESTIMATE_TRUST:
            # The estimate orders this problem's measured configs no better than chance: learn
            # without it.
            logger.info("%s: the kernel's cost model disagrees with %d measured configs; "
                        "ranking without it", self._problem, n)
            self._prior = None
            self._prior_mean = np.zeros(0)
            self._prior_spread = np.zeros(0)
        if isinstance(self._prior, _EstimatePrior):
            # The kernel's own estimate, corrected where it is known to be wrong: near measured
            # configs, by their residuals; far from them, it keeps its order. (A tree model of
            # the residuals spread a family's error everywhere alike and so never left it:
            # benchmarks/RESULTS.md §6.)
            # Residuals in absolute terms (log seconds), less their common part (the estimate's
            # scale on this problem, _estimate_scale), but at most ESTIMATE_SCALE_SLACK either
            # way, so that a first family measured far slower than estimated is seen as such
            # rather than taken for the scale. A model off by more than ESTIMATE_SCALE_OFF (in
            # other units than seconds, say) has no scale to trust: the scale then, whatever it
            # is. What is left is corrected by effects (additive) and by similarity (local).
            error = measured_s - self._prior_mean[idx]
            shift = self._estimate_scale(measured, error)
            if abs(shift) <= ESTIMATE_SCALE_OFF:
                shift = max(-ESTIMATE_SCALE_SLACK, min(ESTIMATE_SCALE_SLACK, shift))
            self.fits += 1
            same = self._agreement(idx)
            additive = self._additive_residual(same, idx, error - shift)
            local = self._local_residual(same, error - shift - additive[idx])
            self._rank(self._prior_mean + additive + local)
            return
        # Tell the good apart: everything slower than the median is just "slow".
        y = np.minimum(raw, 0.0) if self._clip else raw
        model = _make_model(self.backend, trees=32, seed=self._seed + n).fit(self._x[idx], y)
        self.fits += 1
        mean, spread = model.predict(self._x)
        score = mean - self._kappa * spread
        if self._prior is not None:
            # The prior, shifted onto this problem's times, weighs as PRIOR_WEIGHT results.
            prior = self._prior_mean + float(np.median(raw - self._prior_mean[idx]))
            if self._clip:
                prior = np.minimum(prior, 0.0)
            score = (PRIOR_WEIGHT * prior + n * score) / (PRIOR_WEIGHT + n)
        self._rank(score)


def _flag(text: str) -> bool:
    return text not in ("0", "false")


class Ranked(Sampler):
    """The registry's ``ranked``: :class:`RankedSampler` over the request's space, learning from
    the stored history (it :attr:`reads_history`) and ranking with the kernel's cost model.

    Related winners join its candidate pool; only the nearest one is proposed first (a strong
    guess at a near shape), and none when the kernel's cost model ranks."""

    reads_history = True
    options = {"explore": float, "kappa": float, "candidates": int, "model": str,
               "climb": float, "clip": _flag}

    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        if request.space is None:
            raise JobError("the ranked sampler needs its space: build it with valid_sampler().")
        return RankedSampler(
            request.space, seed=request.seed, history=request.history,
            related=list(request.related), estimate=request.estimate, **dict(request.options),
        )

    def first(self, seeds: Iterable[Mapping[str, Any]], request: Request) -> list[Mapping[str, Any]]:
        return [*seeds, *request.related[:1]] if request.estimate is None else list(seeds)


SAMPLER = Ranked()

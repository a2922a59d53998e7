"""Replays the real samplers over recorded ground truth: trials needed to get near the best.

For each recorded problem (:func:`autotune.replay.ground_truth.load_ground_truth`) and sampler,
the real sampler (:func:`autotune.tuning.sampling.valid_sampler`, with its valid-set repair)
runs over the recorded configs (the space restricted to them) for many seeds; each trial is
answered by the replay runner (:class:`autotune.replay.evaluator.ReplayEvaluator`) instead of a
GPU. :func:`run` gives, per problem, mode and sampler, the trials needed to get within 0.5%, 1%
and 2% of the best recorded time (median and 90th percentile over seeds), the first proposal's
gap to the best and, under noise, the trial whose measurement was the fastest.

Modes, both with the kernel's known-good default off (spec ``auto+default`` is today's tuner: the
default first, and ``auto`` resolved as the tuner resolves it, :func:`replay_once`):
``cold``, an empty database; ``warm``, leave-one-out: every other recorded problem of the same
kernel and device is known (``auto`` proposes their winners first, nearest shape first, as the
tuner does; the ranked sampler learns from all their results and puts the winners in its pool).

The ranked sampler's pool is drawn from the *uniform-stage* recorded configs only: configs the
ground truth found by climbing around the best are reachable only as neighbours of measured
configs, as in the real valid set. Its settings were tuned on the problems of ``TUNED_ON``
only; every other problem is held out (``held_out`` in a row). The command line is
``benchmarks/search_efficiency.py``; docs/ranked_sampler.md gives the figures.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.devices import profile_for_name, using_profile
from autotune.replay.evaluator import ReplayEvaluator
from autotune.replay.ground_truth import recorded_us
from autotune.space.kernel import get_kernel
from autotune.space.problem import Config, Problem, shape_distance
from autotune.space.search_space import Constraint, Space
from autotune.tuning import confirmation as cf
from autotune.tuning import optuna_adapter, samplers
from autotune.tuning.samplers.ranked import Observation
from autotune.tuning.sampling import ExhaustedError, distributions, resolve_sampler, valid_sampler
from autotune.tuning.trial_index import OUTCOME_ATTR

__all__ = [
    "MODES",
    "SAMPLERS",
    "THRESHOLDS",
    "TUNED_ON",
    "ConfirmRule",
    "Recorded",
    "Replayed",
    "ReplayedConfirmation",
    "confirm_replayed",
    "live_rows",
    "parse_sampler",
    "pct",
    "related_to",
    "replay_once",
    "replay_study",
    "run",
    "stop_at",
    "trials_to",
]

THRESHOLDS = (0.005, 0.01, 0.02)
SAMPLERS = ("auto", "ranked")
MODES = ("cold", "warm")
# The ranked sampler's settings were chosen on these problems only; all others are held out.
TUNED_ON = (
    "hopper_matmul__k4096_m4096_n4096__bfloat16",
    "hopper_matmul__k4096_m8192_n3584__bfloat16",
    "hopper_matmul__k8192_m256_n8192__bfloat16",
    "hopper_attention__batch1_causalfalse_head_dim64_heads_kv8_heads_q8_seq_kv8192_seq_q8192__float16",
)

class ReplayError(ValueError):
    """A sampler spec the replay cannot run."""


def _recorded_prefix(prefix: Sequence[str], seen: set[tuple[Any, ...]]) -> Constraint:
    """The rule that the values of ``prefix`` are those of a recorded config."""

    def check(config: Mapping[str, Any], problem: Any) -> bool:
        return tuple(config[n] for n in prefix) in seen

    return Constraint(f"recorded_{len(prefix) - 1}", tuple(prefix), check,
                      "only configs measured in the ground truth")


def _recorded_times(data: Mapping[str, Any]) -> dict[str, float | None]:
    """A ground-truth problem's time of each recorded config, by its digest (None: failed)."""
    return {Config(r["config"]).digest(): (recorded_us(r) if r["status"] == "ok" else None)
            for r in data["results"]}


class Recorded:
    """One ground-truth problem: its space restricted to the recorded configs, and times."""

    def __init__(self, data: Mapping[str, Any], family: Sequence[str] = ()) -> None:
        self.data = data
        self.family = tuple(family)
        self.kernel = get_kernel(data["kernel"])
        self.problem = self.kernel.problem(data["shape"], data["dtype"])
        base = self.kernel.bind(self.problem)
        self.times = _recorded_times(data)
        # Only recorded configs: one rule per tunable, on the prefix fixed so far, so that
        # enumerating the valid set visits recorded prefixes only (milliseconds, not minutes).
        names = base.names
        recorded = [tuple(r["config"][n] for n in names) for r in data["results"]]
        rules = tuple(_recorded_prefix(names[:d + 1], {t[:d + 1] for t in recorded})
                      for d in range(len(names)))
        if self.family:
            # Every valid config of a recorded family (``family``), as in the real valid set;
            # an unrecorded one is timed as its family's recorded configs nearest to it.
            known = [tuple(r["config"][n] for n in self.family) for r in data["results"]]
            rules = tuple(_recorded_prefix(self.family[:d + 1], {t[:d + 1] for t in known})
                          for d in range(len(self.family)))
            self.members: dict[tuple[Any, ...], list[tuple[Config, float | None]]] = {}
            for r in data["results"]:
                c = Config(r["config"])
                self.members.setdefault(tuple(c[n] for n in self.family), []).append(
                    (c, self.times[c.digest()]))
        self.bound = Space(base.space.params, base.space.constraints + rules).bind(self.problem)
        self.full = base
        self.best = min(t for t in self.times.values() if t is not None)
        # The pool the ranked sampler may draw: the uniform sample, not the climb around the
        # best ("neighbourhood") nor the cost model's first choices ("estimated"), which a
        # search reaches only by climbing, as in the real space.
        self.drawable = [Config(r["config"]) for r in data["results"]
                         if r.get("stage", "uniform") == "uniform"]
        self.device = data.get("device", "")
        self.name = f"{data['kernel']} {self.problem.shape_text} {self.problem.dtype}"

    def time(self, config: Config) -> float | None:
        """The recorded time of ``config``; with ``family``, of an unrecorded config the median
        of its family's recorded configs that share the most tunables with it."""
        digest = config.digest()
        if digest in self.times or not self.family:
            return self.times[digest]
        members = self.members[tuple(config[n] for n in self.family)]
        share = [sum(c[n] == config[n] for n in config) for c, _ in members]
        nearest = [t for (_, t), s in zip(members, share, strict=True) if s == max(share)]
        ok = [t for t in nearest if t is not None]
        return statistics.median(ok) if len(ok) * 2 >= len(nearest) else None

    def observations(self) -> list[Observation]:
        return [Observation(self.problem, Config(r["config"]),
                            recorded_us(r) if r["status"] == "ok" else None)
                for r in self.data["results"]]

    def winner(self) -> Mapping[str, Any]:
        """The recorded best config's values."""
        best: Mapping[str, Any] = min((r for r in self.data["results"] if r["status"] == "ok"),
                                      key=recorded_us)["config"]
        return best

    def draw(self, n: int, seed: int) -> list[Config]:
        rng = random.Random(seed)
        return rng.sample(self.drawable, min(n, len(self.drawable)))


def parse_sampler(spec: str) -> tuple[str, float | None, dict[str, Any], bool]:
    """``"ranked+explore=0.2"`` -> (name, local share or None, the sampler's options, default
    first). The name is any registered sampler (:mod:`autotune.tuning.samplers`); the options
    are the sampler's own (the registry's) and the replay's ``estimate`` (rank with the
    kernel's cost model or not; samplers that use none ignore it)."""
    name, *parts = spec.split("+")
    if name not in samplers.NAMES:
        raise ReplayError(f"Sampler spec {spec!r}: the name must be one of {', '.join(samplers.NAMES)}, "
                          "then +KEY=VALUE options (e.g. ranked+explore=0.2).")
    known: dict[str, Callable[[str], Any]] = {
        **samplers.load(name).options, "estimate": lambda v: v not in ("0", "false")}
    local, options, default = None, {}, False
    for part in parts:
        key, _, value = part.partition("=")
        if key == "default":
            default = True
        elif key == "local":
            local = float(value)
        elif key in known:
            options[key] = known[key](value)
        else:
            raise ReplayError(f"Sampler spec {spec!r}: unknown option {key!r}; the options are local, "
                              "default, " + ", ".join(known) + ".")
    return name, local, options, default


@dataclass(frozen=True)
class Replayed:
    """One replayed study: ``curve`` is the best true (recorded) time so far after each trial;
    ``final_at`` the trial (1-based) whose measurement was the fastest of all, as the study saw
    it, and ``final_gap`` that config's true gap to the recorded best. Without noise the
    fastest measurement is the fastest config; with it (``--noise``), the study sees each
    recorded time times a random factor, as a live job sees run-to-run noise, and a near-tie
    measured late may be crowned."""

    curve: list[float]
    final_at: int | None
    final_gap: float | None
    # (config, time as measured, recorded time) of each successful trial, in order (studies
    # only; the oracle measures no config of its own choosing).
    trials: tuple[tuple[Config, float, float], ...] = ()


def replay_once(rec: Recorded, spec: str, seed: int, budget: int,
                others: Sequence[Recorded] = (), noise: float = 0.0, in_flight: int = 1) -> Replayed:
    """One replayed study of ``budget`` trials (fewer if the space runs out), ``in_flight`` of
    them asked ahead (:func:`replay_study`).

    ``noise``: the relative standard deviation of each measurement (log-normal, seeded by
    ``seed``); 0 replays the recorded medians exactly. Spec ``oracle`` measures the recorded
    configs fastest first: no search can do better, so under noise it shows what noise alone
    does to ``final_at``."""
    evaluator = ReplayEvaluator(rec.data, noise=noise, seed=seed,
                                unrecorded=rec.time if rec.family else None)
    measured: list[tuple[float, float]] = []  # (as seen, true) per successful trial, in order
    measured_at: list[int] = []
    best, curve = math.inf, []
    if spec == "oracle":
        for t in sorted(t for t in rec.times.values() if t is not None)[:budget]:
            best = min(best, t)
            curve.append(best)
            measured.append((evaluator.seen_us(t), t))
            measured_at.append(len(curve))
        return _replayed(curve, measured, measured_at, rec.best)
    name, local, options, default = parse_sampler(spec)
    seeds = [rec.kernel.default_config(rec.problem)] if default and rec.kernel.default_config else []
    related = [o.winner() for o in sorted(others, key=lambda o: shape_distance(rec.problem.dims, o.problem.dims))[:3]]
    history = [obs for o in others for obs in o.observations()]
    estimate = rec.kernel.cost_model if options.pop("estimate", True) else None
    if default:  # today's tuner: the sampler it makes of the name (``auto``: ranked with a cost model)
        name = resolve_sampler(name, history=history, problem=rec.problem,
                               valid_count=rec.bound.count, cost_model=estimate is not None)
    return replay_study(rec, name, seed, budget, seeds=seeds, local=local, related=related,
                        history=history, options=options, estimate=estimate, evaluator=evaluator,
                        in_flight=in_flight)


def replay_study(rec: Recorded, name: str, seed: int, budget: int, *,
                 seeds: Sequence[Mapping[str, Any]] = (), related: Sequence[Mapping[str, Any]] = (),
                 history: Sequence[Observation] = (), local: float | None = None,
                 options: Mapping[str, Any] | None = None,
                 estimate: Callable[[Any, Mapping[str, Any]], float] | None = None,
                 evaluator: ReplayEvaluator | None = None, in_flight: int = 1) -> Replayed:
    """One replayed study of ``budget`` trials (fewer if the space runs out) of the sampler
    ``name`` as the tuner builds it (:func:`~autotune.tuning.sampling.valid_sampler`), its
    inputs given: ``seeds`` proposed first, ``related`` winners, ``history`` (stored results),
    the ``local`` share, the sampler's ``options`` and the ``estimate`` it ranks by. Answered by
    ``evaluator`` (default: the recorded times, no noise). ``in_flight`` trials are asked before
    the first is told, and one more after each (first asked, first told), as a live job keeps
    configs compiling while one is timed; 1 asks each after the last result. Where no GPU
    driver answers, the study sees the facts of the recorded device's profile (an H200's file
    is replayed with the H200's bandwidth in its cost model, not the default profile's)."""
    if in_flight < 1:
        raise ReplayError(f"in_flight is the trials asked before one is told: at least 1, got {in_flight}")
    with using_profile(profile_for_name(rec.device) if rec.device else None):
        return _replay_study(rec, name, seed, budget, seeds=seeds, related=related,
                             history=history, local=local, options=options, estimate=estimate,
                             evaluator=evaluator, in_flight=in_flight)


def _replay_study(rec: Recorded, name: str, seed: int, budget: int, *,
                  seeds: Sequence[Mapping[str, Any]], related: Sequence[Mapping[str, Any]],
                  history: Sequence[Observation], local: float | None,
                  options: Mapping[str, Any] | None,
                  estimate: Callable[[Any, Mapping[str, Any]], float] | None,
                  evaluator: ReplayEvaluator | None, in_flight: int) -> Replayed:
    if evaluator is None:
        evaluator = ReplayEvaluator(rec.data, seed=seed, unrecorded=rec.time if rec.family else None)
    if name == "ranked":
        # The climb on a cost model walks the whole valid set, as in a real study; only the
        # recorded configs it finds can be replayed.
        options = {"draw": rec.draw, "estimate_space": rec.full, **(options or {})}
    vs = valid_sampler(name, rec.bound, seed=seed, seeds=seeds, local=local, related=related,
                       history=history, ranked=options, estimate=estimate)
    measured: list[tuple[float, float]] = []  # (as seen, true) per successful trial, in order
    configs: list[Config] = []  # their configs
    measured_at: list[int] = []
    curve: list[float] = []  # the best true time so far, after each trial
    best = math.inf
    study = optuna.create_study(sampler=vs)
    dists = distributions(rec.bound)
    asked: collections.deque[optuna.trial.Trial] = collections.deque()
    exhausted = False
    while len(curve) < budget:
        while not exhausted and len(asked) < in_flight and len(curve) + len(asked) < budget:
            try:
                asked.append(study.ask(dists))
            except ExhaustedError:
                exhausted = True
        if not asked:
            break
        trial = asked.popleft()
        config = Config(trial.params)
        result = evaluator.evaluate(rec.kernel, rec.problem, config)
        # A config that failed when recorded is told as a wrong result, whatever its outcome.
        optuna_adapter.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok" if result.ok else "wrong_result")
        if not result.ok or result.median_us is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            true = evaluator.true_us(config)
            assert true is not None  # an ok replayed trial has a recorded time
            measured.append((result.median_us, true))
            configs.append(config)
            study.tell(trial, measured[-1][0])
            best = min(best, true)
            measured_at.append(len(curve) + 1)
        curve.append(best)
    done = _replayed(curve, measured, measured_at, rec.best)
    return dataclasses.replace(done, trials=tuple(
        (c, seen, true) for c, (seen, true) in zip(configs, measured, strict=True)))


def _replayed(curve: list[float], measured: Sequence[tuple[float, float]], at: Sequence[int],
              best: float) -> Replayed:
    if not measured:
        return Replayed(curve, None, None)
    i = min(range(len(measured)), key=lambda j: measured[j][0])
    return Replayed(curve, at[i], measured[i][1] / best - 1)


@dataclass(frozen=True)
class ConfirmRule:
    """How a replayed confirmation picks its programs (``autotune.tuning.confirming``): the
    ``top`` configs the search measured fastest and up to ``most`` below them within ``band``
    (:func:`autotune.tuning.confirmation.joining_configs`)."""

    top: int = cf.DEFAULT_CONFIRM_TOP
    band: float = cf.CONFIRM_JOIN_BAND
    most: int = cf.CONFIRM_JOIN_MAX

    @classmethod
    def parse(cls, text: str) -> ConfirmRule:
        """``"TOP,BAND,MOST"`` (``"5,0.005,3"``, today's rule)."""
        try:
            top, band, most = text.split(",")
            rule = cls(int(top), float(band), int(most))
        except ValueError:
            rule = None
        if rule is None or rule.top < 1 or rule.most < 0 or not 0 <= rule.band < 1:
            raise ReplayError(f"A confirmation rule is TOP,BAND,MOST (today's: 5,0.005,3): top >= "
                              f"1 configs, a band in [0, 1), most >= 0 joining, but got {text!r}.")
        return rule


@dataclass(frozen=True)
class ReplayedConfirmation:
    """A replayed study's confirmation round: the crowned config's recorded gap to the recorded
    best, the best recorded gap among the programs timed (what the rule let in), its rounds,
    programs and blocks (a program's runs in one round: what the round's time is spent on; the
    baseline's not counted)."""

    gap: float
    best_in_round: float
    rounds: int
    programs: int
    blocks: int


def confirm_replayed(rec: Recorded, replayed: Replayed, rule: ConfirmRule, *, noise: float,
                     seed: int) -> ReplayedConfirmation | None:
    """The confirmation round after ``replayed`` (None: no trial measured), as the tuner runs
    it: the programs ``rule`` picks from the study's measurements, the adaptive rounds and race
    of :func:`autotune.tuning.confirmation.timed_rounds`, the crown of
    :func:`~autotune.tuning.confirmation.analyse_confirmation`. Each round moves every program
    by one shared drift (paired ratios cancel it) and each program's round median by its own
    log-normal factor of ``noise`` (a block's noise, as a trial's); the baseline's recorded
    time is timed beside them."""
    ranked: list[tuple[Config, float, float]] = []  # each config once, at its fastest
    seen: set[Config] = set()
    for trial in sorted(replayed.trials, key=lambda t: t[1]):
        if trial[0] not in seen:
            seen.add(trial[0])
            ranked.append(trial)
    if not ranked:
        return None
    top, below = ranked[:rule.top], ranked[rule.top:]
    top += [below[i] for i in cf.joining_configs([(t[1], None) for t in top],
                                                 [(t[1], None) for t in below],
                                                 band=rule.band, most=rule.most)]
    base_us = rec.data.get("baseline", {}).get("median_us")
    truth = [t[2] for t in top] + ([float(base_us)] if base_us else [])
    search_us = [t[1] for t in top]
    # Runs a round as the tuner sizes them: by the search's time, the baseline's by its own.
    runs = [cf.sized_iterations(us) for us in search_us + truth[len(top):]]
    rng = random.Random(f"confirm:{seed}:{rec.name}")

    def time_rounds(n: int, first: int, skip: frozenset[int]) -> list[list[Any]]:
        rows = []
        for _ in range(n):
            drift = rng.gauss(0.0, 0.01)  # the round's clock (1%), shared: paired ratios cancel it
            row: list[Any] = []
            for i, t in enumerate(truth):
                block = t * math.exp(drift + noise * rng.gauss(0.0, 1.0))
                row.append(None if i < len(top) and i in skip else _Timed(tuple(  # runs: 0.2%
                    block * (1 + 0.002 * rng.gauss(0.0, 1.0)) for _ in range(runs[i]))))
            rows.append(row)
        return rows

    default = rec.kernel.default_config(rec.problem) if rec.kernel.default_config else None

    def analyse(rows: list[list[Any]]) -> cf.AnalysedRounds:
        return cf.analyse_rounds(rows, [dict(t[0]) for t in top], search_us=search_us,
                                 baseline=base_us is not None, default_config=default)

    table = cf.timed_rounds(time_rounds, analyse, None)
    confirmation = analyse(table).confirmation
    assert confirmation is not None  # no replayed round fails
    return ReplayedConfirmation(
        gap=top[confirmation.crowned][2] / rec.best - 1,
        best_in_round=min(t[2] for t in top) / rec.best - 1, rounds=len(table), programs=len(top),
        blocks=sum(cell is not None for row in table for cell in row[:len(top)]))


@dataclass(frozen=True)
class _Timed:
    samples_us: tuple[float, ...]
    ok: bool = True


def live_measured(dbs: Sequence[str], problem: Problem,
                  device_name: str | None) -> dict[str, tuple[Config, list[float]]]:
    """The configs the databases ``dbs`` (URLs or SQLite files; never written) measured ok for
    ``problem`` on the device ``device_name`` (None: any), by digest, each with its medians
    there, in the order first found."""
    from autotune.storage.store import Store

    found: dict[str, tuple[Config, list[float]]] = {}
    for db in dbs:
        with Store(db, read_only=True) as store:
            rows = store.trials(problem, device_name=device_name, status="ok")
        for row in rows:
            if row.median_us is not None:
                found.setdefault(row.config.digest(), (row.config, []))[1].append(row.median_us)
    return found


def add_live_truth(data: dict[str, Any], dbs: Sequence[str]) -> int:
    """Adds to a ground-truth problem's results the configs the databases ``dbs`` measured for
    it on its device (stage ``"live"``: never drawn into the ranked sampler's pool; their median
    over the databases), where the problem does not record them. Returns how many were added.
    The recorded data hold a uniform sample with few variants of each (tile, stages) family, so
    a replayed search cannot dwell on one family's grid-order variants as a live one can, on
    the real valid set; with the live ones it can (``benchmarks/RESULTS.md`` §12)."""
    kernel = get_kernel(data["kernel"])
    problem = kernel.problem(data["shape"], data["dtype"])
    recorded = {Config(r["config"]).digest() for r in data["results"]}
    added = 0
    for digest, (config, times) in live_measured(dbs, problem, data.get("device") or None).items():
        if digest not in recorded:
            data["results"].append({"config": dict(config), "stage": "live", "status": "ok",
                                    "median_us": statistics.median(times)})
            added += 1
    return added


def live_rows(db: str, job: str | None = None) -> list[dict[str, Any]]:
    """A live job's counterpart of a replay's figures: per problem and device in ``db`` (only
    ``job``'s problems when given), the trials measured, the index (1-based, in the order
    measured) of the final best (the fastest single measurement), of the served best (the
    confirmation round's winner, what ``autotune best`` answers) and of the first results within
    0.5% and 1% of the final best, the first trial's time (None when it failed) and how many of
    its trials were in flight when one was asked (:func:`in_flight_when_asked`)
    (``benchmarks/search_efficiency.py --live``).

    Where the device's packaged ground truth records the problem, each trial is also scored by
    it (:func:`truth_scores`): one timing per config in one process, so that a lucky timing in
    the job's own process neither sets the best nor hides a config that reached it."""
    from autotune.queries.best import best_result
    from autotune.replay.ground_truth import load_ground_truth, problem_name
    from autotune.storage.store import Store
    from autotune.tuning.jobs import load_job

    wanted = {spec.problem for spec in load_job(job).problems} if job else None
    out: list[dict[str, Any]] = []
    # Each device's packaged ground truth of a kernel, read once, by problem name.
    recorded: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}

    def truth_of(device: str, problem: Problem) -> dict[str, Any] | None:
        if (device, problem.kernel) not in recorded:
            recorded[device, problem.kernel] = {
                p["name"]: p for p in load_ground_truth(device, problem.kernel)}
        return recorded[device, problem.kernel].get(
            problem_name(problem.kernel, problem.dims, problem.dtype))

    with Store(db) as store:
        for problem in store.problems():
            if wanted is not None and problem not in wanted:
                continue
            for device in sorted({r.device.name for r in store.trials(problem)}):
                rows = store.trials(problem, device_name=device)
                rows.sort(key=lambda r: (r.optuna_trial_number if r.optuna_trial_number is not None else math.inf, r.id))
                ok = [(i, r.median_us) for i, r in enumerate(rows, 1) if r.ok and r.median_us is not None]
                in_flight = in_flight_when_asked([(r.started_at, r.finished_at) for r in rows])
                if not ok:
                    out.append({"problem": str(problem), "device": device, "trials": len(rows),
                                "best_us": None, "first_us": None, "best_at": None, "served_at": None,
                                "served_confirmed": False, "within_half_pct_at": None,
                                "within_1pct_at": None, "in_flight": in_flight})
                    continue
                best = min(t for _, t in ok)
                # What the job serves: its confirmation round's winner (the best configs
                # re-timed side by side, docs/measurement.md), else the fastest trial.
                served = best_result(problem.kernel, dict(problem.dims), problem.dtype,
                                     device=device, db=db)
                served_at = None if served is None else min(
                    (i for i, r in enumerate(rows, 1) if r.ok and dict(r.config) == served.config),
                    default=None)
                out.append({
                    "problem": str(problem), "device": device, "trials": len(rows),
                    "best_us": best,
                    "first_us": rows[0].median_us if rows[0].ok else None,
                    "best_at": min(i for i, t in ok if t == best),
                    "served_at": served_at,
                    "served_confirmed": served is not None and served.confirmed,
                    "within_half_pct_at": min(i for i, t in ok if t <= best * 1.005),
                    "within_1pct_at": min(i for i, t in ok if t <= best * 1.01),
                    "in_flight": in_flight,
                    **truth_scores(truth_of(device, problem), [dict(r.config) for r in rows]),
                })
    return out


def in_flight_when_asked(spans: Sequence[tuple[Any, Any]]) -> float | None:
    """The median over a problem's trials (``(asked, stored)`` times each; ``asked`` None where
    it was not stored) of how many of them were in flight, asked and not yet stored, when one
    was asked, itself included: what a replay's ``in_flight`` stands for (``--in-flight``).
    None without any asked time."""
    asked = [(a, b) for a, b in spans if a is not None and b is not None]
    if not asked:
        return None
    return float(statistics.median(sum(1 for a, b in asked if a <= t < b) for t, _ in asked))


def truth_scores(truth: Mapping[str, Any] | None, configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A live job's trials (``configs``, in the order measured) scored by a ground-truth
    problem ``truth`` (None: nothing to score by, no keys): ``truth_best_us`` (its best),
    ``truth_known`` (the trials whose config it records ok), ``truth_first_gap`` (the first
    trial's gap to its best; None when unrecorded) and ``truth_within_1pct_at`` (the first trial
    within 1% of its best, 1-based; None when none is). No keys either where it records no
    config ok."""
    times = {} if truth is None else {
        digest: t for digest, t in _recorded_times(truth).items() if t is not None}
    if not times:
        return {}
    best = min(times.values())
    scored = [times.get(Config(c).digest()) for c in configs]
    first = scored[0] if scored else None
    return {
        "truth_best_us": best,
        "truth_known": sum(t is not None for t in scored),
        "truth_first_gap": None if first is None else first / best - 1,
        "truth_within_1pct_at": next((i for i, t in enumerate(scored, 1)
                                      if t is not None and t <= best * 1.01), None),
    }


def trials_to(curve: Sequence[float], target: float, budget: int) -> int:
    for i, best in enumerate(curve):
        if best <= target:
            return i + 1
    return budget + 1  # not reached within the budget


def stop_at(curve: Sequence[float], patience: int) -> int:
    """Trials run when tuning stops after ``patience`` trials in a row without a new best (the
    tuner's rule), or all of them."""
    last_best = 0
    for i in range(1, len(curve)):
        if curve[i] < curve[i - 1]:
            last_best = i
        if i - last_best >= patience:
            return i + 1
    return len(curve)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def related_to(rec: Recorded, recs: Sequence[Recorded]) -> list[Recorded]:
    """The other recorded problems of the same kernel and device (leave-one-out)."""
    return [o for o in recs if o is not rec and o.data["kernel"] == rec.data["kernel"]
            and o.device == rec.device]


def run(problems: Sequence[Mapping[str, Any]], *, seeds: int, budget: int, samplers: Sequence[str],
        modes: Sequence[str] = MODES, patience: Sequence[int] = (), noise: float = 0.0,
        family: Sequence[str] = (), in_flight: int = 1,
        confirm: Sequence[ConfirmRule] = ()) -> list[dict[str, Any]]:
    """The replay's rows: one per problem (ground-truth dicts, as
    :func:`~autotune.replay.ground_truth.load_ground_truth` gives them), mode and sampler spec,
    over ``seeds`` seeds of ``budget`` trials each (``patience``: also the early-stop figures
    for these patiences; ``family``: every valid config of a recorded family is reachable, see
    :class:`Recorded`; ``in_flight``: trials asked ahead, see :func:`replay_study`;
    ``confirm``: per rule, each study's confirmation round, :func:`confirm_replayed`, at
    ``noise``: runs whose crowned config is beyond 0.5% and 1% of the recorded best, whose
    round left out every config within 0.5%, the rounds, programs and blocks)."""
    for spec in samplers:
        if spec != "oracle":
            parse_sampler(spec)
    recs = [Recorded(d, family) for d in problems]
    rows = []
    for rec in recs:
        others = related_to(rec, recs)
        for mode in modes:
            if mode == "warm" and not others:
                continue  # nothing else recorded for this kernel
            for spec in samplers:
                started = time.process_time()
                replays = [replay_once(rec, spec, s, budget, others if mode == "warm" else (), noise,
                                       in_flight) for s in range(seeds)]
                curves = [r.curve for r in replays]
                row: dict[str, Any] = {
                    "problem": rec.name, "file": rec.data["name"], "mode": mode, "sampler": spec,
                    "held_out": rec.data["name"] not in TUNED_ON, "configs": rec.bound.count(),
                    "cpu_s": round(time.process_time() - started, 1), "noise": noise,
                }
                ats = [r.final_at for r in replays if r.final_at is not None]
                gaps = [r.final_gap for r in replays if r.final_gap is not None]
                row["final_at"] = (statistics.median(ats), pct(ats, 0.9)) if ats else None
                row["final_gap"] = statistics.median(gaps) if gaps else None
                row["final_ats"] = ats
                for th in THRESHOLDS:
                    needed = [trials_to(c, rec.best * (1 + th), budget) for c in curves]
                    row[f"{th:g}"] = (statistics.median(needed), pct(needed, 0.9))
                gaps = [c[0] / rec.best - 1 for c in curves if c]
                row["first_gap"] = statistics.median(gaps)
                row["first_within_2pct"] = sum(g <= 0.02 for g in gaps) / len(gaps)
                row["confirmed"] = {}
                for rule in confirm:
                    done = [c for s, r in enumerate(replays)
                            if (c := confirm_replayed(rec, r, rule, noise=noise, seed=s))]
                    row["confirmed"][f"{rule.top},{rule.band:g},{rule.most}"] = {
                        "runs": len(done), "over_0.5": sum(c.gap > 0.005 for c in done),
                        "over_1": sum(c.gap > 0.01 for c in done),
                        "left_out": sum(c.best_in_round > 0.005 for c in done),
                        "rounds": statistics.mean(c.rounds for c in done) if done else None,
                        "programs": statistics.mean(c.programs for c in done) if done else None,
                        "blocks": statistics.mean(c.blocks for c in done) if done else None}
                row["patience"] = {}
                for p in patience:
                    stops = [stop_at(c, p) for c in curves if c]
                    gaps = [c[s - 1] / rec.best - 1 for c, s in zip([c for c in curves if c], stops, strict=True)]
                    row["patience"][p] = (statistics.median(stops), statistics.median(gaps), pct(gaps, 0.9))
                rows.append(row)
    return rows

"""Replay samplers over recorded ground truth: trials needed to get near the best (CPU only).

    python3 benchmarks/search_efficiency.py [FILES] [--seeds 10] [--budget 64]
        [--samplers auto,ranked,oracle] [--modes cold,warm] [--noise SD] [--json OUT]
        [--save-reference PATH]
    python3 benchmarks/search_efficiency.py --live DB [--job examples/unseen_shapes.toml]
    python3 benchmarks/search_efficiency.py --store-ground-truth DB [FILES]
    python3 benchmarks/search_efficiency.py FILES --live-truth DB[,DB...] [...]

Ground truth: every ``benchmarks/data/<kernel>__<shape>__<dtype>.json`` written by
``benchmarks/ground_truth.py`` on a GPU (a uniform sample of the valid set plus climbing around
the best; ``replay_reference.json`` is the CI reference, not ground truth). For each recorded
problem and sampler, the real sampler (:func:`autotune.tuning.sampling.valid_sampler`, with its
valid-set repair) runs over the recorded configs (the space restricted to them) for many seeds,
looking times up instead of measuring; the table gives the trials needed to get within 1% and
0.5% of the best recorded time (median and 90th percentile over seeds) and the first proposal's
gap to the best.

Modes, both with the kernel's known-good default switched OFF (``--with-default`` adds today's
tuner, ``auto`` with the default first, cold, for reference):
  cold  an empty database: no other result is known;
  warm  leave-one-out: every other recorded problem of the same kernel (and device) is stored;
        ``auto`` proposes their winners first (nearest shape first, as the tuner does), the
        ranked sampler learns from all their results and puts the winners in its pool.

The ranked sampler's pool is drawn from the *uniform-stage* recorded configs only: configs the
ground truth found by climbing around the best are reachable only as neighbours of measured
configs, as they would be in the real valid set (of 10^5 configs, a pool of 1024 rarely holds
the best few).

Sampler specs: ``auto``, ``ranked``, with options after ``+``: ``auto+local=0.3``,
``ranked+model=numpy``, ``ranked+explore=0.2+local=0.5+kappa=1+candidates=512``.

``HELD_OUT``: the settings of the ranked sampler (explore, kappa, local, the features) were
tuned on the files in ``TUNED_ON`` only; every other problem is held out and reported
separately.

``--noise SD`` replays with measurement noise: the study sees each recorded time times a
seeded log-normal factor of relative standard deviation SD (the H200's run-to-run noise on the
live shapes is about 0.01), while the thresholds above still count true (recorded) times. The
table then adds the trial whose *measurement* was the fastest, as ``--live`` reports for a live
job, and the median of it over every problem and seed (issue 17's live goal: at most 8). Spec
``oracle`` measures the recorded configs fastest first: no search does better, so under noise it
shows what noise alone does to that trial.

``--live-truth DB,...`` adds the configs that live jobs measured (median over the databases,
per config; a config the file records keeps its recorded time) to each file's problem as extra
truth, reachable by the climb and as neighbours but never drawn into the pool. The recorded
files hold a uniform sample with few variants of each (tile, stages) family, so a replayed
search cannot dwell on one family's grid-order variants as a live one can, on the real valid
set of 10^5 configs; with them it can (``benchmarks/RESULTS.md`` section 11, "Reach").
``--family T1,T2,...`` goes further: every valid config of a recorded family (the configs that
share the values of T1, T2, ...) is reachable, as in the real valid set, and is timed as the
median of its family's recorded configs that share the most tunables with it (the grid order's
effect is then that of the nearest measured variant, not known exactly).

``--live DB`` reads a live job's results instead: for each problem in the database (or in
``--job``), the trial index at which its final best was first reached, the trial that first
measured its served best (the confirmation round's winner), and at which it was first within
0.5% and 1% of the final best (configs within noise of each other make the first two mostly
chance). ``--store-ground-truth DB`` writes the ground truth into a database first, so a
live job over other shapes starts warm (``examples/unseen_shapes.toml``).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import random
import re
import statistics
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from recorded_times import recorded_samples, recorded_us  # noqa: E402

from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.problem import (
    Config,  # noqa: E402
    shape_distance,  # noqa: E402
)
from autotune.space.search_space import Constraint, Space  # noqa: E402
from autotune.tuning import optuna_adapter  # noqa: E402
from autotune.tuning.ranked_sampler import Observation, model_backend  # noqa: E402
from autotune.tuning.sampling import OUTCOME_ATTR, ExhaustedError, distributions, valid_sampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
GROUND_TRUTH = re.compile(r"^[^_].*__.+__[a-z0-9_]+\.json$")
THRESHOLDS = (0.005, 0.01, 0.02)
SAMPLERS = ("auto", "ranked")
MODES = ("cold", "warm")
# The ranked sampler's settings were chosen on these files only; all others are held out.
TUNED_ON = (
    "hopper_matmul__k4096_m4096_n4096__bfloat16.json",
    "hopper_matmul__k4096_m8192_n3584__bfloat16.json",
    "hopper_matmul__k8192_m256_n8192__bfloat16.json",
    "hopper_attention__batch1_causalfalse_head_dim64_heads_kv8_heads_q8_seq_kv8192_seq_q8192__float16.json",
)
RANKED_OPTIONS = {"explore": float, "kappa": float, "candidates": int, "model": str,
                  "climb": float, "clip": lambda v: v not in ("0", "false"),
                  "estimate": lambda v: v not in ("0", "false")}


def add_live_truth(data: dict[str, Any], dbs: Sequence[str]) -> int:
    """Adds to a ground-truth file's results the configs the databases ``dbs`` measured for its
    problem on its device (stage ``"live"``: never drawn; their median over the databases), where
    the file does not record them. Returns how many were added."""
    from autotune.queries.best import results_frame

    kernel = get_kernel(data["kernel"])
    problem = kernel.problem(data["shape"], data["dtype"])
    names = kernel.bind(problem).names
    recorded = {Config(r["config"]).digest() for r in data["results"]}
    times: dict[str, list[float]] = {}
    configs: dict[str, Config] = {}
    for db in dbs:
        frame = results_frame(db if "://" in db else f"sqlite:///{db}")
        frame = frame[(frame["problem"] == str(problem)) & (frame["status"] == "ok")]
        if data.get("device"):
            frame = frame[frame["device"] == data["device"]]
        for _, row in frame.iterrows():
            config = Config({n: _plain(row[f"config.{n}"]) for n in names})
            digest = config.digest()
            if digest not in recorded:
                configs[digest] = config
                times.setdefault(digest, []).append(float(row["median_us"]))
    for digest, config in configs.items():
        data["results"].append({"config": dict(config), "stage": "live", "status": "ok",
                                "median_us": statistics.median(times[digest])})
    return len(configs)


def _plain(value: Any) -> Any:
    """A frame cell as a config value: missing as None, whole floats as ints."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "<NA>":
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def ground_truth_files(folder: Path = DATA) -> list[str]:
    """Every ``<kernel>__<shape>__<dtype>.json`` in ``folder``, sorted."""
    return sorted(p for p in glob.glob(str(folder / "*.json")) if GROUND_TRUTH.match(Path(p).name))


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        if not isinstance(data, dict) or "results" not in data or "kernel" not in data:
            raise SystemExit(f"{p}: not a ground-truth file (no 'kernel'/'results'); "
                             "give files written by benchmarks/ground_truth.py")
        data["file"] = Path(p).name
        out.append(data)
    return out


class Recorded:
    """One ground-truth problem: its space restricted to the recorded configs, and times."""

    def __init__(self, data: Mapping[str, Any], family: Sequence[str] = ()) -> None:
        self.data = data
        self.family = tuple(family)
        self.kernel = get_kernel(data["kernel"])
        self.problem = self.kernel.problem(data["shape"], data["dtype"])
        base = self.kernel.bind(self.problem)
        self.times = {
            Config(r["config"]).digest(): (recorded_us(r) if r["status"] == "ok" else None)
            for r in data["results"]
        }
        # Only recorded configs: one rule per tunable, on the prefix fixed so far, so that
        # enumerating the valid set visits recorded prefixes only (milliseconds, not minutes).
        names = base.names
        recorded = [tuple(r["config"][n] for n in names) for r in data["results"]]
        rules = tuple(
            Constraint(f"recorded_{d}", names[:d + 1],
                       lambda c, e, d=d, seen={t[:d + 1] for t in recorded}: tuple(c[n] for n in names[:d + 1]) in seen,
                       "only configs measured in the ground truth")
            for d in range(len(names))
        )
        if self.family:
            # Every valid config of a recorded family (``--family``), as in the real valid set;
            # an unrecorded one is timed as its family's recorded configs nearest to it.
            known = [tuple(r["config"][n] for n in self.family) for r in data["results"]]
            rules = tuple(
                Constraint(f"recorded_family_{d}", self.family[:d + 1],
                           lambda c, e, d=d, seen={t[:d + 1] for t in known}: tuple(c[n] for n in self.family[:d + 1]) in seen,
                           "only families measured in the ground truth")
                for d in range(len(self.family))
            )
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

    def observations(self) -> list[Observation]:
        return [Observation(self.problem, Config(r["config"]),
                            recorded_us(r) if r["status"] == "ok" else None)
                for r in self.data["results"]]

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

    def winner(self) -> Config:
        return min((r for r in self.data["results"] if r["status"] == "ok"),
                   key=recorded_us)["config"]

    def draw(self, n: int, seed: int) -> list[Config]:
        rng = random.Random(seed)
        return rng.sample(self.drawable, min(n, len(self.drawable)))


def parse_sampler(spec: str) -> tuple[str, float | None, dict[str, Any], bool]:
    """``"ranked+explore=0.2"`` -> (name, local share or None, ranked options, default first)."""
    name, *parts = spec.split("+")
    if name not in ("auto", "ranked", "tpe", "random"):
        raise SystemExit(f"sampler {spec!r}: expected auto, ranked, tpe or random, then +KEY=VALUE")
    local, options, default = None, {}, False
    for part in parts:
        key, _, value = part.partition("=")
        if key == "default":
            default = True
        elif key == "local":
            local = float(value)
        elif key in RANKED_OPTIONS and name == "ranked":
            options[key] = RANKED_OPTIONS[key](value)
        else:
            raise SystemExit(f"sampler {spec!r}: unknown option {key!r} (local, default"
                             + (", " + ", ".join(RANKED_OPTIONS) if name == "ranked" else "") + ")")
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


def replay_once(rec: Recorded, spec: str, seed: int, budget: int,
                others: Sequence[Recorded] = (), noise: float = 0.0) -> Replayed:
    """One replayed study of ``budget`` trials (fewer if the space runs out).

    ``noise``: the relative standard deviation of each measurement (log-normal, seeded by
    ``seed``); 0 replays the recorded medians exactly. Spec ``oracle`` measures the recorded
    configs fastest first: no search can do better, so under noise it shows what noise alone
    does to ``final_at``."""
    rng = random.Random(f"noise:{seed}:{rec.name}")

    def seen(t: float) -> float:
        return t * math.exp(noise * rng.gauss(0.0, 1.0)) if noise else t

    measured: list[tuple[float, float]] = []  # (as seen, true) per successful trial, in order
    measured_at: list[int] = []
    best, curve = math.inf, []
    if spec == "oracle":
        for t in sorted(t for t in rec.times.values() if t is not None)[:budget]:
            best = min(best, t)
            curve.append(best)
            measured.append((seen(t), t))
            measured_at.append(len(curve))
        return _replayed(curve, measured, measured_at, rec.best)
    name, local, options, default = parse_sampler(spec)
    seeds = [rec.kernel.default_config(rec.problem)] if default and rec.kernel.default_config else []
    related = [o.winner() for o in sorted(others, key=lambda o: shape_distance(rec.problem.dims, o.problem.dims))[:3]]
    history = [obs for o in others for obs in o.observations()]
    estimate = rec.kernel.cost_model if options.pop("estimate", True) else None
    if name == "ranked":
        # The climb on a cost model walks the whole valid set, as in a real study; only the
        # recorded configs it finds can be replayed.
        options = {"draw": rec.draw, "estimate_space": rec.full, **options}
    vs = valid_sampler(name, rec.bound, seed=seed, seeds=seeds, local=local, related=related,
                       history=history, ranked=options, estimate=estimate)
    study = optuna.create_study(sampler=vs)
    dists = distributions(rec.bound)
    for _ in range(budget):
        try:
            trial = study.ask(dists)
        except ExhaustedError:
            break
        t = rec.time(Config(trial.params))
        optuna_adapter.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok" if t else "wrong_result")
        if t is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            measured.append((seen(t), t))
            study.tell(trial, measured[-1][0])
            best = min(best, t)
            measured_at.append(len(curve) + 1)
        curve.append(best)
    return _replayed(curve, measured, measured_at, rec.best)


def _replayed(curve: list[float], measured: Sequence[tuple[float, float]], at: Sequence[int],
              best: float) -> Replayed:
    if not measured:
        return Replayed(curve, None, None)
    i = min(range(len(measured)), key=lambda j: measured[j][0])
    return Replayed(curve, at[i], measured[i][1] / best - 1)


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


def run(files: Sequence[str], *, seeds: int, budget: int, samplers: Sequence[str],
        modes: Sequence[str] = MODES, patience: Sequence[int] = (), noise: float = 0.0,
        live_truth: Sequence[str] = (), family: Sequence[str] = ()) -> list[dict[str, Any]]:
    datas = load(files)
    for data in datas:
        if live_truth:
            print(f"{data['file']}: {add_live_truth(data, live_truth)} configs measured live added")
    recs = [Recorded(d, family) for d in datas]
    rows = []
    for rec in recs:
        others = related_to(rec, recs)
        for mode in modes:
            if mode == "warm" and not others:
                continue  # nothing else recorded for this kernel
            for spec in samplers:
                started = time.process_time()
                replays = [replay_once(rec, spec, s, budget, others if mode == "warm" else (), noise)
                           for s in range(seeds)]
                curves = [r.curve for r in replays]
                row: dict[str, Any] = {
                    "problem": rec.name, "file": rec.data["file"], "mode": mode, "sampler": spec,
                    "held_out": rec.data["file"] not in TUNED_ON, "configs": rec.bound.count(),
                    "cpu_s": round(time.process_time() - started, 1), "noise": noise,
                }
                finals = [r for r in replays if r.final_at is not None]
                row["final_at"] = ((statistics.median(r.final_at for r in finals), pct([r.final_at for r in finals], 0.9))
                                   if finals else None)
                row["final_gap"] = statistics.median(r.final_gap for r in finals) if finals else None
                row["final_ats"] = [r.final_at for r in finals]
                for th in THRESHOLDS:
                    needed = [trials_to(c, rec.best * (1 + th), budget) for c in curves]
                    row[f"{th:g}"] = (statistics.median(needed), pct(needed, 0.9))
                gaps = [c[0] / rec.best - 1 for c in curves if c]
                row["first_gap"] = statistics.median(gaps)
                row["first_within_2pct"] = sum(g <= 0.02 for g in gaps) / len(gaps)
                row["patience"] = {}
                for p in patience:
                    stops = [stop_at(c, p) for c in curves if c]
                    gaps = [c[s - 1] / rec.best - 1 for c, s in zip([c for c in curves if c], stops, strict=True)]
                    row["patience"][p] = (statistics.median(stops), statistics.median(gaps), pct(gaps, 0.9))
                rows.append(row)
    return rows


def print_table(rows: Sequence[Mapping[str, Any]], budget: int) -> None:
    def fmt(v: float) -> str:
        return f">{budget}" if v > budget else f"{v:g}"

    for held_out in (False, True):
        part = [r for r in rows if r["held_out"] == held_out]
        if not part:
            continue
        print("Held out (not used to choose the ranked sampler's settings)" if held_out
              else "Tuned on (the ranked sampler's settings were chosen on these)")
        print()
        noisy = any(r.get("noise") for r in part)
        print("| problem | mode | sampler | within 1% (median / p90) | within 0.5% (median / p90) "
              "| within 2% (median / p90) | first proposal: gap (median), share within 2% |"
              + (" fastest measurement at trial (median / p90), its true gap (median) |" if noisy else ""))
        print("|---|---|---|---|---|---|---|" + ("---|" if noisy else ""))
        for r in part:
            cells = [f"{fmt(r[f'{th:g}'][0])} / {fmt(r[f'{th:g}'][1])}" for th in (0.01, 0.005, 0.02)]
            final = ""
            if noisy and r["final_at"] is not None:
                final = f" {r['final_at'][0]:g} / {r['final_at'][1]:g}, {r['final_gap']:.1%} |"
            print(f"| {r['problem']} | {r['mode']} | {r['sampler']} | " + " | ".join(cells)
                  + f" | {r['first_gap']:.1%}, {r['first_within_2pct']:.0%} |" + final)
        print()
    if any(r.get("noise") for r in rows):
        print("The fastest measurement's trial, median over every problem and seed (issue 17's live "
              "goal: at most 8):")
        print()
        for key in sorted({(r["mode"], r["sampler"]) for r in rows}):
            ats = [a for r in rows if (r["mode"], r["sampler"]) == key for a in r.get("final_ats", ())]
            if ats:
                print(f"- {key[0]}, {key[1]}: {statistics.median(ats):g} over {len(ats)} replayed studies")
        print()
    if any(r["patience"] for r in rows):
        ps = sorted({p for r in rows for p in r["patience"]})
        print("Early stop after P trials without a new best: trials run (median) / gap to the best "
              "at the stop (median, p90)")
        print()
        print("| problem | mode | sampler | " + " | ".join(f"P={p}" for p in ps) + " |")
        print("|" + "---|" * (3 + len(ps)))
        for r in rows:
            cells = [f"{r['patience'][p][0]:g} / {r['patience'][p][1]:.1%}, {r['patience'][p][2]:.1%}" for p in ps]
            print(f"| {r['problem']} | {r['mode']} | {r['sampler']} | " + " | ".join(cells) + " |")


def reference(rows: Sequence[Mapping[str, Any]], files: Sequence[str], args: Any) -> dict[str, Any]:
    """Median trials to each threshold, keyed by problem, mode and sampler, with the settings."""
    return {
        "files": [Path(f).name for f in files],
        "seeds": args.seeds,
        "budget": args.budget,
        "samplers": args.samplers.split(","),
        "modes": args.modes.split(","),
        "model": model_backend("auto"),
        "median_trials": {
            f"{r['problem']} | {r['mode']} | {r['sampler']}": {f"{th:g}": r[f"{th:g}"][0] for th in THRESHOLDS}
            for r in rows
        },
    }


# ---------------------------------------------------------------------------------------------
# Live jobs: when was the final best first reached?


def live_rows(db: str, job: str | None = None) -> list[dict[str, Any]]:
    """Per problem in ``db`` (only ``job``'s problems when given): trials measured, the index
    (1-based, in the order measured) of the final best (the fastest single measurement), of
    the served best (the confirmation round's winner, what ``autotune best`` answers) and of
    the first results within 0.5% and 1% of the final best."""
    from autotune.queries.best import best_result
    from autotune.storage.store import Store

    wanted = None
    if job:
        from autotune.tuning.jobs import load_job

        wanted = {spec.problem for spec in load_job(job).problems}
    out = []
    with Store(db) as store:
        problems = store.problems()
        for problem in problems:
            if wanted is not None and problem not in wanted:
                continue
            for device in sorted({r.device.name for r in store.trials(problem)}):
                rows = store.trials(problem, device_name=device)
                rows.sort(key=lambda r: (r.optuna_trial_number if r.optuna_trial_number is not None else math.inf, r.id))
                ok = [(i, r.median_us) for i, r in enumerate(rows, 1) if r.ok and r.median_us is not None]
                if not ok:
                    out.append({"problem": str(problem), "device": device, "trials": len(rows),
                                "best_us": None, "best_at": None, "served_at": None,
                                "served_confirmed": False, "within_half_pct_at": None,
                                "within_1pct_at": None})
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
                    "best_at": min(i for i, t in ok if t == best),
                    "served_at": served_at,
                    "served_confirmed": served is not None and served.confirmed,
                    "within_half_pct_at": min(i for i, t in ok if t <= best * 1.005),
                    "within_1pct_at": min(i for i, t in ok if t <= best * 1.01),
                })
    return out


def store_ground_truth(db: str, files: Sequence[str]) -> int:
    """Stores every ground-truth result in ``db`` as trials of the device it was measured on
    (``"kind": "gpu"``), so that a live job there starts warm; returns the trials written."""
    from autotune.evaluation.trial import DeviceInfo, Outcome, TrialResult
    from autotune.storage.store import Store

    written = 0
    with Store(db) as store:
        for data in load(files):
            kernel = get_kernel(data["kernel"])
            problem = kernel.problem(data["shape"], data["dtype"])
            device = DeviceInfo(name=data["device"], kind="gpu")
            software = {k: str(v) for k, v in data.get("jax", {}).items()}
            for r in data["results"]:
                if r["status"] == "ok":
                    result = TrialResult.timed(recorded_samples(r), compile_s=r.get("compile_s"), rel_error=None,
                                               timing="cupti")
                else:
                    result = TrialResult.failed(Outcome(r["status"]), r.get("error", ""))
                recorded = store.record_trial(problem, Config(r["config"]), result, device=device,
                                              software=software, worker="ground-truth")
                written += not recorded.duplicate
    return written


def print_live(rows: Sequence[Mapping[str, Any]]) -> None:
    print("| problem | device | trials | best (us) | final best first reached at trial "
          "| served best first measured at trial | within 0.5% at trial | within 1% at trial |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        best = "-" if r["best_us"] is None else f"{r['best_us']:.1f}"
        served = "-" if r["served_at"] is None else (
            f"{r['served_at']}{' (confirmed)' if r['served_confirmed'] else ''}")
        print(f"| {r['problem']} | {r['device']} | {r['trials']} | {best} | {r['best_at'] or '-'} "
              f"| {served} | {r['within_half_pct_at'] or '-'} | {r['within_1pct_at'] or '-'} |")
    reached = [r["best_at"] for r in rows if r["best_at"] is not None]
    if reached:
        print()
        print(f"median trial index of the final best: {statistics.median(reached):g} "
              f"over {len(reached)} problems")
        served_at = [r["served_at"] for r in rows if r["served_at"] is not None]
        if served_at:
            print(f"median trial index of the served best (the confirmation round's winner): "
                  f"{statistics.median(served_at):g} over {len(served_at)} problems")
        # Configs within a measurement's noise of each other make the final best's index mostly
        # chance: the first within 0.5% of it says when the search got there.
        half = [r["within_half_pct_at"] for r in rows if r["within_half_pct_at"] is not None]
        print(f"median trial index within 0.5% of the final best: {statistics.median(half):g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="ground-truth files (default: every one in benchmarks/data)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--samplers", default=",".join(SAMPLERS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--with-default", action="store_true",
                    help="also replay today's tuner: auto with the known-good default first, cold")
    ap.add_argument("--patience", default="", help="comma-separated P: also report stopping after "
                    "P trials without a new best (trials run, gap to the best)")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="relative standard deviation of each replayed measurement (live runs on "
                         "the H200: about 0.01); adds when the fastest measurement came")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--save-reference", metavar="PATH",
                    help="write the settings and median trials per problem, mode, sampler and "
                         "threshold: the committed reference of the CI regression test")
    ap.add_argument("--live-truth", metavar="DB,...", default="",
                    help="add the configs these live databases measured (their median) to the "
                         "recorded problems as extra truth, reachable but never drawn")
    ap.add_argument("--family", metavar="TUNABLE,...", default="",
                    help="every valid config of a recorded family (the configs sharing these "
                         "tunables' values) is reachable, as in the real valid set, and timed as "
                         "the family's recorded configs nearest to it; e.g. "
                         "tile_m,tile_n,tile_k,max_concurrent_steps")
    ap.add_argument("--live", metavar="DB", help="read a live job's database instead of replaying")
    ap.add_argument("--job", help="with --live: only this job file's problems")
    ap.add_argument("--store-ground-truth", metavar="DB",
                    help="store the ground-truth results in DB (as trials of the device they were "
                         "measured on), so that a live job there starts warm; then exit")
    args = ap.parse_args()
    if args.live:
        print_live(live_rows(args.live, args.job))
        return
    files = args.files or ground_truth_files()
    if args.store_ground_truth:
        n = store_ground_truth(args.store_ground_truth, files)
        print(f"stored {n} ground-truth trials from {len(files)} files in {args.store_ground_truth}")
        return
    if not files:
        raise SystemExit("no ground-truth files: run benchmarks/ground_truth.py on a GPU first")
    bad = [f for f in files if not GROUND_TRUTH.match(Path(f).name)]
    if bad:
        raise SystemExit(f"not ground-truth files (<kernel>__<shape>__<dtype>.json): {', '.join(bad)}")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    samplers = args.samplers.split(",")
    for spec in samplers:
        if spec != "oracle":
            parse_sampler(spec)
    if not 0.0 <= args.noise < 1.0:
        raise SystemExit(f"--noise is a relative standard deviation between 0 and 1, got {args.noise}")
    patience = [int(p) for p in args.patience.split(",") if p]
    started = time.monotonic()
    rows = run(files, seeds=args.seeds, budget=args.budget, samplers=samplers,
               modes=args.modes.split(","), patience=patience, noise=args.noise,
               live_truth=[d for d in args.live_truth.split(",") if d],
               family=[n for n in args.family.split(",") if n])
    if args.with_default:
        rows += run(files, seeds=args.seeds, budget=args.budget, samplers=["auto+default"],
                    modes=["cold"], patience=patience)
    print(f"{len(files)} problems, {args.seeds} seeds, budget {args.budget} trials, "
          f"{time.monotonic() - started:.0f} s")
    print()
    print_table(rows, args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.save_reference:
        Path(args.save_reference).write_text(json.dumps(reference(rows, files, args), indent=1) + "\n")


if __name__ == "__main__":
    main()

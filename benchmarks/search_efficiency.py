"""Replay samplers over recorded ground truth: trials needed to get near the best (CPU only).

    python3 benchmarks/search_efficiency.py [benchmarks/data/*.json] [--seeds 50] [--budget 200]

For each recorded problem (``benchmarks/ground_truth.py`` output) and each sampler, runs the
real :class:`~autotune.sampling.ValidSampler` over the recorded configs (the space restricted to
them: a sample stays a sample) for many seeds, looking times up instead of measuring, and prints
the trials needed to reach within 0.5%, 1%, 2% and 5% of the best recorded time: median and
90th percentile over seeds, and the median's ratio to random search. ``default`` is what
``autotune tune`` does (the ``auto`` sampler: JAX's default config first, then multivariate TPE
with half of the proposals local moves around the best so far); ``warm`` adds the winners of the
other recorded problems of the same kernel and dtype after it, nearest shape first, as a tuned
database would. ``NAME+local=SHARE`` sets the share of local moves.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from autotune.kernel import get_kernel  # noqa: E402
from autotune.problem import Config  # noqa: E402
from autotune.queries import shape_distance  # noqa: E402
from autotune.sampling import (  # noqa: E402
    OUTCOME_ATTR,
    ExhaustedError,
    distributions,
    valid_sampler,
)
from autotune.space import Constraint, Space  # noqa: E402

THRESHOLDS = (0.005, 0.01, 0.02, 0.05)
SAMPLERS = ("random", "tpe", "qmc", "cmaes", "default", "warm")


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    return [json.loads(Path(p).read_text()) for p in paths]


def recorded_space(data: Mapping[str, Any]) -> tuple[Any, dict[str, float | None], Any, Any]:
    """The kernel's bound space restricted to the recorded configs, and their times."""
    kernel = get_kernel(data["kernel"])
    problem = kernel.problem(data["shape"], data["dtype"])
    base = kernel.bind(problem)
    times = {
        Config(r["config"]).digest(): (r["median_us"] if r["status"] == "ok" else None)
        for r in data["results"]
    }
    rule = Constraint(
        "recorded", base.names, lambda c, e: Config(dict(c)).digest() in times,
        "only configs measured in the ground truth",
    )
    space = Space(base.space.params, base.space.constraints + (rule,))
    return space.bind(problem), times, kernel, problem


def warm_seeds(data: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    related = [
        o for o in others
        if o is not data and o["kernel"] == data["kernel"] and o["dtype"] == data["dtype"]
    ]
    related.sort(key=lambda o: shape_distance(data["shape"], o["shape"]))
    seeds = []
    for other in related[:3]:
        ok = [r for r in other["results"] if r["status"] == "ok"]
        if ok:
            seeds.append(min(ok, key=lambda r: r["median_us"])["config"])
    return seeds


def parse_sampler(spec: str) -> tuple[str, float | None]:
    """``"tpe"``, ``"tpe+local=0.3"``, ``"default"`` (the tuner's sampler: ``auto`` with the
    kernel's default config first), ``"warm+local=0"``: the sampler's name and the share of
    local moves (None: the sampler's own)."""
    name, _, rest = spec.partition("+")
    local = None
    if rest:
        key, _, value = rest.partition("=")
        if key != "local":
            raise SystemExit(f"sampler {spec!r}: expected NAME or NAME+local=SHARE")
        local = float(value)
    return ("auto" if name in ("default", "warm") else name), local


def replay_once(bound: Any, times: Mapping[str, float | None], sampler: str, seed: int, budget: int,
                seeds: Sequence[Mapping[str, Any]]) -> list[float]:
    """Best-so-far time after each trial of one replayed study."""
    name, local = parse_sampler(sampler)
    vs = valid_sampler(name, bound, seed=seed, seeds=seeds, local=local)
    study = optuna.create_study(sampler=vs)
    dists = distributions(bound)
    best, curve = math.inf, []
    for _ in range(budget):
        try:
            trial = study.ask(dists)
        except ExhaustedError:
            break
        t = times[Config(trial.params).digest()]
        study._storage.set_trial_system_attr(trial._trial_id, OUTCOME_ATTR, "ok" if t else "wrong_result")
        if t is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, t)
            best = min(best, t)
        curve.append(best)
    return curve


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


def pct(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run(files: Sequence[str], *, seeds: int, budget: int, samplers: Sequence[str],
        patience: Sequence[int] = ()) -> list[dict[str, Any]]:
    datasets = load(files)
    rows = []
    for data in datasets:
        bound, times, kernel, problem = recorded_space(data)
        best = min(t for t in times.values() if t is not None)
        default_seeds = [kernel.default_config(problem)] if kernel.default_config else []
        for sampler in samplers:
            kind = sampler.partition("+")[0]
            if kind == "cmaes":
                try:
                    import cmaes  # noqa: F401
                except ImportError:
                    continue
            # The tuner's order: the kernel's default, then the related problems' winners.
            seed_configs = {"default": default_seeds, "warm": default_seeds + warm_seeds(data, datasets)}.get(kind, [])
            if kind == "warm" and len(seed_configs) == len(default_seeds):
                continue  # no related problem recorded
            curves = [replay_once(bound, times, sampler, s, budget, seed_configs) for s in range(seeds)]
            row = {"problem": f"{data['kernel']} {problem.shape_text} {problem.dtype}", "sampler": sampler,
                   "configs": bound.count(), "first_within_2pct": None}
            for th in THRESHOLDS:
                needed = [trials_to(c, best * (1 + th), budget) for c in curves]
                row[f"{th:g}"] = (statistics.median(needed), pct(needed, 0.9))
            row["first_within_2pct"] = sum(c[0] <= best * 1.02 for c in curves if c) / len(curves)
            row["patience"] = {}
            for p in patience:
                stops = [stop_at(c, p) for c in curves if c]
                gaps = [c[s - 1] / best - 1 for c, s in zip([c for c in curves if c], stops, strict=True)]
                row["patience"][p] = (statistics.median(stops), statistics.median(gaps), pct(gaps, 0.9))
            rows.append(row)
    return rows


def print_table(rows: Sequence[Mapping[str, Any]], budget: int) -> None:
    random_median = {(r["problem"], th): r[f"{th:g}"][0] for r in rows if r["sampler"] == "random" for th in THRESHOLDS}
    head = "| problem | configs | sampler | " + " | ".join(f"within {th * 100:g}% (median / p90 / vs random)" for th in THRESHOLDS) + " | 1st within 2% |"
    print(head)
    print("|" + "---|" * (4 + len(THRESHOLDS)))
    for r in rows:
        cells = []
        for th in THRESHOLDS:
            med, p90 = r[f"{th:g}"]
            rnd = random_median.get((r["problem"], th))
            ratio = f"{med / rnd:.2f}x" if rnd else "-"
            fmt = lambda v: f">{budget}" if v > budget else f"{v:g}"  # noqa: E731
            cells.append(f"{fmt(med)} / {fmt(p90)} / {ratio}")
        print(f"| {r['problem']} | {r['configs']} | {r['sampler']} | " + " | ".join(cells) + f" | {r['first_within_2pct']:.0%} |")
    if any(r["patience"] for r in rows):
        ps = sorted({p for r in rows for p in r["patience"]})
        print()
        print("Early stop after P trials without a new best: trials run (median) / gap to the best "
              "at the stop (median, p90)")
        print()
        print("| problem | sampler | " + " | ".join(f"P={p}" for p in ps) + " |")
        print("|" + "---|" * (2 + len(ps)))
        for r in rows:
            cells = [f"{r['patience'][p][0]:g} / {r['patience'][p][1]:.1%}, {r['patience'][p][2]:.1%}" for p in ps]
            print(f"| {r['problem']} | {r['sampler']} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--samplers", default=",".join(SAMPLERS))
    ap.add_argument("--patience", default="", help="comma-separated P: also report stopping after "
                    "P trials without a new best (trials run, gap to the best)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--save-reference", metavar="PATH",
                    help="write the settings and median trials per problem, sampler and threshold: "
                         "the committed reference of the CI regression test")
    args = ap.parse_args()
    files = args.files or sorted(glob.glob(str(Path(__file__).parent / "data" / "*.json")))
    if not files:
        raise SystemExit("no ground-truth files: run benchmarks/ground_truth.py on a GPU first")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    patience = [int(p) for p in args.patience.split(",") if p]
    rows = run(files, seeds=args.seeds, budget=args.budget, samplers=args.samplers.split(","),
               patience=patience)
    print_table(rows, args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.save_reference:
        Path(args.save_reference).write_text(json.dumps(reference(rows, files, args), indent=1) + "\n")


def reference(rows: Sequence[Mapping[str, Any]], files: Sequence[str], args: Any) -> dict[str, Any]:
    """Median trials to each threshold, keyed by problem and sampler, with the settings."""
    return {
        "files": [Path(f).name for f in files],
        "seeds": args.seeds,
        "budget": args.budget,
        "samplers": args.samplers.split(","),
        "median_trials": {
            f"{r['problem']} | {r['sampler']}": {f"{th:g}": r[f"{th:g}"][0] for th in THRESHOLDS}
            for r in rows
        },
    }


if __name__ == "__main__":
    main()

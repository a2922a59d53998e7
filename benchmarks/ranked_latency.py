"""How long the ranked sampler takes to propose: per ask, and per refit (CPU only).

    python3 benchmarks/ranked_latency.py [--trials 64] [--model auto|sklearn|numpy]
        [--history N] [--no-cost-model]

Runs a study of the ranked sampler (behind the valid-set wrapper, as the tuner does) over the
full valid set of hopper_matmul at 4096^3 bf16 with a synthetic time per config, and prints the
time of each ``study.ask``: those that refit the model, and those that only look up the ranked
pool (the target: under 10 ms at the 99th percentile). ``--history N`` first stores N
synthetic results at another shape, so the prior is fitted too (its time is printed). The
kernel's cost model is passed as the tuner passes it (the first ask then also climbs on it);
``--no-cost-model`` leaves it out.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from autotune.replay.runner import pct  # noqa: E402
from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.problem import Config  # noqa: E402
from autotune.tuning import optuna_adapter  # noqa: E402
from autotune.tuning.samplers.ranked import Observation  # noqa: E402
from autotune.tuning.sampling import OUTCOME_ATTR, distributions, valid_sampler  # noqa: E402


def synthetic_us(problem, c) -> float:
    """A deterministic stand-in for a measured time: some structure, no GPU."""
    tiles = (problem["m"] / c["tile_m"]) * (problem["n"] / c["tile_n"])
    return 100.0 * (1 + abs(math.log2(tiles / 132))) * (1 + 0.1 * abs(c["max_concurrent_steps"] - 3)) * (
        1 + 0.05 * (c["tile_k"] != 64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--no-cost-model", action="store_true", help="rank without the kernel's cost model")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    kernel = get_kernel("hopper_matmul")
    problem = kernel.problem({"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
    bound = kernel.valid_space(problem)
    history = []
    if args.history:
        other = kernel.problem({"m": 8192, "n": 2048, "k": 4096}, "bfloat16")
        history = [Observation(other, c, synthetic_us(other, c))
                   for c in kernel.valid_space(other).sample(args.history, seed=1)]
    started = time.perf_counter()
    estimate = None if args.no_cost_model else kernel.cost_model
    sampler = valid_sampler("ranked", bound, seed=0, history=history, ranked={"model": args.model},
                            estimate=estimate)
    base = sampler.base
    study = optuna.create_study(sampler=sampler)
    dists = distributions(bound)
    lookups, refits = [], []
    first_ask = None
    for i in range(args.trials):
        fits = base.fits
        t0 = time.perf_counter()
        trial = study.ask(dists)
        dt = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first_ask = dt  # draws the pool, fits the prior
        elif base.fits > fits:
            refits.append(dt)
        else:
            lookups.append(dt)
        optuna_adapter.set_trial_system_attr(study, trial, OUTCOME_ATTR, "ok")
        study.tell(trial, synthetic_us(problem, Config(trial.params)))
    total = time.perf_counter() - started
    print(f"ranked sampler, model {base.backend}, {bound.count()} valid configs, pool "
          f"{len(base._pool)}, {args.trials} trials, history {len(history)} results, cost model "
          f"{'off' if estimate is None else 'on'}")
    steps = ["draw the pool"] + (["climb on the cost model"] if estimate else []) + (
        ["fit the prior"] if history and not estimate else [])
    print(f"first ask ({', '.join(steps)}): {first_ask:.0f} ms")
    if refits:
        print(f"asks that refit ({len(refits)}): median {statistics.median(refits):.1f} ms, "
              f"max {max(refits):.1f} ms")
    if lookups:
        p99 = pct(lookups, 0.99)
        print(f"asks without a refit ({len(lookups)}): median {statistics.median(lookups):.1f} ms, "
              f"p99 {p99:.1f} ms")
    print(f"total {total:.1f} s")


if __name__ == "__main__":
    main()

"""How long handing out one config takes with many trials stored for the problem (issue 16:
at most 10 ms at the 99th percentile with 10,000 trials).

    python3 benchmarks/ask_latency.py --stored 10000 --asks 200 --samplers auto,tpe,random

Times the scheduler's whole ask path (proposal and repair, the twin check, the shared-budget
count) with ``--stored`` finished trials in the problem's in-memory study (what grows; round
trips: benchmarks/scale_out.py), per sampler: p50, p99 and max wall ms, p50 and p99 of the
asking thread's CPU (to trust on a loaded machine), without and with ``prefetch`` (the next
proposal on a background thread; ``--gap-ms`` between a result and the next ask).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optuna  # noqa: E402
from common import add_finished, ask_run, time_asks  # noqa: E402

from autotune.space.kernel import Kernel  # noqa: E402
from autotune.space.search_space import Choice, Constraint, Space  # noqa: E402
from autotune.tuning import optuna_adapter  # noqa: E402
from autotune.tuning.sampling import OUTCOME_ATTR, distributions, valid_sampler  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _never(*args: object) -> object:
    raise NotImplementedError


# 16 x 16 x 8 x 4 x 4 = 32,768 raw configs, about 3/4 of them valid: room for 10,000 trials.
BIG = Kernel(
    name="ask_latency_big",
    space=Space(
        params=(
            Choice("tile_m", tuple(range(16, 272, 16)), ordered=True),
            Choice("tile_n", tuple(range(16, 272, 16)), ordered=True),
            Choice("tile_k", (16, 32, 48, 64, 80, 96, 112, 128), ordered=True),
            Choice("stages", (1, 2, 3, 4), ordered=True),
            Choice("order", ("MN", "NM", "MK", "NK")),
        ),
        constraints=(Constraint("smem", ("tile_m", "tile_n", "stages"),
                                lambda c, e: c["tile_m"] * c["tile_n"] * c["stages"] <= 3 * 256 * 256 // 2,
                                "fits"),),
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never, make_inputs=_never, reference=_never,
)


def cost(c: dict) -> float:
    return (100 + abs(c["tile_m"] - 128) / 4 + abs(c["tile_n"] - 192) / 4 + abs(c["tile_k"] - 64) / 8
            + 3 * abs(c["stages"] - 3) + (0 if c["order"] == "MN" else 2))


def measure(name: str, stored: int, asks: int, seed: int = 0, *, prefetch: bool = False,
            gap_s: float = 0.0) -> list[tuple[float, float]]:
    problem = BIG.problem({"n": 1}, "float32")
    space = BIG.valid_space(problem)
    dists = distributions(space)
    rng = random.Random(seed)
    sampler = valid_sampler(name, space, seed=seed)
    sampler.prefetch = prefetch
    study = optuna.create_study(sampler=sampler, direction="minimize")
    configs = [dict(c) for c in space.sample(stored, seed=seed)]
    rng.shuffle(configs)
    add_finished(study, dists, configs, cost)
    run = ask_run(BIG, problem, space, sampler, study, dists, name, stored, asks)

    def tell(trial: optuna.trial.Trial, config: dict) -> None:
        trial.storage.set_trial_system_attr(optuna_adapter.trial_id(trial), OUTCOME_ATTR, "ok")
        study.tell(trial, cost(config))

    return time_asks(run, asks, tell, gap_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stored", type=int, default=10_000)
    p.add_argument("--asks", type=int, default=200)
    p.add_argument("--samplers", default="auto,tpe,random")
    p.add_argument("--gap-ms", type=float, default=50.0,
                   help="time between a result and the next ask, in the prefetch rows (default "
                        "50 ms; on the H200 a problem's results come every 0.3-3 s)")
    args = p.parse_args(argv)
    print(f"{'sampler':>8} {'prefetch':>8} {'stored':>7} {'asks':>5} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'cpu p50':>7} {'cpu p99':>7}")
    for name in args.samplers.split(","):
        for prefetch in (False, True):
            measured = measure(name, args.stored, args.asks, prefetch=prefetch,
                               gap_s=args.gap_ms / 1000 if prefetch else 0.0)
            wall = sorted(w for w, _c in measured)
            cpu = sorted(c for _w, c in measured)
            at = min(len(wall) - 1, int(0.99 * len(wall)))
            print(f"{name:>8} {'on' if prefetch else 'off':>8} {args.stored:>7} {len(wall):>5} "
                  f"{statistics.median(wall):>7.2f} {wall[at]:>7.2f} {wall[-1]:>7.2f} "
                  f"{statistics.median(cpu):>7.2f} {cpu[at]:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

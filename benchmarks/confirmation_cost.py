"""What the confirmation round costs the engine, beyond the GPU time it measures (issue 19).

    python3 benchmarks/confirmation_cost.py --out /tmp/confirmation_cost.json   # CPU, ~10 s

With the fake evaluator (no compile, no GPU; every timing returns at once), one engine worker:

* ``search``: a problem's default search, ``--trials`` (32) configs submitted ``parallelism``
  at a time, as the job runner does; the engine's own cost per trial;
* ``confirm``: ``Engine.confirm`` at the defaults (the best 5 and the baseline, 5 rounds of 50
  runs): 30 re-time tasks, one at a time, on the executables the workers kept.

The per-task figure is the engine's overhead (dispatch, pipes, the GPU lock, result); on the
H200 each re-time task adds its GPU time (50 x (kernel + L2 flush)), one CUPTI session, and
fresh inputs. docs/measurement.md states the arithmetic against a job's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.engine.dispatcher import Engine  # noqa: E402
from autotune.space.problem import Config, Problem  # noqa: E402
from autotune.tuning.confirmation import (  # noqa: E402
    CONFIRM_MIN_ROUNDS,
    DEFAULT_CONFIRM_ITERATIONS,
    DEFAULT_CONFIRM_TOP,
)

FAKE = "tests.kernels_for_tests:FAKE"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    problem = Problem(FAKE, {"n": 1, "baseline_us": 150}, "float32")
    configs = [Config(mode="ok", stage="run", cost_us=str(100 + i), noise=2)
               for i in range(args.trials)]
    search_s, confirm_s = [], []
    with Engine("fake", allow_import=True, cache="cold") as engine:
        engine.device_info()
        engine.baseline(FAKE, problem)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            pending = list(configs)
            futures = []
            while pending or futures:
                while pending and len(futures) < engine.parallelism:
                    futures.append(engine.submit(FAKE, problem, pending.pop()))
                futures.pop(0).result()
            search_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.confirm(FAKE, problem, configs[:DEFAULT_CONFIRM_TOP],
                           rounds=CONFIRM_MIN_ROUNDS, iterations=DEFAULT_CONFIRM_ITERATIONS)
            confirm_s.append(time.perf_counter() - t0)
    tasks = CONFIRM_MIN_ROUNDS * (DEFAULT_CONFIRM_TOP + 1)
    doc = {
        "trials": args.trials, "repeat": args.repeat,
        "search_s": search_s, "confirm_s": confirm_s,
        "search_s_per_trial": statistics.median(search_s) / args.trials,
        "confirm_tasks": tasks,
        "confirm_s_per_task": statistics.median(confirm_s) / tasks,
    }
    print(f"search: {statistics.median(search_s):.3f} s for {args.trials} trials "
          f"({1000 * doc['search_s_per_trial']:.2f} ms per trial, engine overhead)")
    print(f"confirm: {statistics.median(confirm_s):.3f} s for {tasks} re-time tasks "
          f"({1000 * doc['confirm_s_per_task']:.2f} ms per task, engine overhead)")
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

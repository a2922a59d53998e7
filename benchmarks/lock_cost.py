"""What one config costs under the GPU's lock, step by step, with and without a compile thread
busy beside it, at two GIL switch intervals (issue 16: the lock is the batch job's bottleneck).

    python3 benchmarks/lock_cost.py --out $OUT/lock_cost.json                  # H200
    python3 benchmarks/lock_cost.py --device interpret --shape m=128,n=128,k=128 --configs 2 \\
        --trials 2 --out /tmp/lock_cost.json                                    # CPU smoke test

One process, as a worker has: an evaluator, ``--configs`` configs compiled (and run once) first,
then per condition (switch interval x compile thread idle or busy: compiling other configs in a
loop) every config run as a trial, ``--trials`` runs in all. Per condition, the median and mean
seconds of each of the evaluator's stages, of the CUPTI sessions inside the timing, and of an
empty session (attached, and detaching as ``profiler.measure`` does). Prints a table; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = ("device->run", "run->check", "check->time", "time->done", "total")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="hopper_matmul")
    p.add_argument("--shape", default="m=4096,n=4096,k=4096")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", choices=("gpu", "interpret"), default="gpu")
    p.add_argument("--configs", type=int, default=8, help="configs compiled and run in turn")
    p.add_argument("--trials", type=int, default=24, help="trials per condition")
    p.add_argument("--switch-intervals", default="0.005,0.0005",
                   help="GIL switch intervals to compare, in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "median_s": statistics.median(values) if values else 0.0,
            "mean_s": statistics.fmean(values) if values else 0.0,
            "max_s": max(values) if values else 0.0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax

    if args.device == "interpret":
        jax.config.update("jax_platforms", "cpu")
    from autotune import _jax_compat
    from autotune.evaluation.contract import Compiled, make_evaluator
    from autotune.space.kernel import get_kernel
    from autotune.space.problem import Problem, parse_shape

    kernel = get_kernel(args.kernel)
    problem = Problem(args.kernel, parse_shape(args.shape), args.dtype)
    evaluator = make_evaluator(args.device)
    pool = kernel.valid_space(problem, interpret=args.device == "interpret").sample(
        args.configs + 64, seed=args.seed)
    timed, spare = list(pool[:args.configs]), list(pool[args.configs:])
    compiled = []
    for config in timed:
        c = evaluator.compile(kernel, problem, config)
        if isinstance(c, Compiled):
            evaluator.run(c)  # first use (module load, the flush's set-up) not counted
            compiled.append(c)
    if not compiled:
        print("No config compiled.", file=sys.stderr)
        return 1

    sessions: list[float] = []
    real_session = _jax_compat.cupti_session

    def timed_session(run: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real_session(run)
        finally:
            sessions.append(time.perf_counter() - t0)

    _jax_compat.cupti_session = timed_session  # cold timing looks it up at each call
    results: list[dict[str, Any]] = []
    spare_iter = iter(spare * 4)
    for interval in [float(s) for s in args.switch_intervals.split(",")]:
        sys.setswitchinterval(interval)
        for busy in (False, True):
            stop = threading.Event()
            compiles = [0]

            def compile_loop(stop: threading.Event = stop, compiles: list[int] = compiles) -> None:
                while not stop.is_set():
                    config = next(spare_iter, None)
                    if config is None:
                        return
                    evaluator.compile(kernel, problem, config)
                    compiles[0] += 1

            worker = threading.Thread(target=compile_loop, daemon=True)
            if busy:
                worker.start()
                time.sleep(0.3)  # into its first compile
            steps: dict[str, list[float]] = {s: [] for s in STEPS}
            sessions.clear()
            empty: list[float] = []
            empty_detached: list[float] = []
            for i in range(args.trials):
                marks: dict[str, float] = {"device": time.perf_counter()}
                evaluator.run(compiled[i % len(compiled)],
                              on_stage=lambda s, m=marks: m.__setitem__(str(s), time.perf_counter()))
                marks["done"] = time.perf_counter()
                for step in STEPS[:-1]:
                    a, b = step.split("->")
                    if a in marks and b in marks:
                        steps[step].append(marks[b] - marks[a])
                steps["total"].append(marks["done"] - marks["device"])
                if args.device == "gpu":
                    # Attached (as the evaluator leaves it), detaching at its end, then the
                    # session after a detach, which attaches again.
                    t0 = time.perf_counter()
                    real_session(lambda: None, detach=False)
                    t1 = time.perf_counter()
                    real_session(lambda: None, detach=True)
                    t2 = time.perf_counter()
                    real_session(lambda: None, detach=False)
                    empty.append(t1 - t0)
                    empty_detached.append(t2 - t1 + time.perf_counter() - t2 - (t1 - t0))
            stop.set()
            if busy:
                worker.join()
            row = {"switch_interval_s": interval, "compile_thread": "busy" if busy else "idle",
                   "compiles_meanwhile": compiles[0],
                   "steps": {s: _summary(v) for s, v in steps.items()},
                   "cupti_session": _summary(list(sessions)),
                   "empty_cupti_session": _summary(empty),
                   "empty_cupti_session_detached": _summary(empty_detached)}
            results.append(row)
            print(f"switch {interval * 1000:.1f} ms, compile thread {row['compile_thread']:4}: "
                  + "  ".join(f"{s} {row['steps'][s]['median_s'] * 1000:.1f}/"
                              f"{row['steps'][s]['mean_s'] * 1000:.1f} ms" for s in STEPS)
                  + f"  session {row['cupti_session']['median_s'] * 1000:.1f} ms,"
                  f" empty {row['empty_cupti_session']['median_s'] * 1000:.1f} ms"
                  f" ({row['empty_cupti_session_detached']['median_s'] * 1000:.1f} ms detaching"
                  " and attaching again)"
                  " (median/mean)", flush=True)
    _jax_compat.cupti_session = real_session
    out = {"problem": str(problem), "device": args.device, "jax": jax.__version__,
           "configs": len(compiled), "trials": args.trials, "conditions": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

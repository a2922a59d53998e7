"""Ground truth for the search-efficiency replay: measure every valid config of a problem.

    python3 benchmarks/ground_truth.py --kernel hopper_matmul --shape m=4096,n=4096,k=4096 \
        --dtype bf16 --max 600 --seconds 240 --out benchmarks/data

Measures all valid configs of the problem (or a uniform random sample of ``--max`` of them when
the space is larger, and says so in the file) with the project's own measurement (the engine:
compile in parallel, CUPTI timing one kernel at a time, output checked against the reference),
plus the baseline; with ``--climb``, then every valid one-tunable neighbour of the kernel's
default and of the best configs so far, round after round (marked ``"stage": "neighbourhood"``);
and writes ``<out>/<kernel>__<shape>__<dtype>.json``: config -> median time,
with device, JAX version and date. Stops submitting after ``--seconds`` and writes what it has.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from concurrent.futures import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune._jax_compat import jax_versions  # noqa: E402
from autotune.engine.dispatcher import Engine  # noqa: E402
from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.problem import Config, parse_shape  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max", type=int, default=600, help="measure a uniform sample above this many")
    ap.add_argument("--climb", type=int, default=0,
                    help="then, for up to this many rounds, measure every one-tunable neighbour of "
                         "the kernel's default and of the --centres best configs so far")
    ap.add_argument("--centres", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=240, help="stop submitting after this long")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--device", default="gpu", choices=("gpu", "interpret"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/data")
    args = ap.parse_args()

    kernel = get_kernel(args.kernel)
    problem = kernel.problem(parse_shape(args.shape), args.dtype)
    space = kernel.valid_space(problem)
    valid = space.count()
    sampled = valid > args.max
    configs = space.sample(args.max, seed=args.seed) if sampled else list(space)
    print(f"{problem}: {valid} valid configs; measuring {'a uniform sample of ' if sampled else ''}{len(configs)}"
          + (f", then up to {args.climb} rounds of neighbourhoods" if sampled and args.climb else ""),
          flush=True)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape_tag = problem.shape_text.replace(",", "_").replace("=", "")
    path = out_dir / f"{kernel.name}__{shape_tag}__{problem.dtype}.json"

    start = time.monotonic()
    results: list[dict] = []
    measured: set[str] = set()

    def measure(engine: Engine, batch: list, stage: str) -> None:
        """Measure ``batch`` (skipping configs already measured), appending to ``results``."""
        futures = {}
        for config in batch:
            if config.digest() in measured:
                continue
            if time.monotonic() - start > args.seconds:
                break
            measured.add(config.digest())
            futures[engine.submit(kernel.name, problem, config)] = config
            # Keep the queue short so that the time limit stops the work, not just submission.
            while sum(not f.done() for f in futures) > 2 * max(1, engine.parallelism):
                wait([f for f in futures if not f.done()], timeout=1.0, return_when="FIRST_COMPLETED")
        remaining = [f for f in futures if not f.done()]
        wait(remaining, timeout=max(60.0, args.seconds * 0.25))
        for future, config in futures.items():
            if not future.done():
                future.cancel()
                continue
            r = future.result()
            results.append({
                "config": dict(config),
                "stage": stage,
                "status": r.outcome.value,
                "median_us": r.median_us,
                "min_us": r.min_us,
                "max_us": r.max_us,
                "compile_s": r.compile_s,
                "error": r.error[-300:] if r.error else "",
            })

    with Engine(mode=args.device, iterations=args.iterations) as engine:
        device = engine.device_info()
        baseline = engine.baseline(kernel.name, problem)
        measure(engine, configs, "uniform")
        # Hill-climbing rounds: every valid one-tunable neighbour of the default and of the best
        # configs so far, until no new best appears. A uniform sample of a space of 10^5 configs
        # rarely holds its best; this adds the region around the best to the ground truth.
        centred: set[str] = set()
        for _ in range(args.climb if sampled else 0):
            ok = sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["median_us"])
            centres = [Config(r["config"]) for r in ok[: args.centres]]
            if kernel.default_config is not None:
                centres.insert(0, kernel.default_config(problem))
            centres = [c for c in centres if c.digest() not in centred]
            if not centres or time.monotonic() - start > args.seconds:
                break
            for centre in centres:
                centred.add(centre.digest())
                measure(engine, [centre, *space.neighbours(centre)], "neighbourhood")
    elapsed = time.monotonic() - start
    ok = [r for r in results if r["status"] == "ok"]
    payload = {
        "kernel": kernel.name,
        "shape": problem.dims,
        "dtype": problem.dtype,
        "device": device.name,
        "jax": jax_versions(),
        "date": dt.date.today().isoformat(),
        "valid_count": valid,
        "sampled": sampled,
        "uniform_sample": sum(r["stage"] == "uniform" for r in results),
        "measured": len(results),
        "seconds": round(elapsed, 1),
        "iterations": args.iterations,
        "baseline": {"name": kernel.baseline_name, "median_us": baseline.median_us} if baseline.ok else None,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=1))
    best = min(ok, key=lambda r: r["median_us"]) if ok else None
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    print(f"wrote {path}: {len(results)} measured in {elapsed:.0f} s ({by_status}); "
          f"best {best['median_us'] if best else None} us {best['config'] if best else ''}; "
          f"baseline {payload['baseline']}", flush=True)


if __name__ == "__main__":
    main()

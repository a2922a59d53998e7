"""Configs evaluated per minute on one GPU: sequential vs the pipelined engine, same configs.

    python benchmarks/throughput.py --out $OUT/throughput.json            # H200: hopper_matmul 4096^3 bf16
    python benchmarks/throughput.py --device interpret --shape m=128,n=128,k=128 --configs 3 \\
        --iterations 1 --out /tmp/throughput.json                       # CPU smoke test

One run measures both modes over the SAME configs (``valid_space(problem).sample(N, seed)``):

* sequential: one process (a child of this script), one config at a time: compile, then check
  and time;
* pipelined: :class:`autotune.engine.Engine` with one worker: compile threads compile later
  configs while earlier ones are timed.

Both are warmed up first on a config outside the measured set (first-compile costs of jax and
Mosaic GPU are not counted, and Mosaic GPU's in-process kernel cache cannot serve a measured
config), the persistent compilation cache is off, and the clock starts after the engine's worker
is up. Prints a table (mode, configs, seconds, configs/min, speedup) and writes JSON to --out.
"""

from __future__ import annotations

import os

# Before jax is imported (here and in the engine's workers, which inherit the environment):
# no persistent compilation cache shared between the two modes, and no process grabbing 75% of
# the GPU's memory while the other mode's process needs it.
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import collections  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from autotune.kernel import get_kernel  # noqa: E402
from autotune.problem import Config, parse_shape  # noqa: E402
from autotune.trial import TrialResult  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kernel", default="hopper_matmul", help="bundled name or package.module:NAME")
    p.add_argument("--shape", default="m=4096,n=4096,k=4096")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--configs", type=int, default=32, help="configs drawn from the valid space")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("gpu", "interpret"), default="gpu")
    p.add_argument("--compile-threads", type=int, default=None, help="engine compile threads")
    p.add_argument("--iterations", type=int, default=None, help="timed iterations per config")
    p.add_argument(
        "--order", choices=("sequential-first", "pipelined-first"), default="sequential-first"
    )
    p.add_argument("--allow-import", action="store_true", help="allow package.module:NAME kernels")
    p.add_argument("--out", default="throughput.json", help="JSON results file")
    return p.parse_args(argv)


def _row(config: Config, result: TrialResult) -> dict[str, Any]:
    return {
        "config": dict(config),
        "outcome": str(result.outcome),
        "median_us": result.median_us,
        "compile_s": result.compile_s,
        "error": result.error.splitlines()[0][:200] if result.error else "",
    }


def run_sequential(
    configs: list[Config], warmup: Config, args: argparse.Namespace
) -> dict[str, Any]:
    """Compile then time, one config at a time, in one process (this script as a child).

    The child is a fresh interpreter so that a config that kills its process (seen: a
    hopper_matmul config interpreted on the CPU dies with SIGFPE inside XLA) does not end the
    benchmark: that config is recorded as crashed, with the time until the death, and a new
    child carries on with the rest. Start-up and warm-up of each child are not counted.
    """
    rows: list[dict[str, Any] | None] = [None] * len(configs)
    seconds = 0.0
    restarts = 0
    device: dict[str, Any] = {}
    remaining = list(range(len(configs)))
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        while remaining:
            job = Path(tmp) / f"job-{restarts}.json"
            out = Path(tmp) / f"out-{restarts}.jsonl"
            job.write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        "warmup": dict(warmup),
                        "configs": [[i, dict(configs[i])] for i in remaining],
                    }
                )
            )
            code = subprocess.call(
                [sys.executable, __file__, "--sequential-child", str(job), str(out)]
            )
            ended = time.time()
            begun: dict[int, float] = {}
            for line in out.read_text().splitlines() if out.exists() else []:
                item = json.loads(line)
                if "device" in item:
                    device = item["device"]
                elif "begin" in item:
                    begun[item["begin"]] = item["t"]
                else:
                    rows[item["i"]] = item["row"]
                    seconds += item["seconds"]
            remaining = [i for i in remaining if rows[i] is None]
            if not remaining:
                break
            if code == 0 or remaining[0] not in begun:
                raise SystemExit(f"The sequential child exited with code {code} before any config.")
            i = remaining.pop(0)
            seconds += ended - begun[i]
            rows[i] = {
                "config": dict(configs[i]),
                "outcome": "crashed",
                "median_us": None,
                "compile_s": None,
                "error": f"the sequential process died (exit code {code})",
            }
            restarts += 1
    return {"seconds": seconds, "device": device, "child_restarts": restarts, "trials": rows}


def sequential_child(job_path: str, out_path: str) -> int:
    from autotune.evaluation import make_evaluator

    job = json.loads(Path(job_path).read_text())
    args = argparse.Namespace(**job["args"])
    kernel = get_kernel(args.kernel, allow_import=args.allow_import)
    problem = kernel.problem(parse_shape(args.shape), args.dtype)
    evaluator = make_evaluator(args.device, iterations=args.iterations)
    with open(out_path, "a") as out:

        def emit(item: dict[str, Any]) -> None:
            out.write(json.dumps(item, default=str) + "\n")
            out.flush()

        evaluator.evaluate(kernel, problem, Config(job["warmup"]))
        emit({"device": dataclasses.asdict(evaluator.device_info())})
        for i, values in job["configs"]:
            config = Config(values)
            emit({"begin": i, "t": time.time()})
            start = time.perf_counter()
            result = evaluator.evaluate(kernel, problem, config)
            emit({"i": i, "row": _row(config, result), "seconds": time.perf_counter() - start})
    return 0


def run_pipelined(
    kernel_name: str, problem: Any, configs: list[Config], warmup: Config, args: argparse.Namespace
) -> dict[str, Any]:
    from autotune.engine import Engine

    with Engine(
        args.device,
        compile_threads=args.compile_threads,
        iterations=args.iterations,
        allow_import=args.allow_import,
    ) as engine:
        device = engine.device_info()
        engine.submit(kernel_name, problem, warmup).result()
        start = time.perf_counter()
        futures = [engine.submit(kernel_name, problem, c) for c in configs]
        results = [f.result() for f in futures]
        seconds = time.perf_counter() - start
        stats = engine.stats()
        threads = engine.compile_threads
    return {
        "seconds": seconds,
        "device": dataclasses.asdict(device),
        "compile_threads": threads,
        "worker_starts": stats.worker_starts,
        "trials": [_row(c, r) for c, r in zip(configs, results, strict=True)],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kernel = get_kernel(args.kernel, allow_import=args.allow_import)
    problem = kernel.problem(parse_shape(args.shape), args.dtype)
    space = kernel.valid_space(problem)
    configs = space.sample(args.configs, seed=args.seed)
    extra = space.sample(1, seed=args.seed + 1, exclude=configs)
    if not configs or not extra:
        print(f"{problem} has {space.count()} valid configs: need --configs + 1.", file=sys.stderr)
        return 2
    warmup = extra[0]
    print(
        f"{problem}: {len(configs)} configs (seed {args.seed}) on {args.device}; warm-up {warmup}"
    )

    modes: dict[str, dict[str, Any]] = {}
    order = ["sequential", "pipelined"]
    if args.order == "pipelined-first":
        order.reverse()
    for mode in order:
        if mode == "sequential":
            modes[mode] = run_sequential(configs, warmup, args)
        else:
            modes[mode] = run_pipelined(kernel.name, problem, configs, warmup, args)
        print(f"  {mode}: {modes[mode]['seconds']:.1f} s")

    base = modes["sequential"]["seconds"]
    print(f"\n{'mode':<11} {'configs':>7} {'seconds':>9} {'configs/min':>12} {'speedup':>8}")
    for mode in ("sequential", "pipelined"):
        m = modes[mode]
        m["configs_per_min"] = len(configs) / m["seconds"] * 60
        m["speedup"] = base / m["seconds"]
        m["outcomes"] = dict(collections.Counter(t["outcome"] for t in m["trials"]))
        print(
            f"{mode:<11} {len(configs):>7} {m['seconds']:>9.1f} {m['configs_per_min']:>12.1f} {m['speedup']:>7.2f}x"
        )
    for mode in ("sequential", "pipelined"):
        print(f"  {mode} outcomes: {modes[mode]['outcomes']}")
    disagree = [
        (s["config"], s["outcome"], p["outcome"])
        for s, p in zip(modes["sequential"]["trials"], modes["pipelined"]["trials"], strict=True)
        if s["outcome"] != p["outcome"]
    ]
    if disagree:
        print(f"  outcomes differ between modes for {len(disagree)} configs: {disagree[:3]}")
    for mode in ("sequential", "pipelined"):
        ok = [
            t for t in modes[mode]["trials"] if t["median_us"] is not None and t["outcome"] == "ok"
        ]
        if ok:
            best = min(ok, key=lambda t: t["median_us"])
            print(f"  {mode} best: {best['median_us']:.1f} us {best['config']}")

    from autotune._jax_compat import jax_versions

    report = {
        "kernel": kernel.name,
        "problem": problem.key(),
        "device_mode": args.device,
        "seed": args.seed,
        "configs": [dict(c) for c in configs],
        "warmup": dict(warmup),
        "versions": jax_versions(),
        "modes": modes,
        "outcomes_differ": disagree,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--sequential-child":
        sys.exit(sequential_child(sys.argv[2], sys.argv[3]))
    sys.exit(main())

"""Configs evaluated per minute on one GPU: sequential vs the engine, same configs.

    python benchmarks/throughput.py --out $OUT/throughput.json            # H200: hopper_matmul 4096^3 bf16
    python benchmarks/throughput.py --device interpret --shape m=128,n=128,k=128 --configs 3 \\
        --iterations 1 --out /tmp/throughput.json                       # CPU smoke test

One run measures every mode over the SAME configs (``valid_space(problem).sample(N, seed)``):

* sequential: one process (a child of this script), one config at a time: compile, then check
  and time;
* threads: the engine with one worker: its compile threads (``--compile-threads``) compile
  later configs while earlier ones are timed;
* processes: the engine by default: ``--workers-per-gpu`` worker processes (``4,8``: a row
  each) compile in parallel and take turns on the GPU through its lock.

Every mode is warmed up first on a config outside the measured set, on every engine worker;
the persistent compilation cache is off; the clock starts after the warm-up. Prints a table
(mode, configs, seconds, configs/min, speedup, mean compile time, how busy the GPU was) and
writes JSON to --out.
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

# This checkout's autotune (and its tests' kernels), not another one installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.outcomes import TrialResult  # noqa: E402
from autotune.space.problem import Config, parse_shape  # noqa: E402


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
    p.add_argument(
        "--modes",
        default="sequential,threads,processes",
        help="comma-separated subset of sequential,threads,processes",
    )
    p.add_argument(
        "--compile-threads",
        type=int,
        default=None,
        help="compile threads of the threads mode's single worker (default: the engine's)",
    )
    p.add_argument(
        "--workers-per-gpu",
        default=None,
        help="worker processes of the processes mode, e.g. 8 or 4,8 for a row each "
        "(default: the engine's)",
    )
    p.add_argument(
        "--worker-compile-threads",
        type=int,
        default=None,
        help="compile threads per worker in the processes mode (default: the engine's)",
    )
    p.add_argument("--iterations", type=int, default=None, help="timed iterations per config")
    p.add_argument(
        "--order",
        choices=("sequential-first", "pipelined-first"),
        default="sequential-first",
        help="pipelined-first: the engine modes before the sequential one",
    )
    p.add_argument("--allow-import", action="store_true", help="allow package.module:NAME kernels")
    p.add_argument("--out", default="throughput.json", help="JSON results file")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - {"sequential", "threads", "processes"})
    if unknown or not args.modes:
        p.error(f"--modes: unknown {unknown}; choose from sequential,threads,processes")
    try:
        args.workers_per_gpu = (
            [None]
            if args.workers_per_gpu is None
            else [int(w) for w in str(args.workers_per_gpu).split(",") if w.strip()]
        )
    except ValueError:
        p.error(f"--workers-per-gpu must be whole numbers like 8 or 4,8: {args.workers_per_gpu!r}")
    if any(w is not None and w < 1 for w in args.workers_per_gpu):
        p.error("--workers-per-gpu must be >= 1")
    return args


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

    A config that kills the child (SIGFPE inside XLA, interpreted on a CPU) is recorded as
    crashed and a new child carries on; start-up and warm-up are not counted.
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
    from autotune.evaluation.contract import make_evaluator

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


def run_engine(
    kernel_name: str,
    problem: Any,
    configs: list[Config],
    warmup: Config,
    args: argparse.Namespace,
    *,
    workers_per_gpu: int | None,
    compile_threads: int | None,
) -> dict[str, Any]:
    """The engine over the configs, every worker warmed up first; the clock starts after."""
    from autotune.engine.dispatcher import Engine
    from autotune.engine.tasks import device_busy_s

    started = time.perf_counter()
    with Engine(
        args.device,
        workers_per_gpu=workers_per_gpu,
        compile_threads=compile_threads,
        iterations=args.iterations,
        allow_import=args.allow_import,
    ) as engine:
        device = engine.device_info()
        warm = engine.warm_up(kernel_name, problem, warmup)
        ready_s = time.perf_counter() - started
        start = time.perf_counter()
        futures = [engine.submit(kernel_name, problem, c) for c in configs]
        results = [f.result() for f in futures]
        seconds = time.perf_counter() - start
        stats = engine.stats()
        measured = {f.task_id for f in futures}  # type: ignore[attr-defined]
        busy = device_busy_s(engine.timeline(), measured)  # the GPU's lock held for them
        layout = (engine.workers_per_gpu, engine.compile_threads, engine.parallelism)
    return {
        "seconds": seconds,
        "device": dataclasses.asdict(device),
        "workers_per_gpu": layout[0],
        "compile_threads": layout[1],
        "parallelism": layout[2],
        "startup_and_warmup_s": ready_s,
        "warmup_outcomes": [str(r.outcome) for r in warm],
        "gpu_busy_s": busy,
        "worker_starts": stats.worker_starts,
        "crashes": stats.crashes,
        "timeouts": stats.timeouts,
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

    plan: list[tuple[str, dict[str, Any] | None]] = []  # (row name, engine options)
    for mode in args.modes:
        if mode == "sequential":
            plan.append(("sequential", None))
        elif mode == "threads":
            plan.append(
                ("threads", {"workers_per_gpu": 1, "compile_threads": args.compile_threads})
            )
        else:
            for w in args.workers_per_gpu:
                name = "processes" if len(args.workers_per_gpu) == 1 else f"processes({w})"
                options = {"workers_per_gpu": w, "compile_threads": args.worker_compile_threads}
                plan.append((name, options))
    if args.order == "pipelined-first":
        plan.sort(key=lambda item: item[1] is None)  # stable: engine rows first, then sequential
    else:
        plan.sort(key=lambda item: item[1] is not None)

    modes: dict[str, dict[str, Any]] = {}
    for name, options in plan:
        if options is None:
            modes[name] = run_sequential(configs, warmup, args)
            print(f"  {name}: {modes[name]['seconds']:.1f} s")
        else:
            modes[name] = run_engine(kernel.name, problem, configs, warmup, args, **options)
            m = modes[name]
            print(
                f"  {name}: {m['seconds']:.1f} s ({m['workers_per_gpu']} worker(s) x "
                f"{m['compile_threads']} compile thread(s), {m['parallelism']} in flight; "
                f"start + warm-up {m['startup_and_warmup_s']:.1f} s)"
            )

    names = [name for name, _ in plan]
    names.sort(
        key=lambda n: ("sequential", "threads").index(n) if n in ("sequential", "threads") else 2
    )
    base = modes["sequential"]["seconds"] if "sequential" in modes else None
    header = (
        f"\n{'mode':<14} {'layout':>8} {'configs':>7} {'seconds':>8} {'configs/min':>12} "
        f"{'speedup':>8} {'compile s':>10} {'gpu busy':>9}"
    )
    print(header)
    for name in names:
        m = modes[name]
        m["configs_per_min"] = len(configs) / m["seconds"] * 60
        m["speedup"] = base / m["seconds"] if base else None
        m["outcomes"] = dict(collections.Counter(t["outcome"] for t in m["trials"]))
        compiles = [t["compile_s"] for t in m["trials"] if t["compile_s"] is not None]
        m["mean_compile_s"] = sum(compiles) / len(compiles) if compiles else None
        layout = (
            f"{m['workers_per_gpu']}x{m['compile_threads']}" if "workers_per_gpu" in m else "1x1"
        )
        speedup = f"{m['speedup']:.2f}x" if m["speedup"] else "-"
        mean_compile = f"{m['mean_compile_s']:.2f}" if m["mean_compile_s"] is not None else "-"
        busy = f"{m['gpu_busy_s'] / m['seconds']:.0%}" if "gpu_busy_s" in m else "-"
        print(
            f"{name:<14} {layout:>8} {len(configs):>7} {m['seconds']:>8.1f} "
            f"{m['configs_per_min']:>12.1f} {speedup:>8} {mean_compile:>10} {busy:>9}"
        )
    print(
        "  (layout: worker processes x compile threads each; gpu busy: share of the wall time "
        "some worker held the GPU)"
    )
    for name in names:
        print(f"  {name} outcomes: {modes[name]['outcomes']}")
    disagree: dict[str, list[Any]] = {}
    reference = "sequential" if "sequential" in modes else names[0]
    for name in names:
        if name == reference:
            continue
        differ = [
            (s["config"], s["outcome"], p["outcome"])
            for s, p in zip(modes[reference]["trials"], modes[name]["trials"], strict=True)
            if s["outcome"] != p["outcome"]
        ]
        if differ:
            disagree[name] = differ
            print(
                f"  outcomes differ between {reference} and {name} for {len(differ)} "
                f"configs: {differ[:3]}"
            )
        # Timings must not depend on the mode: the same config's median against the reference
        # mode's (other workers' compiles must not disturb a timing).
        ratios = sorted(
            p["median_us"] / s["median_us"]
            for s, p in zip(modes[reference]["trials"], modes[name]["trials"], strict=True)
            if s["outcome"] == p["outcome"] == "ok" and s["median_us"] and p["median_us"]
        )
        if ratios:
            modes[name]["median_us_ratio_vs_" + reference] = {
                "median": ratios[len(ratios) // 2],
                "min": ratios[0],
                "max": ratios[-1],
            }
            print(
                f"  {name} / {reference} kernel time per config: median {ratios[len(ratios) // 2]:.3f}, "
                f"range {ratios[0]:.3f}-{ratios[-1]:.3f} over {len(ratios)} configs"
            )
    for name in names:
        ok = [
            t for t in modes[name]["trials"] if t["median_us"] is not None and t["outcome"] == "ok"
        ]
        if ok:
            best = min(ok, key=lambda t: t["median_us"])
            print(f"  {name} best: {best['median_us']:.1f} us {best['config']}")

    from autotune._jax_compat import jax_versions

    report = {
        "kernel": kernel.name,
        "problem": problem.key(),
        "device_mode": args.device,
        "seed": args.seed,
        "cpu_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
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

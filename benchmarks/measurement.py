"""Measurements an expert would defend (issue 19): cold vs warm, the confirmation round, and an
independent interleaved re-time, for 4 hopper_matmul bf16 shapes (one with m <= 128) and softmax.

    python3 benchmarks/measurement.py --out $OUT/measurement.json                 # H200, ~3 min
    python3 benchmarks/measurement.py --device interpret --out /tmp/measurement.json  # CPU smoke

Per problem, with the engine of the tuner (worker processes, CUPTI, the L2 flush of
``autotune.evaluation.cold_timing``):

1. **cold vs warm**: an engine per cache policy times the candidates (the kernel's default
   config first, the "winner" unless ``--winner data`` puts the ground-truth best of
   ``autotune/replay/data`` first; then the next best recorded configs and the default's
   neighbours, ``--top`` in all) and the baseline, as a search does (``--iterations`` runs);
2. **the confirmation round** of each policy (``Engine.confirm`` + ``analyse_rounds``):
   ``--rounds`` interleaved rounds of ``--confirm-iterations`` runs per program; its wall time;
3. **an independent re-time** in a fresh engine (new processes and inputs, another moment; the
   same two programs, loaded from the run's compilation cache: compiled again, XLA's autotuning
   may pick another cuBLAS algorithm, 171.7 against 174.0 us at 4096^3 on 2026-12-03): the
   crowned config and the baseline, interleaved, ``--retime-rounds`` rounds; its median
   per-round speedup against the confirmed one. ``--independent N`` repeats it in N fresh
   engines: the range of their speedups is how far the same two programs move from one
   process to the next, which no single confirmation can see.

In interpret mode (CPU; small shapes, wall-clock timing) only ``warm`` exists: there is no L2
to flush. Prints a table and writes every figure to ``--out`` (JSON).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt, parse_problem  # noqa: E402

from autotune.evaluation.clocks import clock_warnings, read_clocks  # noqa: E402
from autotune.replay.ground_truth import fastest_configs  # noqa: E402
from autotune.space.problem import Config, Problem  # noqa: E402
from autotune.tuning.confirmation import (  # noqa: E402
    analyse_rounds,
    sized_iterations,
    timed_rounds,
)

GPU_PROBLEMS = (
    "hopper_matmul:m=4096,n=4096,k=4096:bfloat16",
    "hopper_matmul:m=128,n=8192,k=8192:bfloat16",
    "hopper_matmul:m=8192,n=1024,k=8192:bfloat16",
    "hopper_matmul:m=4096,n=11008,k=4096:bfloat16",
    "softmax:rows=4096,cols=32768:bfloat16",
)
# On the CPU: softmax only by default. hopper_matmul in interpret mode takes seconds per call
# (3.6 s at 256^3), and at 128^3 bf16 jax 0.10.2's interpreter dies with SIGFPE (in LLVM's
# APInt::urem; the engine stores that trial as crashed). Add one with --problem.
CPU_PROBLEMS = ("softmax:rows=64,cols=512:float32",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="gpu", choices=("gpu", "interpret"))
    p.add_argument("--problem", action="append", metavar="KERNEL:SHAPE:DTYPE",
                   help="repeatable; default: 4 matmul shapes and softmax (tiny ones on the CPU)")
    p.add_argument("--winner", default="default", choices=("default", "data"),
                   help="the first candidate: the kernel's default config, or the ground-truth "
                        "best of the recorded ground truth (autotune/replay/data)")
    p.add_argument("--config", action="append", default=[], metavar="KERNEL=JSON",
                   help="use this config as the winner for every problem of KERNEL")
    p.add_argument("--top", type=int, help="configs confirmed per problem (default 5; 2 on CPU)")
    p.add_argument("--iterations", type=int, help="search timing runs (default 20; 2 on CPU)")
    p.add_argument("--rounds", type=int,
                   help="confirmation rounds (default: adaptive, as the tuner's; 2 on CPU)")
    p.add_argument("--confirm-iterations", type=int,
                   help="runs per program per round (default: sized by each program's time, "
                        "as the tuner's confirmation sizes them; 2 on CPU)")
    p.add_argument("--retime-rounds", type=int, help="independent re-time rounds (default 5; 2 on CPU)")
    p.add_argument("--independent", type=int, default=1, metavar="N",
                   help="independent re-times, each in a fresh engine (new processes, inputs and "
                        "moment): with N > 1 the table also shows how far the speedup moves from "
                        "one process to the next (default 1)")
    p.add_argument("--workers-per-gpu", type=int, default=None)
    p.add_argument("--compilation-cache", metavar="DIR",
                   help="JAX's compilation cache shared by every engine of the run, keeping every "
                        "compile (default: a new temporary folder; 'off': none). The independent "
                        "re-time then times the same two programs: XLA's autotuning can pick "
                        "another cuBLAS algorithm when the baseline is compiled again")
    p.add_argument("--out", required=True, help="JSON output path")
    args = p.parse_args(argv)
    if args.compilation_cache is None:
        args.compilation_cache = tempfile.mkdtemp(prefix="measurement-jax-cache-")
    if args.compilation_cache == "off":
        args.compilation_cache = None
    else:
        # Every compile is kept (JAX keeps only those over 1 s by default): the workers, started
        # after this, inherit it.
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    cpu = args.device == "interpret"
    for name, gpu_default, cpu_default in (("top", 5, 2), ("iterations", 20, 2), ("rounds", None, 2),
                                           ("confirm_iterations", None, 2),
                                           ("retime_rounds", 5, 2), ("independent", 1, 1)):
        if getattr(args, name) is None:
            setattr(args, name, cpu_default if cpu else gpu_default)
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    args.problem = args.problem or list(CPU_PROBLEMS if cpu else GPU_PROBLEMS)
    return args


def candidates(kernel: Any, problem: Problem, args: argparse.Namespace) -> list[Config]:
    """The winner first, then the next best recorded configs and the winner's neighbours."""
    space = kernel.valid_space(problem, interpret=args.device == "interpret")
    given = dict(c.split("=", 1) for c in args.config)
    # The H200's recorded ground truth (autotune/replay/data), fastest first.
    recorded = [Config(c) for c in fastest_configs("NVIDIA H200", problem.kernel, problem.dims,
                                                     problem.dtype) if space.is_valid(Config(c))]
    if kernel.name in given:
        winner = Config(json.loads(given[kernel.name]))
    elif args.winner == "data" and recorded:
        winner = recorded[0]
    elif kernel.default_config is not None:
        winner = space.closest_valid(kernel.default_config(problem))
    else:
        winner = space.sample(1, seed=0)[0]
    out = [winner]
    for c in [*recorded[:args.top], *space.neighbours(winner), *space.sample(args.top, seed=0)]:
        if len(out) >= args.top:
            break
        if all(c.digest() != o.digest() for o in out):
            out.append(c)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _time_rounds(engine: Any, kernel: Any, problem: Problem, ok: list[tuple[Config, Any]],
                 counts: list[int], rounds: int, first: int) -> list[list[Any]]:
    """``rounds`` rounds of the confirmation of the configs ``ok`` and the baseline."""
    return engine.confirm(kernel.name, problem, [c for c, _ in ok], rounds=rounds,
                          first_round=first, iterations=counts,
                          medians_us=[r.median_us for _, r in ok])


def _analyse(ok: list[tuple[Config, Any]], default: Any, table: list[list[Any]]) -> Any:
    """The confirmation of ``table`` (None when every config or the baseline failed in it)."""
    analysed = analyse_rounds(table, [c for c, _ in ok], search_us=[r.median_us for _, r in ok],
                              baseline=True, default_config=default)
    return analysed.confirmation if analysed.base_rounds is not None else None


def measure_policy(args: argparse.Namespace, policy: str, problems: list[tuple[Any, Problem]],
                   ) -> dict[str, Any]:
    """Search timings, baseline and confirmation round of every problem under ``policy``."""
    from autotune.engine.dispatcher import Engine

    out: dict[str, Any] = {}
    with Engine(args.device, cache=policy, iterations=args.iterations,
                workers_per_gpu=args.workers_per_gpu,
                compilation_cache=args.compilation_cache) as engine:
        for kernel, problem in problems:
            configs = candidates(kernel, problem, args)
            t0 = time.monotonic()
            futures = [engine.submit(kernel.name, problem, c) for c in configs]
            results = [f.result() for f in futures]
            baseline = engine.baseline(kernel.name, problem)
            search_s = time.monotonic() - t0
            ok = [(c, r) for c, r in zip(configs, results, strict=True) if r.ok]
            entry: dict[str, Any] = {
                "candidates": [dict(c) for c in configs],
                "search": [{"config": dict(c), "outcome": r.outcome.value,
                            "median_us": r.median_us, "spread": r.spread,
                            "error": r.error[-300:]} for c, r in zip(configs, results, strict=True)],
                "winner_us": results[0].median_us if results[0].ok else None,
                "winner_spread": results[0].spread if results[0].ok else None,
                "baseline_us": baseline.median_us if baseline.ok else None,
                "baseline_spread": baseline.spread if baseline.ok else None,
                "search_s": search_s,
            }
            if ok and baseline.ok:
                ok.sort(key=lambda cr: cr[1].median_us)
                t0 = time.monotonic()
                counts = [sized_iterations(r.median_us, args.confirm_iterations) for _, r in ok]
                counts.append(sized_iterations(baseline.median_us, args.confirm_iterations))
                entry["confirm_iterations"] = counts
                default = kernel.default_config(problem) if kernel.default_config else None
                # As the tuner does (confirming.confirm_best): --rounds, or adaptive rounds.
                table = timed_rounds(
                    functools.partial(_time_rounds, engine, kernel, problem, ok, counts),
                    functools.partial(_analyse, ok, default), args.rounds)
                conf = _analyse(ok, default, table)
                confirm_s = time.monotonic() - t0
                if conf is not None:
                    entry["confirmation"] = {
                        "rounds": len(table),
                        "seconds": confirm_s,
                        "crowned": dict(conf.winner.config or {}),
                        "crowned_is_winner": Config(conf.winner.config or {}).digest()
                        == configs[0].digest(),
                        "crowned_us": conf.winner.median_us,
                        "fastest": dict(conf.configs[conf.fastest].config or {}),
                        "speedup": conf.speedup,
                        "speedup_spread": conf.speedup_spread,
                        "speedup_low": conf.speedup_low,
                        "speedup_high": conf.speedup_high,
                        "baseline_us": conf.baseline.median_us if conf.baseline else None,
                        "ties": sum(p.tie for p in conf.configs),
                        "programs": [{"config": dict(p.config or {}), "median_us": p.median_us,
                                      "search_us": p.search_us, "spread": p.spread,
                                      "diff": p.diff, "noise": p.noise, "tie": p.tie,
                                      "crowned": p.crowned} for p in conf.configs],
                    }
            out[str(problem)] = entry
            print(f"[{policy}] {problem}: winner {entry['winner_us']} us, baseline "
                  f"{entry['baseline_us']} us, confirmed "
                  f"{(entry.get('confirmation') or {}).get('speedup')}", flush=True)
    return out


def independent_retime(args: argparse.Namespace, policy: str, problems: list[tuple[Any, Problem]],
                       crowned: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """In a fresh engine: the crowned config and the baseline, interleaved rounds."""
    from autotune.engine.dispatcher import Engine

    out: dict[str, Any] = {}
    with Engine(args.device, cache=policy, iterations=args.iterations,
                workers_per_gpu=1, compilation_cache=args.compilation_cache) as engine:
        for kernel, problem in problems:
            config = crowned.get(str(problem))
            if config is None:
                continue
            first = engine.submit(kernel.name, problem, Config(config)).result()  # compile, check
            if not first.ok:
                out[str(problem)] = {"error": first.error[-300:]}
                continue
            base_first = engine.baseline(kernel.name, problem)
            base_first_us = base_first.median_us if base_first.ok else None
            ratios, kernel_us, base_us = [], [], []
            for _ in range(args.retime_rounds):
                k = engine.retime(kernel.name, problem, Config(config),
                                  iterations=sized_iterations(first.median_us,
                                                              args.confirm_iterations))
                b = engine.retime(kernel.name, problem, None,
                                  iterations=sized_iterations(base_first_us,
                                                              args.confirm_iterations))
                if not (k.ok and b.ok):
                    break
                kernel_us.append(k.median_us)
                base_us.append(b.median_us)
                ratios.append(b.median_us / k.median_us)
            out[str(problem)] = {
                "rounds": len(ratios), "speedup": _median(ratios),
                "speedup_low": min(ratios, default=None), "speedup_high": max(ratios, default=None),
                "kernel_us": _median(kernel_us), "baseline_us": _median(base_us),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problems = [parse_problem(text) for text in args.problem]
    policies = ["warm"] if args.device == "interpret" else ["cold", "warm"]
    started = time.monotonic()
    clocks_before = read_clocks(0) if args.device == "gpu" else None
    by_policy = {p: measure_policy(args, p, problems) for p in policies}
    main_policy = policies[0]
    crowned = {k: v["confirmation"]["crowned"] for k, v in by_policy[main_policy].items()
               if v.get("confirmation")}
    repeats = [independent_retime(args, main_policy, problems, crowned)
               for _ in range(args.independent)]
    independent = repeats[0]
    clocks_after = read_clocks(0) if args.device == "gpu" else None
    total_s = time.monotonic() - started

    header = ["problem", "winner cold us", "winner warm us", "cold/warm", "base cold us",
              "base warm us", "cold/warm", "confirmed speedup", "ties", "crowned", "independent",
              "agree", "confirm s", "range over engines", "median of engines vs confirmed"]
    rows = []
    summary = []
    for _, problem in problems:
        key = str(problem)
        cold = by_policy.get("cold", {}).get(key, {})
        warm = by_policy.get("warm", {}).get(key, {})
        conf = by_policy[main_policy][key].get("confirmation") or {}
        ind = independent.get(key) or {}
        agree = None
        if conf.get("speedup") and ind.get("speedup"):
            agree = ind["speedup"] / conf["speedup"] - 1
        # Each fresh engine's speedup: how much the same two programs move between processes.
        each = [r[key]["speedup"] for r in repeats if (r.get(key) or {}).get("speedup")]
        across = (max(each) / min(each) - 1) if len(each) > 1 else None
        wc, ww = cold.get("winner_us"), warm.get("winner_us")
        bc, bw = cold.get("baseline_us"), warm.get("baseline_us")
        rows.append([
            key, fmt(wc, ".1f"), fmt(ww, ".1f"), fmt(wc / ww if wc and ww else None, ".3f"),
            fmt(bc, ".1f"), fmt(bw, ".1f"), fmt(bc / bw if bc and bw else None, ".3f"),
            "-" if conf.get("speedup") is None else
            f"{conf['speedup']:.4f} ±{100 * (conf.get('speedup_spread') or 0):.2f}%",
            str(conf.get("ties", "-")),
            "-" if not conf else ("winner" if conf.get("crowned_is_winner") else "other"),
            fmt(ind.get("speedup"), ".4f"),
            "-" if agree is None else f"{100 * agree:+.2f}%",
            fmt(conf.get("seconds"), ".2f"),
            "-" if across is None else f"{100 * across:.2f}%",
            "-" if not each or not conf.get("speedup") else
            f"{100 * (statistics.median(each) / conf['speedup'] - 1):+.2f}%",
        ])
        summary.append({"problem": key, "agreement": agree, "independent_speedups": each,
                        "across_processes": across})
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    agreements = [abs(s["agreement"]) for s in summary if s["agreement"] is not None]
    if agreements:
        print(f"\nconfirmed vs independent speedup: max |difference| {100 * max(agreements):.2f}% "
              f"over {len(agreements)} problem(s) (goal: within 0.5%)")
    warnings = []
    if clocks_before is not None and clocks_after is not None:
        warnings = clock_warnings(clocks_before, clocks_after)
        print(f"clocks: before {clocks_before.to_dict()}\n        after  {clocks_after.to_dict()}")
        for w in warnings:
            print(f"WARNING: {w}")
    print(f"total {total_s:.1f} s")
    doc = {
        "device": args.device, "policies": policies, "args": vars(args), "total_s": total_s,
        "by_policy": by_policy, "independent": independent, "independent_repeats": repeats,
        "summary": summary,
        "clocks_before": None if clocks_before is None else clocks_before.to_dict(),
        "clocks_after": None if clocks_after is None else clocks_after.to_dict(),
        "clock_warnings": warnings,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Replay samplers over recorded ground truth: trials needed to get near the best (CPU only).

    python3 benchmarks/search_efficiency.py [--device NAME] [--kernel K] [--problems N,...]
        [FILES] [--seeds 10] [--budget 64] [--samplers auto,ranked,oracle] [--modes cold,warm]
        [--noise SD] [--patience P,...] [--json OUT] [--save-reference PATH]
        [--live-truth DB,...] [--family T1,T2,...]
    python3 benchmarks/search_efficiency.py --live DB [--job examples/unseen_shapes.toml]
    python3 benchmarks/search_efficiency.py --store-ground-truth DB [--device NAME] [--kernel K]

The command line over :mod:`autotune.replay.runner`. Ground truth: the package's recorded
problems (:func:`autotune.replay.ground_truth.load_ground_truth`, ``autotune/replay/data``; pick
them with ``--device``, ``--kernel`` and ``--problems``), or per-shape files written by
``benchmarks/ground_truth.py`` and not packed yet (``FILES``). The table gives, per problem, mode
(cold: nothing else known; warm: leave-one-out, every other recorded problem of the kernel and
device stored) and sampler, the trials needed to get within 1%, 0.5% and 2% of the best
recorded time (median and 90th percentile over seeds) and the first proposal's gap to the best.
``--with-default`` adds today's tuner (``auto`` with the known-good default first, cold).

Sampler specs: ``auto``, ``ranked``, with options after ``+``: ``auto+local=0.3``,
``ranked+model=numpy``, ``ranked+explore=0.2+local=0.5+kappa=1+candidates=512``; ``oracle``
measures the recorded configs fastest first (no search does better).

``--noise SD`` replays with measurement noise (a seeded log-normal factor of relative standard
deviation SD on each recorded time; the thresholds still count true times) and adds the trial
whose *measurement* was the fastest, as ``--live`` reports for a live job. ``--live-truth
DB,...`` adds the configs live jobs measured to each problem as extra truth (reachable, never
drawn into the pool), ``--family T1,T2,...`` every valid config of a recorded family, timed as
its nearest recorded ones: docs/ranked_sampler.md ("The replay") says why.

``--live DB`` reads a live job's results instead: for each problem in the database (or in
``--job``), the trial index at which its final best was first reached, the trial that first
measured its served best (the confirmation round's winner), and at which it was first within
0.5% and 1% of the final best. ``--store-ground-truth DB`` writes the ground truth into a
database first, so a live job over other shapes starts warm (``examples/unseen_shapes.toml``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from autotune.errors import StorageError  # noqa: E402
from autotune.replay.ground_truth import load_ground_truth, read_problem_file  # noqa: E402
from autotune.replay.runner import (  # noqa: E402
    MODES,
    SAMPLERS,
    THRESHOLDS,
    ReplayError,
    add_live_truth,
    live_rows,
    parse_sampler,
    run,
)
from autotune.tuning.samplers.ranked import model_backend  # noqa: E402


def problems_from(files: Sequence[str], device: str | None = None, kernel: str | None = None,
                  names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The per-shape files given, else the packaged ground truth of ``device`` and ``kernel``
    (None: all), only ``names`` when given (each must exist)."""
    if files:
        try:
            return [{**read_problem_file(p), "name": Path(p).name.removesuffix(".json")}
                    for p in files]
        except ValueError as e:
            raise SystemExit(str(e)) from None
    problems = load_ground_truth(device, kernel)
    if names:
        unknown = sorted(set(names) - {p["name"] for p in problems})
        if unknown:
            raise SystemExit(f"--problems: no recorded problem named {', '.join(unknown)}; the "
                             f"names are {', '.join(sorted({p['name'] for p in problems}))}")
        problems = [p for p in problems if p["name"] in names]
    if not problems:
        raise SystemExit(f"no ground truth recorded for device {device!r}, kernel {kernel!r} "
                         "(autotune/replay/data); run benchmarks/ground_truth.py on a GPU first")
    return problems


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


def reference(rows: Sequence[Mapping[str, Any]], problems: Sequence[Mapping[str, Any]],
              args: Any) -> dict[str, Any]:
    """Median trials to each threshold, keyed by problem, mode and sampler, with the settings."""
    return {
        "device": problems[0].get("device", ""),
        "problems": [p["name"] for p in problems],
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


def print_live(rows: Sequence[Mapping[str, Any]]) -> None:
    print("| problem | device | trials | best (us) | first trial (us) | final best first reached "
          "at trial | served best first measured at trial | within 0.5% at trial | within 1% at trial |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        best = "-" if r["best_us"] is None else f"{r['best_us']:.1f}"
        first = "-" if r["first_us"] is None else f"{r['first_us']:.1f}"
        served = "-" if r["served_at"] is None else (
            f"{r['served_at']}{' (confirmed)' if r['served_confirmed'] else ''}")
        print(f"| {r['problem']} | {r['device']} | {r['trials']} | {best} | {first} | {r['best_at'] or '-'} "
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="per-shape ground-truth files not packed yet (default: "
                    "the package's recorded problems)")
    ap.add_argument("--device", help="only this device's problems (e.g. 'NVIDIA H200')")
    ap.add_argument("--kernel", help="only this kernel's problems")
    ap.add_argument("--problems", default="", help="comma-separated problem names "
                    "(hopper_matmul__k4096_m4096_n4096__bfloat16)")
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
    args = ap.parse_args(argv)
    if args.live:
        print_live(live_rows(args.live, args.job))
        return
    problems = problems_from(args.files, args.device, args.kernel,
                             [n for n in args.problems.split(",") if n])
    if args.store_ground_truth:
        from autotune.replay.store import store_ground_truth

        n = store_ground_truth(args.store_ground_truth, problems)
        print(f"stored {n} ground-truth trials of {len(problems)} problems in {args.store_ground_truth}")
        if not args.files:  # the packaged files' live results too, as that device's store has them
            from autotune.replay.store import store_live_results

            print(f"stored {store_live_results(args.store_ground_truth, problems)} trials of live "
                  "jobs of problems without ground truth")
        return
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    samplers = args.samplers.split(",")
    try:
        for spec in samplers:
            if spec != "oracle":
                parse_sampler(spec)
    except ReplayError as e:
        raise SystemExit(str(e)) from None
    if not 0.0 <= args.noise < 1.0:
        raise SystemExit(f"--noise is a relative standard deviation between 0 and 1, got {args.noise}")
    patience = [int(p) for p in args.patience.split(",") if p]
    live_truth = [d for d in args.live_truth.split(",") if d]
    missing = [d for d in live_truth if "://" not in d and not Path(d).is_file()]
    if missing:
        raise SystemExit(f"--live-truth: no database file at {', '.join(missing)}")
    if live_truth:
        problems = [dict(p, results=list(p["results"])) for p in problems]
        try:
            for p in problems:
                print(f"{p['name']}: {add_live_truth(p, live_truth)} configs measured live added")
        except StorageError as e:
            raise SystemExit(f"--live-truth: {e}") from None
    family = [n for n in args.family.split(",") if n]
    started = time.monotonic()
    rows = run(problems, seeds=args.seeds, budget=args.budget, samplers=samplers,
               modes=args.modes.split(","), patience=patience, noise=args.noise, family=family)
    if args.with_default:
        rows += run(problems, seeds=args.seeds, budget=args.budget, samplers=["auto+default"],
                    modes=["cold"], patience=patience)
    print(f"{len(problems)} problems, {args.seeds} seeds, budget {args.budget} trials, "
          f"{time.monotonic() - started:.0f} s")
    print()
    print_table(rows, args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.save_reference:
        Path(args.save_reference).write_text(json.dumps(reference(rows, problems, args), indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Replay samplers over recorded ground truth: trials needed to get near the best (CPU only).

    python3 benchmarks/search_efficiency.py [--device NAME] [--kernel K] [FILES] [--seeds 10] ...
    python3 benchmarks/search_efficiency.py --live DB[,DB...] [--job examples/unseen_shapes.toml]

The command line over :mod:`autotune.replay.runner`, on the package's recorded problems
(``autotune/replay/data``; ``--device``, ``--kernel``, ``--problems``) or ground_truth.py's
files (``FILES``). Per problem, mode (cold; warm: every other recorded problem of the kernel and
device stored) and sampler: the trials to within 1%, 0.5% and 2% of the best recorded time
(median, p90 over seeds) and the first proposal's gap. ``--with-default``: today's tuner.

Sampler specs: ``auto``, ``ranked``, options after ``+`` (``ranked+explore=0.2``);
``oracle`` measures the recorded configs fastest first.

``--noise SD``: each recorded time times a seeded log-normal factor (thresholds count true
times), and the trial whose *measurement* was the fastest; ``--confirm TOP,BAND,MOST``: each
study's confirmation round too. ``--live-truth DB,...``: live jobs'
configs as extra truth (reachable, never drawn); ``--family T1,...``: every valid config of a
recorded family, timed as its nearest recorded ones (docs/ranked_sampler.md); ``--in-flight K``:
K trials asked before the first result, as a live job compiles ahead.

``--live DB,...``: live jobs instead (per problem of ``--job``: trials to the final and served
best, to 0.5% and 1% of it, in flight at an ask; by the ground truth, the first trial's gap and
first within 1%). ``--store-ground-truth DB`` stores the ground truth (a job there is warm).
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
    ConfirmRule,
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
    (None: all), only ``names`` when given (each must exist: else ReplayError)."""
    if files:
        try:
            return [{**read_problem_file(p), "name": Path(p).name.removesuffix(".json")}
                    for p in files]
        except ValueError as e:
            raise ReplayError(str(e)) from None
    problems = load_ground_truth(device, kernel)
    if names:
        unknown = sorted(set(names) - {p["name"] for p in problems})
        if unknown:
            raise ReplayError(f"--problems: no recorded problem named {', '.join(unknown)}; the "
                              f"names are {', '.join(sorted({p['name'] for p in problems}))}")
        problems = [p for p in problems if p["name"] in names]
    if not problems:
        raise ReplayError(f"no ground truth recorded for device {device!r}, kernel {kernel!r} "
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
    """Per live problem, trial indices (1-based, in measuring order): the final best, the served
    best, the first within 0.5% and 1% of it; then the ground truth's scores."""
    print("| problem | device | trials | best (us) | first trial (us) | final best at | served best at "
          "| within 0.5% at | within 1% at |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        best = "-" if r["best_us"] is None else f"{r['best_us']:.1f}"
        first = "-" if r["first_us"] is None else f"{r['first_us']:.1f}"
        served = "-" if r["served_at"] is None else (
            f"{r['served_at']}{' (confirmed)' if r['served_confirmed'] else ''}")
        print(f"| {r['problem']} | {r['device']} | {r['trials']} | {best} | {first} | {r['best_at'] or '-'} "
              f"| {served} | {r['within_half_pct_at'] or '-'} | {r['within_1pct_at'] or '-'} |")
    truth = [r for r in rows if "truth_best_us" in r]
    if truth:
        print("\n| problem | device | trials recorded | first trial's gap | within 1% at |\n|---|---|---|---|---|")
        for r in truth:
            gap = "-" if r["truth_first_gap"] is None else f"{r['truth_first_gap']:.1%}"
            print(f"| {r['problem']} | {r['device']} | {r['truth_known']}/{r['trials']} | {gap} | "
                  f"{r['truth_within_1pct_at'] or '-'} |")
    for key, what in (("best_at", "trial index of the final best"), ("served_at", "trial index of the "
                      "served best"), ("within_half_pct_at", "trial index of the first within 0.5% of it"),
                      ("in_flight", "trials in flight at an ask (--in-flight)")):
        at = [r[key] for r in rows if r[key] is not None]
        if at:
            print(f"median {what}: {statistics.median(at):g} over {len(at)} problems")


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
                    help="relative standard deviation of each replayed measurement (live: ~0.01)")
    ap.add_argument("--confirm", action="append", default=[], help="5,0.005,3: today's rule")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--save-reference", metavar="PATH",
                    help="write the CI regression test's reference (settings, median trials)")
    ap.add_argument("--live-truth", metavar="DB,...", default="")
    ap.add_argument("--family", metavar="TUNABLE,...", default="")  # these four: the docstring
    ap.add_argument("--in-flight", type=int, default=1, metavar="K")
    ap.add_argument("--live", metavar="DB,...")
    ap.add_argument("--job", help="with --live: only this job file's problems")
    ap.add_argument("--store-ground-truth", metavar="DB",
                    help="store the ground truth in DB (a live job there starts warm); then exit")
    args = ap.parse_args(argv)
    if args.live:
        print_live([r for db in args.live.split(",") for r in live_rows(db, args.job)])
        return
    try:
        problems = problems_from(args.files, args.device, args.kernel,
                                 [n for n in args.problems.split(",") if n])
    except ReplayError as e:
        ap.error(str(e))
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
        rules = [ConfirmRule.parse(r) for r in args.confirm]
    except ReplayError as e:
        ap.error(str(e))
    if args.in_flight < 1:
        ap.error(f"--in-flight is the trials asked ahead: at least 1, got {args.in_flight}")
    if not 0.0 <= args.noise < 1.0:
        ap.error(f"--noise is a relative standard deviation between 0 and 1, got {args.noise}")
    patience = [int(p) for p in args.patience.split(",") if p]
    live_truth = [d for d in args.live_truth.split(",") if d]
    missing = [d for d in live_truth if "://" not in d and not Path(d).is_file()]
    if missing:
        ap.error(f"--live-truth: no database file at {', '.join(missing)}")
    if live_truth:
        problems = [dict(p, results=list(p["results"])) for p in problems]
        try:
            for p in problems:
                print(f"{p['name']}: {add_live_truth(p, live_truth)} configs measured live added")
        except StorageError as e:
            ap.error(f"--live-truth: {e}")
    family = [n for n in args.family.split(",") if n]
    started = time.monotonic()
    rows = run(problems, seeds=args.seeds, budget=args.budget, samplers=samplers,
               modes=args.modes.split(","), patience=patience, noise=args.noise, family=family,
               in_flight=args.in_flight, confirm=rules)
    if args.with_default:
        rows += run(problems, seeds=args.seeds, budget=args.budget, samplers=["auto+default"],
                    modes=["cold"], patience=patience)
    print(f"{len(problems)} problems, {args.seeds} seeds, budget {args.budget} trials, "
          f"{time.monotonic() - started:.0f} s")
    print()
    print_table(rows, args.budget)
    for row in rows:
        for rule, c in row.get("confirmed", {}).items():
            print(f"confirmed {rule}, {row['problem']}, {row['sampler']}: {c}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.save_reference:
        Path(args.save_reference).write_text(json.dumps(reference(rows, problems, args), indent=1) + "\n")


if __name__ == "__main__":
    main()

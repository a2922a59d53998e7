"""The vendor's matmul heuristics as a prior, and warm starts across devices, over the recorded
ground truth (CPU only).

    python3 benchmarks/vendor_prior.py [--seeds 10] [--budget 48] [--top 4] [--target CUTLASS3]
        [--parts vendor,cross] [--json OUT]

Ground truth: each device's ``hopper_matmul`` problems (``load_ground_truth``), each replayed
with that device's profile (the cost model's device).

Part ``vendor`` (``pip install nvidia-matmul-heuristics``): per problem, the gap of the vendor's
first choices (by their nearest recorded config, ``d`` tunables away) and of the first recorded
config by its estimate and the kernel's cost model; the ranked sampler cold against it with the
vendor's first ``--top`` first (``vendor seeds``), in its pool or its estimate as the model.

Part ``cross`` (benchmarks/RESULTS.md §20): each H100 problem with only H200 results stored
(:func:`cross_part`) against cold: the first proposal's gap (goal: within 3% of the best on 4
of 5 shapes) and trials to 1%. Then the other way round as a check.

Figures and what they say: ``docs/vendor_prior.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optuna  # noqa: E402

from autotune.devices import profile_for_name, using_profile  # noqa: E402
from autotune.replay.ground_truth import load_ground_truth, load_live  # noqa: E402
from autotune.replay.runner import Recorded, pct, replay_study, trials_to  # noqa: E402
from autotune.space.problem import Config  # noqa: E402
from autotune.tuning.samplers.ranked import Observation  # noqa: E402

KERNEL = "hopper_matmul"
H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
THRESHOLD = 0.01
CROSS_GOAL = 0.03
VARIANTS = ("ranked", "vendor_seeds", "vendor_pool", "vendor_model")


def records(device: str) -> list[Recorded]:
    """The device's recorded ``hopper_matmul`` problems (the package's ground truth)."""
    with using_profile(profile_for_name(device)):
        return [Recorded(d) for d in load_ground_truth(device, KERNEL)]


def replay(rec: Recorded, seed: int, budget: int, *, seeds: Sequence[Mapping[str, Any]] = (),
           history: Sequence[Observation] = (), related: Sequence[Mapping[str, Any]] = (),
           estimate: Callable[..., float] | None = None) -> list[float]:
    """The best recorded time after each trial of the ranked sampler, as the tuner builds it,
    over the recorded configs only (:func:`autotune.replay.runner.replay_study`)."""
    return replay_study(rec, "ranked", seed, budget, seeds=seeds, related=related, history=history,
                        estimate=estimate if estimate is not None else rec.kernel.cost_model).curve


def summarise(rec: Recorded, curves: Sequence[Sequence[float]], budget: int) -> dict[str, Any]:
    needed = [trials_to(c, rec.best * (1 + THRESHOLD), budget) for c in curves]
    gaps = [c[0] / rec.best - 1 for c in curves if c]
    return {"within_1pct": (statistics.median(needed), pct(needed, 0.9)),
            "first_gap": statistics.median(gaps)}


def fmt_trials(v: tuple[float, float], budget: int) -> str:
    return " / ".join(f">{budget}" if x > budget else f"{x:g}" for x in v)


# Part "vendor".


def _gap(rec: Recorded, config: Mapping[str, Any]) -> float | None:
    t = rec.times.get(Config(config).digest())
    return None if t is None else t / rec.best - 1


def _nearest_recorded(rec: Recorded, config: Mapping[str, Any]) -> tuple[Config | None, int]:
    """The recorded config nearest to ``config`` and how many tunables it differs in."""
    found = rec.bound.nearest(config)
    if found is None:
        return None, len(config)
    return found, sum(found[name] != config[name] for name in rec.full.names)


def _first_by(rec: Recorded, estimate: Callable[..., float]) -> tuple[float, int]:
    """The gap of the recorded config an estimate ranks first (median of those tied within 0.1%)
    and how many tie."""
    ok = [Config(r["config"]) for r in rec.data["results"] if r["status"] == "ok"]
    scored = sorted(((estimate(rec.problem, c), i) for i, c in enumerate(ok)), key=lambda p: p[0])
    scored = [(s, i) for s, i in scored if s > 0]
    top = scored[0][0]
    tied = [ok[i] for s, i in scored if s <= top * 1.001]
    return statistics.median(_gap(rec, c) for c in tied), len(tied)


def vendor_part(recs: Sequence[Recorded], *, seeds: int, budget: int, top: int,
                target: str) -> list[dict[str, Any]]:
    from vendor_heuristics import VendorModel

    rows = []
    for rec in recs:
        with using_profile(profile_for_name(rec.device)) as device:
            model = VendorModel(device, target=target)
            ranked = [c for c, _ in model.ranked(rec.full, top)][:top]
            nearest = [_nearest_recorded(rec, c) for c in ranked]
            first, first_d = nearest[0]
            vendor_first = _first_by(rec, model.cost_model())
            own_first = _first_by(rec, rec.kernel.cost_model)
            base = [replay(rec, s, budget) for s in range(seeds)]
            seeded = [replay(rec, s, budget, seeds=ranked) for s in range(seeds)]
            pooled = [replay(rec, s, budget, related=ranked) for s in range(seeds)]
            modelled = [replay(rec, s, budget, estimate=model.cost_model()) for s in range(seeds)]
        rows.append({
            "problem": rec.name, "device": rec.device, "best_us": rec.best,
            "vendor_first": dict(ranked[0]), "vendor_first_exact": _gap(rec, ranked[0]) is not None,
            "vendor_first_gap": _gap(rec, first) if first else None, "vendor_first_distance": first_d,
            "vendor_top_gap": min(_gap(rec, c) for c, _ in nearest if c is not None),
            "vendor_estimate_first_gap": vendor_first[0], "vendor_estimate_ties": vendor_first[1],
            "own_estimate_first_gap": own_first[0], "own_estimate_ties": own_first[1],
            "ranked": summarise(rec, base, budget),
            "vendor_seeds": summarise(rec, seeded, budget),
            "vendor_pool": summarise(rec, pooled, budget),
            "vendor_model": summarise(rec, modelled, budget),
        })
    return rows


def print_vendor(rows: Sequence[Mapping[str, Any]], budget: int, top: int) -> None:
    print(f"First choices: gap to the best recorded time (vendor: its configuration's nearest "
          f"recorded config, d = tunables that differ; top {top}: the best of its first {top})")
    print()
    print(f"| device | problem | vendor first (d) | vendor best of top {top} | vendor estimate's "
          "first recorded (ties) | own cost model's first recorded (ties) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['device']} | {r['problem']} | {r['vendor_first_gap']:.1%} "
              f"({r['vendor_first_distance']:g}) | {r['vendor_top_gap']:.1%} "
              f"| {r['vendor_estimate_first_gap']:.1%} ({r['vendor_estimate_ties']}) "
              f"| {r['own_estimate_first_gap']:.1%} ({r['own_estimate_ties']}) |")
    print()
    print(f"Replay, cold: trials to within 1% of the best (median / p90), first proposal's gap "
          f"(median); vendor seeds = its first {top} configurations proposed first")
    print()
    print("| device | problem | ranked (own cost model) | ranked + vendor seeds | ranked + vendor "
          "pool | ranked, vendor model in place of the cost model |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{fmt_trials(r[k]['within_1pct'], budget)}, {r[k]['first_gap']:.1%}"
                 for k in VARIANTS]
        print(f"| {r['device']} | {r['problem']} | " + " | ".join(cells) + " |")
    print()
    for device in sorted({r["device"] for r in rows}):
        part = [r for r in rows if r["device"] == device]
        for k in VARIANTS:
            m = statistics.median(r[k]["within_1pct"][0] for r in part)
            print(f"- {device}, {k}: median over problems of the median trials to 1%: {m:g}")
    print()


# Part "cross": warm from another device's results only.


def live_observations(stored: Sequence[Recorded]) -> list[Observation]:
    """The stored devices' live results (``load_live``) of problems they have no ground truth
    for, labelled with the device: a store of that device holds them too."""
    out: list[Observation] = []
    for device in sorted({s.device for s in stored}):
        recorded = {s.problem for s in stored if s.device == device}
        kernel = next(s.kernel for s in stored if s.device == device)
        for entry in load_live(device, KERNEL):
            problem = kernel.problem(entry["shape"], entry["dtype"])
            if problem not in recorded:
                out += [Observation(problem, Config(c), t, device=device) for c, t in entry["times"]]
    return out


def cross_part(truth: Sequence[Recorded], stored: Sequence[Recorded], *, seeds: int,
               budget: int) -> list[dict[str, Any]]:
    """Each ``truth`` problem cold, and warm with only ``stored`` (another device's) results, as
    the tuner has them: all of them, and its live results (:func:`live_observations`), as
    history labelled with that device, and its winner of the same shape as a related winner."""
    rows = []
    live = live_observations(stored)
    for rec in truth:
        history = [Observation(o.problem, o.config, o.time_us, device=s.device)
                   for s in stored for o in s.observations()] + live
        here = [o for o in live if o.problem == rec.problem]
        related = [s.winner() for s in stored if s.problem == rec.problem] or [
            min(here, key=lambda o: o.time_us or math.inf).config for _ in here[:1]]
        with using_profile(profile_for_name(rec.device)):
            cold = [replay(rec, s, budget) for s in range(seeds)]
            warm = [replay(rec, s, budget, history=history, related=related) for s in range(seeds)]
            default = rec.kernel.default_config(rec.problem)
            default_near, _ = _nearest_recorded(rec, default)
        other_winner = related[0] if related else None
        rows.append({
            "problem": rec.name, "device": rec.device, "stored": sorted({s.device for s in stored}),
            "cold": summarise(rec, cold, budget), "warm": summarise(rec, warm, budget),

            "other_winner_gap": (_gap(rec, _nearest_recorded(rec, other_winner)[0])
                                 if other_winner else None),
            "known_good_gap": _gap(rec, default_near) if default_near else None,
        })
    return rows


def print_cross(rows: Sequence[Mapping[str, Any]], budget: int) -> None:
    print("Warm from another device only: first proposal's gap (median over seeds) and trials to "
          "within 1% (median / p90)")
    print()
    print("| device | problem | stored | cold: first gap | warm: first gap | cold: to 1% "
          "| warm: to 1% | the other device's winner here | known-good default here |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        other = "-" if r["other_winner_gap"] is None else f"{r['other_winner_gap']:.1%}"
        known = "-" if r["known_good_gap"] is None else f"{r['known_good_gap']:.1%}"
        print(f"| {r['device']} | {r['problem']} | {', '.join(r['stored'])} "
              f"| {r['cold']['first_gap']:.1%} | {r['warm']['first_gap']:.1%} "
              f"| {fmt_trials(r['cold']['within_1pct'], budget)} "
              f"| {fmt_trials(r['warm']['within_1pct'], budget)} | {other} | {known} |")
    for device in sorted({r["device"] for r in rows}):
        part = [r for r in rows if r["device"] == device]
        within = sum(r["warm"]["first_gap"] <= CROSS_GOAL for r in part)
        print()
        print(f"{device}, warm: first proposal within {CROSS_GOAL:.0%} of the best on {within} of "
              f"{len(part)} recorded shapes (goal on the H100: 4 of 5)")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--top", type=int, default=4, help="vendor configurations proposed first")
    ap.add_argument("--target", default="CUTLASS3", help="the vendor's target: CUTLASS3 or GENERIC")
    ap.add_argument("--parts", default="vendor,cross")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - {"vendor", "cross"})
    if unknown:
        raise SystemExit(f"--parts takes vendor and cross, got {', '.join(unknown)}")
    if args.seeds < 1 or args.budget < 1 or args.top < 1:
        raise SystemExit("--seeds, --budget and --top must be positive whole numbers")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    started = time.monotonic()
    h200, h100 = records(H200), records(H100)
    if not h200 or not h100:
        raise SystemExit(f"need {KERNEL} ground truth of both devices in autotune/replay/data "
                         "(benchmarks/ground_truth.py on each GPU)")
    out: dict[str, Any] = {"seeds": args.seeds, "budget": args.budget, "top": args.top,
                           "target": args.target}
    if "vendor" in parts:
        from vendor_heuristics import VendorPriorError, check_installed

        try:
            check_installed()
        except VendorPriorError as error:
            raise SystemExit(f"part vendor: {error}") from None
        out["vendor"] = vendor_part([*h200, *h100], seeds=args.seeds, budget=args.budget,
                                    top=args.top, target=args.target)
        print_vendor(out["vendor"], args.budget, args.top)
    if "cross" in parts:
        # The goal's direction (H100 truth, H200 stored), then the other way as a check.
        out["cross"] = (cross_part(h100, h200, seeds=args.seeds, budget=args.budget)
                        + cross_part(h200, h100, seeds=args.seeds, budget=args.budget))
        print_cross(out["cross"], args.budget)
    print(f"{len(h200)} H200 and {len(h100)} H100 problems, {args.seeds} seeds, budget "
          f"{args.budget}, {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()

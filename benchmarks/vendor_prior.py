"""The vendor's matmul heuristics as a prior, and warm starts across devices, over the recorded
ground truth (CPU only).

    python3 benchmarks/vendor_prior.py [--seeds 10] [--budget 48] [--top 4] [--target CUTLASS3]
        [--parts vendor,cross] [--cross-variants winner,top4,residual,tiebreak] [--json OUT]

Ground truth: each device's ``hopper_matmul`` problems (``autotune/replay/data/<device>/``,
read through ``autotune.replay.ground_truth.load_ground_truth``), each replayed with that device's profile
(its SMs, clock, bandwidth: the cost model's device).

Part ``vendor`` (needs ``pip install nvidia-matmul-heuristics``): per problem, the gap of the
vendor's first choices (each scored by its nearest recorded config, ``d`` tunables away), of the
first recorded config by its estimate and by the kernel's cost model; and the ranked sampler cold
against the same with the vendor's first ``--top`` proposed first (``vendor seeds``), in the pool
(``vendor pool``) or its estimate as the model (``vendor model``).

Part ``cross`` (the goal of benchmarks/RESULTS.md §20): each H100 problem replayed with only H200 results stored, as
the tuner would have them (every H200 result as a prior labelled with its device, its ground
truth and its live jobs' results of other shapes, ``load_live``, and the H200's winner of the
same shape as a related winner), against cold: the first proposal's gap
(goal: within 3% of the best on 4 of 5 shapes) and trials to within 1%. Then the other way
round (H200 truth, H100 results stored) as a check. ``--cross-variants``: ways of using the
other device's results measured and not kept, each warm plus itself (docs/vendor_prior.md).

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
from autotune.replay.ground_truth import load_ground_truth, load_live, recorded_us  # noqa: E402
from autotune.replay.runner import Recorded, pct, replay_study, trials_to  # noqa: E402
from autotune.space.problem import Config  # noqa: E402
from autotune.tuning.samplers.ranked import Observation  # noqa: E402

KERNEL = "hopper_matmul"
H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
THRESHOLD = 0.01
CROSS_GOAL = 0.03
VARIANTS = ("ranked", "vendor_seeds", "vendor_pool", "vendor_model")
CROSS_VARIANTS = ("winner", "top4", "residual", "tiebreak")
RESIDUAL_WEIGHT = 0.5
TIE_MARGIN = 0.01


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


# ---------------------------------------------------------------------------------------------
# Part "vendor".


def _gap(rec: Recorded, config: Mapping[str, Any]) -> float | None:
    t = rec.times.get(Config(config).digest())
    return None if t is None else t / rec.best - 1


def _nearest_recorded(rec: Recorded, config: Mapping[str, Any]) -> tuple[Config | None, int]:
    """The recorded config nearest to ``config`` (the space's own closeness) and how many
    tunables it differs in."""
    found = rec.bound.nearest(config)
    if found is None:
        return None, len(config)
    return found, sum(found[name] != config[name] for name in rec.full.names)


def _first_by(rec: Recorded, estimate: Callable[..., float]) -> tuple[float, int]:
    """The gap of the recorded config an estimate ranks first (the median over configs tied
    within 0.1% at the top) and how many tie."""
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


# ---------------------------------------------------------------------------------------------
# Part "cross": warm from another device's results only.


def _residual_model(rec: Recorded, stored: Sequence[Recorded]) -> dict[str, float]:
    """A tree model of the stored devices' cost-model residuals (log time less log estimate,
    centred per problem) on the ranked sampler's features: its prediction per config recorded
    here, by digest (only those can be replayed)."""
    import numpy as np

    from autotune.tuning.samplers.ranked import Features, _make_model, _with_estimate

    def features() -> Features:
        return Features(rec.full.params, sorted(rec.problem.dims),
                        extra=_with_estimate(None, rec.kernel.cost_model))

    xs, ys = [], []
    for s in stored:
        with using_profile(profile_for_name(s.device)):
            ok = [(Config(r["config"]), recorded_us(r)) for r in s.data["results"]
                  if r["status"] == "ok"]
            residual = np.log([t * 1e-6 / rec.kernel.cost_model(s.problem, c) for c, t in ok])
            xs.append(features().matrix(s.problem, [c for c, _ in ok]))
            ys.append(residual - np.median(residual))
    model = _make_model("sklearn", trees=96, seed=0).fit(np.vstack(xs), np.concatenate(ys))
    here = [Config(r["config"]) for r in rec.data["results"]]
    predicted = model.predict(features().matrix(rec.problem, here))[0]
    return {c.digest(): float(p) for c, p in zip(here, predicted, strict=True)}


def _corrected(rec: Recorded, stored: Sequence[Recorded], *,
               margin: float | None) -> Callable[..., float]:
    """The cost model times exp(RESIDUAL_WEIGHT x :func:`_residual_model`) (``margin`` None),
    or that order only among the recorded configs within ``margin`` of the best estimate."""
    residual = _residual_model(rec, stored)
    estimate = rec.kernel.cost_model
    ok = [Config(r["config"]) for r in rec.data["results"] if r["status"] == "ok"]
    lowest = min(estimate(rec.problem, c) for c in ok)
    near = [residual[c.digest()] for c in ok if margin is not None
            and estimate(rec.problem, c) <= lowest * (1 + margin)]
    lo, hi = (min(near), max(near)) if near else (0.0, 0.0)

    def corrected(problem: Any, config: Mapping[str, Any]) -> float:
        e = estimate(problem, config)
        r = residual.get(Config(config).digest())
        if r is None:
            return e
        if margin is None:
            return e * math.exp(RESIDUAL_WEIGHT * r)
        if e > lowest * (1 + margin):
            return e
        return lowest * (1 + margin * min(1.0, max(0.0, (r - lo) / (hi - lo or 1.0))))

    return corrected


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
               budget: int, variants: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each ``truth`` problem cold, and warm with only ``stored`` (another device's) results:
    all of them as history labelled with that device, and that device's winner of the same
    shape as a related winner (what ``tuner.related_winners`` gives when this device has
    nothing stored)."""
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
            extra: dict[str, Any] = {}
            same = [s for s in stored if s.problem == rec.problem]
            for v in variants:
                first: list[Mapping[str, Any]] = []
                estimate = None
                if v in ("winner", "top4") and not same:
                    continue  # as warm
                if v == "winner":
                    first = related[:1]
                elif v == "top4":
                    fastest = sorted((r for s in same for r in s.data["results"]
                                      if r["status"] == "ok"), key=recorded_us)[:4]
                    first = sorted((Config(r["config"]) for r in fastest),
                                   key=lambda c: rec.kernel.cost_model(rec.problem, c))
                else:
                    estimate = _corrected(rec, stored,
                                          margin=None if v == "residual" else TIE_MARGIN)
                extra[v] = summarise(rec, [replay(rec, s, budget, seeds=first, history=history,
                                                  related=related, estimate=estimate)
                                           for s in range(seeds)], budget)
        other_winner = related[0] if related else None
        rows.append({
            "problem": rec.name, "device": rec.device, "stored": sorted({s.device for s in stored}),
            "cold": summarise(rec, cold, budget), "warm": summarise(rec, warm, budget),
            **extra,

            "other_winner_gap": (_gap(rec, _nearest_recorded(rec, other_winner)[0])
                                 if other_winner else None),
            "known_good_gap": _gap(rec, default_near) if default_near else None,
        })
    return rows


def print_cross(rows: Sequence[Mapping[str, Any]], budget: int,
                variants: Sequence[str] = ()) -> None:
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
    if variants:
        print("\nWarm plus each variant (first gap, to 1%; '=': as warm)\n")
        print("| device | problem | warm | " + " | ".join(variants) + " |")
        print("|---|---|---|" + "---|" * len(variants))
        for r in rows:
            cells = [f"{r[k]['first_gap']:.1%}, {fmt_trials(r[k]['within_1pct'], budget)}"
                     if k in r else "=" for k in ("warm", *variants)]
            print(f"| {r['device']} | {r['problem']} | " + " | ".join(cells) + " |")
        for device in sorted({r["device"] for r in rows}):
            part = [r for r in rows if r["device"] == device]
            counts = ", ".join(f"{k} {sum(r.get(k, r['warm'])['first_gap'] <= CROSS_GOAL for r in part)}"
                               for k in variants)
            print(f"- {device}: first proposal within {CROSS_GOAL:.0%} on: {counts} of {len(part)}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--top", type=int, default=4, help="vendor configurations proposed first")
    ap.add_argument("--target", default="CUTLASS3", help="the vendor heuristic's target: "
                    "CUTLASS3 (warp-specialized TMA/WGMMA with clusters) or GENERIC")
    ap.add_argument("--parts", default="vendor,cross")
    ap.add_argument("--cross-variants", default="",
                    help=f"part cross: also these, not kept ({', '.join(CROSS_VARIANTS)})")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - {"vendor", "cross"})
    if unknown:
        raise SystemExit(f"--parts takes vendor and cross, got {', '.join(unknown)}")
    variants = [v for v in args.cross_variants.split(",") if v]
    unknown = sorted(set(variants) - set(CROSS_VARIANTS))
    if unknown:
        raise SystemExit(f"--cross-variants takes {', '.join(CROSS_VARIANTS)}, got "
                         f"{', '.join(unknown)}")
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
        out["cross"] = (cross_part(h100, h200, seeds=args.seeds, budget=args.budget,
                                   variants=variants)
                        + cross_part(h200, h100, seeds=args.seeds, budget=args.budget,
                                     variants=variants))
        print_cross(out["cross"], args.budget, variants)
    print(f"{len(h200)} H200 and {len(h100)} H100 problems, {args.seeds} seeds, budget "
          f"{args.budget}, {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()

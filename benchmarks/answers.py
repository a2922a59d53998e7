"""Answers that hold up: the same winner and speedup, run after run, checked by a
second method (benchmarks/RESULTS.md §12).

    python3 benchmarks/answers.py --runs 5 --out $OUT          # a GPU; ~1.5 min a run
    python3 benchmarks/answers.py --runs 1 --device interpret --job J --out /tmp/a   # CPU smoke

1. ``--runs`` fresh default jobs of ``--job`` (default ``benchmarks/answers.toml``), each in
   its own folder and database, then ``autotune verify``: per problem the crowned config, the
   stored and the re-timed speedup, their difference, the round's time, the job's wall and tail
   (its last trial to its last problem done: where the rounds end it);
2. one re-time by the second method of every run's winner, the configs ``verify`` timed
   beside it and the best recorded here (``autotune/replay/data``): each winner's gap to the
   best known; the winners' spread.

``--seconds``: no run starts near it, and none runs past it. ``--out``: a new folder; gets
``answers.json``, ``answers.tgz`` (databases, logs, XLA's picks). ``--recrown``: below.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def autotune(db: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "autotune", "--db", db, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode()
        return subprocess.CompletedProcess(cmd, 124, out, f"stopped after {timeout:.0f} s\n")


def one_run(i: int, args: argparse.Namespace, left: float) -> dict[str, Any]:
    folder = args.out / f"run{i}"
    folder.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{folder / 'answers.db'}"
    start = time.monotonic()
    tune = autotune(db, "tune", str(args.job), "--results-dir", str(folder), "--jsonl",
                    "--device", args.device, timeout=left)
    wall = time.monotonic() - start
    (folder / "tune.jsonl").write_text(tune.stdout)
    (folder / "tune.err").write_text(tune.stderr)
    verified: list[Any] = []
    also: dict[str, list[Any]] = {}
    for n, method in enumerate(args.verify_method):
        verify = autotune(db, "verify", "--device", args.device, "--json", "--method", method,
                          "--compilation-cache", str(folder / "jax_cache"),
                          "--rounds", str(args.rounds), timeout=max(60.0, left - wall))
        (folder / f"verify-{method}.err").write_text(verify.stderr)
        found = json.loads(verify.stdout or "[]") if verify.returncode == 0 else []
        if n == 0:
            verified = found
        else:
            also[method] = found
    results = autotune(db, "results", "--json", timeout=120)
    stored = json.loads(results.stdout or "[]") if results.returncode == 0 else []
    return {"run": i, "tune_rc": tune.returncode, "wall_s": wall, "verify_rc": verify.returncode,
            "verified": verified, "also_verified": also, "stored": stored,
            "confirm_s": confirm_seconds(tune.stdout), "tail_s": tail_seconds(tune.stdout)}


def events(jsonl: str) -> list[dict[str, Any]]:
    found = []
    for line in jsonl.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return [e for e in found if isinstance(e, dict)]


def confirm_seconds(jsonl: str) -> dict[str, float]:
    """Per problem, the confirmation round's seconds from the job's JSON lines, where given."""
    return {f"{e.get('kernel')}{json.dumps(e.get('shape'), sort_keys=True)}": float(e["confirm_s"])
            for e in events(jsonl) if e.get("confirm_s") is not None}


def tail_seconds(jsonl: str) -> float | None:
    """From the job's last trial to its last problem done (None in a job cut short)."""
    found = events(jsonl)

    def last(kind: str) -> float:
        return max((dt.datetime.fromisoformat(e["time"]).timestamp() for e in found
                    if e.get("event") == kind), default=math.nan)
    tail = last("done") - last("trial")
    return None if math.isnan(tail) or tail < 0 else tail


def side_by_side(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run's winner per problem, and the recorded best, re-timed together (step 2)."""
    from autotune.evaluation.independent import CUPTI_METHOD, METHOD, make_timer, time_configs
    from autotune.replay.ground_truth import fastest_configs
    from autotune.space.kernel import get_kernel
    from autotune.space.problem import Config

    by_problem: dict[tuple, dict[str, Any]] = {}
    for run in runs:
        for v in run["verified"]:
            key = (v["kernel"], json.dumps(v["shape"], sort_keys=True), v["dtype"])
            entry = by_problem.setdefault(key, {"winners": {}, "next": []})
            entry["winners"][run["run"]] = Config(v["config"])
            entry["next"] += [Config(o["config"]) for o in v.get("others", ())]
    device = device_name()
    timer = make_timer(METHOD if args.device == "interpret" else CUPTI_METHOD)
    out = []
    for (kernel_name, shape_text, dtype), entry in by_problem.items():
        shape = json.loads(shape_text)
        problem = get_kernel(kernel_name).problem(shape, dtype)
        distinct = list(dict.fromkeys(entry["winners"].values()))
        known = [Config(c) for c in fastest_configs(device, kernel_name, shape, dtype)[:3]]
        configs = distinct + [c for c in dict.fromkeys(known + entry["next"]) if c not in distinct]
        try:
            per_config, base = time_configs(problem, configs, baseline=True, rounds=args.rounds,
                                            calls=20, interpret=args.device == "interpret",
                                            timer=timer)
        except ValueError as e:
            out.append({"problem": str(problem), "error": str(e)})
            continue
        medians = [statistics.median(t for r in rounds for t in r) for rounds in per_config]
        best = min(medians)
        base_us = statistics.median(t for r in base for t in r) if base else None
        winners = {run: medians[distinct.index(c)] for run, c in entry["winners"].items()}
        out.append({
            "problem": str(problem), "configs": [dict(c) for c in configs],
            "medians_us": medians, "recorded": len({*known} - {*distinct}),
            "best_us": best, "baseline_us": base_us, "winner_us": winners,
            "winner_vs_best": {run: us / best - 1 for run, us in winners.items()},
            "winners_spread": (max(winners.values()) / min(winners.values()) - 1)
            if winners else None,
        })
    return out


def recrown(folder: Path, max_rounds: int | None = None) -> None:
    """``--recrown``: each stored round crowned again, and replayed by today's rounds (the race,
    CONFIRM_TARGET_US's runs; at most ``max_rounds``): crown, gap, speedup vs ``verify``'s (the
    median round's; pooled: the ratio of pooled medians); today's kernel time."""
    from autotune.space.kernel import get_kernel
    from autotune.storage.store import Store
    from autotune.tuning import confirmation as cf

    result = json.loads((folder / "answers.json").read_text())
    with tarfile.open(folder / "answers.tgz") as tar:
        tar.extractall(folder / "recrown", filter="data")
    gaps = {(p["problem"], json.dumps(c, sort_keys=True)): us / p["best_us"] - 1
            for p in result["side_by_side"] if "error" not in p
            for c, us in zip(p["configs"], p["medians_us"], strict=True)}
    spent = [0.0, 0.0]
    for run in result["runs"]:
        with Store(f"sqlite:///{folder / 'recrown' / ('run%d' % run['run']) / 'answers.db'}") as st:
            for v in run["verified"]:
                kernel = get_kernel(v["kernel"])
                problem = kernel.problem(v["shape"], v["dtype"])
                row = (st.confirmations(problem, device_kind=None, limit=1) or [None])[0]
                if row is None:
                    print(f"run{run['run']} {problem}: no confirmation round stored")
                    continue
                progs = sorted(row.programs, key=lambda p: p.position)
                default = kernel.default_config and kernel.default_config(problem)
                base = row.baseline_rounds_us or None
                stored = [p.rounds_us for p in progs] + ([base] if base else [])
                # A config raced out of the stored rounds has no cells past them (None).
                table = [[types.SimpleNamespace(ok=True, samples_us=rs[k][:cf.sized_iterations(
                    statistics.median(rs[0]))]) if k < len(rs) else None for rs in stored]
                    for k in range(min(max_rounds or cf.MAX_CONFIRM_ROUNDS,
                                       max(map(len, stored))))]

                def analyse(t: list[list[Any]], stop: bool = False) -> Any:
                    if stop and len(t) == len(table):  # the stored rounds end here
                        return types.SimpleNamespace(confirmation=None)
                    return cf.analyse_rounds(t, [p.config for p in progs], search_us=[None] * len(
                        progs), trial_ids=[p.trial_id for p in progs], baseline=bool(base),
                        default_config=default)

                today = analyse(cf.timed_rounds(lambda n, first, skip: [
                    [None if i in skip else c for i, c in enumerate(r)]
                    for r in table[first:first + n]], lambda t: analyse(t, True), None)).confirmation
                spent[0] += sum(t for rs in stored for r in rs for t in r)
                spent[1] += sum(t for p in (*today.configs, today.baseline) if p
                                for r in p.rounds_us for t in r)
                cells = []
                for w in (cf.analyse_confirmation([cf.Candidate(p.config, p.rounds_us, trial_id=p
                          .trial_id) for p in progs], base, default_config=default), today):
                    gap = gaps.get((str(problem), json.dumps(dict(w.winner.config),
                                                             sort_keys=True)))
                    pool = w.baseline and statistics.median(sum(w.baseline.rounds_us, ())) / \
                        statistics.median(sum(w.winner.rounds_us, ()))
                    cells.append(f"t{w.winner.trial_id} " + (
                        "-" if gap is None else f"{100 * gap:+.2f}%") + (
                        f" vs verify {100 * (w.speedup / v['speedup'] - 1):+.2f}% (pooled "
                        f"{100 * (pool / v['speedup'] - 1):+.2f}%)" if pool and v.get(
                            "speedup") else ""))
                print(f"run{run['run']} {problem}: crowned {cells[0]}; today {cells[1]}")
    if spent[0]:
        print(f"today's rounds: {100 * spent[1] / spent[0]:.1f}% of the stored kernel time")


def pack(out: Path) -> None:
    """``answers.tgz``: each run's files and XLA's autotune picks (its pinned GEMMs)."""
    from autotune.evaluation.xla_autotune import JAX_AUTOTUNE_SUBFOLDER

    with tarfile.open(out / "answers.tgz", "w:gz") as tar:
        for run in sorted(out.glob("run*")):
            picks = run / "jax_cache" / JAX_AUTOTUNE_SUBFOLDER
            for f in sorted([*run.iterdir(), *picks.rglob("*")]):
                if f.is_file():
                    tar.add(f, arcname=str(f.relative_to(out)))


def device_name() -> str:
    from autotune.evaluation.pipeline import gpu_device_info, interpret_device_info

    try:
        return gpu_device_info().name
    except Exception:  # noqa: BLE001
        return interpret_device_info().name


def report(result: dict[str, Any]) -> None:
    print(f"\ndevice {result['device']}; {len(result['runs'])} runs of {result['job']}")
    print(f"{'run':>3} {'problem':48s} {'stored':>22s} {'verified':>22s} {'diff':>7s} "
          f"{'wins':>5s} {'conf s':>7s} {'wall s':>7s} {'tail s':>6s}")
    for run in result["runs"]:
        for v in run["verified"]:
            stored = v.get("stored_speedup")
            cell = ("-" if v["speedup"] is None else
                    f"{v['speedup']:.4f} [{v['speedup_low']:.3f},{v['speedup_high']:.3f}]")
            diff = "-" if v["difference"] is None else f"{100 * v['difference']:+.2f}%"
            problem = f"{v['kernel']}{json.dumps(v['shape'], sort_keys=True)}"
            confirm, tail = run["confirm_s"].get(problem), run.get("tail_s")
            print(f"{run['run']:>3} {problem:47s} {stored if stored is None else round(stored, 4)!s:>22s} "
                  f"{cell:>22s} {diff:>7s} {v['still_wins']!s:>5s} "
                  f"{'-' if confirm is None else f'{confirm:.1f}':>7s} {run['wall_s']:7.1f} "
                  f"{'-' if tail is None else f'{tail:.1f}':>6s}")
    for run in result["runs"]:
        for method, found in run.get("also_verified", {}).items():
            for v in found:
                diff = "-" if v["difference"] is None else f"{100 * v['difference']:+.2f}%"
                print(f"{run['run']:>3} {v['kernel']}{json.dumps(v['shape'], sort_keys=True)} "
                      f"by {method}: {v['speedup']} ({diff})")
    print("\nside by side (second method, one process): each run's winner against the best known")
    for p in result["side_by_side"]:
        if "error" in p:
            print(f"  {p['problem']}: {p['error']}")
            continue
        gaps = ", ".join(f"run{r}: {100 * g:+.2f}%" for r, g in sorted(p["winner_vs_best"].items()))
        print(f"  {p['problem']}: best {p['best_us']:.2f} us (of {len(p['configs'])} configs, "
              f"{p['recorded']} recorded), baseline {p['baseline_us']:.2f} us; {gaps}; winners "
              f"spread {100 * (p['winners_spread'] or 0):.2f}%")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--job", type=Path, default=ROOT / "benchmarks" / "answers.toml")
    p.add_argument("--device", default="gpu", choices=("gpu", "interpret"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--verify-method", action="append", metavar="METHOD",
                   help="verify's --method, repeatable (default auto); the first gives the table")
    p.add_argument("--seconds", type=float, default=540.0,
                   help="stop starting runs past this (default: 540)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-rounds", type=int, help="--recrown's replay: at most (default 15)")
    p.add_argument("--recrown", action="store_true",
                   help="crown the stored rounds again")
    args = p.parse_args(argv)
    if args.recrown:
        if not all((args.out / f).is_file() for f in ("answers.json", "answers.tgz")):
            p.error(f"--recrown reads answers.json and answers.tgz, but {args.out} lacks them.")
        from autotune.tuning.confirmation import CONFIRM_MIN_ROUNDS as least
        if args.max_rounds is not None and args.max_rounds < least:
            p.error(f"--max-rounds must be at least {least}, got {args.max_rounds}.")
        recrown(args.out, args.max_rounds)
        return 0
    args.verify_method = args.verify_method or ["auto"]
    args.out = args.out.resolve()
    args.job = args.job.resolve()
    if (held := sorted(args.out.glob("run[0-9]*"))):
        p.error(f"--out {args.out} holds {held[0].name} of an earlier call: name an empty folder.")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {"job": str(args.job.relative_to(ROOT)) if args.job.is_relative_to(ROOT)
                              else str(args.job), "runs": runs, "side_by_side": []}
    for i in range(args.runs):
        left = args.seconds - (time.monotonic() - start)
        per_run = (time.monotonic() - start) / i if i else 0.0
        if left < max(60.0, 1.2 * per_run) and i:
            print(f"stopping after {i} runs: {left:.0f} s left", flush=True)
            break
        runs.append(one_run(i, args, left))
        print(f"run {i}: tune rc {runs[-1]['tune_rc']} in {runs[-1]['wall_s']:.0f} s, verify rc "
              f"{runs[-1]['verify_rc']}", flush=True)
        (args.out / "answers.json").write_text(json.dumps(result, default=str))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    result["device"] = device_name()
    result["side_by_side"] = side_by_side(runs, args)
    (args.out / "answers.json").write_text(json.dumps(result, default=str))
    pack(args.out)
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

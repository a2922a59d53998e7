"""A whole batch job on a fresh database: the scheduler against one problem at a time.

    python3 benchmarks/batch_job.py examples/gpu_evidence.toml --trials 30 --patience 0 --compare \\
        --out $OUT/batch_job.json                                           # H200
    python3 benchmarks/batch_job.py benchmarks/batch_fake.toml --device fake --compare \\
        --workers-per-gpu 4 --compile-threads 1                             # CPU, simulated

Runs the job (``run_job``, as ``autotune tune`` does) on a fresh database (a new SQLite file;
``--db`` for another, which must be empty) with a new engine, and prints: wall time (the
engine's start to the last result stored), configs/min, the share of it the GPU was busy, the
time to the first compile and the first trial stored, and per problem trials stored, best,
baseline and speedup. ``--sequential`` runs one problem after another; ``--compare`` runs both,
each on a fresh database and engine, and prints their ratios and each problem's best of the two
(the quality goal: within 0.5%). ``--compilation-cache DIR``: JAX's persistent
cache (default off). ``--keep-db DIR``: each run's database. ``--out``: JSON, with where the time
went (:func:`stage_breakdown`).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's autotune (and autotune.replay.sim_kernels)
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import fmt  # noqa: E402

from autotune.space.problem import Config  # noqa: E402
from autotune.tuning.jobs import Budget, load_job  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="a job file (TOML)")
    p.add_argument("--device", default="gpu", choices=("gpu", "interpret", "fake"))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sequential", action="store_true", help="one problem after another")
    mode.add_argument("--compare", action="store_true", help="both, one after the other")
    p.add_argument("--trials", type=int, help="override every problem's trial budget")
    p.add_argument("--patience", type=int, help="override patience (0: never stop early)")
    p.add_argument("--workers-per-gpu", type=int)
    p.add_argument("--compile-threads", type=int)
    p.add_argument("--db", help="an empty database URL (default: a new SQLite file)")
    p.add_argument("--compilation-cache", metavar="DIR",
                   help="JAX's persistent compilation cache for the workers (default: off)")
    p.add_argument("--keep-db", metavar="DIR",
                   help="copy each run's SQLite database here, as <mode>.db")
    p.add_argument("--out", help="write the figures as JSON here")
    return p.parse_args(argv)


def _job(args: argparse.Namespace) -> Any:
    job = load_job(args.job, allow_import=True)
    specs = []
    for spec in job.problems:
        budget = spec.budget
        if args.trials is not None:
            budget = dataclasses.replace(budget, trials=args.trials, seconds=None)
        if args.patience is not None:
            budget = dataclasses.replace(budget, patience=args.patience or None)
        specs.append(dataclasses.replace(spec, budget=Budget(**dataclasses.asdict(budget))))
    return dataclasses.replace(job, problems=tuple(specs))


def stage_breakdown(timeline: list[Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Where the time goes: per task kind, each step between two stage events of one task.

    Steps are named ``a->b`` after their bounding events (``build->compiled`` the compile,
    ``compiled->device`` the wait for the GPU's lock); ``trial first`` is a worker's first trial
    of a problem (first-use costs). Each step: count, sum and median in seconds.
    """
    by_task: dict[int, list[Any]] = {}
    for e in timeline:
        by_task.setdefault(e.task_id, []).append(e)
    seen: set[tuple[int, Any]] = set()
    steps: dict[str, dict[str, list[float]]] = {}
    for events in by_task.values():
        events.sort(key=lambda e: e.t)
        head = events[0]
        kind = getattr(head, "kind", "trial")
        worker = next((e.worker for e in events if e.stage == "device"), head.worker)
        if kind == "trial":
            key = (worker, getattr(head, "problem", None))
            kind = "trial" if key in seen else "trial first"
            seen.add(key)
        for a, b in zip(events, events[1:], strict=False):
            steps.setdefault(kind, {}).setdefault(f"{a.stage}->{b.stage}", []).append(b.t - a.t)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, named in steps.items():
        out[kind] = {}
        for name, values in named.items():
            values.sort()
            out[kind][name] = {"n": len(values), "sum_s": sum(values),
                               "median_s": values[len(values) // 2]}
    return out


def print_breakdown(breakdown: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"  {'where the time goes':<28} {'step':<22} {'n':>5} {'sum s':>8} {'median s':>9}")
    for kind in sorted(breakdown):
        for name, v in breakdown[kind].items():
            print(f"  {kind:<28} {name:<22} {int(v['n']):>5} {v['sum_s']:>8.2f} "
                  f"{v['median_s']:>9.3f}")


def run_once(args: argparse.Namespace, *, sequential: bool, db: str | None) -> dict[str, Any]:
    import optuna

    from autotune.engine.dispatcher import Engine
    from autotune.engine.tasks import device_busy_s

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from autotune.storage.store import Store
    from autotune.tuning.tuner import run_job

    job = _job(args)
    folder = Path(tempfile.mkdtemp(prefix="batch-job-"))
    url = db or f"sqlite:///{folder}/autotune.db"
    store = Store(url)
    if store.trials():
        raise SystemExit(f"--db {store!r} is not empty: the benchmark needs a fresh database.")
    first_trial: list[float] = []

    def on_event(event: Any) -> None:
        if event.kind == "trial" and not first_trial:
            first_trial.append(time.time())

    t0 = time.time()
    engine = Engine(args.device, workers_per_gpu=args.workers_per_gpu,
                    compile_threads=args.compile_threads, allow_import=True,
                    compilation_cache=args.compilation_cache,
                    log_dir=str(folder / "logs"))
    # The path to the first compile: the first worker ready (its device known), the first
    # config handed to the engine, and whether this process had imported jax by then.
    marks: dict[str, Any] = {}
    ready = threading.Thread(target=lambda: (engine.device_info(), marks.setdefault(
        "first_worker_ready_s", time.time() - t0)), daemon=True)
    ready.start()
    submit = engine.submit

    def first_submit(*a: Any, **k: Any) -> Any:
        if "first_submit_s" not in marks:
            marks["first_submit_s"] = time.time() - t0
            marks["main_imported_jax_by_first_submit"] = "jax" in sys.modules
        future = submit(*a, **k)
        # When this process got the first result (the engine's thread resolved its future),
        # between the worker's "done" and the scheduler's store.
        future.add_done_callback(lambda f: marks.setdefault(
            "first_result_received_s", time.time() - t0))
        return future

    engine.submit = first_submit  # type: ignore[method-assign]
    main_samples = _sample_main_thread(t0, MAIN_SAMPLE_S)
    try:
        reports = run_job(job, store=store, engine=engine, results_dir=str(folder / "results"),
                          on_event=on_event, allow_import=True, sequential=sequential)
        wall = time.time() - t0
        timeline = engine.timeline()
    finally:
        engine.close(cancel_pending=True)
    rows = store.trials()
    store.close()
    if args.keep_db and url.startswith("sqlite:///"):
        Path(args.keep_db).mkdir(parents=True, exist_ok=True)
        kept = Path(args.keep_db) / f"{'sequential' if sequential else 'scheduled'}.db"
        # SQLite's backup, not a file copy: the newest pages may still be in the WAL file.
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as src, \
                contextlib.closing(sqlite3.connect(kept)) as dst:
            src.backup(dst)
    builds = [e.t for e in timeline if e.stage == "build"]
    # The first trial's path: each stage of the trial task that finished first, from the start.
    dones = [e for e in timeline if e.stage == "done" and getattr(e, "kind", "trial") == "trial"]
    first_done = min(dones, key=lambda e: e.t, default=None)
    first_path = [] if first_done is None else [
        (e.stage, round(e.t - t0, 3)) for e in sorted(timeline, key=lambda e: e.t)
        if e.task_id == first_done.task_id]
    problems = []
    for r in reports:
        problems.append({
            "problem": str(r.problem), "trials": sum(r.by_status.values()),
            "by_status": dict(r.by_status), "best_us": r.best_us,
            "baseline": r.baseline_name, "baseline_us": r.baseline_us, "speedup": r.speedup,
            "stop": r.stop_reason,
        })
    digests = [(row.problem.digest(), Config(row.config).digest()) for row in rows]
    return {
        "mode": "sequential" if sequential else "scheduled",
        "device": args.device,
        "layout": f"{engine.workers} workers x {engine.compile_threads} compile threads",
        "compilation_cache": args.compilation_cache,
        "wall_s": wall,
        "trials": len(rows),
        "configs_per_min": 60 * len(rows) / wall if wall else 0.0,
        "gpu_busy": device_busy_s(timeline) / wall if wall else 0.0,
        "first_compile_s": (min(builds) - t0) if builds else None,
        "first_trial_s": (first_trial[0] - t0) if first_trial else None,
        "first_trial_path": first_path,
        **marks,
        "measured_twice": len(digests) - len(set(digests)),
        "invalid": sum(p["by_status"].get("invalid", 0) for p in problems),
        "problems": problems,
        "breakdown": stage_breakdown(timeline),
        # What this process's main thread (the scheduler's loop) was doing from the first
        # result done to its store: seconds per innermost autotune function, sampled every 5 ms.
        "main_thread_before_first_store": _main_thread_between(
            main_samples, first_done.t - t0 if first_done else None,
            first_trial[0] - t0 if first_trial else None),
        "main_thread_before_first_submit": _main_thread_between(
            main_samples, marks.get("first_worker_ready_s"), marks.get("first_submit_s")),
    }


MAIN_SAMPLE_S = 15.0  # the main thread is sampled for the job's first seconds


def _sample_main_thread(t0: float, seconds: float) -> list[tuple[float, str]]:
    """Samples, every 5 ms for ``seconds``, the innermost autotune (or search_spaces) function
    on this process's main thread, on a daemon thread: ``(time since t0, "module:function")``."""
    main = threading.main_thread().ident
    samples: list[tuple[float, str]] = []

    def run() -> None:
        while time.time() - t0 < seconds:
            frame = sys._current_frames().get(main)
            where = "other"
            while frame is not None:
                name = frame.f_code.co_filename
                if "/autotune/" in name or "/search_spaces/" in name:
                    where = f"{Path(name).stem}:{frame.f_code.co_name}"
                    break
                frame = frame.f_back
            samples.append((time.time() - t0, where))
            time.sleep(0.005)

    threading.Thread(target=run, name="main-thread-sampler", daemon=True).start()
    return samples


def _main_thread_between(samples: list[tuple[float, str]], start: float | None,
                         end: float | None) -> dict[str, float]:
    if start is None or end is None:
        return {}
    window = [w for t, w in samples if start <= t <= end]
    step = (end - start) / len(window) if window else 0.0
    counts = collections.Counter(window)
    return {w: round(n * step, 3) for w, n in counts.most_common(8)}


def print_run(m: dict[str, Any]) -> None:
    print(f"== {m['mode']} ({m['device']}, {m['layout']})")
    print(f"wall {m['wall_s']:.1f} s, {m['trials']} configs, {m['configs_per_min']:.1f} configs/min, "
          f"GPU busy {m['gpu_busy']:.0%}, first compile {fmt(m['first_compile_s'], '.2f')} s, "
          f"first trial {fmt(m['first_trial_s'], '.2f')} s, measured twice {m['measured_twice']}, "
          f"invalid {m['invalid']}")
    print(f"path to the first compile: first worker ready {fmt(m.get('first_worker_ready_s'), '.2f')} s, "
          f"first config submitted {fmt(m.get('first_submit_s'), '.2f')} s (this process had "
          f"{'' if m.get('main_imported_jax_by_first_submit') else 'not '}imported jax)")
    if m.get("first_trial_path"):
        print("path of the first trial: " + ", ".join(
            f"{stage} {t:.2f}" for stage, t in m["first_trial_path"])
            + f"; received {fmt(m.get('first_result_received_s'), '.2f')}"
            + f", stored {fmt(m.get('first_trial_s'), '.2f')}")
    if m.get("main_thread_before_first_submit"):
        print("main thread from the first worker ready to the first submission (s): " + ", ".join(
            f"{w} {t:.2f}" for w, t in m["main_thread_before_first_submit"].items()))
    if m.get("main_thread_before_first_store"):
        print("main thread from the first result done to its store (s): " + ", ".join(
            f"{w} {t:.2f}" for w, t in m["main_thread_before_first_store"].items()))
    print(f"  {'problem':<60} {'trials':>6} {'best us':>9} {'baseline us':>12} {'speedup':>8}")
    for p in m["problems"]:
        print(f"  {p['problem'][:60]:<60} {p['trials']:>6} {fmt(p['best_us'], '.1f'):>9} "
              f"{fmt(p['baseline_us'], '.1f'):>12} {fmt(p['speedup'], '.3f'):>8}")
    if m.get("breakdown"):
        print_breakdown(m["breakdown"])


def print_compare(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    ratio = new["configs_per_min"] / old["configs_per_min"] if old["configs_per_min"] else None
    print("== scheduled vs sequential")
    print(f"configs/min {new['configs_per_min']:.1f} vs {old['configs_per_min']:.1f} "
          f"({fmt(ratio, '.2f')}x); wall {new['wall_s']:.1f} vs {old['wall_s']:.1f} s; GPU busy "
          f"{new['gpu_busy']:.0%} vs {old['gpu_busy']:.0%}; first trial "
          f"{fmt(new['first_trial_s'], '.2f')} vs {fmt(old['first_trial_s'], '.2f')} s")
    worst = 0.0
    for a, b in zip(new["problems"], old["problems"], strict=True):
        if a["best_us"] and b["best_us"]:
            gap = a["best_us"] / b["best_us"] - 1
            worst = max(worst, gap)
            print(f"  {a['problem'][:60]:<60} best {a['best_us']:.1f} vs {b['best_us']:.1f} us "
                  f"({gap:+.2%})")
    print(f"worst best-vs-sequential gap {worst:+.2%} (goal: within 0.5%)")
    return {"throughput_ratio": ratio, "worst_best_gap": worst}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: dict[str, Any] = {"job": args.job, "argv": sys.argv[1:], "date": time.strftime("%F %T %Z")}
    if args.compare:
        if args.db:
            raise SystemExit("--compare makes two fresh SQLite databases; leave out --db.")
        new = run_once(args, sequential=False, db=None)
        print_run(new)
        old = run_once(args, sequential=True, db=None)
        print_run(old)
        out.update(scheduled=new, sequential=old, compare=print_compare(new, old))
    else:
        m = run_once(args, sequential=args.sequential, db=args.db)
        print_run(m)
        out[m["mode"]] = m
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

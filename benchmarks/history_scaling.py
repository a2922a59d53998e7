"""What a growing database costs: the first proposal of a new problem, ``best``,
``results_frame``, ``autotune --version`` and the ask on SQLite, at 10k, 100k and 1M stored
trials of one kernel (issue 36).

    python3 benchmarks/history_scaling.py --sizes 0,10000,100000,1000000 --db-dir /tmp/history
    python3 benchmarks/history_scaling.py --sizes 200 --per-shape 50 --asks 20 --study-trials 50

Fills one SQLite database per size with valid ``hopper_matmul`` configs over many shapes
(``--per-shape`` each; random times, one in ten a compile error). ``--fill record`` stores
each trial through ``Store.record_trial``; ``bulk`` one shape's rows so, the rest by one
executemany per shape; ``auto`` (default): ``record`` up to 20,000. ``--refill`` fills again.

Then, each in a fresh child (CPU time, peak memory): ``first proposal`` (a new shape with
``auto``, then the first ``ask``; tracemalloc's peak in a second child), the same for
``--job-problems`` (7) shapes in one process, ``best``, ``results_frame`` and ``--version``.
Last: ``auto``'s ask latency on a SQLite study of ``--study-trials`` trials (p50/p99 wall and
CPU, statements and commits per ask+tell, without and with ``prefetch``). No engine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

KERNEL = "hopper_matmul"
DTYPE = "bfloat16"
DEVICE = ("NVIDIA H100 80GB HBM3", "gpu", "9.0", "560.35")
SOFTWARE = {"jax": "0.10.2", "jaxlib": "0.10.2", "autotune": "history-scaling"}
SIDES = (128, 256, 384, 512, 768, 1024, 2048, 4096, 8192, 16384)
NEW_SHAPE = {"m": 6144, "n": 6144, "k": 3072}  # on no side of the grid: a new problem
RECORD_UP_TO = 20_000


def shapes(count: int) -> list[dict[str, int]]:
    """``count`` distinct (m, n, k) of the grid, spread over it (seeded)."""
    grid = [{"m": m, "n": n, "k": k} for m in SIDES for n in SIDES for k in SIDES]
    random.Random(0).shuffle(grid)
    if count > len(grid):
        raise SystemExit(f"at most {len(grid)} shapes: raise --per-shape")
    return grid[:count]


def _device():
    from autotune.space.outcomes import DeviceInfo

    return DeviceInfo(*DEVICE)


def _result(rng: random.Random, base_us: float):
    from autotune.space.outcomes import Outcome, TrialResult

    if rng.random() < 0.1:
        return TrialResult(Outcome.COMPILE_ERROR, error="history-scaling: invalid on purpose",
                           compile_s=0.5, timing="", cache="warm")
    t = base_us * math.exp(rng.gauss(0.0, 0.5))
    return TrialResult(Outcome.OK, samples_us=(t * 0.99, t, t * 1.01), compile_s=0.5,
                       rel_error=1e-3, timing="cupti", cache="warm")


def stored_count(url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return int(c.scalar(sa.text("SELECT count(*) FROM at_trials")) or 0)
    except sa.exc.OperationalError:
        return 0
    finally:
        engine.dispose()


def fill(url: str, size: int, per_shape: int, how: str) -> tuple[str, float]:
    """Fills ``url`` with ``size`` trials; returns the path taken and the seconds spent."""
    import sqlalchemy as sa

    from autotune.space.kernel import get_kernel
    from autotune.storage.schema import Configs, Kernels, Trials
    from autotune.storage.store import Store

    how = how if how != "auto" else ("record" if size <= RECORD_UP_TO else "bulk")
    kernel = get_kernel(KERNEL)
    device = _device()
    rng = random.Random(1)
    start = time.monotonic()
    left = size
    with Store(url) as store:
        config_ids: dict[str, int] = {}
        for i, dims in enumerate(shapes(math.ceil(size / per_shape))):
            problem = kernel.problem(dims, DTYPE)
            space = kernel.valid_space(problem)
            configs = space.sample(min(per_shape, left), seed=i)
            base_us = 1e-3 * dims["m"] * dims["n"] * dims["k"] / 500.0 + 5.0
            results = [_result(rng, base_us) for _ in configs]
            left -= len(configs)
            if how == "record":
                for c, r in zip(configs, results, strict=True):
                    store.record_trial(problem, c, r, device=device, software=SOFTWARE,
                                       worker="history-scaling", cache="warm")
                continue
            # The first through the write path (it creates the problem, device, software rows).
            (first,) = store.record_trials([(problem, configs[0], results[0], device, SOFTWARE)],
                                           worker="history-scaling", cache="warm")
            with store.engine.begin() as conn:
                row = conn.execute(sa.select(Trials.problem_id, Trials.device_id,
                                             Trials.software_id).where(Trials.id == first.id)).one()
                kernel_id = conn.scalar(sa.select(Kernels.id).where(Kernels.name == KERNEL))
                digests = {c.digest(): c for c in configs[1:]}
                missing = [d for d in digests if d not in config_ids]
                for chunk in range(0, len(missing), 500):
                    part = missing[chunk:chunk + 500]
                    found = dict(conn.execute(sa.select(Configs.digest, Configs.id).where(
                        Configs.kernel_id == kernel_id, Configs.digest.in_(part))).all())
                    new = [d for d in part if d not in found]
                    if new:
                        conn.execute(sa.insert(Configs), [
                            {"kernel_id": kernel_id, "digest": d, "config_json": digests[d].to_json()}
                            for d in new])
                        found.update(conn.execute(sa.select(Configs.digest, Configs.id).where(
                            Configs.kernel_id == kernel_id, Configs.digest.in_(new))).all())
                    config_ids.update(found)
                now = dt.datetime.now(dt.UTC)
                conn.execute(sa.insert(Trials), [
                    {"problem_id": row.problem_id, "config_id": config_ids[c.digest()],
                     "device_id": row.device_id, "software_id": row.software_id,
                     "status": r.outcome.value, "median_us": r.median_us, "min_us": r.min_us,
                     "max_us": r.max_us, "samples_us": tuple(r.samples_us),
                     "compile_s": r.compile_s, "rel_error": r.rel_error, "timing": r.timing,
                     "cache_policy": "warm", "spread": r.spread, "error": r.error,
                     "study_name": None, "optuna_trial_number": None,
                     "worker": "history-scaling", "host": "history-scaling", "started_at": None,
                     "finished_at": now}
                    for c, r in zip(configs[1:], results[1:], strict=True)])
    return how, time.monotonic() - start


# -- children ---------------------------------------------------------------------------------


def new_shapes(count: int) -> list[dict[str, int]]:
    """``count`` shapes of a new job: none on the grid's sides (nothing stored near by)."""
    return [{**NEW_SHAPE, "m": m} for m in (6144, 5120, 7168, 3072, 2560, 1536, 12288)[:count]]


def child_first_proposal(url: str, trace: bool, problems: int = 1) -> dict:
    import tracemalloc

    import optuna

    from autotune.space.kernel import get_kernel
    from autotune.storage.store import Store
    from autotune.tuning import seeding, studies
    from autotune.tuning.jobs import Budget, ProblemSpec
    from autotune.tuning.sampling import distributions

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    kernel = get_kernel(KERNEL)
    device = _device()
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp, Store(url) as store:
        storage = studies.optuna_storage(f"sqlite:///{tmp}/study.db")
        if trace:
            tracemalloc.start()
        for shape in new_shapes(problems):  # a job's problems, one after the other
            problem = kernel.problem(shape, DTYPE)
            space = kernel.valid_space(problem)
            spec = ProblemSpec(problem, Budget(trials=10), sampler="auto")
            wall, cpu = time.perf_counter(), time.process_time()
            sampler = seeding.problem_sampler(kernel, problem, spec, space, store=store,
                                              device=device, policy="warm", stored_configs=[])
            study = studies.open_study(problem, device, storage, sampler, SOFTWARE, "warm")
            trial = study.ask(distributions(space))
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            assert space.is_valid(trial.params)
        peak = tracemalloc.get_traced_memory()[1] if trace else None
        return {"wall_s": walls[0], "cpu_s": cpus[0], "job_wall_s": sum(walls),
                "job_cpu_s": sum(cpus), "problems": problems,
                "traced_peak_mb": None if peak is None else peak / 2**20,
                "sampler": type(sampler.base).__name__}


def child_frame(url: str, limit: int | None) -> dict:
    from autotune.queries.best import results_frame

    wall, cpu = time.perf_counter(), time.process_time()
    frame = results_frame(url, kernel=KERNEL, **({} if limit is None else {"limit": limit}))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "rows": len(frame)}


CHILDREN = {"first-proposal": child_first_proposal, "frame": child_frame}


def _spawn(argv: list[str]) -> tuple[dict, float, float]:
    # Popen + wait4 ourselves (communicate would reap the child and lose its rusage).
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    data = json.loads(lines[-1]) if lines else {}
    return data, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _me(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def measure_size(url: str, problems: int = 7) -> dict:
    fp, fp_cpu, fp_rss = _spawn(_me("--child", "first-proposal", "--url", url))
    job, _, job_rss = _spawn(_me("--child", "first-proposal", "--url", url,
                                 "--problems", str(problems)))
    traced, _, _ = _spawn(_me("--child", "first-proposal", "--url", url, "--trace"))
    job_only = {"job_problems": problems, "job_wall_s": job["job_wall_s"],
                "job_cpu_s": job["job_cpu_s"], "job_first_cpu_s": job["cpu_s"],
                "job_peak_rss_mb": job_rss}
    if stored_count(url) == 0:  # the empty database: the job's first proposals only
        return {"first_wall_s": fp["wall_s"], "first_cpu_s": fp["cpu_s"],
                "first_peak_rss_mb": fp_rss, **job_only}
    _, best_cpu, best_rss = _spawn([sys.executable, "-m", "autotune", "best", KERNEL, "--shape",
                                    _stored_shape(),
                                    "--dtype", DTYPE, "--db", url, "-q"])
    frame, frame_cpu, frame_rss = _spawn(_me("--child", "frame", "--url", url))
    limited, _, limited_rss = _spawn(_me("--child", "frame", "--url", url, "--limit", "1000"))
    _, version_cpu, _ = _spawn([sys.executable, "-m", "autotune", "--version"])
    return {**job_only,
        "first_wall_s": fp["wall_s"], "first_cpu_s": fp["cpu_s"], "first_process_cpu_s": fp_cpu,
        "first_peak_rss_mb": fp_rss, "first_traced_peak_mb": traced["traced_peak_mb"],
        "sampler": fp["sampler"], "best_cpu_s": best_cpu, "best_peak_rss_mb": best_rss,
        "frame_wall_s": frame["wall_s"], "frame_rows": frame["rows"], "frame_peak_rss_mb": frame_rss,
        "frame_process_cpu_s": frame_cpu, "frame1000_wall_s": limited["wall_s"],
        "frame1000_peak_rss_mb": limited_rss, "version_cpu_s": version_cpu,
    }


def _stored_shape() -> str:
    dims = shapes(1)[0]
    return ",".join(f"{k}={v}" for k, v in dims.items())


# -- the ask on SQLite --------------------------------------------------------------------------


def measure_asks(study_trials: int, asks: int, sampler_name: str = "auto", *,
                 prefetch: bool = False, gap_s: float = 0.0) -> dict:
    """Asks (and tells) against a SQLite study holding ``study_trials`` finished trials;
    ``prefetch`` as the scheduler runs (the next proposal made on a background thread, while
    the result of ``gap_s`` comes)."""
    import optuna
    import sqlalchemy as sa
    from common import add_finished, ask_run, time_asks

    from autotune.space.kernel import get_kernel
    from autotune.tuning import optuna_adapter, studies
    from autotune.tuning.sampling import distributions, valid_sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    kernel = get_kernel(KERNEL)
    problem = kernel.problem({"m": 4096, "n": 4096, "k": 4096}, DTYPE)
    space = kernel.valid_space(problem)
    dists = distributions(space)
    rng = random.Random(0)

    def cost(c) -> float:
        return 100.0 * math.exp(0.3 * rng.gauss(0.0, 1.0)) + c["tile_k"] / 64

    with tempfile.TemporaryDirectory() as tmp:
        storage = studies.optuna_storage(f"sqlite:///{tmp}/study.db")
        sampler = valid_sampler(sampler_name, space, seed=0)
        sampler.prefetch = prefetch
        study = optuna.create_study(storage=storage, sampler=sampler, direction="minimize",
                                    study_name="history-scaling")
        add_finished(study, dists, [dict(c) for c in space.sample(study_trials, seed=0)], cost)
        run = ask_run(kernel, problem, space, sampler, study, dists, sampler_name, study_trials,
                      asks)
        engine = optuna_adapter.study_storage(study)
        engine = getattr(getattr(engine, "_backend", engine), "engine", None)
        counts = {"statements": 0, "commits": 0}
        if engine is not None:
            sa.event.listen(engine, "before_cursor_execute",
                            lambda *a: counts.__setitem__("statements", counts["statements"] + 1))
            sa.event.listen(engine, "commit",
                            lambda *a: counts.__setitem__("commits", counts["commits"] + 1))
        times = time_asks(run, asks, lambda trial, config: studies.tell_result(
            study, trial, _result(rng, 100.0), duplicate=False), gap_s)
    wall = sorted(w for w, _ in times)
    cpu = sorted(c for _, c in times)
    at = min(len(wall) - 1, int(0.99 * len(wall)))
    return {"study_trials": study_trials, "asks": asks, "prefetch": prefetch,
            "wall_p50_ms": statistics.median(wall),
            "wall_p99_ms": wall[at], "cpu_p50_ms": statistics.median(cpu), "cpu_p99_ms": cpu[at],
            "statements_per_trial": counts["statements"] / asks,
            "commits_per_trial": counts["commits"] / asks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0,10000,100000,1000000",
                   help="stored trials of the kernel, comma-separated (default 0,10k,100k,1M; 0: "
                   "an empty database, for the job's first proposals)")
    p.add_argument("--per-shape", type=int, default=1000, help="trials per shape (default 1000)")
    p.add_argument("--db-dir", default=str(Path(tempfile.gettempdir()) / "autotune-history"),
                   help="where the databases are kept (reused when already filled)")
    p.add_argument("--fill", choices=("auto", "record", "bulk"), default="auto")
    p.add_argument("--refill", action="store_true", help="rebuild the databases")
    p.add_argument("--study-trials", type=int, default=2000,
                   help="finished trials in the SQLite study for the ask latency (default 2000)")
    p.add_argument("--asks", type=int, default=200, help="asks timed (default 200; 0: skip)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--child", choices=tuple(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    p.add_argument("--job-problems", type=int, default=7,
                   help="new problems of a job whose first proposals are timed one after the "
                   "other in one process (default 7; at most 7)")
    p.add_argument("--problems", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.job_problems <= 7:
        p.error(f"--job-problems must be 1 to 7, but got {args.job_problems}")
    if args.child == "first-proposal":
        print(json.dumps(child_first_proposal(args.url, args.trace, args.problems)))
        return 0
    if args.child == "frame":
        print(json.dumps(child_frame(args.url, args.limit)))
        return 0

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    Path(args.db_dir).mkdir(parents=True, exist_ok=True)
    figures: dict = {"sizes": {}}
    print(f"{'stored':>8} {'fill':>6} {'first wall s':>12} {'first cpu s':>11} {'peak MB':>8} "
          f"{'traced MB':>9} {'best cpu s':>10} {'best MB':>8} {'frame s':>8} {'frame MB':>8} "
          f"{'frame1k s':>9} {'--version cpu s':>15}", flush=True)
    for size in sizes:
        path = Path(args.db_dir) / f"history_{size}_{args.per_shape}.db"
        url = f"sqlite:///{path}"
        how = "reused"
        if args.refill or stored_count(url) != size:
            path.unlink(missing_ok=True)
            how, seconds = fill(url, size, args.per_shape, args.fill)
            print(f"# filled {size} trials ({how}) in {seconds:.0f} s", flush=True)
        m = measure_size(url, args.job_problems)
        figures["sizes"][size] = {"fill": how, **m}
        empty = figures["sizes"].get(0)
        print(f"# {size} stored: a {m['job_problems']}-problem job's first proposals "
              f"{m['job_wall_s']:.2f} s wall, {m['job_cpu_s']:.2f} s CPU, peak {m['job_peak_rss_mb']:.0f} MB"
              + ("" if empty is None or size == 0 else
                 f" ({m['job_cpu_s'] / empty['job_cpu_s']:.2f}x the empty database's CPU)"),
              flush=True)
        if size == 0:
            continue
        print(f"{size:>8} {how:>6} {m['first_wall_s']:>12.2f} {m['first_cpu_s']:>11.2f} "
              f"{m['first_peak_rss_mb']:>8.0f} {m['first_traced_peak_mb']:>9.1f} "
              f"{m['best_cpu_s']:>10.2f} {m['best_peak_rss_mb']:>8.0f} {m['frame_wall_s']:>8.2f} "
              f"{m['frame_peak_rss_mb']:>8.0f} {m['frame1000_wall_s']:>9.2f} "
              f"{m['version_cpu_s']:>15.2f}", flush=True)
    if args.asks:
        for prefetch in (False, True):
            a = measure_asks(args.study_trials, args.asks, prefetch=prefetch,
                             gap_s=0.05 if prefetch else 0.0)
            figures["asks" if not prefetch else "asks_prefetch"] = a
            print(f"ask on SQLite, auto, prefetch {'on (50 ms between asks)' if prefetch else 'off'}, "
                  f"{a['study_trials']} trials in the study, {a['asks']} asks: "
                  f"wall p50 {a['wall_p50_ms']:.1f} ms p99 {a['wall_p99_ms']:.1f} ms; CPU p50 "
                  f"{a['cpu_p50_ms']:.1f} ms p99 {a['cpu_p99_ms']:.1f} ms; "
                  f"{a['statements_per_trial']:.1f} statements and {a['commits_per_trial']:.1f} "
                  "commits per ask+tell", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run-time lookup latency on a large results database (CPU only; jax only with --jax-arrays).

    python3 benchmarks/lookup_latency.py                       # 10^6 trials, a temporary SQLite file
    python3 benchmarks/lookup_latency.py --trials 100000 --db sqlite:////tmp/lookup.db

Builds a database of ``--trials`` trials (bulk-inserted: ``--problems`` hopper_matmul problems,
valid configs, two devices, two jax versions, 5% failed) and times
:func:`autotune.lookup_config` for stored problems:

* ``cached``: a repeated lookup, from the in-memory cache (goal < 50 us);
* ``cold``: the cache cleared before each, the database open (goal < 5 ms);
* ``cold, first in process``: the database closed too (opening it and checking its schema);
* ``nearest``: a problem not stored, answered from its nearest neighbours;
* ``decorator``: a cached call through ``@tuned`` (goal < 2 us, CPU time) beside the lookup's
  cache alone (``--decorator-only``: just these); ``--jax-arrays`` passes jax arrays (whose
  ``shape`` and ``dtype`` properties the decorator reads per call) instead of stand-ins.

Prints median and p90 per kind, and the best-trial query's plan.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's autotune

from autotune.queries import best as queries
from autotune.queries import lookup
from autotune.space.kernel import get_kernel
from autotune.space.problem import Problem
from autotune.storage import keys, schema
from autotune.storage import store as storage
from autotune.storage.store import Store

KERNEL = "hopper_matmul"
DTYPE = "bfloat16"
SIZES = (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
OLD = {"jax": "0.9.0", "jaxlib": "0.9.0", "autotune": "0.1.0"}
GOALS_US = {"cached": 50.0, "cold": 5000.0, "decorator": 2.0}


def _shapes(count: int, rng: random.Random) -> list[dict[str, int]]:
    grid = [{"m": m, "n": n, "k": k} for m in SIZES for n in SIZES for k in SIZES]
    if count > len(grid):
        raise SystemExit(f"--problems must be at most {len(grid)}.")
    return rng.sample(grid, count)


def build(url: str, *, trials: int, problems: int, seed: int) -> list[dict[str, int]]:
    """Fills an empty database; returns the stored shapes.

    Each problem's configs are drawn from its valid space (``valid_space(problem).sample``), so
    a cold lookup is answered by the first rows it reads, as in a database the tuner wrote (a
    config the rules refuse is skipped with a warning each: slow). A shape with fewer valid
    configs than its share stores them all."""
    rng = random.Random(seed)
    shapes = _shapes(problems, rng)
    per_problem = -(-trials // problems)
    kernel = get_kernel(KERNEL)
    running = {**queries.running_versions(), "autotune": "0.1.0"}
    gpu = {"name": "NVIDIA H200", "kind": "gpu", "compute_capability": "9.0", "driver": "570.86"}
    cpu = {"name": "cpu-interpret (bench)", "kind": "interpret", "compute_capability": "", "driver": ""}
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    with Store(url) as store, store.engine.begin() as conn:
        t = schema.Base.metadata.tables
        conn.execute(sa.insert(t["at_kernels"]), [{"id": 1, "name": KERNEL}])
        conn.execute(sa.insert(t["at_devices"]), [{"id": 1, **gpu}, {"id": 2, **cpu}])
        conn.execute(sa.insert(t["at_software"]), [
            {"id": i, **{k: v.get(k, "") for k in ("jax", "jaxlib", "autotune")}, "extra": "{}"}
            for i, v in ((1, OLD), (2, running))
        ])
        conn.execute(sa.insert(t["at_problems"]), [
            {"id": i + 1, "kernel_id": 1, "shape_json": (p := Problem(KERNEL, s, DTYPE)).shape_json,
             "dtype": DTYPE, "digest": p.digest()}
            for i, s in enumerate(shapes)
        ])
        config_ids: dict[str, int] = {}
        rows: list[dict] = []
        trial_id = 0
        for problem_id, shape in enumerate(shapes, start=1):
            problem = kernel.problem(shape, DTYPE)
            drawn = kernel.valid_space(problem).sample(min(per_problem, trials - trial_id),
                                                       seed=seed * 100_003 + problem_id)
            new = [c for c in drawn if c.digest() not in config_ids]
            if new:
                first = len(config_ids) + 1
                conn.execute(sa.insert(t["at_configs"]), [
                    {"id": first + i, "kernel_id": 1, "config_json": c.to_json(),
                     "digest": c.digest()} for i, c in enumerate(new)])
                config_ids.update((c.digest(), first + i) for i, c in enumerate(new))
            scale = rng.uniform(10, 5000)
            for config in drawn:
                trial_id += 1
                ok = rng.random() > 0.05
                median = scale * rng.lognormvariate(0.3, 0.3) if ok else None
                rows.append({
                    "id": trial_id, "problem_id": problem_id, "config_id": config_ids[config.digest()],
                    "device_id": 1 if rng.random() < 0.9 else 2,
                    "software_id": 1 if rng.random() < 0.5 else 2,
                    "status": "ok" if ok else "compile_error",
                    "median_us": median, "min_us": median, "max_us": median,
                    "samples_us": (median,) if ok else (), "compile_s": 1.0,
                    "rel_error": 1e-3 if ok else None, "timing": "cupti",
                    "error": "" if ok else "smem", "study_name": None, "optuna_trial_number": None,
                    "worker": "bench", "host": "bench", "started_at": now, "finished_at": now,
                })
                if len(rows) == 50_000:
                    conn.execute(sa.insert(t["at_trials"]), rows)
                    rows.clear()
            if trial_id >= trials:
                shapes = shapes[:problem_id]
                break
        if rows:
            conn.execute(sa.insert(t["at_trials"]), rows)
    return shapes


def _time_us(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1000


def _summary(label: str, samples: list[float]) -> tuple[str, int, float, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return label, len(samples), statistics.median(ordered), p90


def measure(url: str, shapes: list[dict[str, int]], *, samples: int, seed: int,
            decorator_only: bool = False, jax_arrays: bool = False) -> list[tuple]:
    rng = random.Random(seed + 1)
    stored = {tuple(sorted(s.items())) for s in shapes}
    missing = [s for s in _shapes(len(SIZES) ** 3, random.Random(seed))
               if tuple(sorted(s.items())) not in stored]

    def ask(shape: dict[str, int]) -> Callable[[], object]:
        return lambda: lookup.lookup_config(KERNEL, shape, DTYPE, db=url)

    lookup.clear_cache()
    queries.close_stores()
    ask(shapes[0])()  # imports, the kernel module, the first open
    out = []

    if not decorator_only:
        out += _lookups(url, shapes, missing, ask, samples=samples, rng=rng)
    out += _decorator(url, shapes, samples=samples, jax_arrays=jax_arrays)
    return out


def _lookups(url: str, shapes: list[dict[str, int]], missing: list[dict[str, int]],
             ask: Callable[[dict[str, int]], Callable[[], object]], *, samples: int,
             rng: random.Random) -> list[tuple]:
    out = []
    cached = [_time_us(ask(shapes[0])) for _ in range(samples)]
    out.append(_summary("cached", cached))

    cold = []
    for _ in range(samples):
        lookup.clear_cache()
        cold.append(_time_us(ask(rng.choice(shapes))))
    out.append(_summary("cold (database open)", cold))

    first = []
    for _ in range(max(5, samples // 10)):
        lookup.clear_cache()
        queries.close_stores()
        first.append(_time_us(ask(rng.choice(shapes))))
    out.append(_summary("cold, first in process (opens the database)", first))

    near = []
    sources: dict[str, int] = {}
    while missing and len(near) < max(5, samples // 10):
        lookup.clear_cache()
        shape = missing.pop(rng.randrange(len(missing)))
        start = time.perf_counter_ns()
        _, source = lookup.lookup_config(KERNEL, shape, DTYPE, db=url)
        elapsed = (time.perf_counter_ns() - start) / 1000
        sources[source] = sources.get(source, 0) + 1
        if source == "nearest":
            near.append(elapsed)
    if near:
        out.append(_summary(f"nearest (shape not stored; {dict(sorted(sources.items()))})", near))

    return out


def _decorator(url: str, shapes: list[dict[str, int]], *, samples: int,
               jax_arrays: bool = False) -> list[tuple]:
    """The decorator's own cost once a shape is cached: a call through @tuned (with the
    baseline routing on) minus a direct call of the same function, per call; and the same call
    through the lookup's cache only (shape_of, the dtype, lookup_choice, the routing per call).
    In this process's CPU time (``time.process_time_ns``): other processes do not count."""
    import types

    a: Any = types.SimpleNamespace(shape=(shapes[0]["m"], shapes[0]["k"]), dtype=DTYPE)
    b: Any = types.SimpleNamespace(shape=(shapes[0]["k"], shapes[0]["n"]), dtype=DTYPE)
    if jax_arrays:
        import jax.numpy as jnp

        a, b = (jnp.ones(x.shape, jnp.bfloat16) for x in (a, b))

    def body(x: Any, y: Any, *, config: Any = None) -> Any:
        return config

    def route(x: Any, y: Any) -> None:
        return None

    routed = lookup.tuned(KERNEL, db=url, baseline=route)(body)
    kernel = get_kernel(KERNEL)
    shape_of = kernel.shape_of
    assert shape_of is not None

    def through_lookup(x: Any, y: Any) -> Any:
        choice = lookup.lookup_choice(kernel, dict(shape_of(x, y)), str(x.dtype), db=url)
        if choice.runs == "baseline":
            return route(x, y)
        return body(x, y, config=choice.config)

    def loop_ns(fn: Callable[..., Any], n: int) -> int:
        start = time.process_time_ns()
        for _ in range(n):
            fn(a, b)
        return time.process_time_ns() - start

    routed(a, b)
    through_lookup(a, b)
    now, before = [], []
    n = 5000
    for _ in range(max(5, samples // 10)):
        direct = loop_ns(lambda x, y: body(x, y, config=None), n)
        now.append((loop_ns(routed, n) - direct) / n / 1000)
        before.append((loop_ns(through_lookup, n) - direct) / n / 1000)
    arrays = ", jax arrays" if jax_arrays else ""
    return [
        _summary(f"decorator, cached{arrays} (@tuned with baseline=, minus a direct call; CPU time)", now),
        _summary("decorator path without its per-signature cache (lookup cache only; CPU time)",
                 before),
    ]


def query_plan(url: str, shape: dict[str, int]) -> list[str]:
    """SQLite's plan for the best-trial query with the version filter."""
    problem = Problem(KERNEL, shape, DTYPE)
    with Store(url) as store:
        if store.engine.dialect.name != "sqlite":
            return []
        query = (
            keys.trial_query()
            .where(schema.Problems.digest == problem.digest())
            .where(schema.Trials.status == "ok", schema.Trials.median_us.is_not(None))
            .where(schema.Devices.kind == "gpu", schema.Software.jax == "0.10.2")
            .order_by(schema.Trials.median_us, schema.Trials.id)
            .limit(1)
        )
        sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
        with store.engine.connect() as conn:
            return [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1_000_000)
    p.add_argument("--problems", type=int, default=1000)
    p.add_argument("--samples", type=int, default=1000, help="timed lookups per kind")
    p.add_argument("--db", help="an empty database (default: a temporary SQLite file)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decorator-only", action="store_true",
                   help="time only the decorator's cost per cached call")
    p.add_argument("--jax-arrays", action="store_true",
                   help="the decorated calls take jax arrays (imports jax)")
    args = p.parse_args()
    tmp = None
    url = args.db
    if url is None:
        tmp = tempfile.mkdtemp(prefix="lookup-latency-")
        url = f"sqlite:///{tmp}/autotune.db"
    start = time.perf_counter()
    shapes = build(url, trials=args.trials, problems=args.problems, seed=args.seed)
    build_s = time.perf_counter() - start
    size = ""
    path = storage.sqlite_path(storage.resolve_url(url))
    if path is not None:
        size = f", {path.stat().st_size / 2**20:.0f} MiB"
    with Store(url) as store, store.engine.connect() as conn:
        stored = conn.scalar(sa.text("SELECT count(*) FROM at_trials"))
    print(f"database: {stored:,} trials (of {args.trials:,} asked: valid configs only), "
          f"{len(shapes):,} problems, built in {build_s:.1f} s{size}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}, SQLAlchemy {sa.__version__}, {url.split(':')[0]}")
    print("\n| lookup | samples | median (us) | p90 (us) | goal |")
    print("|---|---|---|---|---|")
    for label, n, median, p90 in measure(url, shapes, samples=args.samples, seed=args.seed,
                                         decorator_only=args.decorator_only,
                                         jax_arrays=args.jax_arrays):
        goal = GOALS_US.get(label.split(" ")[0].rstrip(","), None) if label.startswith(
            ("cached", "cold (", "decorator, cached")) else None
        verdict = "-" if goal is None else f"< {goal:g} us: {'met' if p90 < goal else 'MISSED'} (p90)"
        print(f"| {label} | {n} | {median:.1f} | {p90:.1f} | {verdict} |")
    print("\nquery plan of the best-trial query (gpu, running jax):")
    for line in query_plan(url, shapes[0]):
        print("  " + line)
    queries.close_stores()


if __name__ == "__main__":
    main()

"""How far one PostgreSQL carries a job shared by many hosts (CPU, simulated).

    python3 benchmarks/scale_out.py --runners 16,64 --out /tmp/scale_out.json
    python3 benchmarks/scale_out.py --db postgresql+psycopg://user@dbhost/autotune --runners 64

Each runner stands in for one host running ``autotune tune JOB --db postgresql://...``: the real
job runner (:func:`autotune.tuning.tuner.run_job`), in a thread of this process, over an
in-process engine whose configs take ``--run-ms`` of "GPU" and no compile, so the database is
what is measured. Every runner gets the same job (``--problems`` x ``--trials``), which must end
with exactly that many results stored, none twice.

Printed per runner count: wall time, trials stored, trials/s, and per trial the statements,
transactions begun and committed (SQLAlchemy's events; each a round trip with psycopg). The
runners share one pool (at most 45 connections: 30 for Optuna, 15 for the store) where hosts
would hold about 2 each. ``server ms/trial``: the server backends' CPU time (from /proc, so for
a server on this machine) per trial: one server core sustains about 1000 / that trials per
second. Waiting hosts poll (backing off to 30 s): a large share of statements at configs of ms.

The PostgreSQL schema is new for each run and dropped afterwards.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from autotune.replay.sim_kernels import QUICK  # noqa: E402
from autotune.space.outcomes import DeviceInfo, TrialResult  # noqa: E402
from autotune.space.problem import Config  # noqa: E402
from autotune.storage.store import Store  # noqa: E402
from autotune.tuning import studies, tuner  # noqa: E402
from autotune.tuning.jobs import Budget, Job, ProblemSpec  # noqa: E402
from autotune.tuning.trial_index import OUTCOME_ATTR  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.ERROR)

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


class SimEngine:
    """One host's engine: ``parallelism`` configs at a time, each ``run_ms`` long."""

    def __init__(self, run_ms: float, parallelism: int) -> None:
        self.run_s, self.parallelism = run_ms / 1000, parallelism

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(name="sim-gpu", kind="fake")

    def submit(self, kernel_name: str, problem: Any, config: Any) -> Future[TrialResult]:
        future: Future[TrialResult] = Future()
        cost = float(config["cost_us"])
        timer = threading.Timer(self.run_s, lambda: future.set_result(
            TrialResult.timed([cost, cost, cost], compile_s=0.0, rel_error=0.0, timing="fake")))
        timer.daemon = True
        timer.start()
        return future

    def baseline(self, kernel_name: str, problem: Any) -> TrialResult:
        raise AssertionError("QUICK has no baseline")

    def trace(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class Counter:
    """Statements, transactions and connections over every SQLAlchemy engine of the process."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.open = self.max_open = 0
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._statement)
        sa.event.listen(sa.engine.Engine, "begin", lambda conn: self._add("begin"))
        sa.event.listen(sa.engine.Engine, "commit", lambda conn: self._add("commit"))
        sa.event.listen(sa.engine.Engine, "rollback", lambda conn: self._add("rollback"))
        sa.event.listen(sa.pool.Pool, "checkout", self._checkout)
        sa.event.listen(sa.pool.Pool, "checkin", self._checkin)

    def _add(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        word = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        with self.lock:
            self.counts["statement"] += 1
            self.counts[word] += 1

    def _checkout(self, *args: Any) -> None:
        with self.lock:
            self.open += 1
            self.max_open = max(self.max_open, self.open)

    def _checkin(self, *args: Any) -> None:
        with self.lock:
            self.open -= 1

    def reset(self) -> None:
        with self.lock:
            self.counts.clear()
            self.max_open = self.open


def _schema(url: str) -> tuple[str, str]:
    """A new schema on the server and the URL that uses it (its connections are named after
    it: ``application_name``)."""
    schema = f"scale_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    sep = "&" if "?" in url else "?"
    return schema, f"{url}{sep}options=-csearch_path%3D{schema}&application_name={schema}"


def _server_cpu_s(url: str, schema: str) -> float | None:
    """CPU seconds the server's backends of this run have used, read from /proc (a server on
    this machine only; None elsewhere)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        pids = [r[0] for r in conn.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"), {"a": schema})]
    engine.dispose()
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
    return total if pids else None


def _drop(url: str, schema: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


def run(args: argparse.Namespace, runners: int, counter: Counter) -> dict[str, Any]:
    schema, url = _schema(args.db)
    try:
        job = Job("scale", tuple(
            ProblemSpec(QUICK.problem({"n": i + 1}, "float32"), Budget(trials=args.trials),
                        sampler=args.sampler, seed=i, trace_top_k=0)
            for i in range(args.problems)))
        store = Store(url)  # creates the schema once, before the clock
        # One Optuna storage for every runner thread, as studies.optuna_storage makes it, with a
        # pool large enough for 64 threads on a small machine (they wait for the GIL, not PG).
        with warnings.catch_warnings():  # heartbeat_interval is "experimental" since 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                store.url, engine_kwargs={"pool_size": 30, "max_overflow": 0,
                                          "pool_timeout": 600, "pool_pre_ping": True},
                heartbeat_interval=studies.HEARTBEAT_S, grace_period=studies.GRACE_S)
        real = tuner.optuna_storage
        tuner.optuna_storage = lambda _url: storage  # one pool for every runner thread
        errors: list[BaseException] = []

        def runner() -> None:
            try:
                tuner.run_job(job, store=store, engine=SimEngine(args.run_ms, args.parallelism),
                              allow_import=True)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=runner, name=f"runner-{i}") for i in range(runners)]
        counter.reset()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        tuner.optuna_storage = real
        counts = dict(counter.counts)
        server_s = _server_cpu_s(args.db, schema)  # before the pools close their connections
        released = 0  # trials asked and let go unmeasured (twins, or over the budget)
        for name in optuna.get_all_study_names(storage=storage):
            released += sum(1 for t in optuna.load_study(study_name=name, storage=storage)
                            .get_trials(deepcopy=False)
                            if t.state == optuna.trial.TrialState.FAIL
                            and OUTCOME_ATTR not in t.system_attrs)
        if errors:
            raise SystemExit(f"a runner failed: {errors[0]!r}")
        rows = store.trials()
        per_problem = collections.Counter(r.problem for r in rows)
        keys = collections.Counter((r.problem, Config(r.config).digest()) for r in rows)
        storage.engine.dispose()
        store.close()
        n = len(rows)
        transactions = counts.get("begin", 0)
        return {
            "runners": runners, "problems": args.problems, "trials_per_problem": args.trials,
            "wall_s": wall, "trials": n, "trials_per_s": n / wall,
            "exact_budget": all(v == args.trials for v in per_problem.values())
            and len(per_problem) == args.problems,
            "measured_twice": sum(v - 1 for v in keys.values()),
            "statements_per_trial": counts.get("statement", 0) / n,
            "select_per_trial": counts.get("SELECT", 0) / n,
            "write_per_trial": sum(counts.get(k, 0) for k in ("INSERT", "UPDATE", "DELETE")) / n,
            "transactions_per_trial": transactions / n,
            "round_trips_per_trial": (counts.get("statement", 0) + transactions
                                      + counts.get("commit", 0)) / n,
            "max_connections_open": counter.max_open,
            "server_cpu_ms_per_trial": None if server_s is None else 1000 * server_s / n,
            "released_per_trial": released / n,
        }
    finally:
        _drop(args.db, schema)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=DEFAULT_PG, help="a PostgreSQL server URL (a schema is made)")
    p.add_argument("--runners", default="16,64", help="runner counts, e.g. 16,64")
    p.add_argument("--problems", type=int, default=32)
    p.add_argument("--trials", type=int, default=12, help="per problem")
    p.add_argument("--run-ms", type=float, default=5.0)
    p.add_argument("--parallelism", type=int, default=3, help="configs in flight per runner")
    p.add_argument("--sampler", default="random")
    p.add_argument("--out")
    args = p.parse_args(argv)
    counter = Counter()
    results = []
    print(f"{'runners':>7} {'trials':>6} {'wall s':>7} {'trials/s':>8} {'exact':>5} {'twice':>5} "
          f"{'stmts/trial':>11} {'SELECT':>6} {'writes':>6} {'txns':>5} {'round trips':>11} "
          f"{'conns':>5} {'server ms/trial':>15} {'released':>8}")
    for n in [int(x) for x in args.runners.split(",")]:
        m = run(args, n, counter)
        results.append(m)
        print(f"{m['runners']:>7} {m['trials']:>6} {m['wall_s']:>7.1f} {m['trials_per_s']:>8.1f} "
              f"{'yes' if m['exact_budget'] else 'NO':>5} {m['measured_twice']:>5} "
              f"{m['statements_per_trial']:>11.1f} {m['select_per_trial']:>6.1f} "
              f"{m['write_per_trial']:>6.1f} {m['transactions_per_trial']:>5.1f} "
              f"{m['round_trips_per_trial']:>11.1f} {m['max_connections_open']:>5} "
              f"{_fmt(m['server_cpu_ms_per_trial']):>15} {m['released_per_trial']:>8.2f}",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

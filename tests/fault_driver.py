"""The real ``autotune tune`` command with faults injected at chosen points (tests/test_faults.py).

Run as ``python -m tests.fault_driver [FAULT OPTIONS] -- tune JOB.toml --db URL ...``: it installs
the faults asked for, swaps the engine for a real fake-mode :class:`~autotune.engine.dispatcher.Engine`
(worker processes that crash, hang or time configs as the config says, no GPU, no jax) and runs
:func:`autotune.cli.main` with the arguments after ``--``, exiting with its exit code. So the
command line, the job runner, the store, Optuna and the worker processes are the real ones; only
the evaluator is the fake one and the faults are added. :func:`run_in_process` runs the same
in the caller's process (a test's re-run without the faults that act on the process), undoing
every patch after.

Faults (each fires once, at the Nth matching event, counting from 1):

* ``--kill-on-sql REGEX --nth N``: SIGKILL right after the Nth executed SQL statement matching
  REGEX, inside its open transaction (a Store write, an Optuna write, a migration);
* ``--kill-before-store N`` / ``--kill-after-store N``: SIGKILL when the Nth measured result
  reaches ``Store.record_trial`` (measured, not stored) / just after it is committed (stored,
  not yet told to Optuna);
* ``--sigint-after-store N``: a Ctrl-C after the Nth stored trial;
* ``--lock-after-store N --lock-s S``: after the Nth stored trial, another process takes the
  SQLite database's write lock (``BEGIN EXCLUSIVE``) and holds it for S seconds;
* ``--readonly-after-store N``: after the Nth stored trial the database files become read-only
  (``chattr +i`` as root, where permissions do not bind; ``chmod`` otherwise);
* ``--max-pages-headroom P``: SQLite may grow by P pages at most (``PRAGMA max_page_count``),
  then writes fail with SQLITE_FULL, as on a full disk;
* ``--fsize-headroom B``: the process may write files up to B bytes past the database's size
  (``RLIMIT_FSIZE``): the write-ahead log's growth fails in the kernel;
* ``--busy-timeout-s S``: how long SQLite waits for a lock (default: the package's);
* ``--hostname NAME``: the tuner believes it runs on host NAME (a tuner of another host);
  ``--grace-s S``: after how long without a heartbeat another host's trial counts as dead;
  ``--max-poll-s S``: a problem that cannot be asked (its last configs held by other hosts'
  trials) is looked at again within S seconds (the package's back-off goes up to
  ``scheduler.MAX_POLL_S``, 30 s: a dead host's trial, stale at ``--grace-s``, would be
  found up to that long after).

Every committed trial is appended to ``--journal`` (JSON lines, fsynced) before anything else
happens, so a test knows exactly which finished trials must survive.

Kernels for the job files (named ``tests.fault_driver:NAME``, so jobs need ``--allow-import``):
``STEADY`` (64 configs that time fine, ``run_ms`` each), ``PACED`` (32 configs of
``PACED_RUN_MS`` each), ``FLAKY`` (configs that crash the worker, hang it, or time fine) and
``SLOW`` (half its configs compile for a minute: give ``--trial-timeout-s`` above that for them
to finish).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.space.kernel import Kernel
from autotune.space.search_space import Choice, Space

KILL_EXIT = -signal.SIGKILL


def _never(*args: Any) -> Any:
    raise NotImplementedError("only the fake evaluator runs this kernel")


STEADY = Kernel(
    name="tests.fault_driver:STEADY",
    space=Space(
        params=(
            Choice("cost_us", tuple(range(10, 74)), ordered=True),
            Choice("run_ms", (40,)),
        )
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never,
    make_inputs=_never,
    reference=_never,
    description="fake configs that all time fine (fault tests)",
)

# Configs whose run takes RUN_MS on the (fake) GPU: jobs whose wall time is the GPU's, so that
# N runners finish in about 1/N of one runner's time (tests/tuning/test_scheduler.py).
PACED_RUN_MS = 500
PACED = Kernel(
    name="tests.fault_driver:PACED",
    space=Space(
        params=(
            Choice("cost_us", tuple(range(10, 42)), ordered=True),
            Choice("run_ms", (PACED_RUN_MS,)),
        )
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never,
    make_inputs=_never,
    reference=_never,
    description="fake configs that take the GPU for PACED_RUN_MS each (scheduler tests)",
)

FLAKY = Kernel(
    name="tests.fault_driver:FLAKY",
    space=Space(
        params=(
            Choice("cost_us", (10, 20), ordered=True),
            Choice("mode", ("ok", "segfault", "hang")),
        )
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never,
    make_inputs=_never,
    reference=_never,
    description="fake configs that crash or hang their worker (fault tests)",
)


SLOW = Kernel(
    name="tests.fault_driver:SLOW",
    space=Space(
        params=(
            Choice("cost_us", tuple(range(10, 34)), ordered=True),
            Choice("mode", ("sleep",)),
            Choice("stage", ("compile",)),
            Choice("sleep_ms", (0, 60_000)),  # half the configs compile for a minute
        )
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never,
    make_inputs=_never,
    reference=_never,
    description="fake configs of which half take a minute to compile (interrupt tests)",
)


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def sqlite_file(url: str) -> Path | None:
    from autotune.storage.urls import resolve_url, sqlite_path

    return sqlite_path(resolve_url(url))


def db_files(path: Path) -> list[Path]:
    """The database file, its WAL and shared-memory files (those that exist), and its folder."""
    files = [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
    return [*files, path.parent]


def set_read_only(path: Path, read_only: bool) -> None:
    """Makes the database file, its write-ahead log and their folder read-only, or writable
    again, for real.

    As root, permission bits do not stop writes: the immutable attribute (``chattr +i``) does,
    even through file descriptors already open. The WAL index (``-shm``) is left alone: SQLite
    maps it into memory, and the kernel answers a write to a mapped immutable file with SIGBUS.
    """
    for p in db_files(path):
        if p.name.endswith("-shm"):
            continue
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i" if read_only else "-i", str(p)], check=True)
        elif p.is_dir():
            p.chmod(0o555 if read_only else 0o755)
        else:
            p.chmod(0o444 if read_only else 0o644)


_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process holding the SQLite write lock of ``path`` for ``seconds`` (returns once
    it holds it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(path), str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "locked":
        proc.kill()
        raise RuntimeError(f"the lock holder did not take the lock: {line!r}")
    return proc


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m tests.fault_driver [FAULTS] -- tune JOB ...")
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="fault_driver")
    p.add_argument("--journal", required=True)
    p.add_argument("--kill-on-sql")
    p.add_argument("--nth", type=int, default=1)
    p.add_argument("--kill-before-store", type=int)
    p.add_argument("--kill-after-store", type=int)
    p.add_argument("--sigint-after-store", type=int)
    p.add_argument("--lock-after-store", type=int)
    p.add_argument("--lock-s", type=float, default=3.0)
    p.add_argument("--readonly-after-store", type=int)
    p.add_argument("--max-pages-headroom", type=int)
    p.add_argument("--fsize-headroom", type=int)
    p.add_argument("--busy-timeout-s", type=float)
    p.add_argument("--hostname")
    p.add_argument("--grace-s", type=float)
    p.add_argument("--max-poll-s", type=float)
    p.add_argument("--trial-timeout-s", type=float, default=1.0)
    # An interrupted job's engine takes this long to close: a second signal then surely comes
    # while the first one's shutdown is under way (it can otherwise be over in 30 ms).
    p.add_argument("--slow-close-s", type=float, default=0.0)
    return p.parse_args(argv[:split]), argv[split + 1:]


def _db_url(cli_args: Sequence[str]) -> str:
    return cli_args[cli_args.index("--db") + 1] if "--db" in cli_args else os.environ["AUTOTUNE_DB"]


def main(argv: Sequence[str] | None = None) -> int:
    opts, cli_args = _parse(sys.argv[1:] if argv is None else argv)
    undo: list[Callable[[], None]] = []
    try:
        return _run(opts, cli_args, undo)
    finally:
        for step in reversed(undo):  # in-process (run_in_process): leave no patch behind
            step()


# The faults that act on the process itself (kill it, signal it, limit it, or leave a lock
# holder or read-only files behind): run_in_process refuses them.
PROCESS_FAULTS = (
    "--kill-on-sql", "--kill-before-store", "--kill-after-store", "--sigint-after-store",
    "--lock-after-store", "--readonly-after-store", "--fsize-headroom", "--slow-close-s",
)


def run_in_process(argv: Sequence[str]) -> tuple[int, str, str]:
    """:func:`main` with ``argv`` in this process (a test's re-run without faults): the same
    command line, job runner, store, Optuna and worker processes, without starting and
    importing a fresh interpreter; returns the exit code, stdout and stderr. Every patch
    :func:`main` makes is undone after, and the environment is the one :class:`Job` gives its
    subprocesses (no ``CUDA_VISIBLE_DEVICES`` or ``AUTOTUNE_DB``)."""
    if any(arg in PROCESS_FAULTS for arg in argv[: list(argv).index("--")]):
        raise ValueError(f"a fault that acts on the process needs its own process: {argv}")
    import contextlib
    import io

    saved = {k: os.environ.pop(k) for k in ("CUDA_VISIBLE_DEVICES", "AUTOTUNE_DB") if k in os.environ}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def _run(opts: argparse.Namespace, cli_args: list[str], undo: list[Callable[[], None]]) -> int:
    import sqlalchemy as sa

    import autotune.api
    from autotune.cli import main as cli_main
    from autotune.engine.dispatcher import Engine
    from autotune.storage import connection as storage_connection
    from autotune.storage import store as storage

    def patch(obj: Any, name: str, value: Any) -> None:
        old = getattr(obj, name)
        setattr(obj, name, value)
        undo.append(lambda: setattr(obj, name, old))

    def listen(target: Any, event: str, fn: Callable[..., None]) -> None:
        sa.event.listen(target, event, fn)
        undo.append(lambda: sa.event.remove(target, event, fn))

    db_path = sqlite_file(_db_url(cli_args))
    journal = open(opts.journal, "a", encoding="utf-8")  # noqa: SIM115 - open until exit
    undo.append(journal.close)  # a lock holder still running is left to its process group's end

    class SlowClosingEngine(Engine):
        def close(self, *, cancel_pending: bool = False, kill_running: bool = False) -> None:
            if kill_running:
                time.sleep(opts.slow_close_s)
            super().close(cancel_pending=cancel_pending, kill_running=kill_running)

    def fake_engine(device: str = "auto", **kwargs: Any) -> Engine:
        return (SlowClosingEngine if opts.slow_close_s else Engine)(
            "fake", allow_import=True, workers_per_gpu=1, compile_threads=2,
            trial_timeout_s=opts.trial_timeout_s, compile_timeout_s=opts.trial_timeout_s,
            log_dir=kwargs.get("log_dir"),
        )

    patch(autotune.api, "open_engine", fake_engine)  # the CLI looks it up at call time
    # The versions stored with each trial, read without importing jax (2 s per process here).
    from importlib.metadata import version

    import autotune._jax_compat

    patch(autotune._jax_compat, "jax_versions",
          lambda: {"jax": version("jax"), "jaxlib": version("jaxlib")})

    if opts.busy_timeout_s is not None:
        patch(storage_connection, "SQLITE_BUSY_TIMEOUT_S", opts.busy_timeout_s)
    if opts.hostname is not None:
        import socket

        patch(socket, "gethostname", lambda: opts.hostname)
    if opts.grace_s is not None:
        import autotune.tuning.studies

        patch(autotune.tuning.studies, "GRACE_S", opts.grace_s)
    if opts.max_poll_s is not None:
        import autotune.tuning.scheduler

        patch(autotune.tuning.scheduler, "POLL_S",
              min(autotune.tuning.scheduler.POLL_S, opts.max_poll_s))
        patch(autotune.tuning.scheduler, "MAX_POLL_S", opts.max_poll_s)

    if opts.kill_on_sql:
        pattern = re.compile(opts.kill_on_sql, re.IGNORECASE)
        seen = [0]

        def _kill_in_write(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if pattern.search(statement.lstrip()):
                seen[0] += 1
                if seen[0] == opts.nth:
                    _die()  # the statement ran; its transaction is still open

        listen(sa.engine.Engine, "after_cursor_execute", _kill_in_write)

    if opts.max_pages_headroom is not None:
        limit: list[int] = []

        def _cap_pages(dbapi_connection: Any, record: Any) -> None:
            if "sqlite" not in type(dbapi_connection).__module__:
                return
            cursor = dbapi_connection.cursor()
            if not limit:
                pages = cursor.execute("PRAGMA page_count").fetchone()[0]
                limit.append(pages + opts.max_pages_headroom)
            cursor.execute(f"PRAGMA max_page_count = {int(limit[0])}")
            cursor.close()

        listen(sa.pool.Pool, "connect", _cap_pages)

    if opts.fsize_headroom is not None:
        assert db_path is not None
        size = max((p.stat().st_size for p in db_files(db_path)[:-1]), default=0)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        cap = size + opts.fsize_headroom
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    stored = [0]
    original = storage.Store.record_trial
    lockers: list[subprocess.Popen[str]] = []

    def record_trial(self: Any, problem: Any, config: Any, result: Any, **kwargs: Any) -> Any:
        if opts.kill_before_store == stored[0] + 1:
            _die()  # measured, not stored
        recorded = original(self, problem, config, result, **kwargs)
        stored[0] += 1
        journal.write(json.dumps({
            "id": recorded.id, "duplicate": recorded.duplicate, "problem": problem.digest(),
            "config": config.digest(), "status": result.outcome.value,
            "median_us": result.median_us, "t": time.time(),
        }) + "\n")
        journal.flush()
        os.fsync(journal.fileno())
        n = stored[0]
        if opts.kill_after_store == n:
            _die()  # stored, not told to Optuna
        if opts.sigint_after_store == n:
            os.kill(os.getpid(), signal.SIGINT)
        if opts.lock_after_store == n:
            assert db_path is not None
            lockers.append(hold_lock(db_path, opts.lock_s))
        if opts.readonly_after_store == n:
            assert db_path is not None
            set_read_only(db_path, True)
        return recorded

    patch(storage.Store, "record_trial", record_trial)
    return cli_main(cli_args)


if __name__ == "__main__":
    from autotune.interrupts import end_process

    end_process(main())

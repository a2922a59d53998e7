"""Tuning from Python: ``autotune.tune(...)`` for notebooks and scripts.

The CLI's ``autotune tune JOB.toml`` and this function share one path, :func:`run_tuning`: a
:class:`Job` run by :func:`autotune.tuning.tuner.run_job` over an engine and a store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import JobError
from autotune.space.kernel import BUNDLED, Kernel, resolve_kernel
from autotune.tuning.jobs import Job, parse_job

if TYPE_CHECKING:
    from autotune.engine.dispatcher import Engine
    from autotune.progress import Progress
    from autotune.storage.store import Store
    from autotune.tuning.reports import Event, ProblemReport

__all__ = ["tune", "tuned", "detect_device", "open_engine", "count_gpus", "compilation_cache_folder"]


def detect_device() -> str:
    """``"gpu"`` if jax sees a CUDA GPU (:func:`count_gpus`), else ``"interpret"``. A machine
    whose NVIDIA driver lists no GPU (:func:`autotune.queries.best.host_has_gpu`) is answered
    without starting jax in a child process (1.5 to 2.5 s of the quickstart on 2 cores)."""
    from autotune.queries import best as best_queries

    if not best_queries.host_has_gpu():
        return "interpret"
    return "gpu" if count_gpus() > 0 else "interpret"


# jax's CUDA plugins (jax >= 0.4.30 ships CUDA support only as these).
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12",
                 "jax_plugins.xla_cuda13")


def count_gpus() -> int:
    """GPUs jax can see, without importing jax here or initialising CUDA (the engine's workers
    own the GPUs): 0 when no CUDA plugin of jax is installed; else NVML's count (the driver's
    library, through ctypes, no CUDA context) when ``CUDA_VISIBLE_DEVICES`` is unset; else
    (NVML missing, or a visibility list to apply) jax's own count, asked in a child process
    (1.65 s of imports: issue 36)."""
    if not _cuda_plugin_installed():
        return 0
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        found = _nvml_gpu_count()
        if found is not None:
            return found
    return _jax_gpu_count()


def _cuda_plugin_installed() -> bool:
    import importlib.util

    for name in _CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _nvml_gpu_count() -> int | None:
    """The driver's GPU count from NVML (``libnvidia-ml.so.1``), or None where NVML is not
    there or fails."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    count = ctypes.c_uint(0)
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            return int(count.value) if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
        finally:
            nvml.nvmlShutdown()
    except AttributeError:  # an NVML without these entry points
        return None


def _jax_gpu_count() -> int:
    """GPUs jax sees, asked in a child process (this one never initialises CUDA)."""
    code = "import jax\ntry:\n print(len(jax.devices('gpu')))\nexcept RuntimeError:\n print(0)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
        ).stdout.strip().splitlines()
        return int(out[-1]) if out else 0
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def open_engine(
    device: str = "auto",
    *,
    gpus: Sequence[int] | None = None,
    allow_import: bool = False,
    iterations: int | None = None,
    trial_timeout_s: float | None = None,
    log_dir: str | None = None,
    cache: str | None = None,
    workers_per_gpu: int | None = None,
    compile_threads: int | None = None,
    compilation_cache: str | None = None,
) -> Engine:
    """The engine for ``device`` ("auto", "gpu", "interpret"); worker logs go to ``log_dir``;
    ``cache``: the cache policy (None: cold on a GPU, warm in interpret mode).
    ``workers_per_gpu`` and ``compile_threads`` default to the machine's cores and GPU memory
    (:func:`autotune.engine.layout.default_layout`). ``compilation_cache``: the folder of JAX's
    persistent compilation cache for the workers (None: off; :func:`compilation_cache_folder`)."""
    from autotune.engine.dispatcher import Engine

    if device not in ("auto", "gpu", "interpret"):
        raise JobError(f"--device must be auto, gpu or interpret, got {device!r}.")
    mode = detect_device() if device == "auto" else device
    return Engine(
        mode=mode,
        gpus=gpus,
        allow_import=allow_import,
        iterations=iterations,
        trial_timeout_s=trial_timeout_s,
        log_dir=log_dir,
        cache=cache,
        workers_per_gpu=workers_per_gpu,
        compile_threads=compile_threads,
        compilation_cache=compilation_cache,
    )


def compilation_cache_folder(choice: str, *, results_dir: str, device: str) -> str | None:
    """Where the workers keep JAX's persistent compilation cache: ``choice`` is ``"auto"``
    (``<results_dir>/jax_cache`` on a GPU, off in interpret mode), ``"off"``, or a folder.

    On the H200 the cache saves the baselines' autotuned compiles of a job run again
    (benchmarks/RESULTS.md §10); interpret mode compiles in well under a second.
    """
    if choice == "off":
        return None
    if choice == "auto":
        return str(Path(results_dir) / "jax_cache") if device == "gpu" else None
    return choice


def tune(
    kernel: str | Kernel,
    problems: Sequence[Mapping[str, Any]],
    *,
    dtype: str | Sequence[str] = "bfloat16",
    trials: int | None = 32,
    seconds: float | None = None,
    patience: int | None = None,
    sampler: str = "auto",
    seed: int | None = 0,
    db: str | None = None,
    device: str = "auto",
    allow_import: bool = False,
    on_event: Callable[[Event], None] | None = None,
    progress: bool = True,
    cache: str | None = None,
    device_profile: str | None = None,
) -> list[ProblemReport]:
    """Tunes ``kernel`` for each shape in ``problems``; returns one report per problem.

    Args:
      kernel: a bundled kernel's name, ``"package.module:NAME"`` (with ``allow_import``), or a
        :class:`Kernel` object declared as a global of your own module; its results are
        stored under ``"module:NAME"`` (what ``autotune best`` and job files name it by),
        and the worker processes import it from there.
      problems: shapes, e.g. ``[{"m": 4096, "n": 4096, "k": 4096}]``.
      dtype: one dtype or several.
      trials, seconds: the budget per problem (whichever ends first).
      patience: stop a problem early after this many measured configs in a row without a
        better one (0: never; None: the default, 24).
      db: a SQLAlchemy URL; default ``$AUTOTUNE_DB`` or ``sqlite:///results/autotune.db``.
      device: "auto" (GPU if present, else interpret mode), "gpu" or "interpret".
      on_event: called with each :class:`~autotune.tuning.reports.Event` (an observer, as in
        :mod:`autotune.progress`).
      progress: show a live progress bar per problem where a person is watching (stderr is a
        terminal, or a Jupyter kernel runs this); ``False`` shows nothing.
      cache: "cold" (the L2 flushed between timed runs; the default on a GPU) or "warm".
      device_profile: the device to work for where no GPU can be asked (interpret mode on a
        CPU): a name of :data:`autotune.devices.PROFILES` (default: ``$AUTOTUNE_DEVICE_PROFILE``,
        else ``"h100-sxm"``). Its SM count sizes persistent grids, its shared memory the
        spaces. A GPU the driver reports is used as it is.

    Returns:
      One :class:`~autotune.tuning.reports.ProblemReport` per problem: ``best_config``, ``best_us``,
      ``baseline_us``, ``speedup``, ``tflops``, ``gbps``, ``by_status`` (trials per outcome).

    Results are stored as they come; calling again resumes, measuring nothing twice.

    Raises:
      JobError: a bad problem or setting, or a kernel object the worker processes cannot
        import (one that is not a global of an importable module), an unknown
        ``device_profile``, or a device of an architecture the kernel does not support.
    """
    from autotune.devices import using_profile

    with using_profile(device_profile):
        return _tune(kernel, problems, dtype=dtype, trials=trials, seconds=seconds,
                     patience=patience, sampler=sampler, seed=seed, db=db, device=device,
                     allow_import=allow_import, on_event=on_event, progress=progress,
                     cache=cache)


def _tune(
    kernel: str | Kernel,
    problems: Sequence[Mapping[str, Any]],
    *,
    dtype: str | Sequence[str],
    trials: int | None,
    seconds: float | None,
    patience: int | None,
    sampler: str,
    seed: int | None,
    db: str | None,
    device: str,
    allow_import: bool,
    on_event: Callable[[Event], None] | None,
    progress: bool,
    cache: str | None,
) -> list[ProblemReport]:
    if isinstance(kernel, Kernel):
        # Worker processes import the kernel by its path; passing the object is the consent.
        resolved = resolve_kernel(kernel)
        if resolved.name not in BUNDLED and ":" not in resolved.name:
            raise JobError(
                f"Kernel {kernel.name!r} cannot be imported by the worker processes that "
                "measure it: declare it as a global of a module (my_kernels.py, "
                "KERNEL = autotune.Kernel(...)) and import it from there, not in a script or "
                "a notebook cell. It is then stored as 'my_kernels:KERNEL'."
            )
        name = resolved.name
        allow_import = allow_import or ":" in name
    else:
        name = kernel
    # Checked before anything is opened or written (tune() is the API's job file).
    if (
        isinstance(problems, str | Mapping)
        or not isinstance(problems, Sequence)
        or not problems
        or not all(isinstance(p, Mapping) for p in problems)
    ):
        raise JobError(
            "tune(): problems must be a non-empty list of shapes such as "
            f"[{{'m': 4096, 'n': 4096, 'k': 4096}}], but got {problems!r}."
        )
    if device not in ("auto", "gpu", "interpret"):
        raise JobError(f"tune(): device must be auto, gpu or interpret, but got {device!r}.")
    dtypes = [dtype] if isinstance(dtype, str) or not isinstance(dtype, Sequence) else list(dtype)
    settings: dict[str, Any] = {"sampler": sampler}
    if trials is not None:
        settings["trials"] = trials
    if seconds is not None:
        settings["seconds"] = seconds
    if patience is not None:
        settings["patience"] = patience
    if seed is not None:
        settings["seed"] = seed
    data = {
        "defaults": settings,
        "problem": [{"kernel": name, "shapes": [dict(p) for p in problems], "dtypes": dtypes}],
    }
    if cache is not None:
        data["cache"] = cache
    job: Job = parse_job(data, name="api", allow_import=allow_import, where="tune()")
    from autotune.progress import BarProgress, Progress, make_progress

    observer: Progress = Progress()
    if progress and _watched():
        # A terminal gets bars, or lines where it has no size; a notebook gets its bars.
        observer = make_progress("auto") if _stderr_is_terminal() else BarProgress()

    def events(event: Event) -> None:
        observer(event)
        if on_event is not None:
            on_event(event)

    import optuna

    # A library does not print: Optuna's "A new study created ..." lines (INFO, to stderr) are
    # its bookkeeping; its warnings still show. The caller's verbosity is restored after.
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(verbosity, optuna.logging.WARNING))
    try:
        return run_tuning(job, db=db, device=device, allow_import=allow_import,
                          observer=observer, on_event=events)
    finally:
        optuna.logging.set_verbosity(verbosity)


def run_tuning(
    job: Job,
    *,
    db: str | None,
    device: str,
    allow_import: bool,
    observer: Progress,
    on_event: Callable[[Event], None],
    results_dir: str | None = None,
    gpus: Sequence[int] | None = None,
    log_dir: str | None = None,
    layout: Mapping[str, int] | None = None,
    on_store: Callable[[Store], None] | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    compilation_cache: str = "auto",
) -> list[ProblemReport]:
    """The one run path of ``autotune tune`` and :func:`tune`: opens the store (refusing an
    in-memory one before any worker starts), the engine for ``device``, and runs ``job``
    while ``observer`` is active; ``on_store(store)`` is called once the store is open (the
    CLI names the database), ``on_engine(engine)`` once the engine is (the CLI hooks Ctrl-C to
    it); ``compilation_cache`` as in :func:`compilation_cache_folder`. The store is closed
    whatever happens. ``results_dir`` None: :func:`autotune._paths.default_results_dir`."""
    from autotune._paths import default_results_dir
    from autotune.storage.store import Store

    results_dir = results_dir or default_results_dir()
    from autotune.tuning.tuner import require_persistent, run_job

    store = Store(db)
    try:
        if on_store is not None:
            on_store(store)
        require_persistent(store)  # before any worker process starts or writes its logs
        if device == "auto":
            device = detect_device()
        folder = compilation_cache_folder(compilation_cache, results_dir=results_dir,
                                          device=device)
        with observer.active(), open_engine(device, gpus=gpus, allow_import=allow_import,
                                            log_dir=log_dir, cache=job.cache,
                                            compilation_cache=folder,
                                            **dict(layout or {})) as engine:
            if on_engine is not None:
                on_engine(engine)
            return run_job(job, store=store, engine=engine, results_dir=results_dir,
                           on_event=on_event, allow_import=allow_import)
    finally:
        store.close()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _watched() -> bool:
    """Whether a person is likely watching: stderr is a terminal, or a Jupyter kernel runs."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):
        pass
    return "ipykernel" in sys.modules


# ------------------------------------------------------------------------ the run-time decorator

# tune_missing's claim on a problem: an Optuna study of this name in the results database.
# Creating a study is atomic in the database (its name is unique), on SQLite and PostgreSQL
# alike, so of the processes that meet one missing shape exactly one creates it and tunes.
CLAIM_PREFIX = "autotune-claim|"
# A claim older than this, or whose process on this host is gone, is taken over.
CLAIM_STALE_S = 15 * 60.0
# How often a process that did not win the claim looks for the stored answer (growing to MAX).
POLL_S = 0.5
MAX_POLL_S = 5.0
# How long a process waits for another's tuning of a shape before it stops asking.
WAIT_S = 30 * 60.0

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Budget:
    """What ``tune_missing`` spends on a missing shape."""

    trials: int
    patience: int | None


def _budget(tune_missing: bool | str | int) -> _Budget | None:
    """The budget ``tune_missing`` asks for (None: off), or a JobError naming the choices."""
    from autotune.cli import EFFORTS

    if tune_missing is False or tune_missing is None:
        return None
    if tune_missing is True:
        tune_missing = "quick"
    if isinstance(tune_missing, str) and tune_missing in EFFORTS:
        trials, patience = EFFORTS[tune_missing]
        return _Budget(trials, patience)
    if isinstance(tune_missing, int) and not isinstance(tune_missing, bool) and tune_missing > 0:
        return _Budget(tune_missing, None)
    raise JobError(
        "tuned(tune_missing=...) must be False, True (the quick effort), an effort name "
        f"({', '.join(map(repr, EFFORTS))}) or a number of trials above 0, but got "
        f"{tune_missing!r}."
    )


def tuned(
    kernel: str | Kernel,
    *,
    default: Any = None,
    db: str | None = None,
    device: str | None = None,
    table: Any = None,
    strict: bool = False,
    timeout_s: float | None = None,
    baseline: Callable[..., Any] | bool | None = None,
    prefer: str = "fastest",
    tune_missing: bool | str | int = False,
    block: bool = False,
    cache: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates ``fn(*arrays, config=None, **kw)`` so that a call without ``config`` runs
    with the best stored config of its shape (:func:`autotune.queries.lookup.tuned`: the
    lookup, its fallbacks, ``baseline=`` routing and ``prefer``), and, when asked, tunes a
    shape that has nothing stored.

    ``tune_missing``: off by default (the decorator never tunes unless asked). ``True`` or
    ``"quick"`` (16 trials, patience 8), ``"full"`` (256 trials, patience 48; the CLI's
    ``--effort`` names), or a number of trials: the first call of a shape with no result of
    exactly its problem stored for this device tunes it with :func:`tune` (``db``, the device
    found, no progress bars), stores the results in the database and serves them from then on.
    A later process finds them stored and tunes nothing.

    ``block``: ``False`` (default): the tuning runs on a background thread, and the calls
    meanwhile run with what the lookup answers without it (the nearest tuned shape's config,
    else the kernel's default config); the first call after the results are stored uses them.
    ``True``: the first call waits until the shape is tuned, then runs with its best config
    (as ``triton.autotune`` and tune-jax do on the first call of a shape).

    ``cache``: ``"cold"``, ``"warm"`` or None: which timings answer (config and verdict;
    :func:`autotune.queries.lookup.tuned`); a shape with none of that policy stored counts as
    missing, and ``tune_missing`` tunes it under that policy (None: the job's ``auto``).

    Under ``jax.jit`` the lookup runs while the function is traced (shapes are static there);
    no tuning happens in the trace itself: it runs in the engine's worker processes, and the
    trace either goes on with the fallback config (``block=False``; the jitted function keeps
    it until it is traced again, e.g. in the next process) or waits for the tuned one
    (``block=True``).

    Of several processes (or hosts) that meet the same missing shape on one database,
    exactly one tunes it: each first claims the shape (an Optuna study named
    ``autotune-claim|<problem>``, created atomically in the database); the others poll the claim
    until its holder releases it, the tuning ended, then read the stored answer (serving the
    fallback meanwhile, or waiting with ``block=True``). A claim
    whose process is gone (on this host) or older than :data:`CLAIM_STALE_S` is taken over.
    A tuning that fails is logged at WARNING and not tried again in this process.

    On a GPU the tuning's worker processes share the GPU with the program: a program whose
    JAX preallocates most of the GPU's memory (JAX's default, 75%) leaves them little; run it
    with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (or a smaller
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``) where it tunes missing shapes.

    Raises:
      JobError: a ``tune_missing`` that is not one of the above (at decoration); a shape the
        kernel does not accept (on a call); see :func:`autotune.queries.lookup.tuned`.
      ValueError: ``prefer`` is not ``"fastest"`` or ``"kernel"``.
    """
    from autotune.queries import lookup

    budget = _budget(tune_missing)
    if not isinstance(block, bool):
        raise JobError(f"tuned(block=...) must be True or False, but got {block!r}.")
    hook = None if budget is None else _MissingShapes(budget, db=db, device=device, block=block,
                                                      cache=cache)
    return lookup.tuned(kernel, default=default, db=db, device=device, table=table,
                        strict=strict, timeout_s=timeout_s, baseline=baseline, prefer=prefer,
                        on_missing=hook, cache=cache)


class _Tuning:
    """One missing problem being tuned (or waited for) by this process, on its own thread."""

    def __init__(self, kernel: Kernel, shape: Mapping[str, Any], dtype: str, *, budget: _Budget,
                 db: str | None, device: str | None, cache: str | None = None) -> None:
        self.kernel, self.shape, self.dtype = kernel, dict(shape), dtype
        self.budget, self.db, self.device, self.cache = budget, db, device, cache
        self.done = threading.Event()
        self.tuned_here = False  # whether this process ran the tuning (won the claim)
        self.thread = threading.Thread(target=self._run, name="autotune-tune-missing",
                                       daemon=True)

    def _stored(self) -> bool:
        from autotune.queries import lookup

        # By the name its results are stored under (a Kernel object would be resolved again).
        return lookup.stored_here(self.kernel.name, self.shape, self.dtype, db=self.db,
                                  device=self.device, cache=self.cache)

    def _run(self) -> None:
        problem = self.kernel.problem(self.shape, self.dtype)
        try:
            deadline = time.monotonic() + WAIT_S
            poll = POLL_S
            # Until this process holds the claim: a shape another process is tuning has
            # trials stored before its tuning ends, so "something stored" is no answer yet;
            # the released claim is (the holder stores its last trial, then releases).
            while True:
                release = _claim(self.db, problem)
                if release is not None:
                    try:
                        if not self._stored():  # stored between our look and our claim
                            self._tune()
                    finally:
                        release()
                    return
                if time.monotonic() > deadline:
                    log.warning("%s: another process has held the claim to tune it for %g s; "
                                "no longer waiting for its answer.", problem, WAIT_S)
                    return
                time.sleep(poll)
                poll = min(MAX_POLL_S, poll * 2)
        except Exception as e:  # noqa: BLE001 - the program goes on with its fallback config
            log.warning("%s: tune_missing failed (%s: %s); the call runs with the lookup's "
                        "answer, and this process does not try again.", problem,
                        type(e).__name__, e)
        finally:
            self.done.set()

    def _tune(self) -> None:
        name = self.kernel.name
        log.info("%s: nothing stored for this shape; tuning it (%d trials).",
                 self.kernel.problem(self.shape, self.dtype), self.budget.trials)
        self.tuned_here = True
        tune(name, [self.shape], dtype=self.dtype, trials=self.budget.trials, seconds=None,
             patience=self.budget.patience, db=self.db, allow_import=":" in name,
             progress=False, cache=self.cache)


# Every problem this process tunes or waits for: (database, problem key) -> its tuning.
_TUNINGS: dict[tuple[str, str, str | None], _Tuning] = {}
_TUNINGS_LOCK = threading.Lock()


class _MissingShapes:
    """The ``on_missing`` hook of ``tuned(tune_missing=...)``: starts one :class:`_Tuning`
    per missing problem (shared by every decorator of the process on that database)."""

    def __init__(self, budget: _Budget, *, db: str | None, device: str | None,
                 block: bool, cache: str | None = None) -> None:
        self.budget, self.db, self.device, self.block = budget, db, device, block
        self.cache = cache

    def __call__(self, kernel: Kernel, shape: Mapping[str, Any], dtype: str) -> str:
        from autotune.storage.urls import resolve_url

        problem = kernel.problem(shape, dtype)
        key = (resolve_url(self.db).render_as_string(hide_password=False), problem.key(),
               self.cache)
        with _TUNINGS_LOCK:
            tuning = _TUNINGS.get(key)
            if tuning is None:
                tuning = _TUNINGS[key] = _Tuning(kernel, shape, dtype, budget=self.budget,
                                                 db=self.db, device=self.device,
                                                 cache=self.cache)
                tuning.thread.start()
        if self.block:
            tuning.done.wait()
        if not tuning.done.is_set():
            return "pending"
        # Done: look the answer up once more. The decorator caches what it finds then, so a
        # shape whose tuning stored nothing usable is not asked about again.
        return "stored"


def _optuna_storage(url: str) -> Any:
    from autotune.tuning.studies import optuna_storage

    return optuna_storage(url)


def _claim(db: str | None, problem: Any) -> Callable[[], None] | None:
    """Claims ``problem`` for tuning in the database: a function that releases the claim, or
    None where another live process holds it."""
    import optuna

    from autotune.storage.urls import resolve_url
    from autotune.tuning.studies import owner_dead_here, worker_id

    storage = _optuna_storage(resolve_url(db).render_as_string(hide_password=False))
    name = f"{CLAIM_PREFIX}{problem.key()}"
    for _attempt in range(2):
        verbosity = optuna.logging.get_verbosity()  # no "A new study created" line
        optuna.logging.set_verbosity(max(verbosity, optuna.logging.WARNING))
        try:
            study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
        except optuna.exceptions.DuplicatedStudyError:
            try:
                held = storage.get_study_id_from_name(name)
                attrs = storage.get_study_user_attrs(held)
            except KeyError:
                continue  # released meanwhile: try again
            owner, since = attrs.get("owner"), attrs.get("claimed_at")
            stale = (isinstance(owner, str) and owner_dead_here(owner)) or (
                isinstance(since, (int, float)) and time.time() - since > CLAIM_STALE_S)
            if not stale:
                storage.engine.dispose()
                return None
            log.warning("%s: taking over the claim to tune it from %s (gone, or claimed %s s "
                        "ago).", problem, owner, None if since is None else round(time.time() - since))
            with contextlib.suppress(KeyError):
                storage.delete_study(held)
            continue
        finally:
            optuna.logging.set_verbosity(verbosity)
        storage.set_study_user_attr(study_id, "owner", worker_id())
        storage.set_study_user_attr(study_id, "claimed_at", time.time())

        def release(study_id: int = study_id) -> None:
            try:
                with contextlib.suppress(KeyError):
                    storage.delete_study(study_id)
            finally:
                storage.engine.dispose()

        return release
    storage.engine.dispose()
    return None

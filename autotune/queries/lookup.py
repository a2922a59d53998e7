"""Run-time lookup: the config to run a kernel with, from the results database, never tuning.

    @autotune.tuned("hopper_matmul")
    def matmul(a, b, *, config=None):
        ...

    matmul(a, b)  # config = the best stored for (m, n, k, dtype), else a neighbour's, else default

A call without ``config`` derives the problem from its arrays (the kernel's ``shape_of`` maps
them to shape keys; the dtype is the first array's) and picks, in order:

1. ``"exact"``: the best stored config of exactly that problem (GPU results; in a process
   whose JAX has a GPU, that GPU's results only; in a process whose JAX has no GPU, where the
   kernel runs in interpret mode, interpret-mode results when no GPU result is stored; results
   measured with the running jax/jaxlib before those of other versions, see
   :mod:`autotune.queries.best`);
2. ``"nearest"``: the best config of the nearest tuned problem of the same kernel and dtype
   (on the same device as for 1), by ``sum_k |log2(a_k / b_k)|`` over the size keys, if it is
   valid for the new problem (the nearest few are tried in order);
3. ``"default"``: ``default`` (a config mapping, or a callable problem -> config), or the
   kernel's ``default_config`` when ``default`` is None.

Between 2 and 3, ``"table"``: the config of exactly that problem in ``table`` (the ``TUNED``
dict of a module written by ``autotune export --format python``, or the module itself), if
valid for the problem; then ``"other_device"``: where this process's GPU has nothing stored
for the problem or near it, another GPU's exact or nearest answer, labelled so (and logged at
INFO naming the device it was measured on): never served as if measured here.

The lookup never takes the program down because of its database. When the database is
missing, damaged, not a database, a folder, unreadable, locked, unreachable or hung, it answers
from ``table``, else the default, within a bounded time: the database is opened read-only
(never written), connecting, waiting for a lock and each statement are bounded by
``timeout_s`` (default ``$AUTOTUNE_READ_TIMEOUT_S``, else 5 s: SQLite's busy timeout,
PostgreSQL's ``connect_timeout`` and ``statement_timeout``), and whatever the driver does, a
lookup waits for the database ``2 * timeout_s`` at most. It logs one WARNING naming the database
(password hidden) and the reason, and leaves that database alone for
``$AUTOTUNE_LOOKUP_RETRY_S`` (default :data:`RETRY_AFTER_S`, 60 s): lookups meanwhile answer the
fallback at once, and are asked again afterwards. ``strict=True`` raises
:class:`~autotune.errors.StorageError` instead.

Answers are cached in memory per (kernel, shape, dtype, device, db, default, table): a repeated
lookup is a dict hit; the decorator also keeps, per decorated function, its choice (the
function to call and the config) per call signature (the arrays' shapes and dtypes), so a
repeated call costs one tuple and one dict hit. :func:`clear_cache` forgets them (e.g. after tuning more). The source used
is logged at INFO level, with the jax/jaxlib versions the config was measured with and whether
those are the running ones. Nothing here imports jax; shapes and dtypes are read as plain
attributes.

Why one piece (over 400 lines): the decorator (:func:`tuned`) and :func:`lookup_config` share
one cache, one answer order (exact, nearest, the kernel's default) and one warning path; apart,
each would re-implement the other's fallbacks.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from autotune._jax_compat import default_backend_is_gpu
from autotune.devices import current_device
from autotune.errors import JobError, StorageError
from autotune.queries import best as queries
from autotune.space.kernel import Kernel, get_kernel, resolve_kernel
from autotune.space.outcomes import CACHE_POLICIES, DeviceKind
from autotune.space.problem import Config, Problem
from autotune.storage.store import failure_reason
from autotune.storage.urls import display_url, mask_text, read_timeout_s, resolve_url

__all__ = [
    "tuned", "lookup_config", "lookup_choice", "LookupChoice", "clear_cache", "NEAREST_TRIES",
    "SOURCES", "RETRY_AFTER_S", "RETRY_ENV", "PREFER", "stored_here", "OnMissing",
    "MISSING_STATES",
]

log = logging.getLogger(__name__)

SOURCES = ("exact", "nearest", "table", "other_device", "default")
PREFER = ("fastest", "kernel")  # tuned(prefer=...): the faster implementation, or the kernel


@dataclasses.dataclass(frozen=True)
class LookupChoice:
    """What the lookup answers for one problem: the kernel's config and where it came from;
    which implementation the stored verdict finds faster (the confirmation's program check where
    there is one, else the confirmation round: :func:`autotune.queries.best.verdict_figures`):
    ``faster``, ``"kernel"``, ``"baseline"`` (its speedup's interval lies below 1.0) or
    ``"tie"`` (it holds 1.0, or nothing confirmed for exactly this problem); and which one a
    program given the baseline runs (:func:`autotune.queries.best.runs_of`): ``runs``,
    the one the verdict's speedup puts ahead (a tie too, by its estimate), ``"kernel"`` where
    there is no verdict."""

    config: Config | None
    source: str
    faster: str = "tie"
    runs: str = "kernel"
NEAREST_TRIES = 5  # nearest tuned problems tried before falling back to the default
# A database that failed a lookup is left alone this long (``$AUTOTUNE_LOOKUP_RETRY_S``).
RETRY_AFTER_S = 60.0
RETRY_ENV = "AUTOTUNE_LOOKUP_RETRY_S"

Default = Mapping[str, Any] | Callable[[Problem], Mapping[str, Any] | None] | None

# (config, source, faster, runs): ``faster`` is "baseline" where the stored verdict (the program
# check, else the confirmation: best.verdict_figures) puts the baseline ahead beyond its
# interval, "kernel" where it puts the kernel ahead, else "tie"; ``runs`` (best.runs_of) is the
# route: the one the verdict's speedup puts ahead, "kernel" without a verdict.
_Answer = tuple[Config | None, str, str, str]
_NO_VERDICT = ("tie", "kernel")  # (faster, runs) of an answer without a verdict
_CACHE: dict[tuple[Any, ...], _Answer] = {}
_LOCK = threading.Lock()
# Answers given while the database was unusable, kept until it is asked again.
_DEGRADED: dict[tuple[Any, ...], tuple[_Answer, float]] = {}
_DOWN: dict[str, tuple[float, str]] = {}  # database -> (when to ask it again, why it failed)
_WARNED: set[tuple[str, str]] = set()  # (database, reason) already warned about
_BASELINES: dict[tuple[Any, ...], Callable[..., Any]] = {}  # the kernels' own, per problem
# The helper thread last started per database: at most one is ever blocked on a database.
_ASKING: dict[str, threading.Thread] = {}


def clear_cache() -> None:
    """Forgets every cached lookup, and every database failure remembered."""
    with _LOCK:
        _CACHE.clear()
        _DEGRADED.clear()
        _DOWN.clear()
        _WARNED.clear()
        _BASELINES.clear()
        for answers in list(_SHAPE_CACHES.values()):
            answers.clear()


_RESOLVED: dict[int, tuple[Kernel, Kernel]] = {}  # id(object) -> (object, under its stored name)


def _kernel(kernel: str | Kernel) -> Kernel:
    """The kernel, under the name its results are stored by.

    A :class:`Kernel` object of a user's module is looked up under its import path
    (:func:`autotune.space.kernel.resolve_kernel`). A ``"package.module:NAME"`` string needs no
    ``allow_import`` when that module is already imported: nothing new runs.
    """
    if isinstance(kernel, Kernel):
        hit = _RESOLVED.get(id(kernel))
        if hit is None or hit[0] is not kernel:
            hit = (kernel, resolve_kernel(kernel))
            with _LOCK:
                _RESOLVED[id(kernel)] = hit
        return hit[1]
    loaded = ":" in kernel and kernel.partition(":")[0] in sys.modules
    return get_kernel(kernel, allow_import=loaded)


def _dtype_name(array: Any) -> str:
    dtype = getattr(array, "dtype", None)
    if dtype is None:
        raise JobError(f"cannot read a dtype from {type(array).__name__}; pass arrays.")
    return str(getattr(dtype, "name", dtype))


def lookup_config(
    kernel: str | Kernel,
    shape: Mapping[str, Any],
    dtype: str,
    *,
    default: Default = None,
    db: str | None = None,
    device: str | None = None,
    table: Any = None,
    strict: bool = False,
    timeout_s: float | None = None,
    cache: str | None = None,
) -> tuple[Config | None, str]:
    """The config to run ``kernel`` with on ``shape``/``dtype``, and where it came from
    (``"exact"``, ``"nearest"``, ``"table"`` or ``"default"``). Cached; never tunes.

    Returns ``(None, "default")`` when nothing is stored and there is no default. When the
    database cannot answer (see the module docstring) the answer comes from ``table``, else
    the default, within ``2 * timeout_s`` (default ``$AUTOTUNE_READ_TIMEOUT_S``, else 5 s).
    ``cache``: which timings answer, ``"cold"``, ``"warm"`` or None (see :func:`tuned`).

    Raises:
      StorageError: ``strict=True`` and the database cannot answer (the reason is named).
      JobError: ``cache`` is not ``"cold"``, ``"warm"`` or None.
    """
    choice = lookup_choice(kernel, shape, dtype, default=default, db=db, device=device,
                           table=table, strict=strict, timeout_s=timeout_s, cache=cache)
    return choice.config, choice.source


def lookup_choice(
    kernel: str | Kernel,
    shape: Mapping[str, Any],
    dtype: str,
    *,
    default: Default = None,
    db: str | None = None,
    device: str | None = None,
    table: Any = None,
    strict: bool = False,
    timeout_s: float | None = None,
    cache: str | None = None,
) -> LookupChoice:
    """:func:`lookup_config`'s answer with the stored verdict on the baseline (:class:`LookupChoice`).
    Same cache, bounds and fallbacks; ``cache`` as :func:`tuned`'s."""
    answer, _kept = _choose(kernel, shape, dtype, default=default, db=db, device=device,
                            table=table, strict=strict, timeout_s=timeout_s, cache=cache)
    return LookupChoice(*answer)


def _choose(
    kernel: str | Kernel,
    shape: Mapping[str, Any],
    dtype: str,
    *,
    default: Default,
    db: str | None,
    device: str | None,
    table: Any,
    strict: bool,
    timeout_s: float | None,
    cache: str | None = None,
    refresh: bool = False,
) -> tuple[_Answer, bool]:
    """The answer, and whether it is kept (an answer given while the database is down is not:
    the database is asked again after the retry interval). ``refresh``: ask the database
    again even where an answer is cached (after tuning stored a new one)."""
    name = _kernel(kernel).name if isinstance(kernel, Kernel) else kernel
    if cache is not None and cache not in CACHE_POLICIES:
        raise JobError(f"cache must be one of {list(CACHE_POLICIES)} or None (cold results "
                         f"where there are any, else warm), but got {cache!r}.")
    key = (name, tuple(sorted(shape.items())), dtype, device, db, id(default), id(table), cache)
    hit = None if refresh else _CACHE.get(key)
    if hit is not None:
        return hit, True
    resolved = _kernel(kernel)
    problem = resolved.problem(shape, dtype)  # a bad shape or dtype is the caller's: it raises
    degraded = _DEGRADED.get(key)
    if degraded is not None and not strict and time.monotonic() < degraded[1]:
        return degraded[0], False
    where = _database(db)
    try:
        stored = _ask_database(where, strict=strict, timeout_s=timeout_s, ask=lambda t: _lookup_here(
            resolved, shape, dtype, default=default, db=db, device=device, timeout_s=t,
            cache=cache))
    except _Unavailable as e:
        answer = _fallback(resolved, problem, default, table, device)
        with _LOCK:
            _DEGRADED[key] = (answer, e.retry_at)
        return answer, False
    if stored is not None and stored[1] == "other_device":
        from_table = _from_table(resolved, problem, table, device)
        answer = (from_table, "table", *_table_choice(resolved, problem, table, device)) \
            if from_table is not None else stored
    else:
        answer = stored if stored is not None else _fallback(resolved, problem, default, table, device)
    with _LOCK:
        _CACHE[key] = answer
        _DEGRADED.pop(key, None)
    return answer, True


def stored_here(
    kernel: str | Kernel, shape: Mapping[str, Any], dtype: str, *, db: str | None = None,
    device: str | None = None, timeout_s: float | None = None, cache: str | None = None,
) -> bool:
    """Whether the database holds a result of exactly this problem for this process's device
    (what the lookup answers as ``"exact"``); asked afresh, never cached. False when the
    database cannot answer. For ``tuned(tune_missing=...)``: a shape to tune is one without.
    ``cache``: a result timed under that policy (None: either)."""
    resolved = _kernel(kernel)
    try:
        stored = _lookup_here(resolved, shape, dtype, default=None, db=db, device=device,
                              timeout_s=timeout_s, nearest=False, cache=cache)
    except StorageError as e:
        log.info("%s: the database cannot say whether a result is stored: %s", resolved.name, e)
        return False
    return stored is not None and stored[1] == "exact"


def _lookup_here(kernel: Kernel, shape: Mapping[str, Any], dtype: str, *, device: str | None,
                 **kw: Any) -> _Answer | None:
    """:func:`_lookup` for this process: with ``device=None``, the results of this process's
    GPU, else another GPU's labelled ``"other_device"``; in a process whose JAX has no GPU
    (the kernel runs in GPU interpret mode there), GPU results, then interpret-mode ones,
    since those are what ran on such a host."""
    here = _this_gpu() if device is None else None
    if here is not None:
        stored = _lookup(kernel, shape, dtype, device=here, **kw)
        if stored is not None:
            return stored
        other = _lookup(kernel, shape, dtype, device=DeviceKind.GPU, **kw)
        if other is None:
            return None
        log.info("%s: nothing stored for this %s; using a config measured on another GPU "
                 "(a fallback, not a measurement here).", kernel.name, here)
        return other[0], "other_device", *_NO_VERDICT
    stored = _lookup(kernel, shape, dtype, device=device, **kw)
    if stored is None and device is None and _runs_interpreted():
        return _lookup(kernel, shape, dtype, device=DeviceKind.INTERPRET, **kw)
    return stored


def _this_gpu() -> str | None:
    """The name of the GPU this process's JAX runs on (``device_kind``, the name stored with
    its results), or None: JAX not imported (never imported here), or without a GPU."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        if not default_backend_is_gpu():
            return None
        return str(jax.devices()[0].device_kind)
    except Exception:  # noqa: BLE001 - no backend at all: the device is unknown
        return None


def _runs_interpreted() -> bool:
    """Whether this process's JAX (already imported by the caller; never imported here) has
    no GPU backend, so that Pallas Mosaic GPU kernels run in interpret mode."""
    if "jax" not in sys.modules:
        return False
    try:
        return not default_backend_is_gpu()
    except Exception:  # noqa: BLE001 - no backend at all: nothing runs, GPU rows stay the rule
        return False


def _lookup(
    kernel: Kernel,
    shape: Mapping[str, Any],
    dtype: str,
    *,
    default: Default,
    db: str | None,
    device: str | None,
    timeout_s: float | None = None,
    nearest: bool = True,
    cache: str | None = None,
) -> _Answer | None:
    """The stored answer (exact, else nearest), or None when nothing stored is usable.
    ``cache`` picks the exact answer's timing policy (None: cold where there are cold results,
    else warm); a nearest answer is a config only (its verdict a tie), of either policy."""
    problem = kernel.problem(shape, dtype)
    exact = queries.best_result(kernel.name, problem.dims, problem.dtype, device=device, db=db,
                                timeout_s=timeout_s, cache=cache)
    if exact is not None:
        log.info("%s: using the stored best config (%s, %.1f us, %s).", problem, exact.device,
                 exact.median_us, _measured_with(exact))
        return Config(exact.config), "exact", exact.faster, exact.runs
    if not nearest:
        return None
    neighbours = queries.nearest_results(
        kernel.name, problem.dims, problem.dtype, device=device, db=db, limit=NEAREST_TRIES,
        timeout_s=timeout_s,
    )
    if neighbours:
        bound = kernel.bind(problem, device=current_device(ask_driver=False))
        for result in neighbours:
            if bound.is_valid(result.config):
                log.info("%s: using the best config of the nearest tuned problem %s (%s, %s).",
                         problem, result.problem, result.device, _measured_with(result))
                return Config(result.config), "nearest", *_NO_VERDICT
            log.debug("%s: the best config of %s is not valid here; trying the next.",
                      problem, result.problem)
    log.info("%s: nothing tuned nearby is usable.", problem)
    return None


def _fallback(
    kernel: Kernel, problem: Problem, default: Default, table: Any, device: str | None = None
) -> _Answer:
    """The answer without the database: ``table``'s config of the problem, else the default."""
    config = _from_table(kernel, problem, table, device)
    if config is not None:
        log.info("%s: using the config of the exported table.", problem)
        return config, "table", *_table_choice(kernel, problem, table, device)
    log.info("%s: using the default config.", problem)
    return _default(kernel, problem, default), "default", *_NO_VERDICT


def _from_table(
    kernel: Kernel, problem: Problem, table: Any, device: str | None = None
) -> Config | None:
    if table is None:
        return None
    tuned = getattr(table, "TUNED", table)
    if not isinstance(tuned, Mapping):
        raise JobError(
            "table must be the TUNED dict of a module written by `autotune export --format "
            f"python`, or that module, but got {type(table).__name__}."
        )
    key = (kernel.name, tuple(sorted(problem.dims.items())), problem.dtype)
    value = tuned.get(key)
    if value is None and isinstance(tuned.get("default"), Mapping):
        # Keyed by device (`export --format python`): that device's table, else "default".
        per_device = tuned.get(device) if device is not None else None
        value = (per_device if isinstance(per_device, Mapping) else tuned["default"]).get(key)
    if value is None:
        return None
    config = Config(value)
    if not kernel.bind(problem, device=current_device(ask_driver=False)).is_valid(config):
        log.warning("%s: the exported table's config %s is not valid for it; not used.",
                    problem, config.to_json())
        return None
    return config


def _table_choice(kernel: Kernel, problem: Problem, table: Any,
                  device: str | None = None) -> tuple[str, str]:
    """``(faster, runs)`` for ``problem`` from the exported table's ``CHOICE`` (keyed like
    ``TUNED``): ``faster`` as written (``"kernel"``, ``"baseline"``, else ``"tie"``); ``runs``
    by :func:`~autotune.queries.best.written_runs` (as written, else by the entry's interval,
    else ``"baseline"`` only where it says the baseline is faster). Without an entry (no
    ``CHOICE``: an older export, or a bare ``TUNED`` dict) there is no verdict: ``("tie",
    "kernel")``."""
    choice = getattr(table, "CHOICE", None)
    if not isinstance(choice, Mapping):
        return _NO_VERDICT
    key = (kernel.name, tuple(sorted(problem.dims.items())), problem.dtype)
    per_device = choice.get(device) if device is not None else None
    part = per_device if isinstance(per_device, Mapping) else choice.get("default")
    entry = part.get(key) if isinstance(part, Mapping) else None  # as _from_table picks
    fields = entry if isinstance(entry, Mapping) else {"faster": entry}
    faster = fields.get("faster")
    runs = queries.written_runs(fields.get("runs"), faster, fields.get("speedup"),
                                fields.get("speedup_low"), fields.get("speedup_high"))
    return (faster if faster in ("kernel", "baseline") else "tie"), runs


# ----------------------------------------------------------------------------- a failing database


class _Unavailable(Exception):
    """The database cannot answer now; ask it again at ``retry_at`` (time.monotonic)."""

    def __init__(self, retry_at: float) -> None:
        super().__init__(retry_at)
        self.retry_at = retry_at


def _database(db: str | None) -> str:
    """The database ``db`` names, as people may read it: its password hidden."""
    try:
        return display_url(resolve_url(db))
    except StorageError:
        return mask_text(repr(db))


def _seconds(name: str, env: str, value: float | None, default: float) -> float:
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        name = f"${env}"
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < math.inf):
        raise JobError(f"{name} must be a finite number of seconds, 0 or more, but got {value!r}.")
    return float(value)


def _ask_database(
    where: str, *, strict: bool, timeout_s: float | None, ask: Callable[[float], Any]
) -> Any:
    """``ask(timeout_s)``, run on a helper thread that is waited for ``2 * timeout_s`` at most.

    A database that failed is remembered for the retry interval; a failure is logged once at
    WARNING per database and reason. Raises :class:`_Unavailable` (``strict``: StorageError).
    """
    timeout = read_timeout_s(timeout_s)
    now = time.monotonic()
    down = _DOWN.get(where)
    if down is not None and now < down[0]:
        if strict:
            raise StorageError(_unavailable_text(where, down[1], strict=True))
        raise _Unavailable(down[0])
    with _LOCK:
        earlier = _ASKING.get(where)
    if earlier is not None and earlier.is_alive():
        # The ask that timed out is still blocked in the driver: another thread would block
        # beside it. The database counts as silent until that one returns.
        return _failed(where, "an earlier ask is still waiting for an answer", None, strict)
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = ask(timeout)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=run, name="autotune-lookup", daemon=True)
    with _LOCK:
        _ASKING[where] = thread
    thread.start()
    error: BaseException | None = None
    if not done.wait(2 * timeout):
        reason = f"no answer within {2 * timeout:g} s"
    elif "error" in box:
        error = box["error"]
        if isinstance(error, JobError):
            raise error  # the caller's own mistake (a device name), not the database's
        reason = _reason(error)
    else:
        with _LOCK:
            _DOWN.pop(where, None)
        return box["value"]
    return _failed(where, reason, error, strict)


def _failed(where: str, reason: str, error: BaseException | None, strict: bool) -> NoReturn:
    """Remembers that ``where`` failed for ``reason``, warns once, and raises
    :class:`_Unavailable` (``strict``: StorageError)."""
    retry_s = _seconds("retry interval", RETRY_ENV, None, RETRY_AFTER_S)
    retry_at = time.monotonic() + retry_s
    with _LOCK:
        _DOWN[where] = (retry_at, reason)
        first = (where, reason) not in _WARNED
        _WARNED.add((where, reason))
    if strict:
        raise StorageError(_unavailable_text(where, reason, strict=True)) from error
    (log.warning if first else log.info)(
        "%s Not asked again for %g s.", _unavailable_text(where, reason, strict=False), retry_s
    )
    raise _Unavailable(retry_at)


def _reason(error: BaseException) -> str:
    if isinstance(error, StorageError):
        return str(error)
    return f"{type(error).__name__}: {failure_reason(error)}"


def _unavailable_text(where: str, reason: str, *, strict: bool) -> str:
    way = ("(strict=True; without it the lookup answers the exported table or the default "
           "config)" if strict else "Answering from the exported table, else the default config.")
    # Masked as a whole: the reason is the driver's words, which may quote the URL.
    return mask_text(f"The results database {where} cannot answer the run-time lookup: {reason} {way}")


def _measured_with(result: queries.BestResult) -> str:
    versions = f"jax {result.jax_version or '?'}, jaxlib {result.jaxlib_version or '?'}"
    if result.stale:
        return f"measured with {versions}, not the running versions: stale"
    return f"measured with the running {versions}"


def _default(kernel: Kernel, problem: Problem, default: Default) -> Config | None:
    value: Mapping[str, Any] | None
    if default is None:
        if kernel.default_config is None:
            return None
        value = kernel.default_config(problem)
    elif callable(default):
        value = default(problem)
    else:
        value = default
    return None if value is None else Config(value)


# tuned(on_missing=...): called with (kernel, shape, dtype) when a call finds nothing stored for
# exactly its problem; answers what the decorator does with the answer it has (see tuned()).
OnMissing = Callable[[Kernel, Mapping[str, Any], str], str]
MISSING_STATES = ("pending", "stored", "off")


class _ShapeCache(dict[tuple[Any, ...], tuple[Any, ...]]):
    """One decorated function's answers per call signature (its arrays' shapes and dtypes):
    a dict that :func:`clear_cache` empties with the lookup's own cache (weakly referenced)."""


_SHAPE_CACHES: weakref.WeakValueDictionary[int, _ShapeCache] = weakref.WeakValueDictionary()


def _signature(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """The key of a call's answer where some positional is not an array (attention's
    ``causal``): arrays by shape and dtype, the others by type and value (the wrapper keys a
    call of arrays only by ``(shape, dtype)`` pairs itself, inline, as the fast path)."""
    return tuple([(a.shape, a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype")
                  else (type(a), a) for a in arrays])


def tuned(
    kernel_name: str | Kernel,
    *,
    default: Default = None,
    db: str | None = None,
    device: str | None = None,
    table: Any = None,
    strict: bool = False,
    timeout_s: float | None = None,
    baseline: Callable[..., Any] | bool | None = None,
    prefer: str = "fastest",
    on_missing: OnMissing | None = None,
    cache: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates ``fn(*arrays, config=None, **kw)`` so that a call without ``config`` runs
    with the looked-up config (see the module docstring). A given ``config`` is used as is.

    ``kernel_name`` is a bundled kernel's name, or a kernel of your own: its
    ``"package.module:NAME"`` or the :class:`Kernel` object itself. ``table``, ``strict`` and
    ``timeout_s`` are :func:`lookup_config`'s.

    ``baseline``: what to call instead of the kernel, ``baseline(*arrays, **kw)``, for a shape
    whose stored verdict's speedup puts the baseline ahead (at or below 1.0), a tie (the
    interval holding 1.0) included: routing every tie one way did worse (benchmarks/RESULTS.md
    §19). The verdict is the confirmation's program check
    where there is one (the two timed as a program calls them), else the confirmation round
    (CUPTI kernel times, which leave out what a call costs beyond its kernels: §19); the rule
    is :func:`autotune.queries.best.runs_of` (``LookupChoice.runs``). ``True`` takes the
    kernel's own baseline (``Kernel.baseline``: XLA, cuDNN).
    The kernel runs where the speedup is above 1.0, and where there is no verdict: nothing
    confirmed against a baseline for exactly the shape (a nearest, other-device or default
    answer). ``prefer="kernel"`` always runs the kernel. An exported table's ``CHOICE`` routes
    the same way where the answer comes from the table (its ``runs``; an entry older than
    ``runs`` by its interval, one without an interval only where it says the baseline is
    faster).

    ``cache``: which timings answer, config and verdict alike: ``"cold"`` (the L2 flushed
    before every run: a program that streams new data through the kernel), ``"warm"`` (back to
    back on the same inputs: a program that calls it again on data still in L2), or None
    (cold results where the problem has any on the device, else warm). The two can disagree
    where the inputs fit the L2 (benchmarks/RESULTS.md §19): route by the one the program runs
    like; a shape with no result of that policy stored is answered as if nothing were stored.

    The choice (the function to call and its config) is cached per call signature: the
    arrays' shapes and dtypes (and the values of positionals that are not arrays), so a
    repeated call costs a tuple of shapes and one dict hit (benchmarks/lookup_latency.py,
    "decorator"). Answers given while the database cannot answer are not cached.

    ``on_missing(kernel, shape, dtype)`` (what ``autotune.tuned(tune_missing=...)`` passes) is
    called when a call finds no result of exactly its problem stored for this device; it
    answers ``"pending"`` (serve the answer found, nearest or default, and ask again next
    call), ``"stored"`` (a result was stored meanwhile: look it up again now) or ``"off"``
    (nothing more will come: serve and cache the answer found).

    Raises:
      ValueError: ``prefer`` is not one of :data:`PREFER` (at decoration).
      JobError: ``cache`` is not ``"cold"``, ``"warm"`` or None (at decoration).
      JobError (on a call without config): the kernel declares no ``shape_of``, or the arrays
        do not fit it; ``baseline=True`` for a kernel that declares none.
      StorageError: ``strict=True`` and the database cannot answer.
    """
    if prefer not in PREFER:
        raise ValueError(f"prefer must be one of {list(PREFER)}, but got {prefer!r}.")
    if cache is not None and cache not in CACHE_POLICIES:
        raise JobError(f"tuned(cache=...) must be one of {list(CACHE_POLICIES)} or None (cold "
                       f"results where there are any, else warm), but got {cache!r}.")
    routes = baseline is not None and baseline is not False and prefer == "fastest"

    def decide(name: str, arrays: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
        """(baseline function or None, config) for this call, and whether to cache it."""
        kernel = _kernel(kernel_name)
        if kernel.shape_of is None:
            raise JobError(
                f"Kernel {kernel.name!r} declares no shape_of, so its problem cannot be "
                "derived from a call; pass config=... explicitly."
            )
        if not arrays:
            raise JobError(f"{name} was called without input arrays.")
        shape = dict(kernel.shape_of(*arrays))
        dtype = _dtype_name(arrays[0])
        # By the name its results are stored under (a Kernel object is resolved once, above).
        ask = functools.partial(_choose, kernel.name, shape, dtype, default=default, db=db,
                                device=device, table=table, strict=strict, timeout_s=timeout_s,
                                cache=cache)
        answer, keep = ask()
        if on_missing is not None and answer[1] != "exact":
            state = on_missing(kernel, shape, dtype)
            if state == "stored":
                answer, keep = ask(refresh=True)
            elif state == "pending":
                keep = False
        config, _source, _faster, runs = answer
        if routes and runs == "baseline" and baseline is not None:
            return (_baseline_fn(kernel, shape, dtype, baseline), None), keep
        return (None, config), keep

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        answers = _ShapeCache()
        _SHAPE_CACHES[id(answers)] = answers
        name = getattr(fn, "__name__", "the decorated function")

        @functools.wraps(fn)
        def wrapper(*arrays: Any, config: Mapping[str, Any] | None = None, **kw: Any) -> Any:
            if config is not None:
                return fn(*arrays, config=config, **kw)
            # The fast path, inline (each call saved is ~0.1 us): the arrays' shapes and dtypes.
            signature: tuple[Any, ...] | None
            try:
                signature = tuple([(a.shape, a.dtype) for a in arrays])
                hit = answers.get(signature)
            except (AttributeError, TypeError):  # a positional that is not an array
                signature = _signature(arrays)
                try:
                    hit = answers.get(signature)
                except TypeError:  # an unhashable one: answered, never cached
                    signature = hit = None
            if hit is None:
                hit, keep = decide(name, arrays)
                if keep and signature is not None:
                    answers[signature] = hit
            other, chosen = hit
            if other is not None:
                return other(*arrays, **kw)
            return fn(*arrays, config=chosen, **kw)

        return wrapper

    return decorate


def _baseline_fn(kernel: Kernel, shape: Mapping[str, Any], dtype: str,
                 baseline: Callable[..., Any] | bool) -> Callable[..., Any]:
    """The baseline to call for this problem: the caller's, or the kernel's own (cached)."""
    if baseline is not True:
        return baseline  # type: ignore[return-value]
    if kernel.baseline is None:
        raise JobError(f"tuned(baseline=True): kernel {kernel.name!r} declares no baseline; pass "
                       "the function to call instead (baseline=fn).")
    key = (kernel.name, tuple(sorted(shape.items())), dtype)
    fn = _BASELINES.get(key)
    if fn is None:
        fn = kernel.baseline(kernel.problem(shape, dtype))
        with _LOCK:
            _BASELINES[key] = fn
    return fn

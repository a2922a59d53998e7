"""Run-time lookup: the config to run a kernel with, from the results database, never tuning.

    @autotune.tuned("hopper_matmul")
    def matmul(a, b, *, config=None):
        ...

    matmul(a, b)  # config = the best stored for (m, n, k, dtype), else a neighbour's, else default

A call without ``config`` derives the problem from its arrays (the kernel's ``shape_of`` maps
them to shape keys; the dtype is the first array's) and picks, in order:

1. ``"exact"``: the best stored config of exactly that problem (GPU results preferred over
   interpret-mode ones, and results measured with the running jax/jaxlib over those of other
   versions, see :mod:`autotune.queries`);
2. ``"nearest"``: the best config of the nearest tuned problem of the same kernel and dtype,
   by ``sum_k |log2(a_k / b_k)|`` over the size keys, if it is valid for the new problem
   (the nearest few are tried in order);
3. ``"default"``: ``default`` (a config mapping, or a callable problem -> config), or the
   kernel's ``default_config`` when ``default`` is None.

Answers are cached in memory per (kernel, shape, dtype, device, db, default): a repeated lookup is a
dict hit. :func:`clear_cache` forgets them (e.g. after tuning more). The source used is logged
at INFO level, with the jax/jaxlib versions the config was measured with and whether those
are the running ones. Nothing here imports jax; shapes and dtypes are read as plain attributes.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from autotune import queries
from autotune.errors import JobError
from autotune.kernel import Kernel, get_kernel, resolve_kernel
from autotune.problem import Config, Problem

__all__ = ["tuned", "lookup_config", "clear_cache", "NEAREST_TRIES", "SOURCES"]

log = logging.getLogger(__name__)

SOURCES = ("exact", "nearest", "default")
NEAREST_TRIES = 5  # nearest tuned problems tried before falling back to the default

Default = Mapping[str, Any] | Callable[[Problem], Mapping[str, Any] | None] | None

_CACHE: dict[tuple[Any, ...], tuple[Config | None, str]] = {}
_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forgets every cached lookup."""
    with _LOCK:
        _CACHE.clear()


_RESOLVED: dict[int, tuple[Kernel, Kernel]] = {}  # id(object) -> (object, under its stored name)


def _kernel(kernel: str | Kernel) -> Kernel:
    """The kernel, under the name its results are stored by.

    A :class:`Kernel` object of a user's module is looked up under its import path
    (:func:`autotune.kernel.resolve_kernel`). A ``"package.module:NAME"`` string needs no
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
) -> tuple[Config | None, str]:
    """The config to run ``kernel`` with on ``shape``/``dtype``, and where it came from
    (``"exact"``, ``"nearest"`` or ``"default"``). Cached; never tunes.

    Returns ``(None, "default")`` when nothing is stored and there is no default.
    """
    name = _kernel(kernel).name if isinstance(kernel, Kernel) else kernel
    key = (name, tuple(sorted(shape.items())), dtype, device, db, id(default))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    answer = _lookup(_kernel(kernel), shape, dtype, default=default, db=db, device=device)
    with _LOCK:
        _CACHE[key] = answer
    return answer


def _lookup(
    kernel: Kernel,
    shape: Mapping[str, Any],
    dtype: str,
    *,
    default: Default,
    db: str | None,
    device: str | None,
) -> tuple[Config | None, str]:
    problem = kernel.problem(shape, dtype)
    exact = queries.best_result(kernel.name, problem.dims, problem.dtype, device=device, db=db)
    if exact is not None:
        log.info("%s: using the stored best config (%s, %.1f us, %s).", problem, exact.device,
                 exact.median_us, _measured_with(exact))
        return Config(exact.config), "exact"
    neighbours = queries.nearest_results(
        kernel.name, problem.dims, problem.dtype, device=device, db=db, limit=NEAREST_TRIES
    )
    if neighbours:
        bound = kernel.bind(problem)
        for result in neighbours:
            if bound.is_valid(result.config):
                log.info("%s: using the best config of the nearest tuned problem %s (%s, %s).",
                         problem, result.problem, result.device, _measured_with(result))
                return Config(result.config), "nearest"
            log.debug("%s: the best config of %s is not valid here; trying the next.",
                      problem, result.problem)
    config = _default(kernel, problem, default)
    log.info("%s: nothing tuned nearby is usable; using the default config.", problem)
    return config, "default"


def _measured_with(result: queries.BestResult) -> str:
    versions = f"jax {result.jax_version or '?'}, jaxlib {result.jaxlib_version or '?'}"
    if result.stale:
        return f"measured with {versions}, not the running versions: stale"
    return f"measured with the running {versions}"


def _default(kernel: Kernel, problem: Problem, default: Default) -> Config | None:
    if default is None:
        if kernel.default_config is None:
            return None
        value = kernel.default_config(problem)
    elif callable(default):
        value = default(problem)
    else:
        value = default
    return None if value is None else Config(value)


def tuned(
    kernel_name: str | Kernel,
    *,
    default: Default = None,
    db: str | None = None,
    device: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates ``fn(*arrays, config=None, **kw)`` so that a call without ``config`` runs
    with the looked-up config (see the module docstring). A given ``config`` is used as is.

    ``kernel_name`` is a bundled kernel's name, or a kernel of your own: its
    ``"package.module:NAME"`` or the :class:`Kernel` object itself.

    Raises (on a call without config):
      JobError: the kernel declares no ``shape_of``, or the arrays do not fit it.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*arrays: Any, config: Mapping[str, Any] | None = None, **kw: Any) -> Any:
            if config is None:
                kernel = _kernel(kernel_name)
                if kernel.shape_of is None:
                    raise JobError(
                        f"Kernel {kernel.name!r} declares no shape_of, so its problem cannot be "
                        "derived from a call; pass config=... explicitly."
                    )
                if not arrays:
                    raise JobError(f"{fn.__name__} was called without input arrays.")
                shape = dict(kernel.shape_of(*arrays))
                config, _ = lookup_config(
                    kernel, shape, _dtype_name(arrays[0]), default=default, db=db, device=device
                )
            return fn(*arrays, config=config, **kw)

        return wrapper

    return decorate

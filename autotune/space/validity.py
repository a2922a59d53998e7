"""The one validity check on configs that enter or leave the database.

Every config the tool serves (``autotune best``, :func:`autotune.best_config`, the run-time
lookup's exact and nearest answers, every export) and every config ``autotune import`` stores
must be valid for its kernel's space bound to its problem, under the rules of the installed
code. A rule tightened after a config was measured makes the stored row *unservable*: it stays
in the database (``autotune results --invalid`` lists it) but is skipped, with a warning.

    violations(problem, config)   # [] when valid; the broken rules in words otherwise
    servable(problem, config)     # False (and one warning) when a rule is broken

Kernels are resolved without running new code: bundled kernels, kernels registered in this
process, and ``package.module:NAME`` kernels whose module is already imported (the run-time
lookup's case). A kernel that cannot be resolved that way (unknown here, or a user kernel not
imported) cannot be checked: its configs are served as stored and that is logged at INFO.
Nothing here imports jax: bundled kernel modules import jax only when a kernel is built.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.devices import DeviceFacts, current_device
from autotune.errors import AutotuneError
from autotune.space.problem import Config, Problem

if TYPE_CHECKING:  # pragma: no cover
    from autotune.space.kernel import Kernel
    from autotune.space.search_space import BoundSpace

__all__ = ["violations", "servable", "resolve_known_kernel", "clear_cache"]

log = logging.getLogger(__name__)

_MAX_BOUND = 256  # bound spaces kept (per kernel and problem); binding costs ~1 ms
_bound: collections.OrderedDict[tuple[int, Problem, DeviceFacts], tuple[Kernel, BoundSpace | str]] = (
    collections.OrderedDict()
)
_warned: set[tuple[Problem, str]] = set()
_unchecked: set[str] = set()
_lock = threading.Lock()


def clear_cache() -> None:
    """Forgets bound spaces and which rows were already warned about."""
    with _lock:
        _bound.clear()
        _warned.clear()
        _unchecked.clear()


def resolve_known_kernel(name: str) -> Kernel | None:
    """The kernel ``name`` if it resolves without importing new code, else None."""
    from autotune.space.kernel import get_kernel

    loaded = ":" in name and name.partition(":")[0] in sys.modules
    try:
        return get_kernel(name, allow_import=loaded)
    except AutotuneError:
        return None


def _space(kernel: Kernel, problem: Problem) -> BoundSpace | str:
    """``kernel``'s space bound to ``problem`` for the current device, or why the problem
    itself is not valid today. The query side never touches CUDA: the device is the driver's
    only where this process has read it already, else the profile (``ask_driver=False``)."""
    device = current_device(ask_driver=False)
    key = (id(kernel), problem, device)
    with _lock:
        hit = _bound.get(key)
        if hit is not None and hit[0] is kernel:
            _bound.move_to_end(key)
            return hit[1]
    try:
        checked = kernel.problem(problem.dims, problem.dtype)
        if checked.dtype not in kernel.dtypes:
            value: BoundSpace | str = (
                f"[supported_dtype] {kernel.name} supports dtype {', '.join(kernel.dtypes)}, "
                f"not {checked.dtype}"
            )
        else:
            value = kernel.bind(checked, device=device)
    except Exception as e:  # noqa: BLE001 - a problem today's code cannot bind is not valid
        value = f"[problem] the problem no longer fits the kernel: {e}"
    with _lock:
        _bound[key] = (kernel, value)
        while len(_bound) > _MAX_BOUND:
            _bound.popitem(last=False)
    return value


def violations(
    problem: Problem, config: Mapping[str, Any], *, kernel: Kernel | None = None
) -> list[str] | None:
    """The rules ``config`` breaks for ``problem`` under today's space, each as
    ``"[rule] explanation"``; ``[]`` when it is valid; None when the kernel cannot be resolved
    without importing new code (see the module docstring). ``kernel`` overrides the lookup by
    ``problem.kernel``."""
    if kernel is None:
        kernel = resolve_known_kernel(problem.kernel)
        if kernel is None:
            return None
    space = _space(kernel, problem)
    if isinstance(space, str):
        return [space]
    try:
        found = space.validate(config, nearest=False)
    except Exception as e:  # noqa: BLE001 - a rule that cannot read the config rejects it
        return [f"[config] the config cannot be checked: {type(e).__name__}: {e}"]
    return [f"[{v.rule}] {v.message}" for v in found]


def servable(problem: Problem, config: Mapping[str, Any]) -> bool:
    """Whether a stored ``config`` of ``problem`` may be served: valid under today's rules, or
    of a kernel that cannot be checked here. A config that may not is logged once at WARNING."""
    broken = violations(problem, config)
    if broken is None:
        if problem.kernel not in _unchecked:
            _unchecked.add(problem.kernel)
            log.info(
                "Kernel %r is not known to this process (not bundled, registered or imported): "
                "its stored configs are served without checking them against its space.",
                problem.kernel,
            )
        return True
    if not broken:
        return True
    key = (problem, Config(config).digest() if _hashable(config) else repr(config))
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "%s: skipping the stored config %s: it breaks today's rules (%s). It is never served; "
            "`autotune results --invalid` lists such rows.",
            problem, dict(config), "; ".join(broken),
        )
    return False


def _hashable(config: Mapping[str, Any]) -> bool:
    try:
        Config(config)
    except (TypeError, ValueError):
        return False
    return True

"""The sampler registry: the samplers a job file, ``--sampler`` or ``autotune.tune`` may name.

One module per sampler (``autotune/tuning/samplers/<name>.py``), each defining ``SAMPLER``, an
instance of :class:`~autotune.tuning.samplers.base.Sampler` (how to build the Optuna sampler
for a bound space and seed, how it warm-starts from stored results, what it proposes first).
The registry lists them statically (:data:`ENTRIES`: name, module, one-line summary, the
package extra it needs) and imports a module only when its sampler is built, so the command
line names and checks samplers without importing Optuna or numpy (issue 36).

Adding a sampler is one new module here and one :class:`Entry` line in :data:`ENTRIES`
(docs/architecture.md, "Sampling"); code outside the package (a test, a plugin) may
:func:`register` an entry at run time, whose module may live anywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from autotune.errors import JobError

if TYPE_CHECKING:
    from autotune.tuning.samplers.base import Sampler

__all__ = ["Entry", "ENTRIES", "NAMES", "names", "entry", "register", "unregister", "load",
           "require_packages"]


@dataclass(frozen=True)
class Entry:
    """One registered sampler.

    ``module``: the import path of the module that defines ``SAMPLER`` (imported on first use).
    ``summary``: one line for ``--help`` and the docs. ``extra``: the extra of pyproject.toml
    that installs ``packages``, the modules the sampler needs beyond autotune's dependencies.
    """

    name: str
    module: str
    summary: str
    extra: str | None = None
    packages: tuple[str, ...] = ()


_HERE = __name__
# The one list of samplers, in the order --help and the docs give them.
ENTRIES: tuple[Entry, ...] = (
    Entry("auto", f"{_HERE}.auto", "the default: ranked when it pays (results of other shapes, a small "
          "valid set, a cost model), else multivariate TPE with half its proposals local moves"),
    Entry("ranked", f"{_HERE}.ranked", "a cost model learnt from stored results ranks a pool of "
          "valid configs (docs/ranked_sampler.md)"),
    Entry("tpe", f"{_HERE}.tpe", "Optuna's multivariate TPE"),
    Entry("random", f"{_HERE}.random", "uniform over the untaken valid configs"),
    Entry("cmaes", f"{_HERE}.cmaes", "Optuna's CMA-ES", extra="cmaes", packages=("cmaes",)),
    Entry("gp", f"{_HERE}.gp", "Optuna's Gaussian-process sampler", extra="gp",
          packages=("torch", "scipy")),
    Entry("qmc", f"{_HERE}.qmc", "Optuna's quasi-Monte Carlo (Sobol) sampler"),
    Entry("brute", f"{_HERE}.brute", "every valid config, in order"),
)

_lock = threading.Lock()
_entries: dict[str, Entry] = {e.name: e for e in ENTRIES}


def names() -> tuple[str, ...]:
    """The names of the registered samplers, in registration order."""
    return tuple(_entries)


class _Names(Sequence[str]):
    """The registered names as a live sequence (``name in NAMES``, ``", ".join(NAMES)``): it
    follows :func:`register` and :func:`unregister`, so a parser or a job file's check built
    before a registration still sees it."""

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        return names()[i]

    def __len__(self) -> int:
        return len(_entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in _entries

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __repr__(self) -> str:
        return repr(names())


NAMES: Sequence[str] = _Names()


def entry(name: str) -> Entry:
    """The registry's entry for ``name``; a :class:`~autotune.errors.JobError` listing the known
    names if there is none."""
    try:
        return _entries[name]
    except (KeyError, TypeError):
        raise JobError(f"Unknown sampler {name!r}: expected one of {', '.join(_entries)}.") from None


def register(new: Entry) -> None:
    """Adds a sampler to the registry (``--sampler``, job files and ``autotune.tune`` accept its
    name from now on). A name already registered is refused: unregister it first."""
    with _lock:
        if new.name in _entries:
            raise ValueError(f"sampler {new.name!r} is already registered (module "
                             f"{_entries[new.name].module}); unregister it first.")
        _entries[new.name] = new


def unregister(name: str) -> None:
    """Removes a sampler from the registry (a test's, once it is done)."""
    with _lock:
        entry(name)
        del _entries[name]


def load(name: str) -> Sampler:
    """The implementation of sampler ``name``: its module's ``SAMPLER`` (the module is imported
    here, the first time)."""
    from autotune.tuning.samplers.base import Sampler

    e = entry(name)
    impl = getattr(importlib.import_module(e.module), "SAMPLER", None)
    if not isinstance(impl, Sampler):
        raise TypeError(f"sampler {name!r}: module {e.module} must define SAMPLER, an instance of "
                        f"autotune.tuning.samplers.base.Sampler; got {type(impl).__name__}.")
    return impl


def require_packages(name: str) -> None:
    """Raises a JobError naming the extra to install when sampler ``name`` needs packages that
    are missing; job files, ``--sampler`` and ``autotune.tune`` check it before anything runs
    (``--dry-run`` included). Finds the modules without importing them."""
    e = entry(name)
    missing = [m for m in e.packages if importlib.util.find_spec(m) is None]
    if missing:
        self_contained = [n for n, other in _entries.items() if not other.packages]
        raise JobError(
            f"sampler {name!r} needs {', '.join(missing)}, which is not installed: "
            f"pip install 'autotune[{e.extra}]' (or pip install {' '.join(missing)}); or use one "
            f"of {', '.join(self_contained)}."
        )

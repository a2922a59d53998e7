"""Re-measuring stored winners that were measured with other jax/jaxlib versions.

A stored time holds for the jax and jaxlib it was measured with. After an upgrade, queries
keep answering with the old winners (marked stale, see :mod:`autotune.queries.best`) until they are
measured again. :func:`revalidate` does that for every problem stored for the engine's device:

1. the *stale* configs of a problem are its ok trials on that device measured with another
   jax or jaxlib than the running ones; the ``top`` fastest distinct ones are taken, fastest
   (the old winner) first;
2. those not yet measured with the running jax and jaxlib on the device are measured again
   through the engine, exactly as ``autotune tune`` measures a config, and stored as new
   trials under the running software versions (old rows are never touched: the database keeps
   one trial per config, device and software). A problem whose ``top`` stale configs all have
   such a trial already is up to date and left out;
3. the problem's winner under the running versions (every ok trial measured with them, new
   and earlier) is compared with the old winner: ``holds`` when it is the same config.

No Optuna study is involved: the new trials belong to no study.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence

from autotune.engine.protocol import EngineLike
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.protocol import TrialStore
from autotune.storage.rows import TrialRow

__all__ = ["Remeasured", "Revalidation", "revalidate", "stale_configs", "CHANGED_RATIO"]

log = logging.getLogger(__name__)

# A re-measured time that differs from the old one by more than this fraction has changed.
CHANGED_RATIO = 0.05
_VERSION_KEYS = ("jax", "jaxlib")


@dataclasses.dataclass(frozen=True)
class Remeasured:
    """One stale config measured again: its old time and software, and the new result
    (``fresh``: measured by this revalidation, else found stored from an earlier one)."""

    config: Config
    old_us: float
    old_software: dict[str, str] = dataclasses.field(hash=False)
    result: TrialResult
    trial_id: int
    fresh: bool = True

    @property
    def new_us(self) -> float | None:
        return self.result.median_us if self.result.ok else None

    @property
    def ratio(self) -> float | None:
        """``new_us / old_us``: above 1 it got slower."""
        return None if self.new_us is None else self.new_us / self.old_us


@dataclasses.dataclass(frozen=True)
class Revalidation:
    """What re-measuring the stale configs of one problem on one device found.

    ``measured`` starts with the old winner. ``winner`` is the fastest config measured with
    the running versions (None when none of them ran ok).
    """

    problem: Problem
    device: str
    software: dict[str, str] = dataclasses.field(hash=False)
    measured: tuple[Remeasured, ...]
    winner: Config | None
    winner_us: float | None

    @property
    def old_winner(self) -> Remeasured:
        return self.measured[0]

    @property
    def holds(self) -> bool:
        """The old winner is still the fastest with the running versions."""
        return self.winner is not None and self.winner == self.old_winner.config

    @property
    def changed(self) -> bool:
        """The winner changed, failed, or its time moved by more than :data:`CHANGED_RATIO`."""
        ratio = self.old_winner.ratio
        return not self.holds or ratio is None or abs(ratio - 1.0) > CHANGED_RATIO


def _versions(software: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(software.get(key, "") for key in _VERSION_KEYS)


def stale_configs(
    store: TrialStore, problem: Problem, device: DeviceInfo, software: Mapping[str, str], *, top: int
) -> list[TrialRow]:
    """The ``top`` fastest distinct configs of ``problem`` that ran ok on ``device`` with other
    jax/jaxlib versions than ``software``'s, fastest (the stale winner) first, each as its
    fastest old trial."""
    rows = store.trials(problem, device_name=device.name, device_kind=device.kind)
    return _stale(rows, _versions(software), top)


def _stale(rows: Sequence[TrialRow], running: tuple[str, ...], top: int) -> list[TrialRow]:
    fastest: dict[Config, TrialRow] = {}
    for row in rows:
        if not row.ok or row.median_us is None or _versions(row.software) == running:
            continue
        old = fastest.get(row.config)
        if old is None or row.median_us < (old.median_us or 0.0):
            fastest[row.config] = row
    return sorted(fastest.values(), key=lambda r: (r.median_us, r.id))[:top]


def revalidate(
    store: TrialStore,
    engine: EngineLike,
    *,
    kernel: str | None = None,
    top: int = 3,
    software: Mapping[str, str] | None = None,
    on_result: Callable[[Problem, Remeasured], None] | None = None,
) -> list[Revalidation]:
    """Re-measures the stale winners stored for the engine's device; one report per problem
    that had any (see the module docstring).

    Args:
      store: the results database.
      engine: what measures configs (an :class:`autotune.engine.dispatcher.Engine`, or anything with
        ``device_info()`` and ``submit(kernel_name, problem, config) -> Future``).
      kernel: only this kernel's problems.
      top: stale configs re-measured per problem, the old winner first.
      software: the versions to store the new trials under; default: this process's
        (:func:`autotune.tuning.provenance.software_versions`).
      on_result: called with each re-measured config as it is stored.
    """
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be a positive integer, but got {top!r}.")
    if software is None:
        from autotune.tuning.provenance import software_versions

        software = software_versions()
    software = dict(software)
    device = engine.device_info()
    # Stale winners of the engine's cache policy, re-measured with it: never compared across.
    policy = str(getattr(engine, "cache_policy", "warm"))
    reports = []
    running = _versions(software)
    for problem in store.problems(kernel):
        rows = store.trials(problem, device_name=device.name, device_kind=device.kind,
                            cache=policy)
        stale = _stale(rows, running, top)
        current: dict[Config, TrialRow] = {}
        for row in rows:
            if _versions(row.software) == running:
                current.setdefault(row.config, row)
        todo = [row for row in stale if row.config not in current]
        if not todo:
            continue
        log.info("%s on %s: re-measuring %d config(s) measured with other versions.",
                 problem, device.name, len(todo))
        fresh = {m.config: m for m in _measure(store, engine, problem, device, software, todo,
                                               on_result)}
        measured = [
            fresh.get(row.config) or _earlier(row, current[row.config]) for row in stale
        ]
        best = store.best(problem, device_name=device.name, device_kind=device.kind,
                          versions={k: software[k] for k in _VERSION_KEYS if k in software},
                          cache=policy)
        reports.append(
            Revalidation(
                problem=problem,
                device=device.name,
                software=software,
                measured=tuple(measured),
                winner=Config(best[0].config) if best else None,
                winner_us=best[0].median_us if best else None,
            )
        )
    return reports


def _earlier(old: TrialRow, new: TrialRow) -> Remeasured:
    assert old.median_us is not None  # _stale returns timed ok trials only
    return Remeasured(old.config, old.median_us, dict(old.software), new.result(), new.id,
                      fresh=False)


def _measure(
    store: TrialStore,
    engine: EngineLike,
    problem: Problem,
    device: DeviceInfo,
    software: Mapping[str, str],
    stale: Sequence[TrialRow],
    on_result: Callable[[Problem, Remeasured], None] | None,
) -> list[Remeasured]:
    worker = f"{socket.gethostname()}:{os.getpid()}"
    started = dt.datetime.now(dt.UTC)
    futures = [engine.submit(problem.kernel, problem, row.config) for row in stale]
    out = []
    for row, future in zip(stale, futures, strict=True):
        result = future.result()
        recorded = store.record_trial(
            problem, row.config, result, device=device, software=software,
            worker=worker, started_at=started, cache=row.cache_policy,
        )
        assert row.median_us is not None  # _stale returns timed ok trials only
        item = Remeasured(row.config, row.median_us, dict(row.software), result, recorded.id)
        out.append(item)
        if on_result is not None:
            on_result(problem, item)
    return out

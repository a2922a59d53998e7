"""Asking the results database what is best: the API a kernel's caller uses at run time.

    >>> best_config("matmul", {"m": 4096, "n": 4096, "k": 4096}, "bf16")
    {'tile_m': 128, 'tile_n': 256, ...}

Every function answers from the database ``db``, else ``$AUTOTUNE_DB``, else
``sqlite:///results/autotune.db``, opened read-only: a query never writes to the database (not
its header, not a row; an older schema is upgraded first, only once the file proved sound), and
waits at most ``$AUTOTUNE_READ_TIMEOUT_S`` (default 5 s) to connect, for a lock or for one
statement. The few databases used last stay open in this process (a
run-time lookup must not pay for opening and checking the schema each time); a database file
that was replaced is opened afresh. A missing SQLite file answers "nothing tuned" (None, or an
empty list) and is not created; so does a database without autotune's tables (an empty file,
another program's database), which is left as it is.

Devices: ``device`` names a device kind (``"gpu"``, ``"interpret"``, ``"fake"``) or a device
(``"NVIDIA H200"``, or any unambiguous part of the name, such as ``"h200"``). By default only
GPU results are used: interpret-mode rows are functional runs on a CPU, not GPU timings, and
are returned only when asked for (``device="interpret"`` or the interpret device's name), or on
a machine without a GPU (:func:`host_has_gpu`) for a problem with no GPU result stored: there
they are what ran, and the answer says so (``BestResult.device_kind == "interpret"``).

The database: ``db``, else ``$AUTOTUNE_DB``, else ``results/autotune.db`` relative to the
current working directory (made absolute when first used). When that SQLite file does not
exist, the first query warns once (:class:`~autotune.errors.MissingDatabaseWarning`, naming
the resolved path and ``AUTOTUNE_DB``) and every query answers "nothing tuned".

Software versions: a stored time holds for the jax and jaxlib it was measured with. Among the
results of the device (or device kind) chosen as above, :func:`best_result` (and so
:func:`best_config`, :func:`nearest_results` and the run-time lookup) answers with the fastest
measured with the running jax and jaxlib (:func:`running_versions`), even when a result of
other versions was faster, and falls back to the fastest of other versions only when there is
none; ``BestResult.stale`` says which, and the fallback is logged. GPU results of other
versions still come before interpret-mode ones. ``autotune revalidate`` re-measures such stale
winners.

Cache policies: times of the ``cold`` and ``warm`` policies (:mod:`autotune.space.outcomes`)
are never ranked together. A problem is answered from its ``cold`` results when it has any on
the chosen device, else from its ``warm`` ones (``cache=`` picks one); ``BestResult.cache_policy``
says which.

Confirmation: when the newest confirmation round of that policy, device and software is newer
than the fastest trial, the answer is its crowned config, with its confirmed median and speedup
(the median round's) and the speedup's spread, and the configs it found tied
(``BestResult.confirmed``).

Program check: where that round has a program check (a verification row of method
``PROGRAM_METHOD``: the crowned config and the baseline timed as a program calls them), its
speedup and interval decide which implementation runs (:func:`verdict_figures`): CUPTI's kernel
times leave out what a call costs the GPU beyond its kernels (benchmarks/RESULTS.md §19). The
answer carries both figures (``confirmed_speedup``, ``program_speedup``).

This module must not import jax, directly or indirectly: asking for a config must not
initialise CUDA.

Why one piece (over 400 lines): every query answers from the same read-only store cache, the
same servability check (stale versions, validity) and the same result values; split, each would
reopen the database its own way.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from autotune._jax_compat import installed_versions
from autotune.errors import EmptyDatabaseError, JobError, did_you_mean
from autotune.space.outcomes import CACHE_POLICIES, DEVICE_KINDS, DeviceKind, plausible_us
from autotune.space.problem import (
    Problem,
    ShapeValue,
    canonical_dtype,
    parse_shape,
    shape_distance,  # re-exported: part of the query API
)
from autotune.space.validity import servable, violations
from autotune.storage.rows import (
    PROGRAM_CHECK,
    ProblemSummary,
    TrialRow,
    Verdict,
    current_check,
    pick_verdict,
)
from autotune.storage.sqlite_reader import SQLiteReader
from autotune.storage.urls import (
    display_url,
    plain_sqlite_file,
    read_timeout_s,
    resolve_url,
    sqlite_path,
)

if TYPE_CHECKING:  # pragma: no cover
    from types import FrameType

    import pandas

    # Imported where a store is opened: a best-config query on an SQLite file reads it through
    # an SQLiteReader and never imports SQLAlchemy (benchmarks/RESULTS.md §17).
    from autotune.storage.store import Store

    Reader = Store | SQLiteReader

__all__ = [
    "best_config", "best_result", "list_results", "nearest_results", "shape_distance",
    "running_versions", "results_frame", "close_stores", "BestResult", "ProblemSummary",
    "FRAME_COLUMNS", "served_summaries", "unservable_results", "UnservableResult",
    "stored_kernels", "stored_trial_seconds", "check_device", "host_has_gpu",
    "faster_of", "runs_of", "written_runs", "choice_words", "margin_words", "verdict_figures",
    "Verdict", "FASTER", "RUNS",
]

log = logging.getLogger(__name__)

# Which implementation a problem's confirmation round found faster: the kernel (its speedup's
# interval lies above 1.0), the baseline (below) or neither (it holds 1.0, or none confirmed).
FASTER = ("kernel", "baseline", "tie")
# Which implementation a program given a baseline runs (:func:`runs_of`): the one the verdict's
# speedup puts ahead (a tie too: by its estimate), the kernel where there is no verdict.
RUNS = ("kernel", "baseline")


def faster_of(speedup: float | None, low: float | None, high: float | None) -> str:
    """``"kernel"``, ``"baseline"`` or ``"tie"`` (:data:`FASTER`) for a confirmed speedup
    (baseline time over kernel time) and its interval; "tie" without one."""
    if speedup is None or low is None or high is None:
        return "tie"
    if high < 1.0:
        return "baseline"
    return "kernel" if low > 1.0 else "tie"


def runs_of(speedup: float | None, low: float | None, high: float | None,
            other: float | None = None) -> str:
    """Which implementation runs (:data:`RUNS`) for a verdict's speedup (baseline time over
    kernel time) and its interval, the one route rule (``tuned(baseline=...)``, the lookup,
    exports' ``runs`` and ``choose()``, ``best``, the report): the one the speedup puts ahead,
    ``"kernel"`` above 1.0 and ``"baseline"`` at or below it, a tie (the interval holding 1.0)
    included: the estimate is the best guess there is, and neither always-the-kernel nor
    always-the-baseline for ties does as well (benchmarks/RESULTS.md §19: on the H200 a tie
    routed to the kernel ran 1.5% slower than XLA; on the H100 two ties routed to XLA would
    have given up 1.5% and 1.9%). A tie runs the kernel only where ``other`` (the confirmation's
    speedup, where the program check decides: ``Verdict.other``) does not put the baseline
    ahead: where the two timings disagree, nothing shows the kernel faster, and the baseline is
    what the program runs without the tool (§19: an H100 attention tie, program check 1.007,
    CUPTI 0.915, ran the decorated call 3.5% slower than cuDNN). ``"kernel"`` without a verdict
    (a figure missing or not finite: nothing confirmed against a baseline)."""
    if speedup is None or low is None or high is None:
        return "kernel"
    if not (math.isfinite(speedup) and math.isfinite(low) and math.isfinite(high)):
        return "kernel"
    if speedup > 1.0 and low <= 1.0 and other is not None and math.isfinite(other) \
            and other <= 1.0:
        return "baseline"
    return "kernel" if speedup > 1.0 else "baseline"


def written_runs(runs: Any, faster: Any, speedup: Any, low: Any, high: Any) -> str:
    """The route an exported record or ``CHOICE`` entry gives: its ``runs`` where it has one;
    else (an export older than ``runs``) :func:`runs_of` of its speedup and interval where it
    has all three; else (no interval: no verdict) ``"baseline"`` only where its ``faster``
    says the baseline is."""
    if runs in RUNS:
        return str(runs)
    figures = (speedup, low, high)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in figures):
        return runs_of(*figures)
    return "baseline" if faster == "baseline" else "kernel"


def margin_words(speedup: float, low: float | None, high: float | None,
                 baseline: str | None) -> str:
    """Which implementation is faster, by how much, in words with the interval: "XLA is 2.1%
    faster (interval 1.8% to 2.4%)", "the kernel is 3.0% faster than XLA (interval ...)", or
    "no faster than XLA (within the measured noise: -0.4% to +0.6%)"; without an interval, the
    margin alone."""
    name = baseline or "the baseline"
    if low is None or high is None:
        if speedup < 1.0:
            return f"{name} is {100 * (1 / speedup - 1):.1f}% faster (no interval)"
        return f"the kernel is {100 * (speedup - 1):.1f}% faster than {name} (no interval)"
    faster = faster_of(speedup, low, high)
    if faster == "baseline":
        return (f"{name} is {100 * (1 / speedup - 1):.1f}% faster (interval "
                f"{100 * (1 / high - 1):.1f}% to {100 * (1 / low - 1):.1f}%)")
    if faster == "kernel":
        return (f"the kernel is {100 * (speedup - 1):.1f}% faster than {name} (interval "
                f"{100 * (low - 1):.1f}% to {100 * (high - 1):.1f}%)")
    return (f"no faster than {name} (within the measured noise: {100 * (low - 1):+.1f}% to "
            f"{100 * (high - 1):+.1f}%)")


def choice_words(config: Mapping[str, Any] | None, speedup: float | None, low: float | None,
                 high: float | None, baseline: str | None, other: float | None = None) -> str:
    """Which implementation runs (:func:`runs_of`), in words, with the margin and its interval:
    "XLA is 2.1% faster (interval 1.8-2.4%): it runs; the kernel's best config is {...}" where
    the baseline wins, "no faster than XLA (within the measured noise: ...): XLA runs; the
    kernel's best config is {...}" for a tie whose estimate puts XLA ahead ("...: the kernel
    runs with config {...}" for one that puts the kernel ahead), "the kernel is 3.0% faster
    than XLA (...): config {...}" where the kernel wins; "the kernel's best config is {...} (no
    confirmed comparison with a baseline)" without. Give it the figures :func:`verdict_figures`
    picks (``other``: :func:`runs_of`'s)."""
    text = "-" if config is None else json.dumps(dict(config), sort_keys=True)
    if speedup is None or low is None or high is None:
        return f"the kernel's best config is {text} (no confirmed comparison with a baseline)"
    margin = margin_words(speedup, low, high, baseline)
    if runs_of(speedup, low, high, other) == "kernel":
        if faster_of(speedup, low, high) == "tie":
            return f"{margin}: the kernel runs with config {text}"
        return f"{margin}: config {text}"
    if faster_of(speedup, low, high) == "baseline":
        return f"{margin}: it runs; the kernel's best config is {text}"
    return f"{margin}: {baseline or 'the baseline'} runs; the kernel's best config is {text}"


def verdict_figures(answer: BestResult | ProblemSummary) -> Verdict:
    """The speedup, interval and source (``"program-check"``, ``"confirmation"`` or None) that
    decide which implementation runs for ``answer``: its program check where there is one,
    else its confirmation round (:func:`autotune.storage.rows.pick_verdict`, the one rule).
    Every answer asks here: ``best``, the run-time lookup and ``tuned``'s route, ``export``,
    the report."""
    return answer.verdict_figures


@dataclasses.dataclass(frozen=True)
class BestResult:
    """The fastest stored config of a problem, and how it compares with the best baseline.

    ``ratio`` is ``median_us / baseline_us``: below 1 the tuned kernel beats the baseline
    (``speedup`` is its inverse). Both are None without a baseline on the same device.
    """

    problem: Problem
    config: dict[str, Any] = dataclasses.field(hash=False)
    median_us: float
    device: str
    device_kind: str
    jax_version: str
    measured_at: dt.datetime
    trial_id: int
    baseline_name: str | None
    baseline_us: float | None
    ratio: float | None
    jaxlib_version: str = ""
    # Measured with other jax/jaxlib versions than the running ones (none of those stored).
    stale: bool = False
    cache_policy: str = "warm"  # "cold" | "warm": every figure here is of this policy
    spread: float | None = None  # (p90 - p10) / median of the samples behind median_us
    # From the confirmation round (None / () when the answer was not confirmed):
    confirmation_id: int | None = None
    confirmed_speedup: float | None = None  # baseline over crowned config, the median round's
    speedup_spread: float | None = None  # half its interval's width, relative to it
    speedup_low: float | None = None  # the interval of the per-round paired speedups
    speedup_high: float | None = None
    # The other configs of the winner's tied group: within the measured noise of the fastest.
    ties: tuple[dict[str, Any], ...] = dataclasses.field(default=(), hash=False)
    # From the confirmation round's program check (None without one): the speedup as a program
    # calling both implementations sees it, and its interval; it decides the verdict.
    program_check_id: int | None = None
    program_speedup: float | None = None
    program_speedup_low: float | None = None
    program_speedup_high: float | None = None

    @property
    def confirmed(self) -> bool:
        return self.confirmation_id is not None

    @property
    def speedup(self) -> float | None:
        """``baseline_us / median_us`` (above 1 the tuned kernel is faster); the confirmation
        round's paired speedup when confirmed."""
        if self.confirmed_speedup is not None:
            return self.confirmed_speedup
        return None if self.ratio is None else 1.0 / self.ratio

    @property
    def verdict_figures(self) -> Verdict:
        """The figures that decide which implementation runs (:func:`verdict_figures`)."""
        program = None
        if self.program_check_id is not None:
            program = (self.program_speedup, self.program_speedup_low, self.program_speedup_high)
        confirmed = (self.confirmed_speedup, self.speedup_low, self.speedup_high)
        return pick_verdict(confirmed if self.confirmed else None, program)

    @property
    def faster(self) -> str:
        """Which implementation the verdict figures find faster beyond their interval
        (:func:`faster_of`): ``"kernel"``, ``"baseline"`` or ``"tie"``."""
        v = self.verdict_figures
        return faster_of(v.speedup, v.low, v.high)

    @property
    def runs(self) -> str:
        """Which implementation a program given the baseline runs (:func:`runs_of` of the
        verdict figures): the one their speedup puts ahead, ``"kernel"`` without them."""
        v = self.verdict_figures
        return runs_of(v.speedup, v.low, v.high, v.other)

    @property
    def verdict(self) -> str:
        """The verdict in words, from the figures that decide it (the program check where there
        is one, else the confirmed speedup): faster than the baseline, no faster (the interval
        holds 1.0) or slower (it lies below); "" when not confirmed against a baseline."""
        from autotune.tuning.confirmation import speedup_words

        v = self.verdict_figures
        return "" if v.speedup is None else speedup_words(v.speedup, v.low, v.high,
                                                          self.baseline_name)

    @property
    def confirmation_verdict(self) -> str:
        """The confirmation round's speedup (CUPTI kernel times) in words, as :attr:`verdict`
        words it; "" when not confirmed against a baseline."""
        from autotune.tuning.confirmation import speedup_words

        if self.confirmed_speedup is None:
            return ""
        return speedup_words(self.confirmed_speedup, self.speedup_low, self.speedup_high,
                             self.baseline_name)

    @property
    def program_words(self) -> str:
        """The program check's margin in words with its interval (:func:`margin_words`); ""
        without a program check with a speedup."""
        if self.program_speedup is None:
            return ""
        return margin_words(self.program_speedup, self.program_speedup_low,
                            self.program_speedup_high, self.baseline_name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``measured_at`` as ISO 8601 text). ``speedup`` and
        ``confirmed_speedup`` are the confirmation round's (CUPTI kernel times); the
        ``program_speedup`` fields its program check's (None without one); ``faster``,
        ``runs``, ``choice`` and ``verdict`` follow :func:`verdict_figures`, whose source
        ``verdict_source`` names."""
        verdict = self.verdict_figures
        return {
            "kernel": self.problem.kernel,
            "shape": self.problem.dims,
            "dtype": self.problem.dtype,
            "config": dict(self.config),
            "median_us": self.median_us,
            "device": self.device,
            "device_kind": self.device_kind,
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "stale": self.stale,
            "measured_at": self.measured_at.isoformat(),
            "trial_id": self.trial_id,
            "baseline_name": self.baseline_name,
            "baseline_us": self.baseline_us,
            "ratio": self.ratio,
            "speedup": self.speedup,
            "cache_policy": self.cache_policy,
            "spread": self.spread,
            "confirmed": self.confirmed,
            "confirmation_id": self.confirmation_id,
            "confirmed_speedup": self.confirmed_speedup,
            "speedup_spread": self.speedup_spread,
            "speedup_low": self.speedup_low,
            "speedup_high": self.speedup_high,
            "program_check_id": self.program_check_id,
            "program_speedup": self.program_speedup,
            "program_speedup_low": self.program_speedup_low,
            "program_speedup_high": self.program_speedup_high,
            "verdict_source": verdict.source,
            "verdict": self.verdict,
            "faster": faster_of(verdict.speedup, verdict.low, verdict.high),
            "runs": runs_of(verdict.speedup, verdict.low, verdict.high, verdict.other),
            "choice": choice_words(self.config, verdict.speedup, verdict.low, verdict.high,
                                   self.baseline_name, verdict.other),
            "ties": [dict(t) for t in self.ties],
        }


def best_config(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
) -> dict[str, Any] | None:
    """The fastest stored config of a problem, with the kernel's own parameter names, or None.

    ``shape`` is a mapping (``{"m": 4096, ...}``) or ``--shape`` text (``"m=4096,n=4096"``);
    ``dtype`` may be an alias (``"bf16"``).
    """
    result = best_result(kernel, shape, dtype, device=device, db=db)
    return None if result is None else dict(result.config)


def best_result(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
    timeout_s: float | None = None,
    cache: str | None = None,
) -> BestResult | None:
    """The best stored config of a problem with its baseline comparison, or None: the
    confirmation round's winner when there is a current one, else the fastest trial.
    ``timeout_s`` bounds each wait on the database (default: :func:`storage.read_timeout_s`)."""
    problem = Problem(kernel, parse_shape(shape) if isinstance(shape, str) else shape, dtype)
    if cache is not None and cache not in CACHE_POLICIES:
        raise JobError(f"cache must be one of {', '.join(CACHE_POLICIES)}, but got {cache!r}.")
    with open_reader(db, timeout_s=timeout_s) as store:
        if store is None:
            return None
        if device is None:
            found = _best_row(store, problem, None, DeviceKind.GPU, cache)
            if found is None and not host_has_gpu():
                found = _best_row(store, problem, None, DeviceKind.INTERPRET, cache)
                if found is not None:
                    log.info("%s: no GPU on this machine and no GPU result stored: answering "
                             "with the interpret-mode result (a functional run on a CPU).",
                             problem)
        else:
            name, kind = resolve_device(store, device)
            found = _best_row(store, problem, name, kind, cache)
        if found is None:
            return None
        return _best_result(store, problem, *found)


def host_has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU this process may use, found without importing
    jax (which would initialise CUDA): ``CUDA_VISIBLE_DEVICES`` set to nothing or ``-1`` hides
    every GPU; else a GPU the NVIDIA driver lists (``/proc/driver/nvidia/gpus``) or its device
    file (``/dev/nvidia0``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        gpus = Path("/proc/driver/nvidia/gpus")
        if gpus.is_dir() and any(gpus.iterdir()):
            return True
        return Path("/dev/nvidia0").exists()
    except OSError:
        return False


def running_versions() -> dict[str, str]:
    """The installed jax and jaxlib versions (from package metadata: jax is not imported);
    a package that is not installed is left out."""
    return installed_versions()


def _best_row(
    store: Reader, problem: Problem, name: str | None, kind: str | None, cache: str | None = None
) -> tuple[TrialRow, bool] | None:
    """The fastest ok trial measured with the running jax/jaxlib, else the fastest of other
    versions, and whether it is stale (of other versions); of ``cache``'s policy, else of the
    store's preferred one (cold, then warm)."""
    if cache is None:
        cache = store.preferred_policy(problem, device_name=name, device_kind=kind)
    versions = running_versions()
    if versions:
        found = _first_servable(store, problem, name, kind, versions, cache)
        if found is not None:
            return found, False
    best = _first_servable(store, problem, name, kind, None, cache)
    if best is None:
        return None
    log.info(
        "%s on %s: no result measured with the running %s; using one measured with %s "
        "(`autotune revalidate` re-measures it).",
        problem, best.device.name, _versions_text(versions), _versions_text(best.software),
    )
    return best, True


def _first_servable(
    store: Reader, problem: Problem, name: str | None, kind: str | None,
    versions: Mapping[str, str] | None, cache: str | None = None,
) -> TrialRow | None:
    """The fastest ok trial with a plausible time (the one gate on times:
    :func:`autotune.space.outcomes.plausible_us`) whose config is valid under today's rules
    (the one check: :func:`autotune.space.validity.servable`); rows that break them are skipped
    with a warning."""
    n = 4
    while True:
        rows = store.best(problem, device_name=name, device_kind=kind, n=n, versions=versions,
                          cache=cache)
        for row in rows:
            # A time that is not one (written by another tool) is never served either.
            if plausible_us(row.median_us) and servable(problem, row.config):
                return row
        if len(rows) < n:
            return None
        n *= 4


def served_summaries(store: Store, summaries: list[ProblemSummary]) -> list[ProblemSummary]:
    """``summaries`` whose best config is the fastest *servable* one: a stored best that breaks
    today's rules is replaced by the fastest valid trial of its (problem, device), or by none."""
    out = []
    for s in summaries:
        if s.confirmation is not None and not plausible_us(s.confirmation.crowned.median_us):
            # A confirmed time that is not a time: neither it nor its program check answers.
            s = dataclasses.replace(s, confirmation=None, program_check=None)
        if s.baseline_us is not None and not plausible_us(s.baseline_us):
            s = dataclasses.replace(s, baseline_name=None, baseline_us=None)
        if s.best_config is not None and not (
            plausible_us(s.best_us) and servable(s.problem, s.best_config)
        ):
            row = _first_servable(store, s.problem, s.device, s.device_kind, None)
            s = dataclasses.replace(
                s,
                best_us=None if row is None else row.median_us,
                best_config=None if row is None else dict(row.config),
                best_trial_id=None if row is None else row.id,
            )
        out.append(s)
    return out


def _versions_text(versions: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {versions.get(k) or '?'}" for k in ("jax", "jaxlib"))


def _current_confirmation(store: Reader, problem: Problem, best: TrialRow) -> Any:
    """The newest confirmation round of ``best``'s device, software and policy, if it is newer
    than ``best`` (else the search found ``best`` after it, and it is not current)."""
    for c in store.confirmations(problem, device_name=best.device.name,
                                 device_kind=best.device.kind, cache=best.cache_policy, limit=4):
        if all(c.software.get(k, "") == best.software.get(k, "") for k in ("jax", "jaxlib")):
            return c if c.created_at >= best.finished_at else None
    return None


def _best_result(store: Reader, problem: Problem, best: TrialRow, stale: bool = False) -> BestResult:
    confirmation = _current_confirmation(store, problem, best)
    if confirmation is not None and not plausible_us(confirmation.crowned.median_us):
        confirmation = None  # a confirmed time that is not a time is never served
    if confirmation is not None:
        crowned = store.trial(confirmation.crowned_trial_id)
        if crowned is not None:
            return _confirmed_result(store, problem, crowned, confirmation, stale)
    baseline = store.baseline(problem, device_name=best.device.name, device_kind=best.device.kind,
                              cache=best.cache_policy)
    assert best.median_us is not None  # best() returns timed ok trials only
    return BestResult(
        problem=problem,
        config=dict(best.config),
        median_us=best.median_us,
        device=best.device.name,
        device_kind=best.device.kind,
        jax_version=best.software.get("jax", ""),
        measured_at=best.finished_at,
        trial_id=best.id,
        baseline_name=None if baseline is None else baseline.name,
        baseline_us=None if baseline is None else baseline.median_us,
        ratio=None if baseline is None else best.median_us / baseline.median_us,
        jaxlib_version=best.software.get("jaxlib", ""),
        stale=stale,
        cache_policy=best.cache_policy,
        spread=best.spread,
    )


def _confirmed_result(
    store: Reader, problem: Problem, crowned: TrialRow, c: Any, stale: bool
) -> BestResult:
    program = c.crowned
    baseline_us = c.baseline_median_us if plausible_us(c.baseline_median_us) else None
    speedup = _finite(c.speedup)
    check = current_check(c, store.program_checks([c.id]).get(c.id))
    figures = (None, None, None) if check is None else (
        _finite(check.speedup), _finite(check.speedup_low), _finite(check.speedup_high))
    return BestResult(
        problem=problem,
        config=dict(crowned.config),
        median_us=program.median_us,
        device=crowned.device.name,
        device_kind=crowned.device.kind,
        jax_version=crowned.software.get("jax", ""),
        measured_at=c.created_at,
        trial_id=crowned.id,
        baseline_name=c.baseline_name,
        baseline_us=baseline_us,
        ratio=None if speedup is None else 1.0 / speedup,
        jaxlib_version=crowned.software.get("jaxlib", ""),
        stale=stale,
        cache_policy=c.cache_policy,
        spread=program.spread,
        confirmation_id=c.id,
        confirmed_speedup=speedup,
        speedup_spread=c.speedup_spread if speedup is not None else None,
        speedup_low=c.speedup_low if speedup is not None else None,
        speedup_high=c.speedup_high if speedup is not None else None,
        ties=tuple(
            {"config": dict(p.config), "median_us": p.median_us, "diff": p.diff,
             "trial_id": p.trial_id}
            for p in c.tied_with_winner() if plausible_us(p.median_us)
        ),
        program_check_id=None if check is None else check.id,
        program_speedup=figures[0],
        program_speedup_low=figures[1],
        program_speedup_high=figures[2],
    )


def _finite(value: float | None) -> float | None:
    """``value`` where it is a positive finite number, else None (a check that is not one)."""
    return value if isinstance(value, int | float) and 0 < value < math.inf else None


def nearest_results(
    kernel: str,
    shape: Mapping[str, ShapeValue] | str,
    dtype: str,
    *,
    device: str | None = None,
    db: str | None = None,
    limit: int = 5,
    timeout_s: float | None = None,
) -> list[BestResult]:
    """The best results of the tuned problems nearest to ``shape`` (same kernel and dtype,
    the problem itself excluded), nearest first by :func:`shape_distance`.

    With ``device=None``, only GPU results are used (interpret-mode ones only when asked for
    by device); ties in distance keep the order problems were stored in.
    """
    problem = Problem(kernel, parse_shape(shape) if isinstance(shape, str) else shape, dtype)
    with open_store(db, timeout_s=timeout_s) as store:
        if store is None:
            return []
        candidates = [
            (d, p)
            for p in store.problems(kernel)
            if p.dtype == problem.dtype and p != problem
            and math.isfinite(d := shape_distance(p.dims, problem.dims))
        ]
        candidates.sort(key=lambda item: item[0])
        filters = [(None, DeviceKind.GPU)] if device is None else [resolve_device(store, device)]
        out: list[BestResult] = []
        for name, kind in filters:
            found = 0
            for _, other in candidates:
                if found >= limit:
                    break
                best = _best_row(store, other, name, kind)
                if best is not None:
                    out.append(_best_result(store, other, *best))
                    found += 1
        return out


def list_results(
    db: str | None = None,
    *,
    kernel: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
) -> list[ProblemSummary]:
    """One summary per stored (problem, device): trials by outcome, best time and config,
    fastest baseline. ``device=None`` lists every device, interpret mode included (each
    summary names its device and kind)."""
    dtype = None if dtype is None else canonical_dtype(dtype)
    with open_store(db) as store:
        if store is None:
            return []
        name, kind = (None, None) if device is None else resolve_device(store, device)
        return served_summaries(
            store, store.summaries(kernel=kernel, dtype=dtype, device_name=name, device_kind=kind)
        )


@dataclasses.dataclass(frozen=True)
class UnservableResult:
    """A stored ok trial whose config breaks today's rules: kept, never served."""

    trial: TrialRow
    broken: tuple[str, ...]  # "[rule] explanation", one per broken rule

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        t = self.trial
        return {
            "trial_id": t.id, "kernel": t.problem.kernel, "shape": t.problem.dims,
            "dtype": t.problem.dtype, "device": t.device.name, "device_kind": t.device.kind,
            "median_us": t.median_us, "config": dict(t.config), "broken": list(self.broken),
        }


def unservable_results(
    db: str | None = None,
    *,
    kernel: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
) -> list[UnservableResult]:
    """The stored ok trials that are never served because their config breaks today's rules
    (a rule tightened, or a tunable renamed, after they were measured), oldest first."""
    dtype = None if dtype is None else canonical_dtype(dtype)
    with open_store(db) as store:
        if store is None:
            return []
        rows = _frame_rows(store, kernel, dtype, device, "ok")
    out = []
    for row in rows:
        broken = violations(row.problem, row.config)
        if broken:
            out.append(UnservableResult(row, tuple(broken)))
    return out


FRAME_COLUMNS = (
    "trial_id", "kernel", "dtype", "problem", "status", "median_us", "min_us", "max_us",
    "compile_s", "rel_error", "timing", "cache_policy", "spread", "device", "device_kind",
    "compute_capability",
    "driver", "jax", "jaxlib", "autotune", "study_name", "optuna_trial_number", "worker", "host",
    "started_at", "finished_at", "traced", "error",
)


def results_frame(
    db: str | None = None,
    *,
    kernel: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> pandas.DataFrame:
    """Every stored trial as a pandas DataFrame, one row per trial, oldest first.

    Columns: :data:`FRAME_COLUMNS` (times in microseconds, compile time in seconds, datetimes
    in UTC; ``jax``/``jaxlib``/``autotune`` are the versions it was measured with), then one
    ``shape.<key>`` column per problem shape key and one ``config.<name>`` column per config
    parameter (missing where a trial's kernel has no such key). Filters: ``kernel``,
    ``dtype`` (aliases allowed), ``device`` (a kind or a device name, as for
    :func:`best_result`) and ``status`` (an outcome such as ``"ok"``); ``limit``: the first
    ``limit`` trials only. Filters and limit are applied by the database, and the columns are
    built directly (a million trials in well under 1.5 GB: benchmarks/history_scaling.py).

    Raises:
      ImportError: pandas is not installed (``pip install 'autotune[report]'``).
      JobError: an unknown ``status``, or a ``limit`` that is not a whole number >= 0.
    """
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            "results_frame needs pandas, which is not installed: pip install 'autotune[report]' "
            "(or pip install pandas)."
        ) from e
    from autotune.space.outcomes import Outcome

    dtype = None if dtype is None else canonical_dtype(dtype)
    if status is not None and status not in {o.value for o in Outcome}:
        allowed = [o.value for o in Outcome]
        raise JobError(
            f"results_frame(status={status!r}) is not an outcome; expected one of "
            f"{', '.join(allowed)}.{did_you_mean(status, allowed)}"
        )
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise JobError(f"results_frame(limit={limit!r}): the limit must be a whole number >= 0, "
                       "or None for every trial.")
    with open_store(db) as store:
        if store is None:
            return pd.DataFrame(columns=list(FRAME_COLUMNS))
        name, kind = (None, None) if device is None else resolve_device(store, device)
        table = store.trial_table(kernel=kernel, dtype=dtype, device_name=name, device_kind=kind,
                                  status=status, limit=limit)
    return _frame(pd, table)


def _version_of(key: str, software: Mapping[str, str]) -> str:
    return software.get(key, "")


def _frame(pd: Any, table: Any) -> pandas.DataFrame:
    """The DataFrame of a :class:`~autotune.storage.rows.TrialTable`, built a column at a time
    (no Python loop over the trials: a million rows in seconds, benchmarks/RESULTS.md §17).

    A column of values looked up by id (the problem's, device's, software's, and the shape and
    config columns) is typed by pandas from its distinct values, as it would be from every
    trial's (the same values, each at least once), then taken per trial by position; a column
    of repeated strings (status, timing, worker, ...) likewise from its distinct strings."""
    import numpy as np

    from autotune.storage.rows import NO_TIME

    c = table.columns
    if len(table) == 0:
        return pd.DataFrame(columns=list(FRAME_COLUMNS))

    def spread(ids: Any) -> tuple[list[int], Any]:
        """The distinct ids in the order they first appear, and each trial's index into them."""
        trial_ids = np.frombuffer(ids, dtype=np.int64)
        first_seen = pd.unique(trial_ids)
        position = np.zeros(int(first_seen.max()) + 1, dtype=np.intp)
        position[first_seen] = np.arange(len(first_seen))
        return first_seen.tolist(), position[trial_ids]

    def typed(distinct: list[Any], rows: Any) -> Any:
        return _taken(pd.Series(distinct, dtype=None if distinct else object).array, rows)

    def lookup(ids: Any, of: dict[int, Any], get: Callable[[Any], Any]) -> Any:
        seen, rows = spread(ids)
        return typed([get(of[i]) for i in seen], rows)

    def strings(name: str) -> Any:
        return typed(table.strings[name], np.frombuffer(c[name], dtype=np.int64))

    def times(values: Any) -> Any:
        micros = np.frombuffer(values, dtype=np.int64)
        if (micros == NO_TIME).all():  # as pandas infers it from all None
            return [None] * len(micros)
        out = pd.to_datetime(np.where(micros == NO_TIME, 0, micros), unit="us", utc=True)
        return out.where(micros != NO_TIME)

    def numbers(values: Any) -> Any:
        return np.frombuffer(values, dtype=np.float64).copy()

    pids, cids, dids, sids = c["problem_id"], c["config_id"], c["device_id"], c["software_id"]
    trial_numbers = numbers(c["optuna_trial_number"])
    data: dict[str, Any] = {
        "trial_id": np.frombuffer(c["trial_id"], dtype=np.int64).copy(),
        "kernel": lookup(pids, table.problems, lambda p: p.kernel),
        "dtype": lookup(pids, table.problems, lambda p: p.dtype),
        "problem": lookup(pids, table.problems, str),
        "status": strings("status"),
        **{k: numbers(c[k]) for k in ("median_us", "min_us", "max_us", "compile_s", "rel_error")},
        "timing": strings("timing"), "cache_policy": strings("cache_policy"),
        "spread": numbers(c["spread"]),
        "device": lookup(dids, table.devices, lambda d: d.name),
        "device_kind": lookup(dids, table.devices, lambda d: d.kind),
        "compute_capability": lookup(dids, table.devices, lambda d: d.compute_capability),
        "driver": lookup(dids, table.devices, lambda d: d.driver),
        **{k: lookup(sids, table.software, functools.partial(_version_of, k)) for k in ("jax", "jaxlib", "autotune")},
        "study_name": strings("study_name"),
        # As pandas infers it from the values: whole numbers, floats with NaN, or all None.
        "optuna_trial_number": (trial_numbers.astype(np.int64) if not np.isnan(trial_numbers).any()
                                else [None] * len(trial_numbers) if np.isnan(trial_numbers).all()
                                else trial_numbers),
        "worker": strings("worker"), "host": strings("host"),
        "started_at": times(c["started_at"]), "finished_at": times(c["finished_at"]),
        "traced": np.array(c["traced"], dtype=bool), "error": strings("error"),
    }
    # shape.* and config.* in the order their keys first appear, oldest trial first. Each
    # distinct problem or config is read once (the configs' JSON in one json.loads), its keys
    # made columns by pandas (a key a config lacks: NaN), each typed, then taken per trial.
    # A stored config's JSON is canonical (Config.to_json: sorted keys, whole numbers as ints),
    # so json.loads reads what Config.from_json would, without its checks (10 s at 1M rows).
    def shapes(seen: list[int]) -> list[dict[str, Any]]:
        return [dict(table.problems[i].dims) for i in seen]

    def configs(seen: list[int]) -> list[dict[str, Any]]:
        decoded: list[dict[str, Any]] = json.loads(
            "[" + ",".join(map(table.config_json.__getitem__, seen)) + "]")
        return decoded

    readers: tuple[tuple[str, Any, Callable[[list[int]], list[dict[str, Any]]]], ...] = (
        ("shape", pids, shapes), ("config", cids, configs))
    for prefix, ids, read in readers:
        seen, rows = spread(ids)
        records = pd.DataFrame(read(seen), dtype=object)
        for key in records.columns:
            values = records[key].to_numpy(dtype=object)
            data[f"{prefix}.{key}"] = _taken(_whole(pd, values), rows)
    return pd.DataFrame(data, copy=False)  # every column is built here: none needs a copy


def _taken(values: Any, rows: Any) -> Any:
    """``values`` (a pandas array) taken at ``rows``: a numpy array where pandas holds one."""
    import numpy as np

    if isinstance(values.dtype, np.dtype):
        return values.to_numpy().take(rows)
    return values.take(rows)


def _whole(pd: Any, values: Any) -> Any:
    """``values`` (an object array) as pandas types a list of them (a Series' array); whole
    numbers with a gap (a config value of None, a key another kernel lacks) stay whole:
    pandas' nullable Int64, not float64 (64 read as 64.0)."""
    missing = pd.isna(values)
    if missing.any() and not missing.all() and pd.api.types.infer_dtype(
            values[~missing], skipna=False) == "integer":
        return pd.array([None if m else v for m, v in zip(missing.tolist(), values.tolist(),
                                                           strict=True)], dtype="Int64")
    return pd.Series(values.tolist()).array


def _frame_rows(
    store: Store, kernel: str | None, dtype: str | None, device: str | None, status: str | None
) -> list[TrialRow]:
    name, kind = (None, None) if device is None else resolve_device(store, device)
    return store.trials(
        kernel=kernel, dtype=dtype, device_name=name, device_kind=kind, status=status
    )


# Open stores by (url, pid, SQLite file identity), most recently used last. Opening a Store
# (engine, first connection, schema check) takes ~10 ms; a query on an open one well under 1.
_STORES: collections.OrderedDict[tuple[Any, ...], Reader] = collections.OrderedDict()
_STORES_LOCK = threading.Lock()
_MAX_OPEN_STORES = 4


@contextlib.contextmanager
def open_store(db: str | None, *, timeout_s: float | None = None) -> Iterator[Store | None]:
    """The database ``db``, opened read-only (never written to, every wait bounded by
    ``timeout_s``, see :class:`Store`), or None when its SQLite file does not exist or it
    holds no autotune tables (:class:`~autotune.errors.EmptyDatabaseError`)."""
    timeout_s = read_timeout_s(timeout_s)
    url = resolve_url(db)
    path = sqlite_path(url)
    identity: tuple[Any, ...] = ()
    if path is not None:
        try:
            stat = path.stat()
        except FileNotFoundError:
            _warn_missing(path, db)
            yield None
            return
        identity = (stat.st_dev, stat.st_ino)
    key = (url.render_as_string(hide_password=False), os.getpid(), timeout_s, *identity)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is not None:
            _STORES.move_to_end(key)
    if store is None:
        from autotune.storage.store import Store

        try:
            store = Store(db, read_only=True, timeout_s=timeout_s)
        except EmptyDatabaseError:  # an empty file, another program's: nothing stored there
            log.info("No autotune tables in %s: nothing has been tuned there.", display_url(url))
            yield None
            return
        with _STORES_LOCK:
            _STORES[key] = store
            while len(_STORES) > _MAX_OPEN_STORES:
                _close(*_STORES.popitem(last=False))
    yield cast("Store", store)  # open_reader's keys, of its SQLiteReaders, start "sqlite3"


@contextlib.contextmanager
def open_reader(db: str | None, *, timeout_s: float | None = None) -> Iterator[Reader | None]:
    """What a best-config query reads ``db`` with: an :class:`SQLiteReader` (stdlib sqlite3, no
    SQLAlchemy: ``autotune best`` in 0.1 s of CPU, benchmarks/RESULTS.md §17) for a plain SQLite
    file (:func:`~autotune.storage.urls.plain_sqlite_file`) at the newest schema, else the store
    of :func:`open_store`. Kept open in this process as stores are; None as for open_store."""
    timeout_s = read_timeout_s(timeout_s)
    path = plain_sqlite_file(db)
    identity: tuple[Any, ...] = ()
    if path is not None:
        try:
            stat = path.stat()
        except OSError:  # missing (open_store warns) or unreadable (the store words it)
            path = None
        else:
            identity = (stat.st_dev, stat.st_ino)
    if path is None:
        with open_store(db, timeout_s=timeout_s) as store:
            yield store
        return
    key = ("sqlite3", str(path), os.getpid(), timeout_s, *identity)
    with _STORES_LOCK:
        reader = _STORES.get(key)
        if reader is not None:
            _STORES.move_to_end(key)
    if reader is None:
        reader = SQLiteReader.open(path, timeout_s)
        if reader is None:  # not at the newest schema, or unreadable: a store handles it
            with open_store(db, timeout_s=timeout_s) as store:
                yield store
            return
        with _STORES_LOCK:
            _STORES[key] = reader
            while len(_STORES) > _MAX_OPEN_STORES:
                _close(*_STORES.popitem(last=False))
    yield reader


_WARNED: set[str] = set()


def _warn_missing(path: Any, db: str | None) -> None:
    """Warns once per file and process that the database does not exist (the lookup would
    otherwise quietly fall back to default configs)."""
    import warnings

    from autotune.errors import MissingDatabaseWarning

    key = str(path)
    log.info("No results database at %s: nothing has been tuned there.", path)
    if key in _WARNED:
        return
    _WARNED.add(key)
    if db is not None:
        origin = f"db={db!r}"
    elif os.environ.get("AUTOTUNE_DB"):
        origin = "$AUTOTUNE_DB"
    else:
        origin = (f"the default results/autotune.db, relative to the working directory "
                  f"{os.getcwd()}")
    warnings.warn(
        f"No results database at {path} (from {origin}): nothing tuned is found there. Point "
        "to the database with db=... or the AUTOTUNE_DB environment variable (a SQLAlchemy URL "
        "or a file path).",
        MissingDatabaseWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package (and contextlib), so that a
    warning points at the caller's line."""
    import sys

    # the autotune package (this module is in autotune/queries/)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (
        os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep)
        or frame.f_code.co_filename == contextlib.__file__
    ):
        level += 1
        frame = frame.f_back
    return level


def stored_kernels(db: str | None = None) -> list[str]:
    """Names of the kernels with stored problems (empty when the database does not exist)."""
    with open_store(db) as store:
        if store is None:
            return []
        return sorted({p.kernel for p in store.problems()})


def stored_trial_seconds(
    problem: Problem, *, device_kind: str, db: str | None = None
) -> tuple[float | None, int, int]:
    """What tuning ``problem`` costs per trial, from what is stored: (the median seconds a
    trial of the kernel took on ``device_kind``, from start to finish, or its compile time
    where no start is stored; None when nothing is stored), the trials it is drawn from, and
    the trials of ``problem`` itself stored on that kind already."""
    import statistics

    with open_store(db) as store:
        if store is None:
            return None, 0, 0
        rows = store.trials(kernel=problem.kernel, device_kind=device_kind)
    seconds = []
    for r in rows:
        if r.started_at is not None and r.finished_at is not None:
            seconds.append((r.finished_at - r.started_at).total_seconds())
        elif r.compile_s is not None:
            seconds.append(r.compile_s)
    mine = sum(1 for r in rows if r.problem == problem)
    if not seconds:
        return None, 0, mine
    return statistics.median(seconds), len(seconds), mine


def _close(key: tuple[Any, ...], store: Reader) -> None:
    if key[1 if key[0] != "sqlite3" else 2] == os.getpid():
        store.close()
    elif not isinstance(store, SQLiteReader):  # inherited through fork: the parent's to close
        store.engine.dispose(close=False)


def close_stores() -> None:
    """Closes the databases that queries keep open in this process."""
    with _STORES_LOCK:
        while _STORES:
            _close(*_STORES.popitem())


def check_device(device: str | None, db: str | None = None) -> None:
    """Checks a device filter against the devices stored in ``db``, as the queries match it
    (:func:`resolve_device`: a kind, a name, or part of one); None, and a database that does
    not exist, pass.

    Raises:
      JobError: ``device`` is blank, matches several stored devices, or matches none (the
        message names it and lists the stored devices).
    """
    if device is None:
        return
    with open_store(db) as store:
        if store is None:
            return
        name, kind = resolve_device(store, device)
        devices = store.devices()
        names = sorted({d.name for d in devices})
    if kind is not None and names and kind not in {d.kind for d in devices}:
        stored = ", ".join(f"{d.name!r} ({d.kind})" for d in sorted(devices, key=lambda d: d.name))
        raise JobError(
            f"device {device!r} matches no stored device: none of kind {kind} is stored; the "
            f"stored devices are {stored} (give one of them, or its kind)."
        )
    if kind is None and name not in names:
        raise JobError(
            f"device {device!r} matches no stored device; the stored devices are "
            f"{', '.join(map(repr, names)) or 'none'} (or give a kind: {', '.join(DEVICE_KINDS)})."
            + did_you_mean(device, names)
        )


def resolve_device(store: Reader, device: str) -> tuple[str | None, str | None]:
    """(device name, device kind) to filter by, from a kind, a name, or part of a name."""
    if not isinstance(device, str) or not device.strip():
        raise JobError(
            f"device must be a kind ({', '.join(DEVICE_KINDS)}) or a device name such as "
            f"'NVIDIA H100 80GB HBM3', but got {device!r}."
        )
    key = device.strip()
    if key.lower() in DEVICE_KINDS:
        return None, key.lower()
    devices = store.devices()
    names = sorted({d.name for d in devices})
    if key in names:
        return key, None
    matches = [name for name in names if key.casefold() in name.casefold()]
    gpus = sorted({d.name for d in devices if d.is_gpu and d.name in matches})
    if len(matches) > 1 and len(gpus) == 1:
        return gpus[0], DeviceKind.GPU  # "h200" means the GPU, not an interpret run that names it
    if len(matches) > 1:
        raise JobError(
            f"device {device!r} matches several stored devices ({', '.join(matches)}); "
            "give the full name or a kind."
        )
    return (matches[0] if matches else key), None

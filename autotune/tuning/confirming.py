"""Running a problem's confirmation round when its search ends: its best configs (and any the
search could not tell from them) and the baseline re-timed on the engine in interleaved rounds,
analysed (:mod:`autotune.tuning.confirmation`, pure) and stored as rows of their own.

Then its **program check**: the crowned config and the baseline timed as a program calls them
(:data:`~autotune.space.outcomes.PROGRAM_METHOD`: the host's clock around batches of calls back
to back), in :data:`~autotune.tuning.confirmation.PROGRAM_CHECK_ROUNDS` interleaved rounds and
more while its verdict is unclear (up to ``PROGRAM_MAX_ROUNDS``),
stored as a verification row of its own tied to the confirmation
(:func:`autotune.tuning.verify.analyse`). CUPTI's kernel times leave out what a call costs the
GPU beyond its kernels, which differs between implementations (benchmarks/RESULTS.md §19);
where the check is stored, it decides which implementation a program runs
(:mod:`autotune.queries.lookup`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from autotune.engine.protocol import EngineLike
from autotune.space.kernel import Kernel
from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, DeviceKind, TrialResult
from autotune.space.problem import Config, Problem
from autotune.space.validity import violations
from autotune.storage.protocol import TrialStore
from autotune.tuning.confirmation import (
    CONFIRM_JOIN_MAX,
    DEFAULT_CONFIRM_INTERLEAVE,
    DEFAULT_CONFIRM_TOP,
    PROGRAM_CHECK_ROUNDS,
    PROGRAM_MAX_ROUNDS,
    AnalysedRounds,
    Confirmation,
    analyse_rounds,
    joining_configs,
    program_calls,
    program_unclear,
    sized_iterations,
    timed_rounds,
)
from autotune.tuning.jobs import ProblemSpec
from autotune.tuning.provenance import cache_policy_of
from autotune.tuning.verify import Verification, VerifyTarget, analyse

__all__ = ["confirm_best", "program_check", "store_baseline"]

logger = logging.getLogger(__name__)

def confirm_best(
    kernel: Kernel,
    problem: Problem,
    spec: ProblemSpec,
    *,
    store: TrialStore,
    engine: EngineLike,
    device: DeviceInfo,
    software: Mapping[str, str],
    run_id: int | None = None,
    only_if_missing: bool = False,
) -> float | None:
    """The confirmation round of ``problem``: its ``spec.confirm_top`` best configs (this
    software, this cache policy) and the baseline re-timed in ``spec.confirm_rounds``
    interleaved rounds (None: adaptive, :func:`~autotune.tuning.confirmation.timed_rounds`),
    each program for ``spec.confirm_iterations`` runs a round (None: sized by its time,
    :func:`~autotune.tuning.confirmation.sized_iterations`); stored with the tie marks as rows
    of their own. Returns the seconds it took, or None when there was nothing to confirm (no
    ``confirm`` on the engine, ``confirm_top`` 0, no ok trial) or, with ``only_if_missing``,
    when the newest confirmation already covers the current best configs.
    """
    confirm = getattr(engine, "confirm", None)
    n_top = spec.confirm_top
    if n_top is None:
        n_top = 0 if device.kind == DeviceKind.INTERPRET else DEFAULT_CONFIRM_TOP
    if confirm is None or n_top <= 0:
        return None
    policy = cache_policy_of(engine)
    versions = {k: software[k] for k in ("jax", "jaxlib") if software.get(k)}
    ranked = store.best(problem, device_name=device.name, device_kind=device.kind,
                        n=n_top + CONFIRM_JOIN_MAX, versions=versions, cache=policy)
    # A config today's rules refuse (stored before a rule was added) is neither re-timed nor
    # crowned: it would never be served (the one check: docs/guarantees.md, "Validity of
    # served configs").
    ranked = [r for r in ranked if not violations(problem, r.config, kernel=kernel)]
    if not ranked:
        return None
    # Below the top ones, configs the search could not tell from the fastest join the round.
    top = ranked[:n_top]
    below = ranked[n_top:]
    # (store.best returns ok trials only, each with its median.)
    top += [below[i] for i in joining_configs(
        [(float(r.median_us or 0.0), r.spread) for r in top],
        [(float(r.median_us or 0.0), r.spread) for r in below])]
    if only_if_missing:
        done = store.confirmations(problem, device_name=device.name, device_kind=device.kind,
                                   cache=policy)
        if done and {p.trial_id for p in done[0].programs} == {r.id for r in top}:
            return None
    start = time.monotonic()
    # The rounds time the baseline only once it is stored, which it is only after its output
    # passed the kernel's check (measure_baseline): a baseline that computes something else is
    # never confirmed, so never served. None stored yet (a resumed job's first run stopped
    # before it): it is timed and checked here first.
    baseline_us = None
    if kernel.baseline is not None:
        stored = store.baseline(problem, device_name=device.name, device_kind=device.kind,
                                cache=policy)
        baseline_us = stored.median_us if stored is not None else store_baseline(
            kernel, problem, lambda: engine.baseline(problem.kernel, problem), store=store,
            device=device, software=software, cache=policy,
            unless="; the confirmation has no baseline.")
    baseline = baseline_us is not None
    # Runs per round sized by each program's time (sized_iterations), unless the job fixes them.
    iterations = [sized_iterations(r.median_us, spec.confirm_iterations) for r in top]
    if baseline:
        iterations.append(sized_iterations(baseline_us, spec.confirm_iterations))
    configs = [Config(r.config) for r in top]
    default = kernel.default_config(problem) if kernel.default_config is not None else None
    # A job's confirm_rounds is what it gets; else adaptive rounds (timed_rounds).
    medians_us = [r.median_us for r in top]

    def analyse(rows: list[list[TrialResult | None]]) -> AnalysedRounds:
        return analyse_rounds(rows, [r.config for r in top], search_us=medians_us,
                              trial_ids=[r.id for r in top], baseline=baseline,
                              default_config=default)

    # Only an engine told to interleave call by call is asked to (a test's engine need not
    # know the argument).
    how = ({"interleaved": True}
           if (spec.confirm_interleave or DEFAULT_CONFIRM_INTERLEAVE) == "calls" else {})

    def time_rounds(n: int, first: int, skip: frozenset[int]) -> list[list[TrialResult | None]]:
        """``n`` rounds of the configs not in ``skip`` and the baseline; None for the rest."""
        active = [i for i in range(len(configs)) if i not in skip]
        rows = confirm(problem.kernel, problem, [configs[i] for i in active], rounds=n,
                       first_round=first, baseline=baseline,
                       iterations=[iterations[i] for i in active] + iterations[len(configs):],
                       medians_us=[medians_us[i] for i in active], **how)
        out: list[list[TrialResult | None]] = []
        for row in rows:
            cells: list[TrialResult | None] = [None] * len(configs) + list(row[len(active):])
            for i, result in zip(active, row[:len(active)], strict=True):
                cells[i] = result
            out.append(cells)
        return out

    table = timed_rounds(time_rounds, analyse, spec.confirm_rounds)
    analysed = analyse(table)
    for i in analysed.failed:
        bad = next(r for r in (row[i] for row in table) if r is not None and not r.ok)
        logger.warning("%s: confirming %s failed (%s): %s; left out of the confirmation.",
                       problem, Config(top[i].config).to_json(), bad.outcome.value, bad.error)
    if baseline and analysed.confirmation is not None and analysed.base_rounds is None:
        logger.warning("%s: the baseline failed in the confirmation round; no confirmed "
                       "speedup.", problem)
    confirmation, kept, base_rounds = analysed.confirmation, analysed.kept, analysed.base_rounds
    if confirmation is None:
        return time.monotonic() - start
    confirmation_id = store.record_confirmation(
        problem, confirmation, trial_ids=[top[i].id for i in kept], device=device,
        software=software, cache=policy,
        # The most runs a program was timed for in a round, as timed (a round interleaved call
        # by call times each program for the mean of the sized counts).
        iterations=max((len(r.samples_us) for row in table for r in row
                        if r is not None and r.ok),
                       default=max(iterations)),
        baseline_name=kernel.baseline_name if base_rounds is not None else None, run_id=run_id,
    )
    if base_rounds is not None:
        check = program_check(kernel, problem, confirmation, confirmation_id, engine=engine)
        if check is not None:
            store.record_verification(problem, check, device=device, software=software)
    winner = confirmation.winner
    if confirmation.crowned != 0:
        logger.info("%s: the confirmation round crowned %s (%.2f us) over the search's fastest "
                    "%s", problem, Config(winner.config).to_json(), winner.median_us,
                    Config(top[kept[0]].config).to_json())
    return time.monotonic() - start


def store_baseline(kernel: Kernel, problem: Problem, timed: Callable[[], TrialResult], *,
                   store: TrialStore, device: DeviceInfo, software: Mapping[str, str],
                   cache: str, unless: str = ".") -> float | None:
    """The baseline ``timed()`` gives (the search's future, or the engine asked now) stored
    where it ran and passed its check: its median; None, with a warning ending in ``unless``,
    where it failed, its check included, or raised."""
    try:
        result = timed()
    except Exception as e:  # noqa: BLE001 - a failed baseline must not lose the tuning
        logger.warning("%s: the baseline %s failed: %s%s", problem, kernel.baseline_name, e,
                       unless)
        return None
    if not result.ok:
        logger.warning("%s: the baseline %s failed (%s): %s%s", problem, kernel.baseline_name,
                       result.outcome.value, result.error, unless)
        return None
    store.record_baseline(problem, kernel.baseline_name, result.samples_us, device=device,
                          software=software, cache=cache)
    return result.median_us


def program_check(
    kernel: Kernel,
    problem: Problem,
    confirmation: Confirmation,
    confirmation_id: int | None,
    *,
    engine: EngineLike,
    rounds: int = PROGRAM_CHECK_ROUNDS,
    max_rounds: int = PROGRAM_MAX_ROUNDS,
) -> Verification | None:
    """The program check of a confirmation (module docstring): its crowned config and the
    baseline timed as a program calls them, in ``rounds`` interleaved rounds on ``engine``,
    then one more at a time up to ``max_rounds`` while the verdict is unclear
    (:func:`~autotune.tuning.confirmation.program_unclear`).
    None where there is nothing to check (no baseline confirmed) or the check failed (logged:
    the confirmation still answers)."""
    baseline = confirmation.baseline
    if baseline is None or kernel.baseline is None:
        return None
    crowned = confirmation.winner
    config = Config(crowned.config or {})
    calls = [program_calls(crowned.median_us), program_calls(baseline.median_us)]
    confirm = getattr(engine, "confirm", None)
    if confirm is None:
        return None

    def timed(n: int, first: int) -> list[list[TrialResult]]:
        out: list[list[TrialResult]] = confirm(
            problem.kernel, problem, [config], rounds=n, iterations=calls, baseline=True,
            medians_us=[crowned.median_us], program=True, first_round=first)
        return out

    rows = timed(rounds, 0)
    while (len(rows) < max_rounds and all(r.ok for row in rows for r in row)
           and program_unclear([row[0].samples_us for row in rows],
                               [row[1].samples_us for row in rows])):
        rows += timed(1, len(rows))
    bad = [r for row in rows for r in row if not r.ok]
    if bad:
        logger.info("%s: no program check (%s: %s); the confirmation decides.", problem,
                    bad[0].outcome.value, bad[0].error)
        return None
    target = VerifyTarget(
        problem=problem, winner=config, others=(), stored_speedup=confirmation.speedup,
        stored_winner_us=crowned.median_us, stored_baseline_us=baseline.median_us,
        baseline_name=kernel.baseline_name, confirmation_id=confirmation_id,
    )
    try:
        return analyse(target, [row[0].samples_us for row in rows],
                       [row[1].samples_us for row in rows], method=PROGRAM_METHOD,
                       calls=calls[0])
    except ValueError as e:
        logger.info("%s: no program check (%s); the confirmation decides.", problem, e)
        return None

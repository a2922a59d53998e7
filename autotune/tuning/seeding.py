"""What a problem's search starts from: the sampler it is tuned with, chosen from what the store
holds (``auto``), and its seeds: the kernel's known-good default, the winners of related
problems (nearest shapes on this device, this problem on other GPUs) and the stored history."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.space.kernel import Kernel
from autotune.space.outcomes import DeviceInfo, DeviceKind
from autotune.space.problem import Problem, shape_distance
from autotune.space.search_space import BoundSpace
from autotune.storage.protocol import TrialStore
from autotune.tuning.jobs import ProblemSpec
from autotune.tuning.samplers.ranked import stored_history
from autotune.tuning.sampling import ValidSampler, reads_history, resolve_sampler, valid_sampler

__all__ = ["problem_sampler", "related_winners"]

logger = logging.getLogger(__name__)

def problem_sampler(
    kernel: Kernel,
    problem: Problem,
    spec: ProblemSpec,
    space: BoundSpace,
    *,
    store: TrialStore,
    device: DeviceInfo,
    policy: str,
    stored_configs: Sequence[Mapping[str, Any]],
) -> ValidSampler:
    """The sampler a problem is tuned with, as the scheduler opens it with: the
    known-good default first (unless switched off), then the winners of related problems (the
    ranked sampler scores those with its model instead); ``auto`` resolved from what is stored
    (:func:`~autotune.tuning.sampling.resolve_sampler`), with the kernel's cost model.
    ``stored_configs``: results stored before this run (other studies, other processes), taken;
    this run's own and other hosts' live trials are in the shared study, which the sampler
    reads."""
    seeds: list[Mapping[str, Any]] = []
    if kernel.default_config is not None and spec.known_good:
        seeds.append(kernel.default_config(problem))
    related = related_winners(store, problem, device, policy)
    history = stored_history(store, problem, device) if reads_history(spec.sampler) else []
    # The valid set is counted only where it decides (resolve_sampler calls space.count last):
    # a count of a 10^5-config space takes seconds.
    sampler_name = resolve_sampler(spec.sampler, history=history, problem=problem,
                                   valid_count=space.count,
                                   cost_model=kernel.cost_model is not None)
    logger.info("%s: sampler %s (%s)", problem, sampler_name, spec.sampler)
    return valid_sampler(sampler_name, space, seed=spec.seed, seeds=seeds, related=related,
                         history=history, estimate=kernel.cost_model,
                         taken=lambda: stored_configs)


def related_winners(
    store: TrialStore, problem: Problem, device: DeviceInfo, cache: str = "warm", limit: int = 3
) -> list[Mapping[str, Any]]:
    """Best configs of the nearest tuned problems of the same kernel and dtype on ``device``;
    on a GPU, then the best config of this very problem on each other GPU that has one (a
    prior from another device: proposed or ranked like any related winner, never counted as
    measured here).

    Distance between shapes: :func:`autotune.space.problem.shape_distance` (the sum over size keys
    of |log2(a/b)|; non-size keys such as ``causal`` must match).
    """
    candidates = []
    for other in store.problems(problem.kernel):
        if other == problem or other.dtype != problem.dtype:
            continue
        dist = shape_distance(problem.dims, other.dims)
        if dist != float("inf"):
            candidates.append((dist, other))
    candidates.sort(key=lambda t: t[0])
    out: list[Mapping[str, Any]] = []
    for _dist, other in candidates[:limit]:
        best = store.best(other, device_name=device.name, device_kind=device.kind, n=1)
        if best:  # of its own preferred policy: a winner's config is a good seed either way
            out.append(best[0].config)
    if device.kind == DeviceKind.GPU:
        names = sorted({d.name for d in store.devices() if d.kind == device.kind} - {device.name})
        for name in names:
            best = store.best(problem, device_name=name, device_kind=device.kind, n=1)
            if best and best[0].config not in out:
                out.append(best[0].config)
    return out

"""``autotune check``: cross-lower a sample of a space for CUDA before any GPU time is spent.

A space that lets through a config JAX cannot lower is missing a rule. This runs the real
Mosaic GPU lowering on the CPU (:mod:`autotune.evaluation.lowering`) over a uniform sample of the valid
set and reports every failure with JAX's error and, where the error names a known rule
(shared memory, 128-byte transfers, whole warpgroups, divisibility), the building block that
would exclude it.

The rule is also found without reading the message (messages change between JAX versions,
PLATFORM.md): candidate rules over the space's own tunables (each copy a whole multiple of 128
bytes, a register array in whole warpgroups, at most 256 elements per TMA dimension, a tile
dividing a shape key) are tried against the sample, and a failure is explained by the
candidates it breaks while no config that lowered does. The message, when it names a rule,
only ranks them. The tuner uses the same advice (:func:`suggest_rule`) on an ``invalid``
trial, from that one config.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.devices import DeviceFacts
from autotune.evaluation.lowering import lower_for_cuda
from autotune.space.kernel import BuildOptions, Kernel
from autotune.space.problem import Config, Problem
from autotune.space.search_space import (
    TRANSFER_ALIGN_BYTES,
    WARPGROUP_SIZE,
    BoundSpace,
    Env,
    transfer_bytes,
)

__all__ = ["CheckFailure", "CheckReport", "check_space", "suggest_rule", "missing_rules"]


@dataclasses.dataclass(frozen=True)
class CheckFailure:
    config: Config
    error_type: str
    error: str
    suggestion: str
    # A rule that excludes this config and no config of the sample that lowered (Python to
    # add to the space); "" when none of the candidate rules does.
    rule: str = ""


@dataclasses.dataclass(frozen=True)
class CheckReport:
    problem: Problem
    valid: int
    checked: int
    ok: int
    failures: tuple[CheckFailure, ...]


# Error text -> (the kind of rule a space needs, advice). Only used to *advise*; outcomes never
# depend on it, and the kind only ranks the candidate rules (see the module docstring).
_RULES = (
    (re.compile(r"exceeds available shared memory"), "smem",
     "shared memory: add a Constraint comparing the buffers' bytes with env.smem_budget(block_threads=...)"),
    (re.compile(r"multiple of 128 bytes|divisible by the warpgroup size|Transfer is not a multiple"),
     "transfer_128b",
     "128-byte transfers: add a Constraint using is_aligned_transfer(block_shape, env.dtype), "
     "or make the tunable Aligned(unit=per_128_bytes)"),
    (re.compile(r"Block size is not a multiple of"), "trace_threads",
     "whole warps/warpgroups: make the thread count a multiple of env.trace_unit (threads(warpgroups=...))"),
    (re.compile(r"number of elements that is a multiple of"), "whole_warpgroup",
     "whole warpgroups: an array in registers is spread over a warpgroup's 128 threads; make its "
     "element count a multiple of WARPGROUP_SIZE (Aligned(unit=WARPGROUP_SIZE) or a Constraint)"),
    (re.compile(r"<=\s*256 elements"), "tma_box",
     "TMA box: a copy moves at most 256 elements along each dimension; bound the tile's "
     "tunables with high=256"),
    (re.compile(r"must be divisible by|must be a multiple of|divisible|does not divide"), "divides",
     "divisibility: add Aligned(..., divides=KEY) or a Constraint that the tile divides the shape"),
)


def suggest_rule(
    error: str, config: Mapping[str, Any] | None = None, space: BoundSpace | None = None
) -> str:
    """The building block that would have excluded a config failing with ``error``.

    With the ``config`` and its bound ``space``, the advice names the tunables: the candidate
    rule of the error's kind that the config breaks, preferring the one whose numbers the error
    quotes (a copy of ``bytes=64``: the tunables whose tile moves 64 bytes), as Python to add.
    """
    advice = next((text for pattern, _, text in _RULES if pattern.search(error)), "")
    if config is None or space is None:
        return advice
    family = _family(error)
    if family is None:
        return advice
    broken = [c for c in _candidates(space) if c.family == family and c.broken(config, space.env)]
    if not broken:
        return advice
    best = max(broken, key=lambda c: (c.quoted(config, space.env, error), len(c.reads)))
    return f"{advice}; e.g. {best.code}" if advice else best.code


def missing_rules(
    space: BoundSpace,
    failed: Sequence[tuple[Mapping[str, Any], str]],
    lowered: Sequence[Mapping[str, Any]],
) -> list[str]:
    """For each failed ``(config, error)``, a rule that excludes it and none of ``lowered``.

    Candidate rules (:func:`_candidates`) a failed config breaks, minus those any config that
    lowered breaks, of the error's kind when its message names one; among them the rule whose
    size the message quotes, then the one explaining most failures. ``""`` where no candidate
    fits (e.g. shared memory, whose use only the kernel knows).
    """
    env = space.env
    survivors = [
        c for c in _candidates(space) if not any(c.broken(ok, env) for ok in lowered)
    ]
    explains = {
        id(c): sum(c.broken(config, env) for config, _ in failed) for c in survivors
    }
    out = []
    for config, error in failed:
        family = _family(error)
        # A message naming a kind (shared memory, ...) limits the candidates to that kind.
        fits = [
            c for c in survivors
            if c.broken(config, env) and (family is None or c.family == family)
        ]
        if not fits:
            out.append("")
            continue
        best = max(
            fits,
            # Of two rules explaining the same failures, the one over more tunables (a whole
            # tile's bytes rather than one side's) excludes fewer configs.
            key=lambda c: (c.quoted(config, env, error), explains[id(c)], len(c.reads)),
        )
        out.append(best.code)
    return out


# -- candidate rules ---------------------------------------------------------------------------

_TMA_BOX_ELEMS = 256


def _family(error: str) -> str | None:
    return next((family for pattern, family, _ in _RULES if pattern.search(error)), None)


def _numbers(error: str) -> set[int]:
    return {int(n) for n in re.findall(r"(?<![\w.])(\d+)(?![\w.])", error)}


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """A rule the space might be missing: the tunables it reads, the size it bounds (bytes of a
    copy, elements of a register array, a tile's extent: the number an error would quote), and
    the Python that states it."""

    family: str
    reads: tuple[str, ...]
    size_fn: Callable[[Mapping[str, Any], Env], int]
    code: str
    key: str = ""  # the shape key a "divides" rule reads

    def size(self, config: Mapping[str, Any], env: Env) -> int:
        return int(self.size_fn(config, env))

    def broken(self, config: Mapping[str, Any], env: Env) -> bool:
        try:
            size = self.size(config, env)
            if self.family == "transfer_128b":
                return size % TRANSFER_ALIGN_BYTES != 0
            if self.family == "whole_warpgroup":
                return size % WARPGROUP_SIZE != 0
            if self.family == "tma_box":
                return size > _TMA_BOX_ELEMS
            return int(env[self.key]) % size != 0
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return False

    def quoted(self, config: Mapping[str, Any], env: Env, error: str) -> bool:
        try:
            return self.size(config, env) in _numbers(error)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return False


def _tuple(names: Sequence[str]) -> str:
    return "(" + ", ".join(f"{n!r}" for n in names) + ("," if len(names) == 1 else "") + ")"


def _values(names: Sequence[str]) -> str:
    return "(" + ", ".join(f"c[{n!r}]" for n in names) + ("," if len(names) == 1 else "") + ")"


def _candidates(space: BoundSpace) -> list[_Candidate]:
    """Rules over the space's integer tunables that Mosaic GPU enforces (see the module doc)."""
    ints = [
        p.name
        for p, domain in zip(space.params, space.domains, strict=True)
        if domain and all(isinstance(v, int) and not isinstance(v, bool) for v in domain)
    ]
    keys = [
        k for k, v in space.problem.dims.items() if isinstance(v, int) and not isinstance(v, bool)
    ]
    tiles = [(t,) for t in ints] + list(itertools.combinations(ints, 2))
    out: list[_Candidate] = []
    for tile in tiles:
        reads = tuple(tile)

        def nbytes(c: Mapping[str, Any], env: Env, reads: tuple[str, ...] = reads) -> int:
            return transfer_bytes([c[r] for r in reads], env.dtype)

        def elems(c: Mapping[str, Any], env: Env, reads: tuple[str, ...] = reads) -> int:
            return math.prod(c[r] for r in reads)

        out.append(_Candidate(
            "transfer_128b", reads, nbytes,
            f"Constraint('transfer_128b', {_tuple(reads)}, lambda c, env: "
            f"is_aligned_transfer({_values(reads)}, env.dtype), "
            "'each copy moves a whole multiple of 128 bytes')",
        ))
        out.append(_Candidate(
            "whole_warpgroup", reads, elems,
            f"Constraint('whole_warpgroup', {_tuple(reads)}, lambda c, env: "
            f"{' * '.join(f'c[{r!r}]' for r in reads)} % threads(warpgroups=1) == 0, "
            "'an array in registers spreads over the 128 threads of a warpgroup')",
        ))
    for t in ints:

        def value(c: Mapping[str, Any], env: Env, t: str = t) -> int:
            return int(c[t])

        out.append(_Candidate(
            "tma_box", (t,), value,
            f"Constraint('tma_box', ({t!r},), lambda c, env: c[{t!r}] <= {_TMA_BOX_ELEMS}, "
            f"'a TMA copy moves at most {_TMA_BOX_ELEMS} elements along each dimension')",
        ))
        for key in keys:
            out.append(_Candidate(
                "divides", (t,), value,
                f"Constraint('{t}_divides_{key}', ({t!r},), lambda c, env: "
                f"env[{key!r}] % c[{t!r}] == 0, '{t} tiles {key}')  # or Aligned(..., "
                f"divides={key!r})",
                key=key,
            ))
    return out


def check_space(kernel: Kernel, problem: Problem, *, sample: int = 32, seed: int = 0,
                device: DeviceFacts | None = None) -> CheckReport:
    """Cross-lowers ``sample`` valid configs of ``kernel`` for ``problem`` on ``device``
    (default: :func:`~autotune.devices.current_device`: its shared memory limit binds the
    space, its SM count sizes persistent grids); reports failures, each with JAX's error,
    advice from it, and (``rule``) a rule excluding it and none of the configs that lowered
    (:func:`missing_rules`).

    Raises:
      UnsupportedDeviceError: the kernel does not support the device's architecture.
    """
    device = kernel.check_device(device)
    space = kernel.valid_space(problem, device=device)
    configs = space.sample(sample, seed=seed)
    failed = []
    lowered = []
    options = BuildOptions(num_sms=device.num_sms)
    for config in configs:
        result = lower_for_cuda(kernel, problem, config, options)
        if result.ok:
            lowered.append(config)
        else:
            failed.append((config, result))
    rules = missing_rules(space, [(c, r.error) for c, r in failed], lowered)
    failures = [
        CheckFailure(config, result.error_type, result.error, suggest_rule(result.error), rule)
        for (config, result), rule in zip(failed, rules, strict=True)
    ]
    return CheckReport(
        problem=problem,
        valid=space.count(),
        checked=len(configs),
        ok=len(configs) - len(failures),
        failures=tuple(failures),
    )

"""``autotune check``: cross-lower a sample of a space for CUDA before any GPU time is spent.

A space that lets through a config JAX cannot lower is missing a rule. This runs the real
Mosaic GPU lowering on the CPU (:mod:`autotune.lowering`) over a uniform sample of the valid
set and reports every failure with JAX's error and, where the error names a known rule
(shared memory, 128-byte transfers, whole warpgroups, divisibility), the building block that
would exclude it.
"""

from __future__ import annotations

import dataclasses
import re

from autotune.kernel import BuildOptions, Kernel
from autotune.lowering import H200_NUM_SMS, lower_for_cuda
from autotune.problem import Config, Problem

__all__ = ["CheckFailure", "CheckReport", "check_space", "suggest_rule"]


@dataclasses.dataclass(frozen=True)
class CheckFailure:
    config: Config
    error_type: str
    error: str
    suggestion: str


@dataclasses.dataclass(frozen=True)
class CheckReport:
    problem: Problem
    valid: int
    checked: int
    ok: int
    failures: tuple[CheckFailure, ...]


# Error text -> the rule a space needs. Only used to *advise*; outcomes never depend on it.
_RULES = (
    (re.compile(r"exceeds available shared memory"),
     "shared memory: add a Constraint comparing the buffers' bytes with env.smem_budget(block_threads=...)"),
    (re.compile(r"multiple of 128 bytes|divisible by the warpgroup size|Transfer is not a multiple"),
     "128-byte transfers: add a Constraint using is_aligned_transfer(block_shape, env.dtype), "
     "or make the tunable Aligned(unit=per_128_bytes)"),
    (re.compile(r"Block size is not a multiple of"),
     "whole warps/warpgroups: make the thread count a multiple of env.trace_unit (threads(warpgroups=...))"),
    (re.compile(r"must be divisible by|must be a multiple of|divisible"),
     "divisibility: add Aligned(..., divides=KEY) or a Constraint that the tile divides the shape"),
)


def suggest_rule(error: str) -> str:
    """The building block that would have excluded a config failing with ``error``."""
    for pattern, advice in _RULES:
        if pattern.search(error):
            return advice
    return ""


def check_space(kernel: Kernel, problem: Problem, *, sample: int = 32, seed: int = 0) -> CheckReport:
    """Cross-lowers ``sample`` valid configs of ``kernel`` for ``problem``; reports failures."""
    space = kernel.valid_space(problem)
    configs = space.sample(sample, seed=seed)
    failures = []
    options = BuildOptions(num_sms=H200_NUM_SMS)
    for config in configs:
        result = lower_for_cuda(kernel, problem, config, options)
        if not result.ok:
            failures.append(
                CheckFailure(config, result.error_type, result.error, suggest_rule(result.error))
            )
    return CheckReport(
        problem=problem,
        valid=space.count(),
        checked=len(configs),
        ok=len(configs) - len(failures),
        failures=tuple(failures),
    )

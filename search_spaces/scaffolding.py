"""What the bundled kernels share: problem sizes, rule templates, the rules of tiles, copies,
shared memory and an in-place TMA pipeline, the build's refusals, a kernel's plan, its
``Kernel`` and its default config.

Scaffolding only: each kernel module states its own space, build, inputs and reference; a
piece that two of them wrote alike lives here once. Like the kernels, it uses autotune's
public kernel API only (:mod:`autotune.kernels`) and never imports jax.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeVar

import autotune.kernels as ak

__all__ = [
    "dim",
    "dims",
    "Reason",
    "reasons",
    "rule_kinds",
    "space",
    "kernel",
    "trace_regions_fit",
    "refill_needs_free_slot",
    "refuse",
    "check_refill",
    "smem_fits",
    "divisible",
    "tile_divides",
    "copies_128b",
    "closest_valid",
    "plan",
]

P = TypeVar("P")


def dim(problem: ak.Problem, key: str) -> int:
    """A size of the problem (shape values may also be flags; this one is a size)."""
    return int(problem[key])


def dims(problem: ak.Problem, keys: Iterable[str]) -> tuple[int, ...]:
    """The sizes ``keys`` of the problem, in that order."""
    return tuple(dim(problem, key) for key in keys)


class _Unknown(dict[str, Any]):
    """Format values; one a partial config cannot give shows as ``?`` instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


class Reason(str):
    """A rule's reason: a template ``autotune spaces`` shows as is, and that a violation's
    message fills in with the values ``derive(config, env)`` gives (the config, the problem,
    and the sizes computable from a partial config)."""

    derive: Callable[[Mapping[str, Any], ak.Env], Mapping[str, Any]]

    def __new__(cls, text: str,
                derive: Callable[[Mapping[str, Any], ak.Env], Mapping[str, Any]]) -> Reason:
        reason = super().__new__(cls, text)
        reason.derive = derive
        return reason

    def __call__(self, c: Mapping[str, Any], env: ak.Env) -> str:
        return self.format_map(_Unknown(self.derive(c, env)))

    def __getnewargs__(self) -> tuple[str, Any]:  # type: ignore[override]
        # Copied and pickled (a space sent to a worker) with its template and its derivation.
        return (str(self), self.derive)


def reasons(
    derive: Callable[[Mapping[str, Any], ak.Env], Mapping[str, Any]],
) -> Callable[[str], Reason]:
    """``says(text)``: a :class:`Reason` filled in by ``derive`` (one per kernel module)."""
    return functools.partial(Reason, derive=derive)


def rule_kinds(
    constraints: Iterable[ak.Constraint], domain_kinds: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every rule's kind: the tunables' domain rules (``domain_kinds``), then each
    constraint's own, so no list of kinds is kept in step by hand."""
    return {**(domain_kinds or {}), **{c.name: c.kind for c in constraints}}


def space(
    params: tuple[Any, ...],
    constraints: tuple[ak.Constraint, ...],
    domain_kinds: Mapping[str, str] | None = None,
) -> tuple[ak.Space, dict[str, str]]:
    """A kernel's space and its rules' kinds (:func:`rule_kinds`)."""
    return ak.Space(params, constraints), rule_kinds(constraints, domain_kinds)


# The functions a bundled kernel module defines under these names become its Kernel's fields.
CONVENTIONAL_FIELDS = ("build", "make_inputs", "reference", "baseline", "default_config",
                       "shape_of", "flops", "bytes_moved")


def kernel(name: str, namespace: Mapping[str, Any], **fields: Any) -> ak.Kernel:
    """The :class:`~autotune.kernels.Kernel` of a bundled kernel module: ``name``, its
    ``SPACE``, and its functions of :data:`CONVENTIONAL_FIELDS`' names, from ``namespace``
    (the module's ``globals()``); ``fields`` give the rest and win over both."""
    found = {f: namespace[f] for f in CONVENTIONAL_FIELDS if f in namespace}
    return ak.Kernel(**{"name": name, "space": namespace["SPACE"], **found, **fields})


def trace_regions_fit(regions: int, unit: str) -> ak.Constraint:
    """The problem rule of a kernel that traces ``regions`` ranges (Mosaic GPU's own ``Init``
    included) of each ``unit``'s first tile: a smaller buffer is overrun on the GPU, undefined
    behaviour rather than an error (policy)."""
    return ak.Constraint(
        "trace_regions_fit",
        (),
        lambda c, env: env.profile_space == 0 or env.profile_space > regions,
        lambda c, env: (
            f"tracing needs profile_space >= {regions + 1} to hold the {regions} "
            f"regions of a {unit}'s first tile, got profile_space={env.profile_space}"
        ),
        kind="policy",
    )


def refill_needs_free_slot(slots: str) -> ak.Constraint:
    """The rule of an in-place pipeline with ``slots`` slots whose ``refill_lag`` 1 refills
    the previous step's slot: with one slot that refill waits on a tile it has not fetched
    (build: the kernel would hang)."""
    return ak.Constraint(
        "refill_needs_free_slot",
        (slots, "refill_lag"),
        lambda c, env: c["refill_lag"] < c[slots],
        lambda c, env: (
            f"refill_lag={c['refill_lag']} needs {slots} > {c['refill_lag']}: a "
            "lagged refill with one slot waits on a tile it has not fetched (deadlock)"
        ),
        kind="build",
    )


def refuse(rule: str, message: str) -> NoReturn:
    """A kernel's build refusing a config that would hang or compute a wrong answer silently
    (a config outside the space: its build rules say the same): ``ValueError`` naming the rule."""
    raise ValueError(f"[{rule}] {message}")


def check_refill(refill_lag: int, slots: int, slots_name: str) -> None:
    """The build's side of :func:`refill_needs_free_slot`: refuses a refill that would wait on
    a tile it has not fetched (a negative lag, or as many as there are slots)."""
    if not 0 <= refill_lag < slots:
        refuse("refill_needs_free_slot", f"need 0 <= refill_lag < {slots_name}, got "
               f"refill_lag={refill_lag}, {slots_name}={slots}")


def smem_fits(
    rule: str,
    reads: tuple[str, ...],
    smem_bytes: Callable[[Mapping[str, Any], ak.Env], int],
    block_threads: Callable[[Mapping[str, Any]], int],
    explain: Callable[[Mapping[str, Any], ak.Env], str],
) -> ak.Constraint:
    """The shared-memory rule every kernel has: what one block allocates,
    ``smem_bytes(config, env)``, fits the budget of a block of ``block_threads(config)``
    threads (``env.smem_budget``: the device's limit, less the profiler's buffer when tracing).
    Mosaic GPU refuses more (lowering)."""
    return ak.Constraint(
        rule,
        reads,
        lambda c, env: smem_bytes(c, env) <= env.smem_budget(block_threads=block_threads(c)),
        explain,
        kind="lowering",
    )


def divisible(rule: str, size: str, tile: str, says: Callable[[str], Reason]) -> ak.Constraint:
    """The tunable ``tile`` divides the problem's ``size``, as the kernel itself checks
    (lowering); the reason is a template of the kernel's ``says``."""
    return ak.Constraint(
        rule,
        (tile,),
        lambda c, env: env[size] % c[tile] == 0,
        says(f"{size}={{{size}}} must be divisible by {tile}={{{tile}}}; the kernel checks it"),
        kind="lowering",
    )


def tile_divides(rule: str, tile: str, size: str) -> ak.Constraint:
    """The tunable ``tile`` divides the problem's ``size``: a persistent loop over whole tiles
    would skip the tail (build: the kernel would compute a wrong answer)."""
    return ak.Constraint(
        rule,
        (tile,),
        lambda c, env: env[size] % c[tile] == 0,
        lambda c, env: f"{tile}={c[tile]} must divide {size}={env[size]}",
        kind="build",
    )


def copies_128b(
    reads: tuple[str, ...],
    copy_shapes: Callable[[Mapping[str, Any], ak.Problem], list[tuple[int, ...]]],
    explain: Callable[[Mapping[str, Any], ak.Env], str],
    *,
    kind: str,
) -> ak.Constraint:
    """``transfer_128b``: every copy the kernel issues (``copy_shapes(config, problem)``)
    moves a whole multiple of 128 bytes."""
    return ak.Constraint(
        "transfer_128b",
        reads,
        lambda c, env: all(ak.is_aligned_transfer(s, env.dtype) for s in copy_shapes(c, env.problem)),
        explain,
        kind=kind,
    )


def plan(cls: type[P], config: Mapping[str, Any], **fields: Any) -> P:
    """A kernel's plan: the dataclass ``cls`` (a config resolved against a problem), each of
    its fields the config holds under the same name from the config, the others from
    ``fields`` (which win)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: v for k, v in config.items() if k in names}, **fields})


def closest_valid(kernel: ak.Kernel, problem: ak.Problem,
                  proposal: Mapping[str, Any]) -> ak.Config:
    """The valid config of ``kernel`` for ``problem`` nearest to ``proposal`` (a default
    config). No driver call here: the run-time lookup's default (the query side) comes here
    too."""
    device = ak.current_device(ask_driver=False)
    return kernel.bind(problem, device=device).closest_valid(proposal)

"""Search spaces: tunables, constraints, and the valid set they define.

A :class:`Space` is declared once per kernel from *tunables* (aligned integers, powers of two,
choices, booleans) and named *constraints* across tunables and the problem. Binding it to a
:class:`~autotune.space.problem.Problem` gives a :class:`BoundSpace`: concrete domains, and the valid
set, which is enumerated, counted and sampled without generating the raw grid first: each
constraint is checked as soon as the tunables it reads are fixed, so a bad prefix prunes its
whole subtree (as ATF and Kernel Tuner's constraint solver do).

The building blocks for Mosaic GPU's rules (warpgroups of 128 threads, transfers in whole
multiples of 128 bytes, shared memory within the device limit) are here too, so a space states
``transfer_bytes(...)`` or ``threads(warpgroups=...)`` instead of redoing the arithmetic.

Pure Python and numpy (imported where used: a query that binds a space needs none); never
imports jax.

Why one piece (over 400 lines): tunables, constraints, the space and its binding to a problem
are one declaration language; the hardware helpers (alignment, shared memory) are what
constraints are written with.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.devices import DEFAULT_PROFILE, PROFILES, DeviceFacts, current_device
from autotune.errors import NoValidConfigError, SpaceError
from autotune.space.problem import Config, Problem, dtype_bits

if TYPE_CHECKING:
    import numpy as np

# BoundSpace.neighbours: values tried per tunable (the nearest); every bundled kernel's domains
# hold at most 32 values, so its neighbourhoods are whole.
MAX_MOVES_PER_TUNABLE = 32


def _nearest_indices(size: int, centre: int, *, ordinal: bool, keep: int) -> list[int]:
    """The ``keep`` domain indices nearest ``centre`` (by steps; around the declared order,
    wrapping, for a choice), in domain order."""
    def steps(j: int) -> int:
        return abs(j - centre) if ordinal else min((j - centre) % size, (centre - j) % size)

    return sorted(sorted(range(size), key=lambda j: (steps(j), j))[:keep])

__all__ = [
    "WARP_SIZE",
    "WARPGROUP_SIZE",
    "TRANSFER_ALIGN_BYTES",
    "SMEM_LIMIT_BYTES",
    "SMEM_ALIGNMENT_BYTES",
    "MBARRIER_BYTES",
    "Aligned",
    "PowerOfTwo",
    "Choice",
    "Bool",
    "Constraint",
    "RULE_KINDS",
    "Violation",
    "Env",
    "Space",
    "BoundSpace",
    "elems_per_bytes",
    "transfer_bytes",
    "threads",
    "is_aligned_transfer",
    "per_128_bytes",
    "profiler_smem_bytes",
    "smem_aligned",
]

WARP_SIZE = 32
WARPGROUP_SIZE = 128
# Mosaic GPU splits every copy/TMA transfer over a warpgroup's 128 threads (seeds 002, 003).
TRANSFER_ALIGN_BYTES = 128
# Shared memory one block may use on the default profile's device (the opt-in maximum, which
# Mosaic GPU's errors name); a bound space reads its own device's (``Env.smem_limit_bytes``).
SMEM_LIMIT_BYTES = PROFILES[DEFAULT_PROFILE].smem_per_block
# Pallas Mosaic GPU starts every scoped shared-memory allocation on this boundary
# (``gpu_core.SMEM_ALIGNMENT``), and every mbarrier takes 8 bytes.
SMEM_ALIGNMENT_BYTES = 1024
MBARRIER_BYTES = 8

Value = Any  # int | bool | str | None
IntSpec = int | Callable[["Env"], int]


# ---------------------------------------------------------------------------------------------
# Building blocks for the Mosaic GPU rules.


def elems_per_bytes(nbytes: int, dtype: str) -> int:
    """Elements of ``dtype`` in ``nbytes`` bytes: ``elems_per_bytes(128, "bfloat16") == 64``."""
    bits = dtype_bits(dtype)
    if (nbytes * 8) % bits:
        raise SpaceError(f"{nbytes} bytes do not hold a whole number of {dtype} elements.")
    return nbytes * 8 // bits


def transfer_bytes(shape: Iterable[int], dtype: str) -> int:
    """Bytes one copy of a ``shape`` block of ``dtype`` moves."""
    return math.prod(shape) * dtype_bits(dtype) // 8


def smem_aligned(nbytes: int) -> int:
    """Shared memory an allocation of ``nbytes`` takes: rounded up to
    :data:`SMEM_ALIGNMENT_BYTES`, as Pallas allocates it."""
    return -(-nbytes // SMEM_ALIGNMENT_BYTES) * SMEM_ALIGNMENT_BYTES


def is_aligned_transfer(shape: Iterable[int], dtype: str) -> bool:
    """Whether a copy of ``shape`` moves a whole multiple of 128 bytes (Mosaic GPU's rule)."""
    return transfer_bytes(shape, dtype) % TRANSFER_ALIGN_BYTES == 0


def threads(*, warpgroups: int = 0, warps: int = 0) -> int:
    """Threads in ``warpgroups`` warpgroups plus ``warps`` warps."""
    return warpgroups * WARPGROUP_SIZE + warps * WARP_SIZE


def per_128_bytes(env: Env) -> int:
    """Elements of the problem's dtype per 128 bytes: the transfer unit (64 for bf16, 32 for f32)."""
    return elems_per_bytes(TRANSFER_ALIGN_BYTES, env.dtype)


def profiler_smem_bytes(*, profile_space: int, block_threads: int, scope: str = "warpgroup") -> int:
    """Shared memory the in-kernel profiler takes from a block (0 when not tracing).

    Pallas gives each traced warp or warpgroup ``profile_space * 4`` 32-bit entries in shared
    memory, 8-byte aligned after the kernel's own buffers (``mosaic/gpu/core.py``).
    """
    if not profile_space:
        return 0
    scope_size = {"warp": WARP_SIZE, "warpgroup": WARPGROUP_SIZE}[scope]
    return (block_threads // scope_size) * profile_space * 4 * 4 + 8


@dataclasses.dataclass(frozen=True)
class Env:
    """What a space's rules read besides the config: the problem and the device's limits.

    ``env["m"]`` reads a shape key. ``profile_space`` is non-zero for the tracing pass, whose
    profiler buffer takes shared memory (seed 000: and a block in whole warps or warpgroups).
    ``device`` is the device the configs are for; unless given, the current device as far as
    known without asking the driver (:func:`autotune.devices.current_device` with
    ``ask_driver=False``: the driver's facts once this process has read them, as
    :meth:`Kernel.bind <autotune.space.kernel.Kernel.bind>` does, else the profile).
    ``smem_limit_bytes`` (0 or unset) is its shared memory per block.
    """

    problem: Problem
    smem_limit_bytes: int = 0  # 0: the device's shared memory per block
    profile_space: int = 0
    trace_scope: str = "warpgroup"
    # True when configs run in GPU interpret mode on a CPU, whose interpreter lacks some
    # primitives (cluster barriers): rules may exclude what only the interpreter cannot run.
    interpret: bool = False
    device: DeviceFacts = dataclasses.field(default_factory=lambda: current_device(ask_driver=False))

    def __post_init__(self) -> None:
        if not self.smem_limit_bytes:
            object.__setattr__(self, "smem_limit_bytes", self.device.smem_per_block)

    def __getitem__(self, key: str) -> Any:
        return self.problem[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.problem.dims.get(key, default)

    @property
    def dtype(self) -> str:
        return self.problem.dtype

    @property
    def dtype_bytes(self) -> int:
        return self.problem.dtype_bytes

    @property
    def trace_unit(self) -> int:
        """Threads one trace covers: a block must be a whole multiple of this when tracing."""
        return WARP_SIZE if self.trace_scope == "warp" else WARPGROUP_SIZE

    def smem_budget(self, *, block_threads: int) -> int:
        """Shared memory left for the kernel's own buffers after the profiler's share."""
        return self.smem_limit_bytes - profiler_smem_bytes(
            profile_space=self.profile_space, block_threads=block_threads, scope=self.trace_scope
        )


# ---------------------------------------------------------------------------------------------
# Tunables.


def _resolve(spec: IntSpec, env: Env) -> int:
    return spec(env) if callable(spec) else spec


@dataclasses.dataclass(frozen=True)
class _Param:
    name: str

    ordinal = True
    kind = "param"

    def domain(self, env: Env) -> tuple[Value, ...]:
        raise NotImplementedError

    def describe(self, env: Env | None = None) -> str:
        """What a value must be, in words; with ``env``, the problem's own numbers."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Aligned(_Param):
    """An integer that is a whole multiple of ``unit``, from ``low`` to ``high`` inclusive.

    ``unit``, ``low`` and ``high`` may be ints or functions of the problem (e.g.
    ``unit=per_128_bytes`` for a block whose transfer must be 128 bytes). ``divides`` names a
    shape key the value must divide, so that tiles cover the problem exactly.
    """

    unit: IntSpec = 1
    low: IntSpec = 1
    high: IntSpec = 1
    divides: str | None = None

    kind = "aligned"

    def domain(self, env: Env) -> tuple[int, ...]:
        unit, low, high = (_resolve(s, env) for s in (self.unit, self.low, self.high))
        if unit <= 0:
            raise SpaceError(f"Tunable {self.name!r}: unit must be positive, got {unit}.")
        start = max(unit, -(-low // unit) * unit)
        values = range(start, high + 1, unit)
        if self.divides is not None:
            total = env[self.divides]
            return tuple(v for v in values if total % v == 0)
        return tuple(values)

    def describe(self, env: Env | None = None) -> str:
        if env is None:
            named = "a dtype-derived unit" if callable(self.unit) else str(self.unit)
            return f"a multiple of {named}" + (f" dividing {self.divides}" if self.divides else "")
        unit, low, high = (_resolve(s, env) for s in (self.unit, self.low, self.high))
        text = f"a multiple of {unit}"
        if self.divides:
            text += f" dividing {self.divides}={env[self.divides]}"
        return text + f", from {low} to {high}"


@dataclasses.dataclass(frozen=True)
class PowerOfTwo(_Param):
    """A power of two from ``low`` to ``high`` inclusive (both may be functions of the problem)."""

    low: IntSpec = 1
    high: IntSpec = 1

    kind = "pow2"

    def domain(self, env: Env) -> tuple[int, ...]:
        low, high = _resolve(self.low, env), _resolve(self.high, env)
        out, v = [], 1
        while v <= high:
            if v >= low:
                out.append(v)
            v *= 2
        return tuple(out)

    def describe(self, env: Env | None = None) -> str:
        if env is None:
            return "a power of two"
        return f"a power of two from {_resolve(self.low, env)} to {_resolve(self.high, env)}"


@dataclasses.dataclass(frozen=True)
class Choice(_Param):
    """One of ``values`` (ints, strings, None). ``ordered`` says whether neighbours are similar."""

    values: tuple[Value, ...] = ()
    ordered: bool = False

    kind = "choice"

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise SpaceError(f"Choice {self.name!r} needs at least one value.")
        if len(set(map(repr, self.values))) != len(self.values):
            raise SpaceError(f"Choice {self.name!r} lists a value twice: {self.values!r}.")

    @property
    def ordinal(self) -> bool:  # type: ignore[override]
        return self.ordered

    def domain(self, env: Env) -> tuple[Value, ...]:
        return self.values

    def describe(self, env: Env | None = None) -> str:
        return "one of " + ", ".join(map(repr, self.values))


@dataclasses.dataclass(frozen=True)
class Bool(_Param):
    """True or False."""

    kind = "bool"
    ordinal = False

    def domain(self, env: Env) -> tuple[bool, ...]:
        return (False, True)

    def describe(self, env: Env | None = None) -> str:
        return "true or false"


Param = Aligned | PowerOfTwo | Choice | Bool


# ---------------------------------------------------------------------------------------------
# Constraints.


# The kinds of rule a constraint may be (Constraint.kind); see the class for what each means.
RULE_KINDS = ("lowering", "build", "launch", "correctness", "problem", "interpret", "policy")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A named rule over some tunables and the problem.

    Attributes:
      name: short identifier, e.g. ``"smem_within_limit"``.
      reads: the tunables the rule reads; it is checked as soon as they are all fixed.
        Empty for a rule on the problem alone (e.g. an unsupported dtype).
      check: ``check(config, env) -> bool``; ``config`` maps at least ``reads``; ``env`` is
        the :class:`Env` (``env["m"]``, ``env.dtype``, ``env.smem_budget(...)``).
      reason: why the rule exists, in words; or a function ``(config, env) -> str`` that
        says what is wrong with the given values.
      kind: why a config breaking it is never proposed, one of :data:`RULE_KINDS` or several
        joined by ``+`` (``"policy+lowering"``): ``lowering`` (Mosaic GPU refuses it),
        ``build`` (the kernel's own code refuses it), ``launch`` (CUDA refuses the launch),
        ``correctness`` (it runs and gives wrong results), ``problem`` (the problem itself
        cannot be run), ``interpret`` (only GPU interpret mode cannot run it; binds only
        there), ``policy`` (it runs, and is left out as never worth measuring). Default
        ``lowering``. The cross-lowering tests read it: a config broken by ``lowering``
        rules alone must fail to lower.
    """

    name: str
    reads: tuple[str, ...]
    check: Callable[[Mapping[str, Value], Env], bool]
    reason: str | Callable[[Mapping[str, Value], Env], str]
    kind: str = "lowering"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", tuple(self.reads))
        words = self.kind.split("+") if isinstance(self.kind, str) else [self.kind]
        unknown = [w for w in words if w not in RULE_KINDS]
        if unknown:
            raise SpaceError(
                f"Constraint {self.name!r}: kind={self.kind!r} is not a rule kind; expected one "
                f"of {', '.join(RULE_KINDS)}, or several joined by '+' (e.g. 'policy+lowering')."
            )

    def explain(self, config: Mapping[str, Value], env: Env) -> str:
        if callable(self.reason):
            return self.reason(config, env)
        values = ", ".join(f"{k}={config[k]!r}" for k in self.reads if k in config)
        return f"{self.reason} (got {values})" if values else self.reason


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule of a config: the rule's name, what is wrong, and valid alternatives."""

    rule: str
    message: str
    nearest: tuple[Mapping[str, Value], ...] = ()

    def __str__(self) -> str:
        text = f"[{self.rule}] {self.message}"
        if self.nearest:
            alts = "; ".join(", ".join(f"{k}={v!r}" for k, v in alt.items()) for alt in self.nearest)
            text += f". Nearest valid: {alts}"
        return text


# ---------------------------------------------------------------------------------------------
# The space.


@dataclasses.dataclass(frozen=True)
class Space:
    """Tunables and constraints of one kernel, before a problem is chosen.

    Tunables are fixed in the order given; put the ones most constraints read first, so that
    pruning happens early.
    """

    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise SpaceError(f"Tunable names must be unique, got {names}.")
        for c in self.constraints:
            unknown = [r for r in c.reads if r not in names]
            if unknown:
                raise SpaceError(
                    f"Constraint {c.name!r} reads {unknown}, which are not tunables of this "
                    f"space ({names})."
                )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def bind(self, problem: Problem | Env, **env: Any) -> BoundSpace:
        """The space for one problem: concrete domains and the problem's rules.

        ``env`` keywords (``profile_space``, ``trace_scope``, ``device``, ``smem_limit_bytes``) build the
        :class:`Env` the rules read; pass ``profile_space`` for the tracing pass.

        Raises:
          NoValidConfigError: a rule on the problem alone fails, or a tunable has no value for
            this problem; the message names the rule.
        """
        if "device" in env and "smem_limit_bytes" not in env:
            env["smem_limit_bytes"] = 0  # the new device's
        if isinstance(problem, Env):
            return BoundSpace(self, dataclasses.replace(problem, **env))
        return BoundSpace(self, Env(problem, **env))


class BoundSpace:
    """A :class:`Space` for one problem: its valid set, counted, enumerated, sampled, checked."""

    # Above this many valid configs, nearest-config repair and sampling stay lazy.
    MATERIALIZE_LIMIT = 200_000
    # sample(n) enumerates the valid set only when it holds at most this many times n configs.
    ENUMERATE_TO_SAMPLE = 8
    _DRAW_MEMO_MAX = 1_000_000  # prefixes whose draw weights are kept
    _NEIGHBOUR_MEMO_MAX = 16_384  # configs whose neighbour keys are kept

    def __init__(self, space: Space, env: Env) -> None:
        self.space = space
        self.env = env
        self.problem = env.problem
        self.params = space.params
        self.names = space.names
        self.domains: tuple[tuple[Value, ...], ...] = tuple(p.domain(env) for p in self.params)
        self._index = {name: i for i, name in enumerate(self.names)}
        self._value_index = [{repr(v): j for j, v in enumerate(d)} for d in self.domains]

        by_level: list[list[Constraint]] = [[] for _ in self.params]
        self.problem_rules: list[Constraint] = []
        for c in space.constraints:
            if not c.reads:
                self.problem_rules.append(c)
            else:
                by_level[max(self._index[r] for r in c.reads)].append(c)
        self._by_level = [tuple(level) for level in by_level]
        # _free_from[d]: no constraint reads any tunable at position >= d.
        last = max((i for i, lv in enumerate(self._by_level) if lv), default=-1)
        self._free_from = last + 1
        self._checks = [tuple(self._cached(c) for c in level) for level in self._by_level]
        self._all_checks = tuple(chk for level in self._checks for chk in level)
        self._problem_ok: bool | None = None  # the problem rules hold (is_valid's fast path)
        self._valid: list[tuple[Value, ...]] | None = None
        self._valid_idx: np.ndarray | None = None
        self._count: int | None = None
        self._memo: dict[tuple[Value, ...], int] = {}
        self._live_cache: list[tuple[int, ...]] | None = None
        self._draw_weights: dict[tuple[Value, ...], list[int]] = {}
        self._exists_memo: dict[tuple[Value, ...], bool] = {}
        # neighbour_keys' answers: a climb looks at the neighbours of the same configs again and
        # again (a neighbour's neighbours, from several starts and rounds).
        self._neighbour_memo: dict[tuple[Any, ...], tuple[tuple[Value, ...], ...]] = {}

    # -- rules ------------------------------------------------------------------------------

    def _cached(self, c: Constraint) -> Callable[[Sequence[Value]], bool]:
        """A check on a value tuple, memoised on the values the rule reads."""
        idx = tuple(self._index[r] for r in c.reads)
        env = self.env
        reads = c.reads
        memo: dict[tuple[Value, ...], bool] = {}  # a plain dict: binding 10,000 problems stays cheap
        # The key: the values the rule reads, as a tuple (itemgetter of one index gives the
        # value itself). The checks run millions of times in a local search's neighbourhoods.
        pick = operator.itemgetter(*idx) if len(idx) > 1 else None
        only = idx[0] if len(idx) == 1 else 0

        def check(values: Sequence[Value]) -> bool:
            key = pick(values) if pick is not None else (values[only],)
            hit = memo.get(key)
            if hit is None:
                if len(memo) >= 65536:
                    memo.clear()
                hit = memo[key] = bool(c.check(dict(zip(reads, key, strict=True)), env))
            return hit

        return check

    def unsatisfiable_reason(self) -> str | None:
        """Why this problem has no valid config, naming the binding rule; None if it has one."""
        for rule in self.problem_rules:
            if not rule.check({}, self.env):
                return f"[{rule.name}] {rule.explain({}, self.env)}"
        for param, domain in zip(self.params, self.domains, strict=True):
            if not domain:
                return (
                    f"[{param.name}_domain] tunable {param.name!r} has no value for {self.problem}: "
                    f"it must be {param.describe(self.env)}; give a shape that has one"
                )
        if not self.has_valid():
            rules = "; ".join(f"[{c.name}] {c.explain(example, self.env)}"
                              for c, example in self._binding_rules())
            return (f"no config satisfies {rules}. The tunables' values for this problem: "
                    f"{self._bounds()}; give a shape these rules allow")
        return None

    def _bounds(self) -> str:
        """Each tunable's values for this problem, in brief: ``tile_m 64..512 (8 values)``."""
        parts = []
        for param, domain in zip(self.params, self.domains, strict=True):
            if len(domain) > 4 and param.kind in ("aligned", "pow2"):
                text = f"{domain[0]}..{domain[-1]} ({len(domain)} values)"
            else:
                text = ", ".join(map(repr, domain[:4])) + (", ..." if len(domain) > 4 else "")
            parts.append(f"{param.name} {text}")
        return ", ".join(parts)

    def has_valid(self) -> bool:
        """Whether any config is valid: a depth-first search that stops at the first one, so
        checking a problem (a job of 10,000 problems) does not count its whole space."""
        if self._count is not None:
            return self._count > 0
        if any(not rule.check({}, self.env) for rule in self.problem_rules):
            return False
        return self._exists(0, [None] * len(self.params))

    def _exists(self, d: int, values: list[Value]) -> bool:
        if d >= self._free_from:
            return all(self.domains[d:])
        key = (d, *(values[i] for i in self._live(d)))
        hit = self._memo.get(key)
        if hit is not None:
            return hit > 0
        hit_exists = self._exists_memo.get(key)
        if hit_exists is not None:
            return hit_exists
        found = False
        level_checks = self._checks[d]
        for v in self.domains[d]:
            values[d] = v
            if all(chk(values) for chk in level_checks) and self._exists(d + 1, values):
                found = True
                break
        values[d] = None
        self._exists_memo[key] = found
        return found

    def require_nonempty(self) -> None:
        """Raises :class:`NoValidConfigError` naming the binding rule if the space is empty."""
        reason = self.unsatisfiable_reason()
        if reason is not None:
            raise NoValidConfigError(f"No valid config for {self.problem}: {reason}.")

    def _binding_rules(self) -> list[tuple[Constraint, dict[str, Value]]]:
        """The constraints that reject the most of 2,000 random raw configs (every one that
        rejects all of them, else the one rejecting most: the rules to relax first), each with
        an example config it rejects (of the smallest values found)."""
        fails: dict[str, int] = {}
        examples: dict[str, tuple[int, dict[str, Value]]] = {}
        rules = {c.name: c for level in self._by_level for c in level}
        rng = random.Random(0)
        samples = 2000
        for i in range(samples):  # the first: every tunable's first (smallest) value
            picks = [0 if i == 0 else rng.randrange(len(d)) for d in self.domains]
            config = {n: d[j] for n, d, j in zip(self.names, self.domains, picks, strict=True)}
            broken = [name for name, c in rules.items() if not c.check(config, self.env)]
            rank = sum(picks)  # small values read best
            for name in broken:
                fails[name] = fails.get(name, 0) + 1
                if name not in examples or rank < examples[name][0]:
                    examples[name] = (rank, config)
        if not fails:  # pragma: no cover - an empty space breaks some rule on every config
            return []
        top = [n for n, k in fails.items() if k == samples] or [max(fails, key=lambda n: fails[n])]
        return [(rules[n], examples[n][1]) for n in top[:3]]

    # -- sizes ------------------------------------------------------------------------------

    @property
    def raw_count(self) -> int:
        """Size of the raw grid (the product of the tunables' domains)."""
        return math.prod(len(d) for d in self.domains)

    def count(self) -> int:
        """Number of valid configs, counted without building the raw grid.

        Dynamic programming over the tunable order: the number of valid completions below
        depth ``d`` depends only on the earlier values that rules at depth ``d`` or later
        read, so it is memoised on those (a 10^9-raw space counts in well under a second
        when its rules read few tunables each).
        """
        if self._count is None:
            if any(not rule.check({}, self.env) for rule in self.problem_rules):
                self._count = 0
            else:
                self._count = self._completions(0, [None] * len(self.params))
        return self._count

    def _live(self, d: int) -> tuple[int, ...]:
        """Indices before ``d`` that some rule checked at depth ``d`` or later reads."""
        if self._live_cache is None:
            live: list[tuple[int, ...]] = []
            for depth in range(len(self.params) + 1):
                reads = {
                    self._index[r]
                    for level in self._by_level[depth:]
                    for c in level
                    for r in c.reads
                }
                live.append(tuple(sorted(i for i in reads if i < depth)))
            self._live_cache = live
        return self._live_cache[d]

    def _completions(self, d: int, values: list[Value]) -> int:
        """Valid completions of ``values[:d]`` (memoised on the values later rules read)."""
        if d >= self._free_from:
            return math.prod(len(dom) for dom in self.domains[d:])
        key = (d, *(values[i] for i in self._live(d)))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        total = 0
        level_checks = self._checks[d]
        for v in self.domains[d]:
            values[d] = v
            if all(chk(values) for chk in level_checks):
                total += self._completions(d + 1, values)
        values[d] = None
        self._memo[key] = total
        return total

    def _prefixes(self) -> Iterator[list[Value]]:
        """Valid assignments of the constrained tunables (those before ``_free_from``).

        Subtrees with no valid completion (per the memoised counts) are never entered, so the
        walk costs about as much as its output.
        """
        depth_max = self._free_from
        values: list[Value] = [None] * len(self.params)
        if depth_max == 0:
            yield values
            return
        if self.count() == 0:
            return
        domains, checks = self.domains, self._checks

        def rec(d: int) -> Iterator[list[Value]]:
            level_checks = checks[d]
            last = d == depth_max - 1
            for v in domains[d]:
                values[d] = v
                if not all(chk(values) for chk in level_checks):
                    continue
                if last:
                    yield values
                elif self._completions(d + 1, values):
                    yield from rec(d + 1)

        yield from rec(0)

    # -- enumeration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Config]:
        """Every valid config, in a fixed order, lazily."""
        for values in self._iter_tuples():
            yield self._config(values)

    def _iter_tuples(self) -> Iterator[tuple[Value, ...]]:
        if any(not rule.check({}, self.env) for rule in self.problem_rules):
            return
        tail_domains = self.domains[self._free_from :]
        k = self._free_from
        for prefix in self._prefixes():
            head = tuple(prefix[:k])
            for tail in itertools.product(*tail_domains):
                yield head + tail

    def valid_tuples(self) -> list[tuple[Value, ...]]:
        """All valid configs as value tuples (materialised once; only for small spaces)."""
        if self._valid is None:
            self._valid = list(self._iter_tuples())
            self._count = len(self._valid)
        return self._valid

    def _valid_index_matrix(self) -> np.ndarray:
        """The valid set as an (N, tunables) array of domain indices, built once."""
        import numpy as np

        if self._valid_idx is None:
            lookups = self._value_index
            self._valid_idx = np.array(
                [[lookups[i][repr(v)] for i, v in enumerate(t)] for t in self.valid_tuples()],
                dtype=np.int32,
            ).reshape(-1, len(self.params))
        return self._valid_idx

    def _distances_to(self, target: Sequence[Value]) -> np.ndarray:
        """Distance (as :meth:`_distance`) from every valid config to ``target``."""
        import numpy as np

        idx = self._valid_index_matrix()
        dist = np.zeros(len(idx), dtype=np.float64)
        for i, param in enumerate(self.params):
            j = self._value_index[i].get(repr(target[i]))
            if j is None:
                dist += 1.0
            elif param.ordinal:
                dist += np.abs(idx[:, i] - j) / max(1, len(self.domains[i]) - 1) * 2
            else:
                dist += idx[:, i] != j
        return dist

    def _config(self, values: Sequence[Value]) -> Config:
        return Config(dict(zip(self.names, values, strict=True)))

    def config_of(self, key: Sequence[Value]) -> Config:
        """The config whose key (:meth:`key`: its values in tunable order) is ``key``."""
        return self._config(key)

    def _tuple(self, config: Mapping[str, Value]) -> tuple[Value, ...]:
        return tuple(config[n] for n in self.names)

    # -- sampling ---------------------------------------------------------------------------

    def sample(
        self,
        n: int,
        *,
        seed: int | None = None,
        exclude: Iterable[Mapping[str, Value]] = (),
    ) -> list[Config]:
        """Up to ``n`` distinct valid configs drawn uniformly at random, none in ``exclude``.

        Small spaces, and spaces already enumerated, are sampled from the valid set; others
        lazily: each tunable's value is drawn with probability proportional to its number of
        valid completions (the memoised counts of :meth:`count`), which is exactly uniform over
        the valid set and never materialises it. (Enumerating 200,000 configs to draw 1,024 of
        them took 2 s; the lazy draws take 0.2 s.)
        """
        rng = random.Random(seed)
        banned = {self._tuple_or_none(c) for c in exclude}
        count = self.count()
        if self._valid is not None or count <= min(self.MATERIALIZE_LIMIT, self.ENUMERATE_TO_SAMPLE * max(n, 1)):
            pool = [t for t in self.valid_tuples() if t not in banned]
            picked = rng.sample(pool, min(n, len(pool)))
            return [self._config(t) for t in picked]
        out: list[Config] = []
        seen = set(banned)
        attempts = 0
        max_attempts = 100 * max(n, 1) + 1_000
        while len(out) < n and attempts < max_attempts:
            attempts += 1
            values = self._draw(rng)
            if values is not None and values not in seen:
                seen.add(values)
                out.append(self._config(values))
        return out

    def _draw(self, rng: random.Random) -> tuple[Value, ...] | None:
        """One valid config, uniformly: each value weighted by its count of valid completions."""
        values: list[Value] = [None] * len(self.params)
        for d, domain in enumerate(self.domains):
            if d >= self._free_from:
                values[d] = domain[rng.randrange(len(domain))]
                continue
            # The weights depend on the prefix only: memoised, so many draws cost little more
            # than one (`spaces --sample 10000` on a 10^7-config space).
            key = (d, *values[:d])
            weights = self._draw_weights.get(key)
            if weights is None:
                weights = []
                for v in domain:
                    values[d] = v
                    ok = all(chk(values) for chk in self._checks[d])
                    weights.append(self._completions(d + 1, values) if ok else 0)
                if len(self._draw_weights) < self._DRAW_MEMO_MAX:
                    self._draw_weights[key] = weights
            total = sum(weights)
            if total == 0:
                return None
            pick = rng.randrange(total)
            for v, w in zip(domain, weights, strict=True):
                if pick < w:
                    values[d] = v
                    break
                pick -= w
        return tuple(values)

    def _tuple_or_none(self, config: Mapping[str, Value]) -> tuple[Value, ...] | None:
        try:
            return self._tuple(config)
        except KeyError:
            return None

    # -- validation -------------------------------------------------------------------------

    def is_valid(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` breaks no rule: ``validate(config, nearest=False)`` is empty.

        A config of exactly this space's tunables, each in its domain, is checked through the
        memoised rules (those that enumerate the valid set), with nothing put in words;
        anything else goes through :meth:`validate`."""
        if self._problem_ok is None:
            self._problem_ok = all(rule.check({}, self.env) for rule in self.problem_rules)
        if self._problem_ok and len(config) == len(self.names):
            values = self._tuple_or_none(config)
            if values is not None and all(
                repr(v) in lookup for v, lookup in zip(values, self._value_index, strict=True)
            ):
                try:
                    return self._all_ok(values)
                except KeyError:  # a rule that reads a tunable it does not declare
                    pass
        return not self.validate(config, nearest=False)

    def validate(self, config: Mapping[str, Value], *, nearest: bool = True) -> list[Violation]:
        """The rules ``config`` breaks, in words, each with the nearest valid alternatives.

        An empty list means the config is valid for this problem.
        """
        out: list[Violation] = []
        for rule in self.problem_rules:
            if not rule.check({}, self.env):
                out.append(Violation(rule.name, rule.explain({}, self.env)))
        if out:
            return out
        unknown = sorted(set(config) - set(self.names))
        if unknown:
            out.append(
                Violation(
                    "known_tunables",
                    f"unknown tunable(s) {unknown} for {self.problem.kernel}; its tunables are "
                    f"{list(self.names)}",
                )
            )
        for param, domain in zip(self.params, self.domains, strict=True):
            if param.name not in config:
                out.append(Violation("complete", f"tunable {param.name!r} is missing"))
                continue
            value = config[param.name]
            if repr(value) not in self._value_index[self._index[param.name]]:
                alts = self._nearest_in_domain(param, domain, value) if nearest else ()
                out.append(
                    Violation(
                        f"{param.name}_domain",
                        f"{param.name}={value!r} is not allowed for {self.problem}: it must be "
                        f"{param.describe()}",
                        tuple({param.name: a} for a in alts),
                    )
                )
        if out:
            return out
        values = self._tuple(config)
        full = dict(config)
        for level in self._by_level:
            for c in level:
                if not c.check(full, self.env):
                    alts = self._nearest_fixing(c, values) if nearest else ()
                    out.append(Violation(c.name, c.explain(full, self.env), alts))
        return out

    def _nearest_in_domain(
        self, param: Param, domain: Sequence[Value], value: Value
    ) -> tuple[Value, ...]:
        if not domain:
            return ()
        if param.ordinal and isinstance(value, int | float) and not isinstance(value, bool):
            ranked = sorted(domain, key=lambda v: (abs(v - value), v))
            return tuple(sorted(ranked[:2]))
        return tuple(domain[:3])

    def _nearest_fixing(
        self, c: Constraint, values: tuple[Value, ...]
    ) -> tuple[Mapping[str, Value], ...]:
        """Values of the tunables ``c`` reads that satisfy it, closest first (up to 2).

        Other tunables keep their values; rules reading only the same tunables must hold too,
        so an alternative never trades this rule for a sibling's.
        """
        idx = [self._index[r] for r in c.reads]
        reads = set(c.reads)
        local = [
            self._cached(other)
            for other in self.space.constraints
            if other.reads and set(other.reads) <= reads
        ]
        options = []
        for combo in itertools.product(*(self.domains[i] for i in idx)):
            candidate = list(values)
            for i, v in zip(idx, combo, strict=True):
                candidate[i] = v
            if all(chk(candidate) for chk in local):
                dist = sum(self._distance(i, values[i], candidate[i]) for i in idx)
                options.append((dist, {self.names[i]: candidate[i] for i in idx}))
        options.sort(key=lambda t: t[0])
        return tuple(o[1] for o in options[:2])

    def _all_ok(self, values: Sequence[Value]) -> bool:
        return all(chk(values) for chk in self._all_checks)

    def _distance(self, i: int, a: Value, b: Value) -> float:
        """Distance between two values of tunable ``i``: index steps if ordinal, else 0/1."""
        if a == b:
            return 0.0
        if not self.params[i].ordinal:
            return 1.0
        lookup = self._value_index[i]
        ia, ib = lookup.get(repr(a)), lookup.get(repr(b))
        if ia is None or ib is None:
            return 1.0
        return abs(ia - ib) / max(1, len(self.domains[i]) - 1) * 2

    # -- repair -----------------------------------------------------------------------------

    def snap(self, proposal: Mapping[str, Value]) -> tuple[Value, ...]:
        """Each proposed value moved to the nearest value of its tunable's domain."""
        out = []
        for param, domain in zip(self.params, self.domains, strict=True):
            value = proposal.get(param.name, domain[0] if domain else None)
            if repr(value) in self._value_index[self._index[param.name]] or not domain:
                out.append(value)
            elif param.ordinal and isinstance(value, int | float) and not isinstance(value, bool):
                out.append(min(domain, key=lambda v: (abs(math.log2(max(v, 1e-9)) - math.log2(max(value, 1e-9))), v)))
            else:
                out.append(domain[0])
        return tuple(out)

    def nearest(
        self,
        proposal: Mapping[str, Value],
        *,
        exclude: Callable[[tuple[Value, ...]], bool] | None = None,
    ) -> Config | None:
        """The valid config closest to ``proposal`` for which ``exclude`` is false, or None.

        Closeness sums, over tunables, the index distance in the domain (ordered tunables) or a
        mismatch (choices). Small spaces are searched exactly; large ones by a depth-first walk
        that tries each tunable's values nearest first, so the first hit is close.
        """
        exclude = exclude or (lambda t: False)
        target = self.snap(proposal)
        if self.count() <= self.MATERIALIZE_LIMIT:
            valid = self.valid_tuples()
            if not valid:
                return None
            import numpy as np

            dist = self._distances_to(target)
            # Stable sort: among equally near configs the enumeration order decides.
            for i in np.argsort(dist, kind="stable"):
                if not exclude(valid[i]):
                    return self._config(valid[i])
            return None
        orders = []
        for i, domain in enumerate(self.domains):
            orders.append(sorted(domain, key=functools.partial(self._distance, i, target[i])))
        values: list[Value] = [None] * len(self.params)

        def rec(d: int) -> tuple[Value, ...] | None:
            if d == len(self.params):
                t = tuple(values)
                return None if exclude(t) else t
            for v in orders[d]:
                values[d] = v
                if all(chk(values) for chk in self._checks[d]):
                    hit = rec(d + 1)
                    if hit is not None:
                        return hit
            return None

        found = rec(0)
        return None if found is None else self._config(found)

    def neighbours(
        self, config: Mapping[str, Value], *, radius: int | None = None,
        per_tunable: int | None = MAX_MOVES_PER_TUNABLE,
    ) -> list[Config]:
        """Valid configs that differ from ``config`` in exactly one tunable, nearest first
        (:meth:`neighbour_keys`, as configs)."""
        keys = self.neighbour_keys(config, radius=radius, per_tunable=per_tunable)
        return [self._config(values) for values in keys]

    def neighbour_keys(
        self, config: Mapping[str, Value], *, radius: int | None = None,
        per_tunable: int | None = MAX_MOVES_PER_TUNABLE,
    ) -> list[tuple[Value, ...]]:
        """The keys (:meth:`key`) of the valid configs that differ from ``config`` in exactly
        one tunable, nearest first: :meth:`neighbours` without making a config of each (a
        climb looks most of them up among those it has seen).

        ``radius`` keeps, for ordered tunables, only values at most that many domain steps
        away (choices always count as one step). The one-tunable moves of a local search.
        ``per_tunable`` bounds the values tried per tunable (the nearest in domain steps; of a
        choice, those next to it in declared order), so the cost does not grow with a domain
        of thousands of values (issue 36); None tries them all. Every bundled kernel's domains
        are within the default (:data:`MAX_MOVES_PER_TUNABLE`), where nothing is left out.
        """
        if per_tunable is not None and per_tunable < 1:
            raise ValueError(f"per_tunable must be a positive whole number or None, got {per_tunable!r}.")
        base = self._tuple_or_none(config)
        if base is None:
            base = self.snap(config)
        memo_key = (base, radius, per_tunable)
        hit = self._neighbour_memo.get(memo_key)
        if hit is not None:
            return list(hit)
        found: list[tuple[float, int, tuple[Value, ...]]] = []
        for i, domain in enumerate(self.domains):
            here = self._value_index[i].get(repr(base[i]))
            tried: Iterable[int] = range(len(domain))
            if per_tunable is not None and len(domain) > per_tunable + 1:
                tried = _nearest_indices(len(domain), 0 if here is None else here,
                                         ordinal=self.params[i].ordinal, keep=per_tunable + 1)
            for j in tried:
                value = domain[j]
                if value == base[i]:
                    continue
                if radius is not None and self.params[i].ordinal and here is not None and abs(j - here) > radius:
                    continue
                values = base[:i] + (value,) + base[i + 1:]
                if self._all_ok(values):
                    found.append((self._distance(i, base[i], value), len(found), values))
        found.sort()
        if len(self._neighbour_memo) >= self._NEIGHBOUR_MEMO_MAX:
            self._neighbour_memo.clear()
        self._neighbour_memo[memo_key] = tuple(values for _, _, values in found)
        return [values for _, _, values in found]

    def closest_valid(self, proposal: Mapping[str, Value]) -> Config:
        """``proposal`` if it is valid here, else the valid config nearest to it.

        What a kernel's ``default_config`` returns: a known-good config, adapted to a problem
        whose rules exclude it. Returns the proposal unchanged when nothing is valid.
        """
        if self.is_valid(proposal):
            return Config(proposal)
        found = self.nearest(proposal)
        return found if found is not None else Config(proposal)

    def key(self, config: Mapping[str, Value]) -> tuple[Value, ...]:
        """The value tuple of a config, in tunable order (hashable)."""
        return self._tuple(config)

    def describe(self, example: Mapping[str, Value] | None = None) -> list[str]:
        """One line per tunable and rule, for ``autotune spaces``.

        A rule is shown in words with its values filled in: the problem's, and the tunables'
        of ``example`` (by default the first valid config), never as a template.
        """
        lines = []
        for param, domain in zip(self.params, self.domains, strict=True):
            shown = ", ".join(map(repr, domain[:8])) + (", ..." if len(domain) > 8 else "")
            lines.append(f"  {param.name}: {param.describe()} -> [{shown}] ({len(domain)})")
        if example is None:
            example = next(iter(self.sample(1, seed=0)), None) if self.space.constraints else None
        for c in self.space.constraints:
            if callable(c.reason):
                try:
                    reason = c.reason(example or {}, self.env)
                except Exception:  # noqa: BLE001 - a reason that needs more than it has
                    reason = getattr(c.reason, "__doc__", None) or "(explains itself)"
            else:
                reason = c.reason
            lines.append(f"  rule {c.name}({', '.join(c.reads)}): {reason}")
        return lines

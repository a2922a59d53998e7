"""The constraint engine: domains, pruning enumeration, counting, sampling, validation, repair."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.errors import NoValidConfigError, SpaceError
from autotune.space.problem import Problem
from autotune.space.search_space import (
    Aligned,
    Bool,
    Choice,
    Constraint,
    Env,
    PowerOfTwo,
    Space,
    elems_per_bytes,
    is_aligned_transfer,
    per_128_bytes,
    profiler_smem_bytes,
    threads,
    transfer_bytes,
)

PROBLEM = Problem("toy", {"m": 1024, "n": 768}, "bfloat16")


def toy_space() -> Space:
    return Space(
        params=(
            Aligned("bm", unit=64, low=64, high=512, divides="m"),
            Aligned("bn", unit=64, low=64, high=512),
            PowerOfTwo("width", low=1, high=16),
            Choice("order", ("M", "N")),
            Bool("flag"),
        ),
        constraints=(
            Constraint("bn_divides_n", ("bn",), lambda c, e: e["n"] % c["bn"] == 0, "bn must divide n"),
            Constraint(
                "smem", ("bm", "bn"), lambda c, e: (c["bm"] + c["bn"]) * 64 * 2 * 4 <= 100_000,
                "A and B tiles for 4 stages must fit in 100,000 bytes",
            ),
            Constraint(
                "width_order", ("width", "order"), lambda c, e: c["order"] == "M" or c["width"] <= 4,
                "grid_tile_width above 4 only with order M",
            ),
        ),
    )


def brute_force(space: Space, problem: Problem) -> set[tuple]:
    bound = space.bind(problem)
    out = set()
    for values in itertools.product(*bound.domains):
        config = dict(zip(bound.names, values, strict=True))
        env = bound.env
        if all(c.check(config, env) for c in space.constraints):
            out.add(values)
    return out


def test_alignment_units_per_dtype():
    """128 bytes hold 32 f32, 64 bf16/f16 and 128 fp8 elements."""
    assert elems_per_bytes(128, "float32") == 32
    assert elems_per_bytes(128, "bfloat16") == 64
    assert elems_per_bytes(128, "float16") == 64
    assert elems_per_bytes(128, "float8_e4m3fn") == 128
    assert per_128_bytes(Env(Problem("k", {"m": 1}, "f32"))) == 32
    assert per_128_bytes(Env(Problem("k", {"m": 1}, "fp8"))) == 128


def test_transfer_helpers():
    """transfer_bytes/is_aligned_transfer reproduce the seed examples (48 f32 = 192 B is bad)."""
    assert transfer_bytes((48,), "float32") == 192
    assert not is_aligned_transfer((48,), "float32")
    assert is_aligned_transfer((64,), "float32")
    assert is_aligned_transfer((64, 64), "bfloat16")
    assert threads(warpgroups=3) == 384 and threads(warps=3) == 96


def test_profiler_smem_matches_mosaic_formula():
    """The profiler takes profile_space*4 int32 entries per warpgroup, 8-byte aligned."""
    assert profiler_smem_bytes(profile_space=0, block_threads=384) == 0
    assert profiler_smem_bytes(profile_space=64, block_threads=384) == 3 * 64 * 4 * 4 + 8
    assert profiler_smem_bytes(profile_space=64, block_threads=128, scope="warp") == 4 * 64 * 4 * 4 + 8
    env = Env(PROBLEM, profile_space=64)
    assert env.smem_budget(block_threads=384) == 232_448 - (3 * 64 * 16 + 8)


def test_enumeration_matches_brute_force():
    """Pruned enumeration yields exactly the configs a generate-then-filter pass keeps."""
    space = toy_space()
    bound = space.bind(PROBLEM)
    expected = brute_force(space, PROBLEM)
    got = {bound.key(c) for c in bound}
    assert got == expected
    assert bound.count() == len(expected)
    assert bound.raw_count == len(list(itertools.product(*bound.domains)))


def test_divides_prunes_domain():
    """Aligned(divides=...) keeps only tiles that divide the shape key."""
    bound = toy_space().bind(PROBLEM)
    assert bound.domains[0] == (64, 128, 256, 512)


def test_problem_rule_names_binding_rule():
    """A rule on the problem alone makes the space empty with an error naming it."""
    space = Space(
        params=(Aligned("b", unit=64, low=64, high=128),),
        constraints=(Constraint("f16_only", (), lambda c, e: e.dtype == "float16", "the kernel allocates float16 smem"),),
    )
    bound = space.bind(PROBLEM)
    assert bound.count() == 0
    with pytest.raises(NoValidConfigError, match=r"\[f16_only\]"):
        bound.require_nonempty()


def test_empty_domain_names_the_tunable():
    """A shape no tile divides reports the tunable and what it must be, with the problem's
    value and the tunable's bounds."""
    bound = toy_space().bind(Problem("toy", {"m": 100, "n": 768}, "bf16"))
    with pytest.raises(NoValidConfigError,
                       match=r"bm_domain.*multiple of 64 dividing m=100, from 64 to 512"):
        bound.require_nonempty()


def test_no_valid_config_shows_the_binding_rule_with_values_and_the_bounds():
    """A space its rules empty: the message names each binding rule explained with example
    values, every tunable's values for the problem, and the way out."""
    bound = toy_space().bind(Problem("toy", {"m": 1024, "n": 100}, "bf16"))
    with pytest.raises(NoValidConfigError) as info:
        bound.require_nonempty()
    message = str(info.value)
    assert "[bn_divides_n] bn must divide n (got bn=64)" in message, message
    assert ("values for this problem: bm 64, 128, 256, 512, bn 64..512 (8 values), width 1..16 (5 "
            "values), order 'M', 'N', flag False, True") in message
    assert "give a shape these rules allow" in message


def test_validate_names_rule_value_and_nearest():
    """validate() returns each broken rule with the value and nearest valid alternatives."""
    bound = toy_space().bind(PROBLEM)
    violations = bound.validate({"bm": 100, "bn": 256, "width": 3, "order": "N", "flag": True})
    rules = {v.rule for v in violations}
    assert rules == {"bm_domain", "width_domain"}
    bm = next(v for v in violations if v.rule == "bm_domain")
    assert "bm=100" in bm.message and {"bm": 64} in bm.nearest and {"bm": 128} in bm.nearest
    violations = bound.validate({"bm": 512, "bn": 512, "width": 8, "order": "N", "flag": True})
    rules = {v.rule for v in violations}
    assert {"smem", "width_order"} <= rules
    for v in violations:
        assert v.nearest, v
        for alt in v.nearest:
            fixed = {"bm": 512, "bn": 512, "width": 8, "order": "N", "flag": True, **alt}
            assert not any(x.rule == v.rule for x in bound.validate(fixed, nearest=False))
    assert bound.validate({"bm": 64, "bn": 128, "width": 2, "order": "N", "flag": False}) == []


def test_validate_unknown_and_missing_tunables():
    """Unknown and missing tunables are reported by name."""
    bound = toy_space().bind(PROBLEM)
    violations = bound.validate({"bm": 64, "bn": 128, "width": 2, "order": "N", "bogus": 1})
    text = " ".join(str(v) for v in violations)
    assert "bogus" in text and "'flag' is missing" in text


def test_sample_is_valid_distinct_and_respects_exclude():
    """sample() returns distinct valid configs and never an excluded one."""
    bound = toy_space().bind(PROBLEM)
    first = bound.sample(10, seed=1)
    assert len({c.digest() for c in first}) == 10
    assert all(bound.is_valid(c) for c in first)
    rest = bound.sample(10_000, seed=2, exclude=first)
    assert len(rest) == bound.count() - 10
    assert not {c.digest() for c in first} & {c.digest() for c in rest}


def test_lazy_sampling_on_a_huge_space():
    """A 10^9-raw space samples valid configs by rejection without materialising anything."""
    params = tuple(Aligned(f"p{i}", unit=1, low=1, high=32) for i in range(6))  # 32^6 ~ 1.07e9
    space = Space(params, (Constraint("sum", ("p0", "p1"), lambda c, e: c["p0"] + c["p1"] <= 40, "p0+p1 <= 40"),))
    bound = space.bind(PROBLEM)
    assert bound.raw_count == 32**6
    configs = bound.sample(50, seed=0)
    assert len(configs) == 50 and all(c["p0"] + c["p1"] <= 40 for c in configs)
    assert bound._valid is None  # nothing materialised
    near = bound.nearest({"p0": 32, "p1": 32, "p2": 5, "p3": 5, "p4": 5, "p5": 5})
    assert near is not None and near["p0"] + near["p1"] <= 40 and near["p2"] == 5


def test_a_few_samples_of_a_mid_sized_space_do_not_enumerate_it():
    """sample(n) enumerates the valid set only when it holds at most ENUMERATE_TO_SAMPLE x n
    configs (or is enumerated already): drawing 1,024 of hopper_matmul's 199,499 valid configs
    at 512x14336x4096 took 2 s by enumeration and takes 0.2 s drawn lazily."""
    params = tuple(Aligned(f"p{i}", unit=1, low=1, high=12) for i in range(4))  # 20,736 raw
    bound = Space(params, ()).bind(PROBLEM)
    assert bound.count() <= bound.MATERIALIZE_LIMIT
    few = bound.sample(100, seed=0)
    assert len({c.digest() for c in few}) == 100 and all(bound.is_valid(c) for c in few)
    assert bound._valid is None  # 20,736 > 8 x 100: drawn lazily
    many = bound.sample(5_000, seed=0)
    assert len({c.digest() for c in many}) == 5_000
    assert bound._valid is not None  # 20,736 <= 8 x 5,000: enumerated, then sampled exactly


def test_count_uses_unconstrained_tail():
    """Counting multiplies out tunables no rule reads instead of enumerating them."""
    params = (Aligned("a", unit=1, low=1, high=100),) + tuple(
        Aligned(f"t{i}", unit=1, low=1, high=10) for i in range(4)
    )
    space = Space(params, (Constraint("even", ("a",), lambda c, e: c["a"] % 2 == 0, "a even"),))
    assert space.bind(PROBLEM).count() == 50 * 10**4


def test_nearest_excludes_taken_and_is_valid():
    """nearest() returns the closest valid config not excluded, or None when all are."""
    bound = toy_space().bind(PROBLEM)
    proposal = {"bm": 512, "bn": 512, "width": 16, "order": "N", "flag": True}
    first = bound.nearest(proposal)
    assert first is not None and bound.is_valid(first)
    taken = {bound.key(first)}
    second = bound.nearest(proposal, exclude=taken.__contains__)
    assert second is not None and bound.key(second) != bound.key(first)
    everything = {bound.key(c) for c in bound}
    assert bound.nearest(proposal, exclude=everything.__contains__) is None


def test_space_declaration_errors():
    """Duplicate tunables and constraints on unknown tunables are rejected with names."""
    with pytest.raises(SpaceError, match="unique"):
        Space((Bool("x"), Bool("x")))
    with pytest.raises(SpaceError, match=r"reads \['y'\]"):
        Space((Bool("x"),), (Constraint("c", ("y",), lambda c, e: True, "r"),))
    with pytest.raises(SpaceError, match="twice"):
        Choice("c", (1, 1))


@settings(max_examples=60, deadline=None)
@given(
    m=st.sampled_from([64, 128, 192, 256, 384, 512, 1024, 3072]),
    n=st.sampled_from([64, 128, 320, 768, 1024]),
    limit=st.integers(min_value=10_000, max_value=400_000),
    max_width=st.sampled_from([1, 2, 4, 8]),
)
def test_property_enumeration_equals_filter(m, n, limit, max_width):
    """For random problems and limits, enumeration == brute-force filter and count agrees."""
    space = Space(
        params=(
            Aligned("bm", unit=64, low=64, high=512, divides="m"),
            Aligned("bn", unit=64, low=64, high=512),
            PowerOfTwo("width", low=1, high=16),
            Choice("order", ("M", "N")),
        ),
        constraints=(
            Constraint("bn_n", ("bn",), lambda c, e: e["n"] % c["bn"] == 0, "bn | n"),
            Constraint("smem", ("bm", "bn"), lambda c, e, L=limit: (c["bm"] + c["bn"]) * 512 <= L, "fits"),
            Constraint("w", ("width", "order"), lambda c, e, W=max_width: c["order"] == "M" or c["width"] <= W, "w"),
        ),
    )
    problem = Problem("toy", {"m": m, "n": n}, "f16")
    bound = space.bind(problem)
    expected = brute_force(space, problem)
    assert {bound.key(c) for c in bound} == expected
    assert bound.count() == len(expected)
    for config in bound.sample(5, seed=m + n):
        assert bound.validate(config) == []


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["bm", "bn", "width", "order", "flag"]),
                       st.one_of(st.integers(-10, 2000), st.sampled_from(["M", "N", "X"]), st.booleans(), st.none())))
def test_property_repair_always_valid(proposal):
    """Whatever a base sampler proposes, repair returns a valid config."""
    bound = toy_space().bind(PROBLEM)
    fixed = bound.nearest(proposal)
    assert fixed is not None and bound.validate(fixed, nearest=False) == []


def test_lazy_sampling_is_uniform_over_the_valid_set():
    """The count-weighted lazy sampler hits every valid config about equally often."""
    from collections import Counter

    bound = toy_space().bind(PROBLEM)
    bound.MATERIALIZE_LIMIT = 0  # force the lazy path on a small space
    n_valid = bound.count()
    rng = __import__("random").Random(7)
    draws = Counter(bound._draw(rng) for _ in range(n_valid * 200))
    assert len(draws) == n_valid
    expected = 200
    # Every config within 5 sigma of its binomial mean; a prefix-uniform sampler would fail.
    assert all(abs(c - expected) < 5 * expected**0.5 for c in draws.values()), draws.most_common(3)


def test_neighbours_differ_in_one_tunable_and_are_valid():
    """neighbours(): every valid config one tunable away, nearest first; radius limits the
    steps of ordered tunables."""
    bound = toy_space().bind(PROBLEM)
    for config in bound.sample(20, seed=3):
        near = bound.neighbours(config)
        expected = [
            c for c in bound
            if sum(c[k] != config[k] for k in bound.names) == 1
        ]
        assert {bound.key(c) for c in near} == {bound.key(c) for c in expected}
        assert len(near) == len({bound.key(c) for c in near})
        dist = [sum(bound._distance(i, config[n], c[n]) for i, n in enumerate(bound.names)) for c in near]
        assert dist == sorted(dist)
        for c in bound.neighbours(config, radius=1):
            (name,) = [k for k in bound.names if c[k] != config[k]]
            i = bound.names.index(name)
            if bound.params[i].ordinal:
                domain = list(bound.domains[i])
                assert abs(domain.index(c[name]) - domain.index(config[name])) == 1


@pytest.mark.parametrize("kernel_name", ["hopper_matmul", "hopper_attention", "softmax", "mosaic_scale"])
def test_has_valid_agrees_with_the_count(kernel_name):
    """The early-exit check used when a job is checked (has_valid) answers exactly
    count() > 0, on bundled spaces with and without valid configs."""
    from autotune.space.kernel import get_kernel

    kernel = get_kernel(kernel_name)
    sizes = [1, 256, 1000, 4096, 65536]
    seen = set()
    combos = list(itertools.product(sizes, repeat=len(kernel.shape_keys)))
    for combo in combos[:: max(1, len(combos) // 40)]:
        for dtype in kernel.dtypes:
            problem = kernel.problem(dict(zip(kernel.shape_keys, combo, strict=True)), dtype)
            lazy = kernel.bind(problem).has_valid()
            assert lazy == (kernel.bind(problem).count() > 0), problem
            seen.add(lazy)
    assert seen  # answers both ways across the kernels: matmul has valid and empty cases


def test_has_valid_finds_an_empty_space():
    """has_valid answers False where every config breaks a rule (shared memory), True where
    some config fits."""
    from autotune.space.kernel import get_kernel

    attention = get_kernel("hopper_attention")
    huge = dict.fromkeys(attention.shape_keys, 1024)
    assert not attention.bind(attention.problem(huge, "float16")).has_valid()
    matmul = get_kernel("hopper_matmul")
    assert matmul.bind(matmul.problem({"m": 4096, "n": 4096, "k": 4096}, "bfloat16")).has_valid()


def test_a_constraint_carries_its_kind_and_a_bad_kind_is_refused():
    """Each constraint says what kind of rule it is (no dict kept beside it); an unknown kind
    names the rule, the value and the kinds allowed."""
    from autotune.errors import SpaceError
    from autotune.space.search_space import RULE_KINDS, Constraint
    from search_spaces import hopper_matmul

    assert Constraint("r", (), lambda c, env: True, "why").kind == "lowering"
    assert Constraint("r", (), lambda c, env: True, "why", kind="policy+lowering").kind
    with pytest.raises(SpaceError, match=r"'r'.*kind='polcy'.*expected one of lowering"):
        Constraint("r", (), lambda c, env: True, "why", kind="polcy")
    kinds = {c.name: c.kind for c in hopper_matmul.SPACE.constraints}
    assert kinds["smem_within_limit"] == "lowering" and kinds["epi_canonical"] == "policy"
    assert hopper_matmul.RULE_KINDS == kinds
    assert all(set(k.split("+")) <= set(RULE_KINDS) for k in kinds.values())


def test_neighbours_try_a_bounded_number_of_values_per_tunable():
    """With a tunable of 4,096 values, neighbours() tries only the MAX_MOVES_PER_TUNABLE values
    nearest the config's (a choice: those next to it in declared order, wrapping), so its cost
    does not grow with the domain; within the bound it is the whole neighbourhood."""
    from autotune.space.search_space import MAX_MOVES_PER_TUNABLE, Choice

    wide = Space(params=(Choice("tile", tuple(range(1, 4097)), ordered=True),
                         Choice("mode", tuple(f"m{i}" for i in range(100))),
                         Choice("stages", (1, 2, 3, 4), ordered=True)))
    bound = wide.bind(Problem("wide", {"n": 1}, "float32"))
    config = {"tile": 2000, "mode": "m0", "stages": 2}
    near = bound.neighbours(config)
    tiles = sorted(c["tile"] for c in near if c["mode"] == "m0" and c["stages"] == 2)
    assert len(tiles) == MAX_MOVES_PER_TUNABLE and tiles == [t for t in range(1984, 2017) if t != 2000]
    modes = {c["mode"] for c in near if c["tile"] == 2000 and c["stages"] == 2}
    assert len(modes) == MAX_MOVES_PER_TUNABLE and {"m1", "m99", "m16", "m84"} <= modes
    assert len(bound.neighbours(config, per_tunable=None)) == 4095 + 99 + 3
    assert sorted(c["stages"] for c in near if c["tile"] == 2000 and c["mode"] == "m0") == [1, 3, 4]
    with pytest.raises(ValueError, match="per_tunable"):
        bound.neighbours(config, per_tunable=0)

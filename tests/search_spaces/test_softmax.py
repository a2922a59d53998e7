"""The bundled softmax kernel: its space proposes only configs that lower, and it is right.

The oracle is ``lower_for_cuda`` (the whole Mosaic GPU lowering, on the CPU); numerics run in
GPU interpret mode. The module docstring of ``search_spaces.softmax`` records the wide
raw-grid sweep these tests sample from.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.errors import NoValidConfigError
from autotune.evaluation.lowering import lower_for_cuda
from autotune.space.kernel import BuildOptions
from autotune.space.problem import Config, Problem
from autotune.space.search_space import Env, is_aligned_transfer, per_128_bytes
from search_spaces import softmax
from search_spaces.softmax import KERNEL, RULE_KINDS, copy_shapes, lane_unit, smem_bytes

# (shape, dtype, configs to sample): every supported dtype, long and short rows.
ORACLE_PROBLEMS = [
    ({"rows": 8192, "cols": 32768}, "bfloat16", 24),
    ({"rows": 4096, "cols": 4096}, "float32", 20),
    ({"rows": 1024, "cols": 8192}, "float16", 20),
    ({"rows": 96, "cols": 3072}, "float8_e5m2", 16),
    ({"rows": 512, "cols": 768}, "float32", 12),
    ({"rows": 2048, "cols": 1024}, "bfloat16", 16),
]


def _problem(shape, dtype):
    return KERNEL.problem(shape, dtype)


def _lower(problem, config, options=None):
    return lower_for_cuda(KERNEL, problem, Config(config), options)


@pytest.mark.parametrize(("shape", "dtype", "n"), ORACLE_PROBLEMS, ids=lambda v: str(v))
def test_sampled_configs_lower(shape, dtype, n):
    """A random sample of the valid configs of each problem cross-lowers for CUDA."""
    problem = _problem(shape, dtype)
    bound = KERNEL.valid_space(problem)
    configs = bound.sample(n, seed=7)
    assert configs, f"no valid config for {problem}"
    failures = [(dict(c), r.error) for c in configs if not (r := _lower(problem, c)).ok]
    assert not failures, failures


@pytest.mark.parametrize("scope", ["warpgroup", "warp"])
def test_sampled_configs_lower_with_tracing(tmp_path, scope):
    """With tracing on (space bound with the same profile_space), proposed configs lower."""
    options = BuildOptions(profile_space=64, profile_dir=str(tmp_path), trace_scope=scope)
    checked = 0
    for shape, dtype in [
        ({"rows": 8192, "cols": 32768}, "bfloat16"),
        ({"rows": 1024, "cols": 4096}, "float32"),
    ]:
        problem = _problem(shape, dtype)
        bound = KERNEL.bind(problem, profile_space=64, trace_scope=scope)
        for config in bound.sample(8, seed=3):
            result = _lower(problem, config, options)
            assert result.ok, (dict(config), result.error)
            checked += 1
    assert checked == 16


def test_default_configs_are_valid_and_lower():
    """The default config of each oracle problem is in the space and lowers."""
    for shape, dtype, _ in ORACLE_PROBLEMS[:4]:
        problem = _problem(shape, dtype)
        config = KERNEL.default_config(problem)
        assert KERNEL.bind(problem).is_valid(config), KERNEL.bind(problem).validate(config)
        assert _lower(problem, config).ok


def test_excluded_configs_fail_or_break_a_policy_rule():
    """Raw-grid configs the rules exclude fail to lower, unless every rule they break is policy."""
    rng = random.Random(5)
    checked = 0
    for shape, dtype, _ in ORACLE_PROBLEMS:
        problem = _problem(shape, dtype)
        bound = KERNEL.bind(problem)
        raw = list(itertools.product(*bound.domains))
        rejected = [
            t
            for t in rng.sample(raw, min(600, len(raw)))
            if not bound.is_valid(dict(zip(bound.names, t, strict=True)))
        ]
        for values in rejected[:12]:
            config = dict(zip(bound.names, values, strict=True))
            rules = [v.rule for v in bound.validate(config, nearest=False)]
            result = _lower(problem, config)
            checked += 1
            if result.ok:
                assert all("policy" in RULE_KINDS[r] for r in rules), (config, rules)
    assert checked >= 60


def test_every_rule_has_a_kind():
    """Each constraint (and the domain rules) is documented as lowering, build or policy."""
    names = {c.name for c in softmax.SPACE.constraints} | {"chunk_cols_domain"}
    assert names <= set(RULE_KINDS)
    assert all(
        set(kind.split("+")) <= {"lowering", "build", "policy"} for kind in RULE_KINDS.values()
    )


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
@pytest.mark.parametrize(
    ("dtype", "config"),
    [
        (
            "float32",
            dict(
                warps_per_row=1, block_rows=4, chunk_cols=128, warpgroups=1, max_concurrent_steps=1
            ),
        ),
        (
            "bfloat16",
            dict(
                warps_per_row=4, block_rows=1, chunk_cols=256, warpgroups=2, max_concurrent_steps=2
            ),
        ),
        (
            "float8_e5m2",
            dict(
                warps_per_row=4, block_rows=2, chunk_cols=512, warpgroups=3, max_concurrent_steps=1
            ),
        ),
    ],
)
def test_smem_rule_is_exact_at_the_boundary(tmp_path, dtype, config, traced):
    """At the widest rows the space allows, the config lowers; one step wider it fails."""
    config = {**config, "refill_lag": 0, "approx_math": True}
    profile = 64 if traced else 0
    options = BuildOptions(profile_space=profile, profile_dir=str(tmp_path) if traced else None)
    step = config["warps_per_row"] * config["chunk_cols"]

    def fits(cols):
        problem = _problem({"rows": 64, "cols": cols}, dtype)
        return KERNEL.bind(problem, profile_space=profile).is_valid(config)

    cols = step
    while fits(cols + step):
        cols += step
    widest = _lower(_problem({"rows": 64, "cols": cols}, dtype), config, options)
    assert widest.ok, widest.error
    assert not fits(cols + step)
    over = _lower(_problem({"rows": 64, "cols": cols + step}, dtype), config, options)
    assert not over.ok and "shared memory" in over.error


def test_smem_model_counts_what_mosaic_counts():
    """smem_bytes adds 1024-aligned buffers and exchange, and 8-byte barriers, as Mosaic does."""
    problem = _problem({"rows": 64, "cols": 29696}, "bfloat16")
    config = dict(
        warps_per_row=4, block_rows=1, chunk_cols=256, warpgroups=2, max_concurrent_steps=2
    )
    # 4 slots of 58 KiB, an exchange of 128 B aligned to 1 KiB, 4 barriers; no reduction scratch.
    assert smem_bytes(config, problem) == 4 * 59392 + 1024 + 32
    result = _lower(problem, {**config, "refill_lag": 0, "approx_math": True})
    assert f"smem_bytes={smem_bytes(config, problem)} " in result.error


# ---------------------------------------------------------------------------------------------
# Alignment.


@pytest.mark.parametrize(
    ("dtype", "unit"),
    [
        ("float32", 32),
        ("bfloat16", 64),
        ("float16", 64),
        ("float8_e5m2", 128),
        ("float8_e4m3fn", 128),
    ],
)
def test_128_byte_unit_in_elements(dtype, unit):
    """per_128_bytes gives 32 f32, 64 bf16/f16, 128 fp8 elements; the lane unit is 4x that."""
    env = Env(Problem("softmax", {"rows": 8, "cols": 1024}, dtype))
    assert per_128_bytes(env) == unit
    assert lane_unit(dtype) == 4 * unit


@settings(max_examples=60, deadline=None)
@given(
    rows_log2=st.integers(0, 14),
    rows_odd=st.sampled_from([1, 3, 5]),
    cols_units=st.integers(1, 160),
    dtype=st.sampled_from(softmax.DTYPES),
    profile=st.sampled_from([0, 64]),
    seed=st.integers(0, 2**16),
)
def test_every_proposed_copy_moves_whole_128_bytes(
    rows_log2, rows_odd, cols_units, dtype, profile, seed
):
    """Property: each copy of every proposed config moves a whole multiple of 128 bytes."""
    cols = cols_units * 128  # some multiples of the lane unit, some not
    problem = _problem({"rows": rows_odd << rows_log2, "cols": cols}, dtype)
    bound = KERNEL.bind(problem, profile_space=profile)
    for config in bound.sample(25, seed=seed):
        for shape in copy_shapes(config, problem):
            assert is_aligned_transfer(shape, dtype), (dict(config), shape)
        assert config["chunk_cols"] % lane_unit(dtype) == 0


# ---------------------------------------------------------------------------------------------
# Problems the kernel cannot take.


def test_unsupported_dtype_and_unaligned_columns_are_refused_with_the_rule():
    """e4m3 is not a softmax output dtype; rows of 1000 bf16 fit no lane unit."""
    with pytest.raises(NoValidConfigError, match="supported_dtype"):
        KERNEL.valid_space(_problem({"rows": 64, "cols": 1024}, "float8_e4m3fn"))
    with pytest.raises(NoValidConfigError, match="chunk"):
        KERNEL.valid_space(_problem({"rows": 2048, "cols": 1000}, "bfloat16"))


def test_tracing_needs_room_for_the_regions():
    """A profile_space too small for the 4 trace ranges leaves no valid config, naming the rule."""
    problem = _problem({"rows": 64, "cols": 512}, "float32")
    with pytest.raises(NoValidConfigError, match="trace_regions_fit"):
        KERNEL.valid_space(problem, profile_space=4)


def test_build_refuses_what_would_compute_wrong():
    """Configs whose tail rows or columns would be skipped are refused by build, by rule."""
    problem = _problem({"rows": 96, "cols": 512}, "float32")
    base = dict(
        warps_per_row=1,
        block_rows=4,
        chunk_cols=128,
        warpgroups=1,
        max_concurrent_steps=2,
        refill_lag=0,
        approx_math=True,
    )
    for change, rule in [
        ({"block_rows": 64}, "rows_tile"),
        ({"block_rows": 2}, "warp_rows"),
        ({"chunk_cols": 384}, "chunk_divides_segment"),
        ({"max_concurrent_steps": 1, "refill_lag": 1}, "refill_needs_free_slot"),
    ]:
        config = Config({**base, **change})
        assert rule in [v.rule for v in KERNEL.bind(problem).validate(config, nearest=False)]
        with pytest.raises(ValueError, match=rule):
            KERNEL.build(problem, config, BuildOptions())


# ---------------------------------------------------------------------------------------------
# Numerics, in GPU interpret mode.


@pytest.mark.parametrize(
    ("dtype", "cols", "config"),
    [
        (
            "float32",
            512,
            dict(
                warps_per_row=1,
                block_rows=16,
                chunk_cols=256,
                warpgroups=1,
                max_concurrent_steps=1,
                refill_lag=0,
            ),
        ),
        (
            "float32",
            512,
            dict(
                warps_per_row=4,
                block_rows=4,
                chunk_cols=128,
                warpgroups=1,
                max_concurrent_steps=3,
                refill_lag=1,
            ),
        ),
        (
            "bfloat16",
            512,
            dict(
                warps_per_row=1,
                block_rows=8,
                chunk_cols=256,
                warpgroups=2,
                max_concurrent_steps=2,
                refill_lag=0,
            ),
        ),
        (
            "bfloat16",
            1024,
            dict(
                warps_per_row=4,
                block_rows=8,
                chunk_cols=256,
                warpgroups=1,
                max_concurrent_steps=2,
                refill_lag=0,
            ),
        ),
    ],
    ids=["f32-warp-rows", "f32-split-rows", "bf16-2wg", "bf16-split-rows"],
)
def test_interpret_mode_matches_reference(dtype, cols, config):
    """Interpreted on the CPU, small problems match the float32 reference (fresh inputs)."""
    import jax
    import jax.numpy as jnp

    problem = _problem({"rows": 64, "cols": cols}, dtype)
    config = Config({**config, "approx_math": True})
    assert KERNEL.bind(problem).is_valid(config), KERNEL.bind(problem).validate(config)
    # Two SMs: every worker gets several tiles, so the refill path runs.
    fn = jax.jit(KERNEL.build(problem, config, BuildOptions(interpret=True, num_sms=2)))
    (x,) = KERNEL.make_inputs(problem, jax.random.key(random.randrange(2**31)))
    out = fn(x)
    ref = KERNEL.reference(problem)(x)
    assert out.shape == ref.shape and out.dtype == x.dtype
    err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
    assert err < KERNEL.tolerance[dtype], err


@pytest.mark.parametrize("warps_per_row", [1, 4])
def test_tracing_records_each_region_once(tmp_path, monkeypatch, warps_per_row):
    """A traced build records Init, load, compute and store once each, outside any loop."""
    from jax.experimental.mosaic.gpu import profiler

    sites: list[str] = []
    record = profiler.OnDeviceProfiler.record

    def counting_record(self, name):
        sites.append(name)
        return record(self, name)

    monkeypatch.setattr(profiler.OnDeviceProfiler, "record", counting_record)
    problem = _problem({"rows": 1024, "cols": 4096}, "float32")
    config = dict(
        warps_per_row=warps_per_row,
        block_rows=4,
        chunk_cols=512,
        warpgroups=1,
        max_concurrent_steps=2,
        refill_lag=1,
        approx_math=True,
    )
    options = BuildOptions(profile_space=64, profile_dir=str(tmp_path))
    assert KERNEL.bind(problem, profile_space=64).is_valid(config)
    assert _lower(problem, config, options).ok
    assert sorted(sites) == sorted(["Init", "load", "compute", "store"])
    assert softmax.TRACE_REGIONS == len(sites)

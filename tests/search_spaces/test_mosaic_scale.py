"""The bundled raw Mosaic GPU kernel ``mosaic_scale``: its space proposes only configs that
lower, with and without tracing, and seed 000 ("Block size is not a multiple of
{scope_size}") cannot happen.

The oracle is ``lower_for_cuda``; the sweep it summarises is in the module's docstring.
"""

from __future__ import annotations

import itertools
import random

import pytest

from autotune.evaluation.lowering import lower_for_cuda
from autotune.space.kernel import BuildOptions
from autotune.space.problem import Config
from autotune.space.search_space import WARP_SIZE, WARPGROUP_SIZE, is_aligned_transfer
from search_spaces import mosaic_scale
from search_spaces.mosaic_scale import KERNEL, RULE_KINDS, copy_shapes, smem_bytes

ORACLE_PROBLEMS = [
    ({"n": 1 << 24}, "bfloat16", 30),
    ({"n": 1 << 20}, "float32", 30),
    ({"n": 3 << 16}, "float16", 30),
    ({"n": 1 << 12}, "float32", 15),
]
SCOPE_THREADS = {"warp": WARP_SIZE, "warpgroup": WARPGROUP_SIZE}


def _problem(shape, dtype):
    return KERNEL.problem(shape, dtype)


def _lower(problem, config, options=None):
    return lower_for_cuda(KERNEL, problem, Config(config), options)


def _traced(tmp_path, scope):
    return BuildOptions(profile_space=64, profile_dir=str(tmp_path), trace_scope=scope)


@pytest.mark.parametrize(("shape", "dtype", "n"), ORACLE_PROBLEMS, ids=lambda v: str(v))
def test_sampled_configs_lower(shape, dtype, n):
    """A random sample of the valid configs of each problem cross-lowers for CUDA."""
    problem = _problem(shape, dtype)
    configs = KERNEL.valid_space(problem).sample(n, seed=11)
    assert len(configs) == n
    failures = [(dict(c), r.error) for c in configs if not (r := _lower(problem, c)).ok]
    assert not failures, failures


@pytest.mark.parametrize("scope", ["warp", "warpgroup"])
@pytest.mark.parametrize(("shape", "dtype", "n"), ORACLE_PROBLEMS[:3], ids=lambda v: str(v))
def test_sampled_configs_lower_with_tracing(tmp_path, shape, dtype, n, scope):
    """With tracing at either scope, and the space bound the same way, proposed configs lower."""
    problem = _problem(shape, dtype)
    bound = KERNEL.valid_space(problem, profile_space=64, trace_scope=scope)
    configs = bound.sample(12, seed=13)
    failures = [
        (dict(c), r.error)
        for c in configs
        if not (r := _lower(problem, c, _traced(tmp_path, scope))).ok
    ]
    assert not failures, failures


def test_default_configs_are_valid_and_lower():
    """The default config of each oracle problem is in the space and lowers."""
    for shape, dtype, _ in ORACLE_PROBLEMS:
        problem = _problem(shape, dtype)
        config = KERNEL.default_config(problem)
        assert KERNEL.bind(problem).is_valid(config)
        assert _lower(problem, config).ok


def test_excluded_configs_fail_or_break_a_policy_rule(tmp_path):
    """Raw-grid configs the rules exclude fail to lower, unless every rule they break is policy."""
    rng = random.Random(17)
    checked = 0
    for (shape, dtype, _), trace in itertools.product(
        ORACLE_PROBLEMS[:3], [None, "warp", "warpgroup"]
    ):
        problem = _problem(shape, dtype)
        env = {"profile_space": 64, "trace_scope": trace} if trace else {}
        options = _traced(tmp_path, trace) if trace else None
        bound = KERNEL.bind(problem, **env)
        raw = list(itertools.product(*bound.domains))
        picked = rng.sample(raw, 800)
        rejected = [t for t in picked if not bound.is_valid(dict(zip(bound.names, t, strict=True)))]
        for values in rejected[:10]:
            config = dict(zip(bound.names, values, strict=True))
            rules = [v.rule for v in bound.validate(config, nearest=False)]
            result = _lower(problem, config, options)
            checked += 1
            if result.ok:
                assert all("policy" in RULE_KINDS[r] for r in rules), (config, rules)
    assert checked >= 80


def test_every_rule_has_a_kind():
    """Each constraint and domain rule is documented as lowering, build, launch or policy."""
    names = {c.name for c in mosaic_scale.SPACE.constraints}
    names |= {f"{p.name}_domain" for p in mosaic_scale.SPACE.params}
    assert names <= set(RULE_KINDS)
    kinds = {"lowering", "build", "policy", "launch"}
    assert all(set(kind.split("+")) <= kinds for kind in RULE_KINDS.values())


def test_every_transfer_is_whole_128_bytes():
    """Every proposed tile moves a whole multiple of 128 bytes, for every dtype."""
    for dtype in mosaic_scale.DTYPES:
        problem = _problem({"n": 1 << 20}, dtype)
        for config in KERNEL.bind(problem):
            assert all(is_aligned_transfer(s, dtype) for s in copy_shapes(config, problem))


# ---------------------------------------------------------------------------------------------
# Seed 000: "Block size is not a multiple of {scope_size}".


@pytest.mark.parametrize("scope", ["warp", "warpgroup"])
def test_every_proposed_thread_count_is_a_multiple_of_the_trace_scope(scope):
    """Bound for tracing, the space proposes only block sizes in whole traced units."""
    unit = SCOPE_THREADS[scope]
    for dtype in mosaic_scale.DTYPES:
        bound = KERNEL.bind(_problem({"n": 1 << 22}, dtype), profile_space=64, trace_scope=scope)
        assert bound.env.trace_unit == unit
        counts = {config["block_threads"] for config in bound}
        assert counts and all(t % unit == 0 for t in counts), sorted(counts)
    untraced = {c["block_threads"] for c in KERNEL.bind(_problem({"n": 1 << 22}, "float32"))}
    assert any(t % WARPGROUP_SIZE for t in untraced)  # whole warps suffice without tracing


def test_a_non_multiple_is_rejected_naming_the_rule(tmp_path):
    """96 threads under warpgroup tracing break trace_scope_threads; Mosaic GPU agrees."""
    problem = _problem({"n": 1 << 20}, "float32")
    config = Config(
        block_threads=96, tile_elems=4096, slots=2, refill_lag=0, vector_bytes=16, blocks_per_sm=1
    )
    assert KERNEL.bind(problem).is_valid(config)
    assert KERNEL.bind(problem, profile_space=64, trace_scope="warp").is_valid(config)
    violations = KERNEL.bind(problem, profile_space=64, trace_scope="warpgroup").validate(config)
    assert [v.rule for v in violations] == ["trace_scope_threads"]
    assert "multiple of 128" in violations[0].message and "seed 000" in violations[0].message
    assert {alt["block_threads"] % 128 for alt in violations[0].nearest} == {0}
    # The oracle: untraced and warp-traced it lowers; warpgroup-traced it raises seed 000.
    assert _lower(problem, config).ok
    assert _lower(problem, config, _traced(tmp_path, "warp")).ok
    failed = _lower(problem, config, _traced(tmp_path, "warpgroup"))
    assert not failed.ok and "Block size is not a multiple of 128" in failed.error
    # Off whole warps, 48 threads are outside the tunable's domain, which says so.
    [off] = KERNEL.bind(problem, profile_space=64, trace_scope="warp").validate(
        config.replace(block_threads=48)
    )
    assert off.rule == "block_threads_domain" and "multiple of 32" in off.message


# ---------------------------------------------------------------------------------------------
# Shared memory, interpret mode.


@pytest.mark.parametrize("scope", [None, "warp", "warpgroup"])
def test_smem_rule_holds_at_the_boundary(tmp_path, scope):
    """The largest tile x slots the space allows lowers; the next slot count does not."""
    problem = _problem({"n": 1 << 22}, "float32")
    env = {"profile_space": 64, "trace_scope": scope} if scope else {}
    bound = KERNEL.bind(problem, **env)
    options = _traced(tmp_path, scope) if scope else None
    base = Config(
        block_threads=1024, tile_elems=8192, slots=1, refill_lag=0, vector_bytes=16, blocks_per_sm=1
    )
    slots = max(s for s in range(1, 9) if bound.is_valid(base.replace(slots=s)))
    assert slots < 8
    assert _lower(problem, base.replace(slots=slots), options).ok
    assert not bound.is_valid(base.replace(slots=slots + 1))
    over = _lower(problem, base.replace(slots=slots + 1), options)
    assert not over.ok and "shared memory" in over.error
    assert smem_bytes(base.replace(slots=slots), problem) == slots * (8192 * 4 + 8)


def test_interpret_mode_is_refused_clearly():
    """Raw Mosaic GPU kernels do not run in GPU interpret mode, and the kernel says so."""
    assert KERNEL.interpret_ok is False and "interpret" in KERNEL.interpret_note
    problem = _problem({"n": 1 << 20}, "float32")
    with pytest.raises(NotImplementedError, match="interpret"):
        KERNEL.build(problem, Config(KERNEL.default_config(problem)), BuildOptions(interpret=True))


def test_reference_and_inputs():
    """Inputs are fresh and non-zero; the reference is x * scale + bias in float32."""
    import jax
    import jax.numpy as jnp

    problem = _problem({"n": 4096}, "bfloat16")
    x1, p1 = KERNEL.make_inputs(problem, jax.random.key(1))
    x2, _ = KERNEL.make_inputs(problem, jax.random.key(2))
    assert x1.dtype == jnp.bfloat16 and p1.shape == (2,) and bool(jnp.all(p1 != 0))
    assert not bool(jnp.all(x1 == x2)) and bool(jnp.any(x1 != 0))
    ref = KERNEL.reference(problem)(x1, p1)
    assert ref.dtype == jnp.float32
    assert jnp.allclose(ref, x1.astype(jnp.float32) * p1[0] + p1[1])
    base = KERNEL.baseline(problem)(x1, p1)
    assert base.dtype == x1.dtype and jnp.allclose(
        base.astype(jnp.float32), ref, rtol=1e-2, atol=1e-2
    )


@pytest.mark.parametrize("scope", ["warp", "warpgroup"])
def test_tracing_records_each_region_once(tmp_path, monkeypatch, scope):
    """A traced build records Init, load, compute and store once each, outside any loop."""
    from jax.experimental.mosaic.gpu import profiler

    sites: list[str] = []
    record = profiler.OnDeviceProfiler.record

    def counting_record(self, name):
        sites.append(name)
        return record(self, name)

    monkeypatch.setattr(profiler.OnDeviceProfiler, "record", counting_record)
    problem = _problem({"n": 1 << 20}, "bfloat16")
    config = KERNEL.default_config(problem)
    assert _lower(problem, config, _traced(tmp_path, scope)).ok
    assert sorted(sites) == sorted(["Init", "load", "compute", "store"])
    assert mosaic_scale.TRACE_REGIONS == len(sites)

"""The bundled Hopper attention: its space proposes only configs that lower, and no fewer.

The oracle is ``lower_for_cuda`` (the whole Mosaic GPU lowering, on the CPU, with a CUDA
version stand-in). ``attention_mgpu`` does not run in GPU interpret mode on JAX 0.10.2, so
numerics are left to the GPU evaluator. The module docstring of
``search_spaces.hopper_attention`` records the raw-grid sweep the rules come from.
"""

from __future__ import annotations

import pytest

from autotune.devices import profile
from autotune.errors import NoValidConfigError
from autotune.evaluation.lowering import input_specs, lower_for_cuda
from autotune.space.kernel import BuildOptions
from autotune.space.problem import Config
from autotune.space.search_space import profiler_smem_bytes
from search_spaces.hopper_attention import (
    BLOCK_THREADS,
    KERNEL,
    KNOWN_GOOD,
    RULE_KINDS,
    SPACE,
    default_config,
    smem_bytes,
)

OPTIONS = BuildOptions(num_sms=profile("h200").num_sms)


def _shape(**kw):
    shape = {
        "batch": 4,
        "seq_q": 2048,
        "seq_kv": 2048,
        "heads_q": 16,
        "heads_kv": 16,
        "head_dim": 128,
    }
    shape.update(kw)
    return shape


# (shape, configs to check: None = all, chunks): PLATFORM.md's problems, GQA, causal,
# seq_q != seq_kv, head_dim 256.
ORACLE_PROBLEMS = [
    (_shape(), None, 2),
    (_shape(batch=1, seq_q=8192, seq_kv=8192, heads_q=8, heads_kv=8, head_dim=64), None, 6),
    (_shape(batch=2, seq_q=4096, seq_kv=4096, heads_kv=4), None, 2),
    (_shape(batch=2, seq_q=4096, seq_kv=4096, heads_q=8, heads_kv=8, causal=True), None, 2),
    (_shape(batch=1, seq_q=1024, seq_kv=4096, heads_q=8, heads_kv=2, head_dim=64), 20, 3),
    (_shape(batch=1, heads_q=8, heads_kv=8, head_dim=256), None, 1),
]
# The default run lowers each problem's first chunk (every problem); the other chunks are the
# sweep's long tail (`-m extended`, or `-m ""` for everything).
ORACLE_CASES = [
    pytest.param(shape, n, chunk, chunks, marks=[pytest.mark.extended] if chunk else [])
    for shape, n, chunks in ORACLE_PROBLEMS for chunk in range(chunks)
]


def _problem(shape, dtype="float16"):
    return KERNEL.problem(shape, dtype)


def _config(**kw):
    return Config(dict(KNOWN_GOOD, **kw))


def _lower(problem, config, options=OPTIONS):
    return lower_for_cuda(KERNEL, problem, Config(config), options)


def _lowered_text(problem, config):
    import jax

    fn = KERNEL.build(problem, Config(config), OPTIONS)
    specs = input_specs(KERNEL, problem)
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(("shape", "n", "chunk", "chunks"), ORACLE_CASES, ids=lambda v: str(v))
def test_valid_configs_lower(shape, n, chunk, chunks):
    """Every valid config (or a random sample) of each problem cross-lowers for CUDA."""
    problem = _problem(shape)
    bound = KERNEL.valid_space(problem)
    configs = list(bound) if n is None else bound.sample(n, seed=5)
    assert configs
    mine = configs[chunk::chunks]
    failures = [(dict(c), r.error[-300:]) for c in mine if not (r := _lower(problem, c)).ok]
    assert not failures, failures


def test_known_good_configs_are_valid():
    """The configs that ran fastest on the H200 (PLATFORM.md) are valid for their problems."""
    cases = [
        (_shape(), _config(block_q=64, block_kv=128, max_concurrent_steps=2)),
        (
            _shape(batch=1, seq_q=8192, seq_kv=8192, heads_q=8, heads_kv=8, head_dim=64),
            _config(block_q=64, block_kv=256, max_concurrent_steps=3),
        ),
        (_shape(batch=2, seq_q=4096, seq_kv=4096), KNOWN_GOOD),
    ]
    for shape, config in cases:
        assert KERNEL.valid_space(_problem(shape)).validate(config) == [], (shape, config)


def test_lowering_rules_exclude_only_configs_that_fail():
    """Raw configs broken only by 'lowering' rules really fail to lower: no rule is too strict."""
    checked: dict[str, int] = {}
    lowered = []
    for shape in (_shape(), _shape(batch=1, seq_q=3072, seq_kv=3072, head_dim=64)):
        problem = _problem(shape)
        bound = SPACE.bind(problem)
        for values in _raw_grid(bound):
            config = dict(zip(bound.names, values, strict=True))
            if not config["use_schedule_barrier"]:
                continue
            rules = {v.rule for v in bound.validate(config, nearest=False)}
            if not rules or any(RULE_KINDS[r] != "lowering" for r in rules):
                continue
            key = ",".join(sorted(rules))
            if checked.get(key, 0) >= 3:
                continue
            checked[key] = checked.get(key, 0) + 1
            if _lower(problem, config).ok:
                lowered.append((shape, config, key))
    assert not lowered, lowered
    seen = {r for key in checked for r in key.split(",")}
    assert {"q_divisible", "kv_divisible", "qk_wgmma_n", "smem_within_limit"} <= seen, seen


def _raw_grid(bound):
    import itertools

    return itertools.product(*bound.domains)


def test_policy_rules_exclude_duplicate_kernels():
    """'policy' exclusions compile to the very kernel of a config the space keeps."""
    problem = _problem(_shape(seq_q=1024, seq_kv=512, head_dim=64))
    bound = SPACE.bind(problem)
    kept = _config(block_kv=128, max_concurrent_steps=4)
    assert bound.validate(kept) == []
    clamped = _config(block_kv=128, max_concurrent_steps=6)  # 512 / 128 = 4 KV steps
    barrier_off = _config(block_kv=128, max_concurrent_steps=4, use_schedule_barrier=False)
    assert [v.rule for v in bound.validate(clamped)] == ["no_clamped_steps"]
    assert [v.rule for v in bound.validate(barrier_off)] == ["schedule_barrier_always_on"]
    text = _lowered_text(problem, kept)
    assert _lowered_text(problem, clamped) == text
    assert _lowered_text(problem, barrier_off) == text
    assert _lowered_text(problem, _config(block_kv=128, max_concurrent_steps=3)) != text


def test_single_kv_step_keeps_one_config():
    """With one KV block, the least upstream accepts (2 stages, clamped to 1) stays valid."""
    problem = _problem(_shape(seq_q=128, seq_kv=64, head_dim=64))
    bound = KERNEL.valid_space(problem)
    assert [dict(c) for c in bound] == [dict(_config(block_kv=64))]
    assert _lower(problem, _config(block_kv=64)).ok


def test_smem_formula_matches_the_lowering():
    """``smem_bytes`` equals Mosaic GPU's own count (seen by lowering with a zero limit)."""
    import re

    from jax.experimental.mosaic.gpu import core as mgpu_core

    problem = _problem(_shape(batch=1, seq_q=8192, seq_kv=1024, head_dim=64))
    configs = KERNEL.valid_space(problem).sample(4, seed=2)
    configs.append(_config(block_kv=256, max_concurrent_steps=8))  # clamped to 4
    for config in configs:
        with mgpu_core.artificial_shared_memory_limit(0):
            error = _lower(problem, config).error
        measured = int(re.search(r"smem_bytes=(\d+)", error).group(1))
        assert measured == smem_bytes(config, 64, seq_kv=1024), dict(config)


def test_tracing_pass_counts_the_profiler_buffer(tmp_path):
    """Profiling reaches the kernel and its buffer counts: the space drops what it pushes over."""
    import re

    from jax.experimental.mosaic.gpu import core as mgpu_core

    problem = _problem(_shape())
    profile_space = 1024
    share = profiler_smem_bytes(profile_space=profile_space, block_threads=BLOCK_THREADS)
    options = BuildOptions(
        num_sms=profile("h200").num_sms, profile_space=profile_space, profile_dir=str(tmp_path)
    )
    config = _config(block_kv=64, max_concurrent_steps=2)
    with mgpu_core.artificial_shared_memory_limit(0):
        error = _lower(problem, config, options).error
    measured = int(re.search(r"smem_bytes=(\d+)", error).group(1))
    # ``profiler_smem_bytes`` counts the up-to-8 bytes aligning the buffer as 8.
    assert smem_bytes(config, 128) + share - 8 <= measured <= smem_bytes(config, 128) + share
    assert _lower(problem, config, options).ok
    tight = _config(block_kv=128, max_concurrent_steps=3)
    assert SPACE.bind(problem).validate(tight) == []
    traced = KERNEL.valid_space(problem, profile_space=profile_space)
    assert [v.rule for v in traced.validate(tight)] == ["smem_within_limit"]
    assert "exceeds available shared memory" in _lower(problem, tight, options).error


def test_bfloat16_is_refused_naming_the_rule():
    """bfloat16 inputs are refused with the float16-staging rule, and really fail to lower."""
    problem = _problem(_shape(), "bfloat16")
    with pytest.raises(NoValidConfigError, match=r"\[float16_inputs\].*Mixed input dtypes"):
        KERNEL.valid_space(problem)
    assert SPACE.bind(problem).unsatisfiable_reason().startswith("[float16_inputs]")
    assert "Mixed input dtypes" in _lower(problem, KNOWN_GOOD).error


@pytest.mark.parametrize(
    ("shape", "rule"),
    [
        (_shape(head_dim=96), "head_dim_multiple_of_64"),
        (_shape(heads_q=6, heads_kv=4), "heads_grouped"),
        (_shape(seq_q=100), "q_divisible"),
        (_shape(seq_kv=96), "kv_divisible"),
        (_shape(seq_q=4096, causal=True), "causal_seq_q_within_seq_kv"),
        (_shape(head_dim=512), "smem_within_limit"),
    ],
    ids=str,
)
def test_problem_without_valid_config_names_the_binding_rule(shape, rule):
    """A problem no config can serve is refused naming the rule that binds."""
    with pytest.raises(NoValidConfigError, match=rf"\[{rule}\]"):
        KERNEL.valid_space(_problem(shape))


def test_rule_messages_name_values_and_rule():
    """A rule's message states the rule and the values it computed from."""
    bound = SPACE.bind(_problem(_shape(seq_q=1664)))
    (violation,) = bound.validate(_config(block_q=128), nearest=False)
    assert violation.rule == "q_divisible"
    assert "seq_q=1664" in violation.message and "256" in violation.message
    assert set(RULE_KINDS) == {c.name for c in SPACE.constraints}


@pytest.mark.parametrize(
    "shape",
    [_shape(), _shape(seq_q=128, seq_kv=64, head_dim=64), _shape(head_dim=256, causal=True)],
    ids=str,
)
def test_default_config_is_valid(shape):
    """The default config is a valid config of every problem that has one."""
    problem = _problem(shape)
    assert KERNEL.valid_space(problem).validate(default_config(problem)) == []


def test_kernel_declares_interpret_unsupported_and_cudnn_baseline():
    """Interpret mode is declared unsupported with a reason; the baseline is cuDNN, built lazily."""
    assert not KERNEL.interpret_ok and "run_state" in KERNEL.interpret_note
    assert KERNEL.baseline_name == "cudnn"
    problem = _problem(_shape(causal=True))
    assert callable(KERNEL.baseline(problem))  # building it touches no device
    assert KERNEL.flops(problem) == 4 * 4 * 16 * 2048 * 2048 * 128 // 2


@pytest.mark.extended
def test_importing_the_kernel_leaves_attention_mgpu_as_it_was():
    """Importing the kernel module (and the kernel API) changes nothing of JAX's
    ``attention_mgpu``: its patch is a scoped call at trace time, not an import side effect.

    In the extended run only: the default run's
    tests/test_architecture.py::test_no_module_patches_jax_at_import imports this module and
    autotune.kernels (every module) in a fresh interpreter and checks that no attribute of
    ``attention_mgpu`` (of any JAX module) changed; this one spends a second interpreter and
    its jax import (about 4 s) on the one module."""
    import subprocess
    import sys

    code = (
        "from jax.experimental.pallas.ops.gpu import attention_mgpu as am\n"
        "before = {k: id(v) for k, v in vars(am).items()}\n"
        "import search_spaces.hopper_attention, autotune.kernels\n"
        "search_spaces.hopper_attention.KERNEL.build\n"
        "after = {k: id(v) for k, v in vars(am).items()}\n"
        "assert before == after, sorted(k for k in before.keys() | after.keys()\n"
        "                               if before.get(k) != after.get(k))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_attention_patch_holds_only_while_the_kernel_is_traced():
    """Building and lowering the kernel leaves ``attention_mgpu`` as it was; inside the scope
    the CUDA stand-in and the ``plgpu`` proxy are in place, and overlapping scopes (threads)
    keep them until the last one closes."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    import autotune.kernels as ak

    own = (am.cuda_versions, am.plgpu)
    problem = _problem(_shape(batch=1, seq_q=256, seq_kv=256, heads_q=2, heads_kv=2, head_dim=64))
    assert _lower(problem, KNOWN_GOOD).ok
    assert (am.cuda_versions, am.plgpu) == own
    with ak.patched_attention_mgpu() as patched:
        assert patched is am and am.plgpu is not own[1] and am.cuda_versions is not None
        with ak.patched_attention_mgpu({"profile_space": 8}):
            assert am.plgpu is not own[1]
        assert am.plgpu is not own[1]  # the outer scope is still open
    assert (am.cuda_versions, am.plgpu) == own


def test_the_reference_takes_query_rows_in_chunks_only_where_its_logits_pass_the_budget():
    """Float32 logits of 4 GiB at B1 S8192 H16 (a job on an H100 failed to allocate them):
    1,024 rows at a time (512 MiB); B4 S2048 H16 (1 GiB) in two chunks; a problem whose logits
    fit is upstream's reference whole."""
    from search_spaces.hopper_attention import reference_chunk

    assert reference_chunk(KERNEL.problem(_shape(batch=1, seq_q=8192, seq_kv=8192),
                                          "float16")) == 1024
    assert reference_chunk(KERNEL.problem(_shape(), "float16")) == 1024
    assert reference_chunk(KERNEL.problem(_shape(batch=1, seq_q=1024, seq_kv=1024),
                                          "float16")) == 1024


@pytest.mark.parametrize("causal", [False, True])
def test_the_chunked_reference_is_upstreams_reference(causal, monkeypatch):
    """On the CPU, with grouped heads: the reference taken 16 query rows at a time (the budget
    shrunk to make it chunk) equals upstream's attention_reference, causal rows included."""
    import jax
    import numpy as np
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    import search_spaces.hopper_attention as ha

    problem = KERNEL.problem(_shape(batch=2, seq_q=64, seq_kv=64, heads_q=4, heads_kv=2,
                                    head_dim=32, causal=causal), "float16")
    monkeypatch.setattr(ha, "REFERENCE_LOGITS_BYTES", 2 * 64 * 4 * 4 * 16)
    assert ha.reference_chunk(problem) == 16
    q, k, v = ha.make_inputs(problem, jax.random.key(0))
    chunked = jax.jit(ha.reference(problem))(q, k, v)
    whole = am.attention_reference(q, k, v, causal=causal)
    assert chunked.dtype == whole.dtype
    # float32 sums in another order (jitted, chunked, a busy CPU's threads) move the last bits:
    # up to 4e-6 here; a mask that loses the chunk's offset moves outputs by up to 4.
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(whole), rtol=1e-5, atol=2e-5)
    if causal:  # the mask kept each chunk's rows in place: row 0 sees key 0 alone, each
        # pair of query heads its key-value head
        first = np.asarray(v, np.float32)[:, 0].repeat(2, axis=1)
        np.testing.assert_allclose(np.asarray(chunked)[:, 0], first, rtol=1e-6)

"""Run-time lookup: exact, nearest and default configs, the cache, and the decorator."""

from __future__ import annotations

import itertools
import logging

import pytest

import autotune
from autotune import lookup, queries
from autotune.kernel import get_kernel
from autotune.problem import Config
from autotune.storage import Store
from autotune.trial import DeviceInfo, TrialResult

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
KERNEL = get_kernel("hopper_matmul")
SMALL = {"m": 64, "n": 64, "k": 64}
MID = {"m": 128, "n": 128, "k": 128}
BIG = {"m": 256, "n": 256, "k": 256}


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=1.0, rel_error=1e-3, timing="fake")


def _problem(shape):
    return KERNEL.problem(shape, "bfloat16")


@pytest.fixture(scope="module")
def configs():
    """(valid at 64^3, 128^3 and 256^3; valid at 128^3 and 256^3 but not 64^3)."""
    small, mid, big = (KERNEL.bind(_problem(s)) for s in (SMALL, MID, BIG))
    everywhere = next(c for c in small if mid.is_valid(c) and big.is_valid(c))
    not_small = next(c for c in itertools.islice(mid, 5000) if big.is_valid(c) and not small.is_valid(c))
    return everywhere, not_small


@pytest.fixture(autouse=True)
def _fresh_cache():
    lookup.clear_cache()
    yield
    lookup.clear_cache()


def _fill(url, rows):
    with Store(url) as store:
        for shape, config, us, device in rows:
            store.record_trial(_problem(shape), Config(config), timed(us), device=device,
                               software=SOFTWARE)


def test_exact_hit(tmp_path, configs):
    """A problem with stored results gets its fastest stored config."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, other = configs
    _fill(url, [(BIG, ok, 50.0, GPU), (BIG, other, 40.0, GPU)])
    assert autotune.lookup_config("hopper_matmul", BIG, "bf16", db=url) == (other, "exact")


def test_gpu_rows_preferred_over_interpret(tmp_path, configs):
    """A faster interpret-mode row does not beat a GPU row of the same problem."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, other = configs
    _fill(url, [(BIG, ok, 50.0, GPU), (BIG, other, 1.0, INTERPRET)])
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == (ok, "exact")


def test_nearest_skips_invalid_configs(tmp_path, configs):
    """The nearest problem's config is skipped when invalid for the new shape; the next is used."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, not_small = configs
    _fill(url, [(MID, not_small, 10.0, GPU), (BIG, ok, 20.0, GPU)])
    config, source = lookup.lookup_config("hopper_matmul", SMALL, "bfloat16", db=url)
    assert (config, source) == (ok, "nearest")
    assert KERNEL.bind(_problem(SMALL)).is_valid(config)


def test_nearest_takes_the_closest_valid(tmp_path, configs):
    """Of two tuned neighbours with valid configs, the nearer one's config is used."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, not_small = configs
    _fill(url, [(BIG, not_small, 10.0, GPU), (MID, ok, 20.0, GPU)])
    assert lookup.lookup_config("hopper_matmul", {"m": 512, "n": 512, "k": 512}, "bfloat16",
                                db=url) == (not_small, "nearest")
    assert queries.shape_distance(MID, BIG) == 3.0


def test_default_fallback(tmp_path, configs):
    """Nothing usable stored: the given default, a callable default, else the kernel's."""
    url = f"sqlite:///{tmp_path}/missing.db"
    ok, _ = configs
    assert lookup.lookup_config("hopper_matmul", SMALL, "bf16", db=url, default=dict(ok)) == (ok, "default")
    assert lookup.lookup_config("hopper_matmul", SMALL, "bf16", db=url, default=lambda p: ok)[0] == ok
    expected = Config(KERNEL.default_config(_problem(SMALL)))
    assert lookup.lookup_config("hopper_matmul", SMALL, "bf16", db=url) == (expected, "default")


def test_cache_hit_does_not_query(tmp_path, configs, monkeypatch):
    """A repeated lookup is answered from memory; clear_cache forgets it."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])
    first = lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url)

    def boom(*args, **kwargs):
        raise AssertionError("queried")

    monkeypatch.setattr(queries, "best_result", boom)
    monkeypatch.setattr(queries, "nearest_results", boom)
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == first
    lookup.clear_cache()
    with pytest.raises(AssertionError, match="queried"):
        lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url)


class _Array:
    def __init__(self, shape, dtype="bfloat16"):
        self.shape, self.dtype = shape, dtype


def test_decorator_derives_problem_and_logs(tmp_path, configs, caplog):
    """tuned() reads shapes/dtype from the arrays, passes the config, and logs the source."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, other = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])

    @autotune.tuned("hopper_matmul", db=url)
    def matmul(a, b, *, config=None, scale=1):
        return config, scale

    with caplog.at_level(logging.INFO, logger="autotune.lookup"):
        assert matmul(_Array((256, 256)), _Array((256, 256)), scale=3) == (ok, 3)
    assert "stored best config" in caplog.text
    assert matmul(_Array((256, 256)), _Array((256, 256)), config=other) == (other, 1)


def test_shape_of_declared_for_matmul_and_softmax():
    """hopper_matmul and softmax map their inputs to shape keys."""
    assert KERNEL.shape_of(_Array((8, 16)), _Array((16, 32))) == {"m": 8, "k": 16, "n": 32}
    assert get_kernel("softmax").shape_of(_Array((4, 1024))) == {"rows": 4, "cols": 1024}


def test_shape_of_declared_for_attention_and_mosaic_scale():
    """hopper_attention reads q/k shapes (causal from a bool after the arrays); mosaic_scale x."""
    attention = get_kernel("hopper_attention")
    q, k = _Array((2, 256, 8, 64), "float16"), _Array((2, 512, 4, 64), "float16")
    shape = attention.shape_of(q, k, k)
    assert shape == {"batch": 2, "seq_q": 256, "seq_kv": 512, "heads_q": 8, "heads_kv": 4,
                     "head_dim": 64}
    assert attention.problem(shape, "float16")["causal"] is False
    assert attention.shape_of(q, k, k, True)["causal"] is True
    scale = get_kernel("mosaic_scale")
    assert scale.shape_of(_Array((4096,), "float32"), _Array((2,), "float32")) == {"n": 4096}
    assert scale.problem(scale.shape_of(_Array((4096,)), _Array((2,))), "bf16").dims == {"n": 4096}


def test_decorated_attention_finds_its_causal_problem(tmp_path):
    """tuned('hopper_attention') looks up the causal problem when causal=True is passed."""
    url = f"sqlite:///{tmp_path}/a.db"
    attention = get_kernel("hopper_attention")
    dims = {"batch": 1, "seq_q": 256, "seq_kv": 256, "heads_q": 4, "heads_kv": 4, "head_dim": 64}
    causal = attention.problem({**dims, "causal": True}, "float16")
    config = attention.default_config(causal)
    with Store(url) as store:
        store.record_trial(causal, config, timed(9.0), device=GPU, software=SOFTWARE)

    @autotune.tuned("hopper_attention", db=url)
    def attend(q, k, v, causal=False, *, config=None):
        return config

    q = _Array((1, 256, 4, 64), "float16")
    assert attend(q, q, q, True) == config


def _running():
    return {**queries.running_versions(), "autotune": "0.1.0"}


def test_lookup_prefers_the_running_versions_and_logs_them(tmp_path, configs, caplog):
    """A slower config measured with the running jax/jaxlib wins over a faster older one."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, other = configs
    old = {"jax": "0.0.1", "jaxlib": "0.0.1", "autotune": "0.1.0"}
    with Store(url) as store:
        store.record_trial(_problem(BIG), Config(other), timed(10.0), device=GPU, software=old)
        store.record_trial(_problem(BIG), Config(ok), timed(90.0), device=GPU, software=_running())
    with caplog.at_level(logging.INFO, logger="autotune.lookup"):
        assert lookup.lookup_config("hopper_matmul", BIG, "bf16", db=url) == (ok, "exact")
    assert f"measured with the running jax {queries.running_versions()['jax']}" in caplog.text


def test_lookup_falls_back_to_other_versions_and_says_stale(tmp_path, configs, caplog):
    """With only results of other versions, lookup still uses them and logs them as stale."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    old = {"jax": "0.0.1", "jaxlib": "0.0.2", "autotune": "0.1.0"}
    with Store(url) as store:
        store.record_trial(_problem(BIG), Config(ok), timed(10.0), device=GPU, software=old)
    with caplog.at_level(logging.INFO, logger="autotune"):
        assert lookup.lookup_config("hopper_matmul", BIG, "bf16", db=url) == (ok, "exact")
    assert "jax 0.0.1, jaxlib 0.0.2" in caplog.text and "stale" in caplog.text
    assert "autotune revalidate" in caplog.text

"""Cold timing's pure parts: splitting a flushed CUPTI record, and the L2 size."""

from __future__ import annotations

import types

import pytest

from autotune.evaluation import cold_timing as timing


def test_a_flushed_record_splits_into_the_programs_launches():
    """Each iteration's flush launches (by position and name) are dropped, the rest kept."""
    flush = ("loop_add_fusion",)
    record = []
    for i in range(3):
        record += [("loop_add_fusion", 0.05), ("gemm_mosaic_gpu", 0.17 + i), ("copy_fusion", 0.01)]
    out = timing.split_flushed(record, 3, flush)
    assert out == [[("gemm_mosaic_gpu", 0.17 + i), ("copy_fusion", 0.01)] for i in range(3)]


def test_a_record_that_does_not_split_is_an_error_not_a_time():
    """Launch counts that do not divide, an iteration not led by the flush, or one with only
    the flush raise, so nothing half-measured is stored."""
    with pytest.raises(RuntimeError, match="do not split into 2 iterations"):
        timing.split_flushed([("f", 1.0)] * 3, 2, ("f",))
    with pytest.raises(RuntimeError, match="does not begin with the L2 flush"):
        timing.split_flushed([("k", 1.0), ("f", 1.0)], 1, ("f",))
    with pytest.raises(RuntimeError, match="nothing but the L2 flush"):
        timing.split_flushed([("f", 1.0)] * 2, 2, ("f",))


def test_l2_size_comes_from_jax_then_the_driver_then_the_h200_constant(monkeypatch):
    """A device attribute wins; else the CUDA driver's answer; else 50 MiB, and it says so."""
    assert timing.l2_cache_bytes(types.SimpleNamespace(l2_cache_size=123)) == (123, "jax")
    monkeypatch.setattr(timing, "_l2_from_driver", lambda ordinal: 40 * 2**20)
    assert timing.l2_cache_bytes(types.SimpleNamespace()) == (40 * 2**20, "cuda")
    monkeypatch.setattr(timing, "_l2_from_driver", lambda ordinal: None)
    assert timing.l2_cache_bytes() == (timing.L2_FALLBACK_BYTES, "constant")
    assert timing.L2_FALLBACK_BYTES == 50 * 2**20

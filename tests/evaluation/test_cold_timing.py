"""Cold timing's pure parts: splitting a flushed CUPTI record, and the L2 size."""

from __future__ import annotations

import dataclasses
import types

import pytest

from autotune import devices
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


def test_l2_size_comes_from_jax_then_the_driver_then_the_device_profile(monkeypatch):
    """A device attribute wins; else the CUDA driver's answer; else the device profile's
    (--device-profile, default h100-sxm: 50 MiB), and it says which."""
    assert timing.l2_cache_bytes(types.SimpleNamespace(l2_cache_size=123)) == (123, "jax")
    driver = dataclasses.replace(devices.profile("h100-pcie"), l2_bytes=40 * 2**20, source="driver")
    monkeypatch.setattr(timing, "read_device", lambda ordinal=0: driver)
    assert timing.l2_cache_bytes(types.SimpleNamespace()) == (40 * 2**20, "cuda")
    monkeypatch.setattr(timing, "read_device", lambda ordinal=0: None)
    monkeypatch.setattr(devices, "read_device", lambda ordinal=0: None)
    monkeypatch.delenv(devices.PROFILE_ENV_VAR, raising=False)
    assert timing.l2_cache_bytes() == (50 * 2**20, "profile:h100-sxm")
    with devices.using_profile("h20"):
        assert timing.l2_cache_bytes() == (60 * 2**20, "profile:h20")


def _sessions(*records):
    """A fake CUPTI session that runs the recorded function and answers the next record."""
    answers = iter(records)

    def session(fn):
        fn()
        return [(name, 0.01) for name in next(answers)]

    return session


def test_flush_calibration_ignores_a_launch_made_meanwhile_by_another_thread():
    """Seen on the H200: a compile thread's XLA autotuning launched a comparison kernel in the
    flush's calibration session, and every cold timing of that worker then failed. The flush's
    launches are those two sessions in a row agree on."""
    flush = timing.L2Flush(nbytes=1024)
    flush.calibrate(_sessions(("xla_fp_comparison", "loop_add_fusion"), ("loop_add_fusion",),
                              ("loop_add_fusion",)))
    assert flush.names == ("loop_add_fusion",)


def test_flush_calibration_that_never_settles_is_an_error_naming_what_it_saw():
    flush = timing.L2Flush(nbytes=1024)
    records = [("a", "f"), ("f",), ("b", "f"), ("f", "c")]
    with pytest.raises(RuntimeError, match=r"4 CUPTI sessions .*\[\['a', 'f'\]"):
        flush.calibrate(_sessions(*records))
    assert flush.names is None


def test_cold_timing_retries_once_when_a_foreign_launch_breaks_the_split(monkeypatch):
    """One recorded window with a stray launch is measured again; the times are the retry's."""
    import autotune._jax_compat as compat

    flush = timing.L2Flush(nbytes=1024)
    flush.names = ("f",)
    records = iter([
        [("f", 0.01), ("stray", 0.5), ("k", 0.2), ("f", 0.01), ("k", 0.2)],
        [("f", 0.01), ("k", 0.2), ("f", 0.01), ("k", 0.3)],
    ])

    def session(fn):
        fn()
        return next(records)

    monkeypatch.setattr(compat, "cupti_session", session)
    samples, _ = timing.time_cold(lambda: 1, (), 2, flush, aggregate=True, select=None)
    assert samples == pytest.approx([200.0, 300.0])


def test_calls_split_at_each_flush_whatever_each_program_launches():
    """A loop of programs that launch different numbers of kernels (XLA's glue, a Mosaic GPU
    kernel alone) splits at the flush's launches; a record that does not begin with the flush,
    or a flush that launched nothing, is an error."""
    flush = ("f1", "f2")
    record = [("f1", 1), ("f2", 1), ("gemm", 5), ("f1", 1), ("f2", 1), ("cublas", 4), ("glue", 1),
              ("f1", 1), ("f2", 1)]
    assert timing.split_calls(record, flush) == [[("gemm", 5)], [("cublas", 4), ("glue", 1)], []]
    with pytest.raises(RuntimeError, match="begins with 'gemm'"):
        timing.split_calls(record[2:], flush)
    with pytest.raises(RuntimeError, match="launched nothing"):
        timing.split_calls(record, ())


class _LoggedFlush:
    """A flush whose launches land in ``log`` (what the fake session returns)."""

    def __init__(self, log):
        self.log, self.names = log, None

    def calibrate(self, session):
        self.names = ("flush",)

    def launch(self):
        self.log.append(("flush", 0.001))


def test_interleaved_cold_timing_gives_each_program_its_own_calls_in_order():
    """``time_cold_interleaved``: one session over iterations x (flush, program, flush,
    program, ...); each program gets its own calls (the baseline all its launches, a kernel
    what ``select`` picks), the warm-up excluded; a record of the wrong count is an error."""
    log = []
    calls = {"kernel": 0, "xla": 0}
    step = {"kernel": (0.100, 0.001), "xla": (0.2, 0.01)}  # ms: the first, then each call's more

    def program(name, launches):
        def run():
            first, more = step[name]
            log.extend([(name, first + more * calls[name])] + [("glue", 0.01)] * (launches - 1))
            calls[name] += 1
            return name
        return run

    def session(fn):
        log.clear()
        fn()
        return list(log)

    flush = _LoggedFlush(log)
    fns = [program("kernel", 1), program("xla", 2)]
    out = timing.time_cold_interleaved(
        fns, [(), ()], 3, flush, aggregate=[False, True], session=session,
        select=lambda its: [it[0][1] * 1000.0 for it in its])
    # The warm-up took each program's first time; the loop alternates kernel, xla, kernel, ...
    assert out[0] == pytest.approx([101.0, 102.0, 103.0])
    assert out[1] == pytest.approx([220.0, 230.0, 240.0])
    with pytest.raises(ValueError, match="2 program\\(s\\), 1 input set"):
        timing.time_cold_interleaved(fns, [()], 1, flush, aggregate=[True, True], select=None)
    short = lambda fn: (fn(), [("flush", 0.001), ("kernel", 0.1)])[1]  # noqa: E731
    with pytest.raises(RuntimeError, match="1 call\\(s\\) recorded, not 1 x 2"):
        timing.time_cold_interleaved(fns, [(), ()], 1, flush, aggregate=[True, True],
                                     select=None, session=short)


def test_interleaved_cold_timing_times_again_once_when_a_stray_launch_breaks_the_split():
    """A launch of another thread in the window (before the first flush) is timed again once;
    the times are the retry's. Twice in a row is an error."""
    records = iter([
        [("stray", 0.5), ("flush", 0.001), ("a", 0.1), ("flush", 0.001), ("b", 0.2)],
        [("flush", 0.001), ("a", 0.3), ("flush", 0.001), ("b", 0.4)],
        [("stray", 0.5)], [("stray", 0.5)],
    ])

    def session(fn):
        fn()
        return next(records)

    flush = _LoggedFlush([])
    fns = [lambda: 1, lambda: 2]
    out = timing.time_cold_interleaved(fns, [(), ()], 1, flush, aggregate=[True, True],
                                       select=None, session=session)
    assert out == [pytest.approx([300.0]), pytest.approx([400.0])]
    with pytest.raises(RuntimeError, match="begins with 'stray'"):
        timing.time_cold_interleaved(fns, [(), ()], 1, flush, aggregate=[True, True],
                                     select=None, session=session)


def test_a_cupti_session_stays_attached_unless_asked_to_detach(monkeypatch):
    """A worker times session after session: CUPTI is left attached (the extension's
    ``finalize`` False) unless ``detach`` asks, and a run that raises still ends its session."""
    import sys
    import types

    import jax._src.lib

    import autotune._jax_compat as compat

    calls = []
    ext = types.SimpleNamespace(
        _cupti_init=lambda: calls.append("init"),
        _cupti_get_timings=lambda finalize: calls.append(("end", finalize)) or [("k", 0.5)],
    )
    monkeypatch.delattr(jax._src.lib, "mosaic_gpu", raising=False)
    monkeypatch.setitem(sys.modules, "jax._src.lib.mosaic_gpu",
                        types.SimpleNamespace(_mosaic_gpu_ext=ext))
    assert compat.cupti_session(lambda: None) == [("k", 0.5)]
    assert compat.cupti_session(lambda: None, detach=True) == [("k", 0.5)]
    with pytest.raises(ZeroDivisionError):
        compat.cupti_session(lambda: 1 / 0)
    assert calls == ["init", ("end", False), "init", ("end", True), "init", ("end", False)]


def test_the_gpu_evaluator_times_a_cold_round_call_by_call_in_one_session(monkeypatch):
    """``GpuEvaluator.retime_round`` under the cold policy: the round's programs (a config and
    the baseline, here jitted CPU programs whose launches a stand-in session records) in one
    session, call by call after a flush each: the config's own launch counts, every launch of
    the baseline; the baseline's executable is the one kept from its timing. A session that
    fails fails every program of the round, as a value."""
    import jax

    import autotune._jax_compat as compat
    from autotune.evaluation import pipeline
    from autotune.evaluation.contract import Compiled
    from autotune.space.kernel import get_kernel
    from autotune.space.outcomes import Outcome
    from autotune.space.problem import Config, Problem

    log: list[tuple[str, float]] = []
    calls = {"config": 0, "base": 0}

    def logged(name: str, launches: list[tuple[str, float]]):
        jitted = jax.jit(lambda x, y: 2 * x + y)

        def run(*args):
            calls[name] += 1
            log.extend((n, ms * calls[name]) for n, ms in launches)
            return jitted(*args)
        return run

    def session(fn):
        log.clear()
        jax.block_until_ready(fn())
        return list(log)

    monkeypatch.setattr(compat, "cupti_session", session)
    kernel = get_kernel("tests.kernels_for_tests:SCALE_ADD", allow_import=True)
    problem = Problem(kernel.name, {"n": 384}, "float32")
    evaluator = pipeline.GpuEvaluator(iterations=1, cache="cold")
    evaluator._l2_flush = _LoggedFlush(log)
    evaluator._keep_baseline((kernel.name, problem),
                             logged("base", [("gemm_fusion", 0.2), ("copy_fusion", 0.01)]))
    config = Compiled(kernel, problem, Config(block=128),
                      logged("config", [("scale_add_mosaic_gpu_kernel", 0.1),
                                        ("copy_fusion", 0.05)]), compile_s=1.5)
    ok = evaluator.retime_round(kernel, problem, [config, None], iterations=3)
    assert [r.outcome for r in ok] == [Outcome.OK] * 2
    assert [(r.timing, r.cache) for r in ok] == [("cupti", "cold")] * 2
    # Call 1 of each was the warm-up; the kernel's launch alone, both of the baseline's.
    assert ok[0].samples_us == pytest.approx([200.0, 300.0, 400.0])
    assert ok[1].samples_us == pytest.approx([420.0, 630.0, 840.0])
    assert (ok[0].compile_s, ok[1].compile_s) == (1.5, None)
    monkeypatch.setattr(compat, "cupti_session", lambda fn: (fn(), [("stray", 0.5)])[1])
    failed = evaluator.retime_round(kernel, problem, [config, None], iterations=3)
    assert len(failed) == 2 and failed[0] == failed[1] and not failed[0].ok
    assert failed[0].outcome is not Outcome.CRASHED and "begins with 'stray'" in failed[0].error
    assert evaluator.healthy

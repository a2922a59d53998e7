"""Tests for autotune.evaluation (contract, timing, pipeline, fake): classification, kernel-time selection, checks, evaluators."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest

from autotune.evaluation import contract, timing
from autotune.evaluation import fake as fake_mod
from autotune.evaluation import pipeline as ev
from autotune.evaluation.contract import Stage
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import Outcome, TrialResult
from autotune.space.problem import Config, Problem

SCALE_ADD = "tests.kernels_for_tests:SCALE_ADD"
FAKE = "tests.kernels_for_tests:FAKE"


# -- classify_error ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "stage", "device_ok", "outcome"),
    [
        (ValueError("block must divide n"), Stage.BUILD, True, Outcome.INVALID),
        (
            NotImplementedError("Only copies transferring ... warpgroup size"),
            Stage.LOWER,
            True,
            Outcome.INVALID,
        ),
        (ValueError("exceeds available shared memory"), "lower", True, Outcome.INVALID),
        (AssertionError(), Stage.LOWER, True, Outcome.INVALID),
        (RuntimeError("ptxas fatal"), Stage.COMPILE, True, Outcome.COMPILE_ERROR),
        (RuntimeError("launch failed"), Stage.RUN, True, Outcome.COMPILE_ERROR),
        (RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS"), Stage.RUN, False, Outcome.CRASHED),
        (RuntimeError("launches not divisible"), Stage.TIME, True, Outcome.COMPILE_ERROR),
        (RuntimeError("anything"), Stage.CHECK, False, Outcome.CRASHED),
        # The message never decides: the same text at another stage is another outcome.
        (ValueError("exceeds available shared memory"), Stage.COMPILE, True, Outcome.COMPILE_ERROR),
    ],
)
def test_classify_error_by_stage_and_device_health(error, stage, device_ok, outcome):
    """Outcomes follow from the stage that failed and whether the device survived."""
    assert contract.classify_error(error, stage, device_ok=device_ok) is outcome


def test_classify_error_interpret_lowering_is_not_invalid():
    """The interpreter is not the validity oracle: its lowering failures are COMPILE_ERROR."""
    error = NotImplementedError("nan + cluster_barrier")
    assert contract.classify_error(error, Stage.LOWER, interpret=True) is Outcome.COMPILE_ERROR
    assert contract.classify_error(ValueError(), Stage.BUILD, interpret=True) is Outcome.INVALID


def test_classify_error_import_error_is_not_the_configs():
    """A missing module raises EvaluationError instead of marking configs invalid."""
    with pytest.raises(contract.EvaluationError, match="absl-py") as info:
        contract.classify_error(ModuleNotFoundError("No module named 'absl'"), Stage.LOWER)
    assert isinstance(info.value.__cause__, ImportError)


def test_classify_error_rejects_unknown_stage():
    """A stage name outside the enum is a programming error."""
    with pytest.raises(ValueError):
        contract.classify_error(ValueError(), "linking")


# -- select_kernel_time ------------------------------------------------------------------------

MOSAIC = "scale_add_mosaic_gpu_kernel"


def test_select_keeps_only_the_mosaic_kernel_and_converts_to_us():
    """XLA glue around the custom call does not count; ms become µs."""
    timings = [
        [("input_convert_fusion", 0.010), (MOSAIC, 0.100), ("wrapped_copy", 0.005)],
        [("input_convert_fusion", 0.011), (MOSAIC, 0.102), ("wrapped_copy", 0.004)],
    ]
    assert timing.select_kernel_time(timings) == pytest.approx([100.0, 102.0])


def test_select_sums_several_mosaic_launches_per_iteration():
    """A kernel made of two Mosaic GPU calls counts both."""
    timings = [
        [("a_mosaic_gpu_kernel", 0.1), ("loop_fusion", 1.0), ("b_mosaic_gpu_kernel", 0.2)]
    ] * 3
    assert timing.select_kernel_time(timings) == pytest.approx([300.0] * 3)


def test_select_accepts_a_single_unnested_iteration():
    """``measure(..., iterations=1)`` returns one iteration's list, not a list of lists."""
    assert timing.select_kernel_time([("zero_fill", 0.5), (MOSAIC, 0.25)]) == pytest.approx([250.0])


def test_select_without_mosaic_names_drops_xla_glue_and_named_glue():
    """Fallback: everything but glue patterns and the glue baseline's names counts."""
    timings = [
        [
            ("transpose_123", 1.0),
            ("my_cutlass_gemm", 0.5),
            ("loop_multiply_fusion", 2.0),
            ("memset32", 0.1),
            ("custom_helper", 0.25),
        ],
    ] * 2
    assert timing.select_kernel_time(timings) == pytest.approx([750.0, 750.0])
    assert timing.select_kernel_time(timings, glue_names={"custom_helper"}) == pytest.approx(
        [500.0] * 2
    )


def test_select_custom_pattern():
    """The kernel's own launch name pattern can be given."""
    timings = [[("triton_softmax", 0.3), ("input_fusion", 0.1)]]
    assert timing.select_kernel_time(timings, kernel_pattern="triton_") == pytest.approx([300.0])


@pytest.mark.parametrize(
    "timings",
    [
        [],
        [[("loop_fusion", 1.0), ("copy_1", 0.1)]],  # only glue
        [[(MOSAIC, 0.1)], [("other", 0.1)]],  # iterations disagree
    ],
)
def test_select_raises_when_the_kernel_cannot_be_found(timings):
    """No iteration, only glue, or inconsistent iterations: a ValueError, never a guess."""
    with pytest.raises(ValueError):
        timing.select_kernel_time(timings)


# -- relative_error ----------------------------------------------------------------------------


def test_relative_error_values():
    """||out-ref||/||ref|| over all leaves together; equal arrays give 0."""
    ref = np.array([3.0, 4.0], np.float32)
    assert ev.relative_error(ref, ref) == 0.0
    assert ev.relative_error(np.array([3.0, 4.5], np.float32), ref) == pytest.approx(0.1)
    pair = (np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32))
    assert ev.relative_error((pair[0], pair[1] * 2), pair) == pytest.approx(1 / math.sqrt(2))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_relative_error_non_finite_never_passes(bad):
    """A single NaN or inf element gives inf, above any tolerance."""
    out = np.array([1.0, bad, 2.0], np.float32)
    assert ev.relative_error(out, np.ones(3, np.float32)) == math.inf


def test_relative_error_mismatched_structure_or_shape():
    """A missing output or a wrong shape is not comparable: inf."""
    ones = np.ones(4, np.float32)
    assert ev.relative_error(ones[:3], ones) == math.inf
    assert ev.relative_error((ones,), (ones, ones)) == math.inf


def test_relative_error_zero_reference_uses_absolute_norm():
    """An all-zero reference falls back to ||out - ref||."""
    assert ev.relative_error(np.full(4, 0.5, np.float32), np.zeros(4, np.float32)) == pytest.approx(
        1.0
    )


def test_relative_error_low_precision_outputs():
    """bfloat16 outputs are compared in float32, not in bfloat16."""
    import jax.numpy as jnp

    ref = np.linspace(1, 2, 1000, dtype=np.float32)
    err = ev.relative_error(jnp.asarray(ref, jnp.bfloat16), ref)
    assert 0 < err < 4e-3


# -- the fake evaluator ------------------------------------------------------------------------


def _fake_problem():
    return Problem(FAKE, {"n": 1}, "float32")


@pytest.fixture(scope="module")
def fake_kernel():
    return get_kernel(FAKE, allow_import=True)


@pytest.mark.parametrize(
    ("config", "outcome"),
    [
        ({"mode": "ok"}, Outcome.OK),
        ({"mode": "sleep", "sleep_ms": 1}, Outcome.OK),
        ({"mode": "raise", "stage": "build"}, Outcome.INVALID),
        ({"mode": "raise", "stage": "lower"}, Outcome.INVALID),
        ({"mode": "raise", "stage": "compile"}, Outcome.COMPILE_ERROR),
        ({"mode": "raise", "stage": "run"}, Outcome.COMPILE_ERROR),
        ({"mode": "raise", "stage": "time"}, Outcome.COMPILE_ERROR),
        ({"mode": "wrong"}, Outcome.WRONG_RESULT),
        ({"mode": "poison"}, Outcome.CRASHED),
    ],
)
def test_fake_evaluator_outcomes(fake_kernel, config, outcome):
    """Each in-process fake behaviour ends with the outcome a real failure there would."""
    fake = fake_mod.FakeEvaluator(iterations=4)
    result = fake.evaluate(fake_kernel, _fake_problem(), Config(config, cost_us=50))
    assert result.outcome is outcome
    assert fake.healthy is (config["mode"] != "poison")
    if outcome is Outcome.OK:
        assert result.timing == "fake" and len(result.samples_us) == 4
        assert result.median_us == pytest.approx(50, rel=0.01)
    else:
        assert result.error and not result.samples_us


def test_fake_evaluator_reports_stages_in_order(fake_kernel):
    """The stage hook sees build, lower, compile, then run, check, time."""
    fake, seen = fake_mod.FakeEvaluator(), []
    compiled = fake.compile(fake_kernel, _fake_problem(), Config(mode="ok"), on_stage=seen.append)
    fake.run(compiled, on_stage=seen.append)
    assert seen == list(Stage)


def test_fake_behaviour_rejects_unknown_mode():
    """A typo in a fake mode fails loudly."""
    with pytest.raises(ValueError, match="explode"):
        fake_mod.FakeBehaviour.from_config({"mode": "explode"})


def test_fake_trace_and_baseline(fake_kernel, tmp_path):
    """The fake trace goes through the real parser; the baseline is fake-timed."""
    fake = fake_mod.FakeEvaluator()
    regions = fake.trace(fake_kernel, _fake_problem(), Config(cost_us=5), tmp_path, profile_space=8)
    assert regions == {"body": (5.0, 2), "kernel": (7.0, 2)}
    assert fake.baseline(fake_kernel, _fake_problem()).median_us == 100.0


def test_make_evaluator_modes():
    """Each engine mode maps to its evaluator and default iteration count."""
    assert isinstance(contract.make_evaluator("fake"), fake_mod.FakeEvaluator)
    assert contract.make_evaluator("interpret").iterations == 3
    assert contract.make_evaluator("gpu").iterations == 20
    assert contract.make_evaluator("gpu", iterations=5).iterations == 5
    with pytest.raises(ValueError, match="'tpu'"):
        contract.make_evaluator("tpu")


# -- interpret mode with a real Pallas Mosaic GPU kernel ----------------------------------------


@pytest.fixture(scope="module")
def interp():
    return ev.InterpretEvaluator(iterations=2)


def _scale_add(suffix=""):
    kernel = get_kernel(SCALE_ADD + suffix, allow_import=True)
    return kernel, Problem(kernel.name, {"n": 512}, "float32")


def test_interpret_ok_with_wallclock_samples(interp):
    """A real kernel runs interpreted once, matches the reference, and that checked run's
    wall-clock time is its one sample (interpret mode spends nothing on timing)."""
    kernel, problem = _scale_add()
    result = interp.evaluate(kernel, problem, Config(block=128))
    assert result.outcome is Outcome.OK, result.error
    assert interp.iterations == 2  # for re-timing only: a config runs once
    assert result.timing == "wallclock" and len(result.samples_us) == 1
    assert all(s > 0 for s in result.samples_us)
    assert result.rel_error is not None and result.rel_error < 1e-6
    assert result.compile_s is not None and result.compile_s > 0


def test_interpret_wrong_variant_is_wrong_result(interp):
    """The off-by-one variant is caught by the reference check, with its error value."""
    kernel, problem = _scale_add("_WRONG")
    result = interp.evaluate(kernel, problem, Config(block=256))
    assert result.outcome is Outcome.WRONG_RESULT
    assert result.rel_error is not None and result.rel_error > 0.1
    assert "tolerance" in result.error and not result.samples_us


def test_interpret_kernel_refusal_is_invalid(interp):
    """The kernel's own ValueError while building is INVALID, with the message kept."""
    kernel, problem = _scale_add()
    result = interp.evaluate(kernel, problem, Config(block=100))
    assert result.outcome is Outcome.INVALID
    assert "block=100 must divide n=512" in result.error


def test_interpret_not_supported_is_a_clear_error_value(interp):
    """A kernel marked interpret_ok=False gets a result saying so, not a crash."""
    kernel, problem = _scale_add("_NO_INTERPRET")
    result = interp.evaluate(kernel, problem, Config(block=128))
    assert result.outcome is Outcome.COMPILE_ERROR
    assert "does not run in GPU interpret mode" in result.error
    assert "primitive the interpreter lacks" in result.error


def test_interpret_baseline_and_device(interp):
    """The baseline is timed the same way; the device says it is the CPU interpreter."""
    kernel, problem = _scale_add()
    result = interp.baseline(kernel, problem)
    assert result.outcome is Outcome.OK and result.timing == "wallclock"
    assert result.rel_error == pytest.approx(0.0, abs=1e-6)
    info = interp.device_info()
    assert info.kind == "interpret" and info.name.startswith("cpu-interpret (")


def test_interpret_program_check_times_kernel_and_baseline_as_a_program_calls_them(interp):
    """``program=True``: the config (re-timed) and the baseline (its kept executable) each
    give PROGRAM_BLOCKS per-call times from the host's clock, timing PROGRAM_METHOD, no check."""
    from autotune.evaluation.timing import PROGRAM_BLOCKS
    from autotune.space.outcomes import PROGRAM_METHOD

    kernel, problem = _scale_add()
    compiled = interp.compile(kernel, problem, Config(block=256))
    kernel_check = interp.retime(compiled, iterations=2, program=True)
    base_check = interp.baseline(kernel, problem, iterations=3, program=True)
    for result in (kernel_check, base_check):
        assert result.outcome is Outcome.OK, result.error
        assert result.timing == PROGRAM_METHOD and result.rel_error is None
        assert len(result.samples_us) == PROGRAM_BLOCKS and min(result.samples_us) > 0


def test_time_program_times_batches_of_calls_on_every_input_set():
    """time_program: one warm-up call per input set, then per block ``calls`` calls cycling
    through the sets and one wait; per-call µs per block. Bad arguments name the rule."""
    import jax
    import jax.numpy as jnp

    from autotune.evaluation.timing import time_program

    seen = []

    def fn(x):
        seen.append(float(x[0]))
        return x * 2

    sets = [(jnp.full((4,), float(i)),) for i in range(3)]
    per_call = time_program(fn, sets, 5, blocks=2)
    assert len(per_call) == 2 and min(per_call) > 0
    assert seen == [0.0, 1.0, 2.0] + [0.0, 1.0, 2.0, 0.0, 1.0] * 2
    with pytest.raises(ValueError, match="calls >= 1"):
        time_program(jax.jit(fn), sets, 0)
    with pytest.raises(ValueError, match="0 set"):
        time_program(fn, [], 1)


def test_a_cold_program_check_rotates_input_sets_that_outgrow_the_l2():
    """program_input_sets: one set warm; cold, enough to hold twice the L2 and one more
    (at least 2, at most PROGRAM_MAX_SETS); other policies and sizes are refused by name."""
    from autotune.evaluation.timing import PROGRAM_MAX_SETS, program_input_sets

    mib = 1 << 20
    assert program_input_sets("warm", 10 * mib, 50 * mib) == 1
    assert program_input_sets("cold", 10 * mib, 50 * mib) == 11
    assert program_input_sets("cold", 96 * mib, 50 * mib) == 3
    assert program_input_sets("cold", 500 * mib, 50 * mib) == 2
    assert program_input_sets("cold", 1024, 50 * mib) == PROGRAM_MAX_SETS
    with pytest.raises(ValueError, match="'warm' or 'cold', not 'hot'"):
        program_input_sets("hot", 1, 1)
    with pytest.raises(ValueError, match="at least 1 byte"):
        program_input_sets("cold", 0, 1)


def test_interpret_inputs_are_fresh_for_each_run(interp, monkeypatch):
    """Every run draws new random inputs (never zeros, never reused)."""
    kernel, problem = _scale_add()
    seen = []
    original = interp._fresh_inputs

    def spy(k, p):
        inputs = original(k, p)
        seen.append(np.asarray(inputs[0]))
        return inputs

    monkeypatch.setattr(interp, "_fresh_inputs", spy)
    compiled = interp.compile(kernel, problem, Config(block=256))
    interp.run(compiled)
    interp.run(compiled)
    assert len(seen) == 2 and not np.array_equal(seen[0], seen[1])
    assert all(np.abs(x).sum() > 0 for x in seen)


def test_inputs_reference_and_check_are_compiled_ahead_without_autotuning(monkeypatch):
    """Seen on the H200: 8 workers each compiling every problem's reference with XLA's
    autotuning ran autotuning kernels on the GPU beside another worker's timed kernels, and
    held the first compile back ~30 s. The input maker and the reference are compiled ahead,
    outside the GPU's lock, with ``NO_AUTOTUNE`` (an option XLA accepts: a wrong name would
    leave the reference uncompiled), and so is the output check, which a run then uses."""
    import jax

    options = []
    original = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        options.append(compiler_options)
        return original(self, compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    monkeypatch.setattr(ev, "_ERROR_TERMS_AOT", {})
    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = get_kernel(SCALE_ADD, allow_import=True)
    problem = Problem(kernel.name, {"n": 384}, "float32")
    evaluator._prepare(kernel, problem)
    key = (kernel.name, problem)
    assert evaluator._makers[key] is not None and key in evaluator._references
    assert options[:2] == [ev.NO_AUTOTUNE, ev.NO_AUTOTUNE]
    assert ((384,), "float32", (384,), "float32") in ev._ERROR_TERMS_AOT

    calls = []
    aot = ev._ERROR_TERMS_AOT[((384,), "float32", (384,), "float32")]
    ev._ERROR_TERMS_AOT[((384,), "float32", (384,), "float32")] = lambda o, r: (
        calls.append(1) or aot(o, r))
    result = evaluator.run(evaluator.compile(kernel, problem, Config(block=128)))
    assert result.outcome is Outcome.OK, result.error
    assert calls, "the run's output check did not use the check compiled ahead"


def test_the_input_maker_compiles_while_the_reference_does():
    """A problem's host work ahead of its first trial: the input maker and the reference (with
    the check) compile side by side, so the first trial waits for the longer of them, not for
    both. Here each one's tracing waits for the other's to begin: one after the other, the
    maker would give up (and inputs would be made eagerly)."""
    import dataclasses
    import threading

    base = get_kernel(SCALE_ADD, allow_import=True)
    both = threading.Barrier(2, timeout=10)

    def make_inputs(problem, key):
        if threading.current_thread().name.startswith("prepare-inputs"):  # not the input specs
            both.wait()
        return base.make_inputs(problem, key)

    def reference(problem):
        fn = base.reference(problem)

        def traced(*inputs):
            both.wait()
            return fn(*inputs)

        return traced

    kernel = dataclasses.replace(base, make_inputs=make_inputs, reference=reference)
    evaluator = ev.InterpretEvaluator(iterations=1)
    problem = Problem(kernel.name, {"n": 384}, "float32")
    evaluator._prepare(kernel, problem)
    key = (kernel.name, problem)
    assert evaluator._makers[key] is not None and key in evaluator._references


def test_the_l2_flush_is_compiled_when_a_problem_is_prepared_and_touches_the_device_later():
    """The cold policy's L2 flush compiles with a problem's host work, off the GPU's lock (it
    took 0.13 s of the H200's first trial); its buffer is made at its first launch."""
    evaluator = ev.GpuEvaluator(iterations=1, cache="cold")
    kernel = get_kernel(SCALE_ADD, allow_import=True)
    evaluator._prepare(kernel, Problem(kernel.name, {"n": 384}, "float32"))
    flush = evaluator._l2_flush
    assert flush is not None and flush._buf is None
    assert evaluator._flush() is flush  # one per evaluator
    flush.launch()
    assert flush._buf.shape == (flush.nbytes // 4,) and int(flush._buf[0]) == 1
    warm = ev.GpuEvaluator(iterations=1, cache="warm")
    warm._prepare(kernel, Problem(kernel.name, {"n": 384}, "float32"))
    assert warm._l2_flush is None


def test_warm_device_learns_the_flushs_launches_once_and_only_for_cold_cupti(monkeypatch):
    """warm_host compiles the L2 flush (host work); warm_device pays the first timing's
    once-only device costs: its buffer on the device and its launches learnt from CUPTI
    sessions (here a stand-in)."""
    import autotune._jax_compat as compat

    sessions = []

    def session(run):
        sessions.append(run())
        return [("loop_add_fusion", 0.01)]

    monkeypatch.setattr(compat, "cupti_session", session)
    evaluator = ev.GpuEvaluator(iterations=1, cache="cold")
    evaluator.warm_host()  # the flush compiled, nothing on the device yet
    assert evaluator._l2_flush is not None and evaluator._l2_flush._buf is None and not sessions
    evaluator.warm_device()
    assert evaluator._l2_flush.names == ("loop_add_fusion",) and len(sessions) == 2
    evaluator.warm_device()
    assert len(sessions) == 2  # once
    warm = ev.GpuEvaluator(iterations=1, cache="warm")
    warm.warm_device()
    assert warm._l2_flush is None and len(sessions) == 2


def test_a_baselines_host_work_is_prepared_ahead_and_only_its_compile_is_left(monkeypatch):
    """Seen on the H200: the 7 baselines of a job held the GPU's lock 36 s, though each one's
    autotuned compile takes 0.05-0.7 s alone: its inputs, reference and check were made
    eagerly under the lock, and so was its lowering. ``prepare`` (a compile thread, outside
    the lock) does that host work; ``baseline`` then compiles what was lowered, with XLA's
    autotuning (default options), and times it. Its executable is kept for the newest
    ``KEPT_BASELINES`` problems, so the confirmation rounds of a job's problems in flight
    compile no baseline again."""
    import dataclasses

    import jax

    options, traced = [], []
    original = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        options.append(compiler_options)
        return original(self, compiler_options, **kw)

    def baseline(problem):
        def fn(x, y):
            traced.append(problem)
            return x * 2.0 + y
        return fn

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    monkeypatch.setattr(ev, "KEPT_BASELINES", 2)
    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = dataclasses.replace(get_kernel(SCALE_ADD, allow_import=True), baseline=baseline)
    problems = [Problem(kernel.name, {"n": n}, "float32") for n in (256, 512, 768)]
    evaluator.prepare(kernel, problems[0])
    key = (kernel.name, problems[0])
    assert evaluator._makers[key] is not None and key in evaluator._references
    assert traced == [problems[0]], "the baseline was not lowered ahead"
    ahead = len(options)
    assert set(map(str, options)) == {str(ev.NO_AUTOTUNE)}, options
    result = evaluator.baseline(kernel, problems[0])
    assert result.outcome is Outcome.OK and result.rel_error == 0.0, result.error
    assert traced == [problems[0]], "baseline() traced the baseline again"
    assert options[ahead:] == [None], "the baseline was not compiled once, with autotuning"
    for problem in problems[1:]:
        evaluator.prepare(kernel, problem)
        assert evaluator.baseline(kernel, problem).ok
    compiles = len(options)
    assert evaluator.baseline(kernel, problems[1]).ok   # kept: no compile
    assert evaluator.baseline(kernel, problems[2]).ok
    assert len(options) == compiles
    assert evaluator.baseline(kernel, problems[0]).ok   # the oldest, dropped: compiled anew
    assert options[compiles:] == [None]


def test_a_baselines_retime_computes_no_reference(monkeypatch):
    """A baseline's first timing computes its error against the kernel's reference; a
    confirmation round's re-time (``check=False``, as the workers and ``retime_round`` ask)
    computes no reference under the GPU's lock, and says so (``rel_error`` None)."""
    import dataclasses

    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = dataclasses.replace(get_kernel(SCALE_ADD, allow_import=True),
                                 baseline=lambda problem: (lambda x, y: x * 2.0 + y))
    problem = Problem(kernel.name, {"n": 256}, "float32")
    evaluator.prepare(kernel, problem)
    expected, calls = evaluator._expected, []

    def counted(*args):
        calls.append(args[1])
        return expected(*args)

    monkeypatch.setattr(evaluator, "_expected", counted)
    first = evaluator.baseline(kernel, problem)
    assert first.ok and first.rel_error == 0.0 and calls == [problem]
    again = evaluator.baseline(kernel, problem, iterations=3, check=False)
    assert again.ok and again.rel_error is None and len(again.samples_us) == 3
    [in_round] = evaluator.retime_round(kernel, problem, [None], iterations=2)
    assert in_round.ok and in_round.rel_error is None
    assert calls == [problem], "a re-time computed the reference again"


def test_a_baseline_off_the_reference_is_a_wrong_result_naming_the_tolerance():
    """A baseline whose output is off the kernel's reference beyond the kernel's tolerance (a
    user's ``baseline=`` that computes something else) is a WRONG_RESULT, as a config's would
    be, with its error and the tolerance; it is not timed. A round's re-time does not check."""
    import dataclasses

    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = dataclasses.replace(get_kernel(SCALE_ADD, allow_import=True),
                                 baseline=lambda problem: (lambda x, y: x * 3.0 + y))
    problem = Problem(kernel.name, {"n": 256}, "float32")
    evaluator.prepare(kernel, problem)
    result = evaluator.baseline(kernel, problem)
    assert result.outcome is Outcome.WRONG_RESULT and not result.samples_us
    assert result.rel_error is not None and result.rel_error > 2e-3
    assert re.fullmatch(r"\[check\] relative error \S+ of the baseline exceeds the tolerance "
                        r"0\.002 \(\|\|out-ref\|\|/\|\|ref\|\|\)\.", result.error), result.error
    assert evaluator.baseline(kernel, problem, iterations=2, check=False).ok


def test_a_baseline_that_fails_ahead_is_reported_by_baseline(monkeypatch):
    """``prepare`` never raises for the baseline's own failure: ``baseline`` reports it."""
    import dataclasses

    def baseline(problem):
        raise ValueError("no XLA program for this shape")

    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = dataclasses.replace(get_kernel(SCALE_ADD, allow_import=True), baseline=baseline)
    problem = Problem(kernel.name, {"n": 256}, "float32")
    evaluator.prepare(kernel, problem)
    with pytest.raises(ev.EvaluationError, match="no XLA program for this shape"):
        evaluator.baseline(kernel, problem)


def test_a_problems_first_config_compiles_while_its_reference_is_prepared(monkeypatch):
    """The first trial waits for the longer of the two host jobs, not for both: the config's
    compile starts before the preparation ends, and compile() returns once both are done."""
    import time as _time

    evaluator = ev.InterpretEvaluator(iterations=1)
    kernel = get_kernel(SCALE_ADD, allow_import=True)
    problem = Problem(kernel.name, {"n": 640}, "float32")
    marks = {}
    prepare, compile_config = evaluator._prepare, ev.compile_config

    def slow_prepare(k, p):
        _time.sleep(1.0)
        prepare(k, p)
        marks["prepared"] = _time.perf_counter()

    def spy_compile(*args, **kwargs):
        marks["compile_started"] = _time.perf_counter()
        return compile_config(*args, **kwargs)

    monkeypatch.setattr(evaluator, "_prepare", slow_prepare)
    monkeypatch.setattr(ev, "compile_config", spy_compile)
    compiled = evaluator.compile(kernel, problem, Config(block=128))
    assert isinstance(compiled, contract.Compiled)
    assert marks["compile_started"] < marks["prepared"]
    assert (kernel.name, problem) in evaluator._makers  # ready when compile() returns
    assert evaluator.run(compiled).outcome is Outcome.OK


def test_a_low_precision_output_is_checked_by_the_check_compiled_ahead(monkeypatch):
    """hopper_matmul's bfloat16 output against its float32 reference: both pairs are compiled
    ahead, and the check answers what the jitted one does."""
    import jax
    import jax.numpy as jnp

    monkeypatch.setattr(ev, "_ERROR_TERMS_AOT", {})
    ev.prepare_error_terms(jax.ShapeDtypeStruct((64,), jnp.float32), "bfloat16")
    assert set(ev._ERROR_TERMS_AOT) == {((64,), "float32", (64,), "float32"),
                                        ((64,), "bfloat16", (64,), "float32")}
    ref = jax.random.normal(jax.random.key(0), (64,), jnp.float32)
    out = (ref * 1.01).astype(jnp.bfloat16)
    ahead = ev.relative_error(out, ref)
    monkeypatch.setattr(ev, "_ERROR_TERMS_AOT", {})
    assert ahead == pytest.approx(ev.relative_error(out, ref)) and 0.005 < ahead < 0.02


def test_run_compiled_cupti_path_selects_the_kernel(interp, monkeypatch):
    """With CUPTI timing, measure()'s per-launch list goes through select_kernel_time."""
    from jax.experimental.mosaic.gpu import profiler

    calls = {}

    def fake_measure(f, *, aggregate, iterations):
        calls.update(aggregate=aggregate, iterations=iterations)

        def wrapper(*args):
            out = f(*args)
            launch = [("input_fusion", 0.5), (MOSAIC, 0.020)]
            return out, launch if iterations == 1 else [launch] * iterations

        return wrapper

    monkeypatch.setattr(profiler, "measure", fake_measure)
    monkeypatch.setattr(ev, "device_still_works", lambda: True)
    monkeypatch.setattr(timing, "device_still_works", lambda: True)
    kernel, problem = _scale_add()
    compiled = interp.compile(kernel, problem, Config(block=128))
    inputs = interp._fresh_inputs(kernel, problem)
    for iterations in (1, 3):
        result = ev.run_compiled(
            compiled,
            inputs,
            expected=inputs[0] * 2 + inputs[1],
            tolerance=1e-5,
            iterations=iterations,
            timing="cupti",
        )
        assert result.outcome is Outcome.OK, result.error
        assert result.samples_us == pytest.approx((20.0,) * iterations)
        assert calls == {"aggregate": False, "iterations": iterations}


def test_run_compiled_wrong_expected_and_nan(interp):
    """A reference that disagrees, or is NaN, fails the check with the error recorded."""
    kernel, problem = _scale_add()
    compiled = interp.compile(kernel, problem, Config(block=128))
    inputs = interp._fresh_inputs(kernel, problem)
    expected = inputs[0] * 2 + inputs[1]
    kwargs = dict(tolerance=1e-3, iterations=1, timing="wallclock")
    off = ev.run_compiled(compiled, inputs, expected=expected * 1.1, **kwargs)
    assert off.outcome is Outcome.WRONG_RESULT and off.rel_error == pytest.approx(1 / 11, rel=1e-3)
    shaped = ev.run_compiled(compiled, inputs, expected=expected[:10], **kwargs)
    assert shaped.outcome is Outcome.WRONG_RESULT and shaped.rel_error == math.inf


def test_trace_in_interpret_mode_writes_nothing(interp, tmp_path):
    """The interpreter has no in-kernel profiler: tracing returns no regions, not an error."""
    kernel, problem = _scale_add()
    assert interp.trace(kernel, problem, Config(block=128), tmp_path, profile_space=16) == {}


def test_a_trace_compiled_ahead_is_run_without_compiling_again(interp, tmp_path, monkeypatch):
    """prepare_trace compiles the traced program outside the GPU's lock (a Mosaic GPU compile:
    about a second under it per trace on the H200); trace() runs that program, once."""
    kernel, problem = _scale_add()
    compiles = []
    real = ev.compile_config
    monkeypatch.setattr(ev, "compile_config", lambda *a, **k: compiles.append(a[3]) or real(*a, **k))
    interp.prepare_trace(kernel, problem, Config(block=128), tmp_path, profile_space=16)
    assert compiles and compiles[-1].profile_space == 16
    assert interp.trace(kernel, problem, Config(block=128), tmp_path, profile_space=16) == {}
    assert len(compiles) == 1  # trace() took the program made ahead
    interp.trace(kernel, problem, Config(block=128), tmp_path, profile_space=16)
    assert len(compiles) == 2  # taken once: a second trace compiles its own


# -- the module --------------------------------------------------------------------------------


def test_gpu_device_info_without_a_gpu_says_so():
    """On a CPU-only machine asking for the GPU is an EvaluationError naming interpret mode."""
    import jax

    if jax.devices()[0].platform == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(contract.EvaluationError, match="interpret"):
        ev.gpu_device_info()


def test_importing_evaluation_does_not_import_jax():
    """jax is imported lazily, inside the functions that need it."""
    code = "import autotune.evaluation.pipeline, autotune.evaluation.contract, autotune.evaluation.fake, autotune.evaluation.timing, sys; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_public_api():
    """The evaluation modules' ``__all__`` lists together exactly the public names."""
    modules = (contract, timing, ev, fake_mod)
    assert sorted(n for m in modules for n in m.__all__) == sorted(
        [
            "Stage",
            "EvaluationError",
            "classify_error",
            "Compiled",
            "StageHook",
            "select_kernel_time",
            "time_program",
            "program_input_sets",
            "PROGRAM_BLOCKS",
            "relative_error",
            "compile_config",
            "lower_config_for_cuda",
            "run_compiled",
            "measure_baseline",
            "trace_config",
            "gpu_device_info",
            "interpret_device_info",
            "Evaluator",
            "GpuEvaluator",
            "InterpretEvaluator",
            "FakeBehaviour",
            "FakeEvaluator",
            "make_evaluator",
        ]
    )
    assert all(hasattr(m, name) for m in modules for name in m.__all__)
    assert isinstance(TrialResult.failed(Outcome.INVALID, "x"), TrialResult)


# -- cache policies and the confirmation round's re-timing (issue 19) ---------------------------


def test_fake_search_reads_search_us_and_the_retime_reads_the_true_cost(fake_kernel):
    """A config's lucky search moment (search_us) is what its trial measures; the re-time of
    the confirmation round measures its true cost, in the evaluator's cache policy."""
    fake = fake_mod.FakeEvaluator(iterations=5, cache="cold")
    config = Config(mode="ok", cost_us="100", cold_us="104", search_us="95")
    compiled = fake.compile(fake_kernel, _fake_problem(), config)
    trial = fake.run(compiled)
    again = fake.retime(compiled, iterations=7)
    assert trial.median_us == pytest.approx(95, rel=0.01) and trial.cache == "cold"
    assert again.median_us == pytest.approx(104, rel=0.01) and len(again.samples_us) == 7
    assert again.cache == "cold" and again.rel_error is None


def test_fake_program_check_adds_what_a_call_costs_beyond_its_kernel(fake_kernel):
    """The fake evaluator's program check: PROGRAM_BLOCKS samples of the true time plus the
    config's ``call_us`` (the baseline: its shape's ``baseline_call_us``)."""
    from autotune.evaluation.timing import PROGRAM_BLOCKS
    from autotune.space.outcomes import PROGRAM_METHOD

    fake = fake_mod.FakeEvaluator(iterations=5, cache="cold")
    compiled = fake.compile(fake_kernel, _fake_problem(), Config(mode="ok", cost_us="100",
                                                                  cold_us="104", call_us=6))
    check = fake.retime(compiled, iterations=40, program=True)
    assert check.median_us == pytest.approx(110, rel=0.002) and len(check.samples_us) == PROGRAM_BLOCKS
    assert check.timing == PROGRAM_METHOD
    problem = Problem(fake_kernel.name, {"n": 1, "baseline_us": 90, "baseline_call_us": 12},
                      "float32")
    assert fake.baseline(fake_kernel, problem, program=True).median_us == pytest.approx(102, rel=0.002)
    assert fake.baseline(fake_kernel, problem).median_us == pytest.approx(90)


def test_fake_noise_spreads_samples_deterministically(fake_kernel):
    """``noise`` (per mille) spreads the samples; the same evaluator history gives the same
    samples, and the spread is about the asked noise."""
    def samples():
        fake = fake_mod.FakeEvaluator(iterations=400)
        return fake.evaluate(fake_kernel, _fake_problem(), Config(mode="ok", noise=10)).samples_us

    first = samples()
    assert first == samples()
    result = TrialResult.timed(first, compile_s=0, rel_error=0, timing="fake")
    assert 0.02 < result.spread < 0.04  # (p90 - p10) of a 1% gaussian is 2.56%


def test_evaluators_time_with_the_policy_of_their_mode():
    """Cold by default on a GPU, warm in interpret and fake mode; cold refused in interpret."""
    assert contract.make_evaluator("gpu").cache == "cold"
    assert contract.make_evaluator("gpu", cache="warm").cache == "warm"
    assert contract.make_evaluator("interpret").cache == "warm"
    assert contract.make_evaluator("fake").cache == "warm"
    assert contract.make_evaluator("fake", cache="cold").cache == "cold"
    with pytest.raises(ValueError, match="needs a GPU"):
        contract.make_evaluator("interpret", cache="cold")


def test_cold_timing_goes_through_the_l2_flush(monkeypatch):
    """With CUPTI and the cold policy, timing runs the flushed loop (autotune.evaluation.cold_timing), never
    profiler.measure's back-to-back loop; warm does the opposite."""
    from autotune.evaluation import cold_timing

    seen = []

    def fake_cold(fn, inputs, iterations, flush, *, aggregate, select):
        seen.append(("cold", flush, aggregate))
        return [1.0] * iterations, None

    def fake_cupti(fn, inputs, iterations, *, aggregate):
        seen.append(("warm", None, aggregate))
        return [2.0] * iterations, None

    monkeypatch.setattr(cold_timing, "time_cold", fake_cold)
    monkeypatch.setattr(timing, "_time_cupti", fake_cupti)
    flush = object()
    assert timing.time_runs(None, (), 3, "cupti", cache="cold", flush=flush, aggregate=True)[0] == [1.0] * 3
    assert timing.time_runs(None, (), 2, "cupti", cache="warm")[0] == [2.0] * 2
    assert seen == [("cold", flush, True), ("warm", None, False)]

"""Bring your own kernel: the examples in ``examples/user_kernels/`` and a checked space.

* The examples (a Pallas kernel with ``emit_pipeline``, a raw Mosaic GPU kernel) pass
  ``autotune check`` (CUDA lowering on this CPU) and tune end to end from their job files with
  ``--allow-import``: the Pallas one in GPU interpret mode, the raw one (which the interpreter
  cannot run) through the fake evaluator, each measured config cross-lowered for CUDA.
* A deliberately incomplete user space (``tests/user_kernel_missing_rule.py``, no 128-byte
  rule): ``autotune check`` lists exactly the failing configs with JAX's error and names the
  rule that excludes them; tuning records each as ``invalid`` once, with that rule, and never
  measures it again.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import autotune
from autotune import Config, Constraint, Space, is_aligned_transfer
from autotune.cli import main
from autotune.errors import JobError
from autotune.evaluation.checking import check_space, missing_rules
from autotune.evaluation.lowering import lower_for_cuda
from autotune.space.kernel import get_kernel
from autotune.storage.store import Store
from tests.cli_in_process import cli_here

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "user_kernels"
BIAS_GELU = "examples.user_kernels.bias_gelu:KERNEL"
RAW_ADD = "examples.user_kernels.raw_mosaic_add:KERNEL"
MISSING = "tests.user_kernel_missing_rule:KERNEL"
MISSING_SHAPE = {"rows": 8, "cols": 32}
# What `autotune check` must name: the rule the incomplete space lacks.
TRANSFER_RULE = "is_aligned_transfer((c['block_rows'], c['block_cols']), env.dtype)"


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m autotune ARGS`` in a fresh process, from the repo root (as a user would)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False,
    )


def _unaligned(config: dict) -> bool:
    """Whether a float32 tile of the incomplete kernel moves a non-multiple of 128 bytes."""
    return not is_aligned_transfer((config["block_rows"], config["block_cols"]), "float32")


# -- the examples ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_examples_use_only_the_public_api(path):
    """An example imports autotune's top level only (``import autotune``, ``from autotune
    import ...``), never a submodule."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            assert node.module == "autotune", f"{path.name} imports {node.module}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("autotune."), f"{path.name} imports {alias.name}"


@pytest.mark.parametrize(
    "kernel, shape, dtype",
    [
        (BIAS_GELU, "rows=256,cols=1024", "float32"),
        (BIAS_GELU, "rows=512,cols=768", "bfloat16"),
        (RAW_ADD, "n=16777216", "bfloat16"),
        (RAW_ADD, "n=4096", "float32"),
    ],
)
def test_examples_pass_check(kernel, shape, dtype, capsys, monkeypatch):
    """`autotune check` cross-lowers a sample of each example's space for CUDA: none fails."""
    monkeypatch.chdir(REPO)
    code = main(["check", kernel, "--allow-import", "--shape", shape, "--dtype", dtype,
                 "--sample", "12"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "12 ok, 0 failed" in out


def test_example_smem_rules_hold_at_the_boundary():
    """Each example's shared-memory model is exact: the largest config it allows lowers, the
    next one up is excluded and does not lower."""
    gelu = get_kernel(BIAS_GELU, allow_import=True)
    problem = gelu.problem({"rows": 4096, "cols": 1024}, "float32")
    bound = gelu.bind(problem)
    base = {"block_cols": 128, "block_rows": 128, "row_splits": 1, "store_slots": 1}
    steps = max(s for s in range(1, 5) if bound.is_valid({**base, "max_concurrent_steps": s}))
    assert steps < 4
    assert lower_for_cuda(gelu, problem, Config(base, max_concurrent_steps=steps)).ok
    over = lower_for_cuda(gelu, problem, Config(base, max_concurrent_steps=steps + 1))
    assert not over.ok and "shared memory" in over.error
    assert [v.rule for v in bound.validate({**base, "max_concurrent_steps": steps + 1})] == [
        "smem_within_budget"
    ]

    add = get_kernel(RAW_ADD, allow_import=True)
    problem = add.problem({"n": 1 << 20}, "float32")
    fits = Config(block_threads=256, tile_elems=16384, vector_bytes=16)
    too_big = fits.replace(tile_elems=32768)
    assert add.bind(problem).is_valid(fits) and lower_for_cuda(add, problem, fits).ok
    assert not add.bind(problem).is_valid(too_big)
    assert "shared memory" in lower_for_cuda(add, problem, too_big).error


@pytest.mark.slow
def test_pallas_example_tunes_end_to_end_in_interpret_mode(tmp_path, monkeypatch, capsys):
    """The Pallas example's job tunes with --allow-import (in its own process, as a user runs
    it); `best` (the same command line, in this process) and the run-time lookup of the kernel
    object answer from the same rows, and the example's @autotune.tuned function runs with that
    config."""
    db = f"sqlite:///{tmp_path}/gelu.db"
    first = run_cli("tune", "examples/user_kernels/bias_gelu.toml", "--allow-import", "--db", db,
                    "--device", "interpret", "--trials", "3", "--results-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    with Store(db) as store:
        rows = store.trials()
    assert len(rows) == 3 and all(r.status == "ok" for r in rows), [r.error[-300:] for r in rows]
    assert {r.problem.kernel for r in rows} == {BIAS_GELU}

    best = cli_here(capsys, "best", BIAS_GELU, "--shape", "rows=16,cols=256", "--dtype",
                    "float32", "--db", db, "--json", "--device", "interpret")
    assert best.returncode == 0, best.stderr
    config = json.loads(best.stdout)["config"]
    assert config in [dict(r.config) for r in rows]

    kernel = get_kernel(BIAS_GELU, allow_import=True)
    from examples.user_kernels import bias_gelu

    for key in (bias_gelu.KERNEL, BIAS_GELU):  # the object in its module, or its path
        found, source = autotune.lookup_config(key, {"rows": 16, "cols": 256}, "float32", db=db,
                                               device="interpret")
        assert (dict(found), source) == (config, "exact")
    assert kernel.bind(kernel.problem({"rows": 16, "cols": 256}, "float32")).is_valid(config)

    import jax
    import numpy as np

    from autotune.queries.lookup import clear_cache

    monkeypatch.setenv("AUTOTUNE_DB", db)
    clear_cache()
    problem = kernel.problem({"rows": 16, "cols": 256}, "float32")
    x, bias = kernel.make_inputs(problem, jax.random.key(0))
    seen, jitted = [], bias_gelu._jitted

    def spy(problem, config):
        seen.append(dict(config))
        return jitted(problem, config)

    monkeypatch.setattr(bias_gelu, "_jitted", spy)
    y = bias_gelu.bias_gelu(x, bias)  # no GPU here: the example runs in GPU interpret mode
    assert seen == [config]
    np.testing.assert_allclose(np.asarray(y), np.asarray(kernel.reference(problem)(x, bias)),
                               rtol=1e-5, atol=1e-5)
    clear_cache()


@pytest.mark.slow
def test_raw_example_on_a_cpu_checks_and_tunes_what_it_can(tmp_path, capsys):
    """The raw Mosaic GPU example cannot run interpreted: a CPU job skips it and says why;
    tuned through the fake evaluator, every config measured lowers for CUDA and `best`
    answers under its import path (the same command line, in this process: its answer does
    not depend on the process)."""
    from autotune.engine.dispatcher import Engine
    from autotune.tuning.jobs import Budget, load_job
    from autotune.tuning.tuner import run_job

    db = f"sqlite:///{tmp_path}/raw.db"
    skipped = run_cli("tune", "examples/user_kernels/raw_mosaic_add.toml", "--allow-import",
                      "--db", db, "--device", "interpret", "--results-dir", str(tmp_path))
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert "does not run in GPU interpret mode" in skipped.stdout
    with Store(db) as store:
        assert store.trials() == []

    job = load_job(EXAMPLES / "raw_mosaic_add.toml", allow_import=True)
    problems = tuple(dataclasses.replace(p, budget=Budget(trials=4)) for p in job.problems)
    job = dataclasses.replace(job, problems=problems)
    store = Store(db)
    try:
        with Engine(mode="fake", allow_import=True) as engine:
            reports = run_job(job, store=store, engine=engine, results_dir=tmp_path,
                              allow_import=True)
        rows = store.trials()
    finally:
        store.close()
    assert [r.by_status for r in reports] == [{"ok": 4}, {"ok": 4}]
    kernel = get_kernel(RAW_ADD, allow_import=True)
    for row in rows:
        problem = kernel.problem(row.problem.dims, row.problem.dtype)
        assert lower_for_cuda(kernel, problem, Config(row.config)).ok, row.config
    best = cli_here(capsys, "best", RAW_ADD, "--shape", "n=16777216", "--dtype", "bfloat16",
                    "--db", db, "--device", "fake", "--json")
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["config"] in [dict(r.config) for r in rows]


@pytest.mark.parametrize(
    "argv",
    [
        ["tune", "examples/user_kernels/bias_gelu.toml"],
        ["check", BIAS_GELU, "--shape", "rows=256,cols=1024"],
        ["spaces", RAW_ADD, "--shape", "n=4096"],
    ],
    ids=["tune", "check", "spaces"],
)
def test_an_import_path_needs_allow_import(argv, capsys, monkeypatch, tmp_path):
    """Without --allow-import a kernel named by import path is refused: exit 2, the message
    names the flag, and nothing is imported or written."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("AUTOTUNE_DB", f"sqlite:///{tmp_path}/never.db")
    assert main(argv) == 2
    assert "--allow-import" in capsys.readouterr().err
    assert not (tmp_path / "never.db").exists()


def test_a_missing_module_names_the_directory(capsys, monkeypatch, tmp_path):
    """An import path that does not import says so, and where it was looked for."""
    monkeypatch.chdir(tmp_path)
    assert main(["spaces", "nowhere.kernels:KERNEL", "--allow-import", "--shape", "n=1"]) == 2
    err = capsys.readouterr().err
    assert "cannot import module 'nowhere.kernels'" in err and str(tmp_path) in err


# -- a space missing the 128-byte rule ---------------------------------------------------------


def test_check_lists_the_failing_configs_and_names_the_missing_rule(capsys, monkeypatch):
    """`autotune check` on the incomplete space: exit 1, exactly the unaligned configs listed
    with JAX's error, and the 128-byte rule over (block_rows, block_cols) named."""
    monkeypatch.chdir(REPO)
    code = main(["check", MISSING, "--allow-import", "--shape", "rows=8,cols=32",
                 "--dtype", "float32", "--sample", "12"])
    out = capsys.readouterr().out
    assert code == 1
    kernel = get_kernel(MISSING, allow_import=True)
    space = kernel.bind(kernel.problem(MISSING_SHAPE, "float32"))
    expected = [dict(c) for c in space if _unaligned(dict(c))]
    assert len(expected) == 3
    failing = [json.loads(line.split("FAIL ", 1)[1]) for line in out.splitlines() if "FAIL " in line]
    assert sorted(map(json.dumps, failing)) == sorted(map(json.dumps, expected))
    assert out.count("Error") >= 3  # JAX's error for each (its wording depends on the version)
    assert out.count(TRANSFER_RULE) == 4  # for each failure, and once in the summary


def test_the_named_rule_repairs_the_space():
    """check_space's rule, added to the space as printed, leaves a space that checks clean."""
    import math

    from autotune import Aligned, threads

    kernel = get_kernel(MISSING, allow_import=True)
    problem = kernel.problem(MISSING_SHAPE, "float32")
    report = check_space(kernel, problem, sample=12)
    assert report.checked == 12 and len(report.failures) == 3
    assert {f.rule for f in report.failures} == {report.failures[0].rule}
    names = {"Constraint": Constraint, "Aligned": Aligned, "is_aligned_transfer": is_aligned_transfer,
             "threads": threads, "math": math}
    rule = eval(report.failures[0].rule, names)  # noqa: S307 - the tool's own output
    fixed = dataclasses.replace(
        kernel, space=Space(kernel.space.params, (*kernel.space.constraints, rule))
    )
    again = check_space(fixed, problem, sample=12)
    assert again.checked == 9 and again.failures == ()


def test_the_rule_is_found_without_reading_the_message():
    """JAX's wording changes between versions (0.11.2 says "Failed to infer a possible set of
    layouts"): the rule is still the one that excludes the failures and no config that lowered."""
    kernel = get_kernel(MISSING, allow_import=True)
    space = kernel.bind(kernel.problem(MISSING_SHAPE, "float32"))
    configs = [dict(c) for c in space]
    failed = [(c, "ValueError: Failed to infer a possible set of layouts") for c in configs
              if _unaligned(c)]
    lowered = [c for c in configs if not _unaligned(c)]
    rules = missing_rules(space, failed, lowered)
    assert len(rules) == 3 and all(TRANSFER_RULE in r for r in rules)


def test_check_names_the_warpgroup_and_tma_box_rules_too():
    """The test kernel SCALE_ADD lets through 64 (under a warpgroup's 128 threads) and 512 (over
    a TMA copy's 256 elements): each failure gets its own rule."""
    kernel = get_kernel("tests.kernels_for_tests:SCALE_ADD", allow_import=True)
    report = check_space(kernel, kernel.problem({"n": 512}, "float32"), sample=4)
    rules = {f.config["block"]: f.rule for f in report.failures}
    assert sorted(rules) == [64, 512]
    assert "c['block'] % threads(warpgroups=1) == 0" in rules[64]
    assert "c['block'] <= 256" in rules[512]


def test_one_invalid_config_gets_its_rule_from_the_error():
    """Without a sample to compare (a trial while tuning), the error's kind and the size it
    quotes pick the rule: a 64-byte copy of a 2 x 8 float32 tile is the tile's rule."""
    from autotune.evaluation.checking import suggest_rule

    kernel = get_kernel(MISSING, allow_import=True)
    space = kernel.bind(kernel.problem(MISSING_SHAPE, "float32"))
    error = ("NotImplementedError: Only copies transferring a number of bytes divisible by the "
             "warpgroup size are supported. Got bytes=64 but warpgroup size is 128")
    hint = suggest_rule(error, {"block_rows": 2, "block_cols": 8}, space)
    assert hint.startswith("128-byte transfers") and TRANSFER_RULE in hint
    assert suggest_rule("RuntimeError: something else", {"block_rows": 2, "block_cols": 8}, space) == ""


@pytest.mark.slow
def test_tuning_records_each_failing_config_invalid_once(tmp_path, capsys):
    """Tuned in interpret mode (each config first lowered for CUDA), the unaligned configs are
    stored `invalid` with JAX's error and the missing rule, each once; a re-run (the same
    command line, in this process) measures none of them again, and the tune output points at
    `autotune check`."""
    db = f"sqlite:///{tmp_path}/missing.db"
    job = tmp_path / "missing.toml"
    job.write_text(
        "[defaults]\ntrials = 12\niterations = 1\nseed = 0\n"
        f'[[problem]]\nkernel = "{MISSING}"\ndtype = "float32"\nshape = {{ rows = 8, cols = 32 }}\n'
    )
    first = run_cli("tune", str(job), "--allow-import", "--db", db, "--device", "interpret",
                    "--results-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "did not lower" in first.stdout and f"autotune check {MISSING}" in first.stdout
    with Store(db) as store:
        rows = store.trials()
    assert len(rows) == 12 == len({Config(r.config).digest() for r in rows})
    invalid = [r for r in rows if r.status == "invalid"]
    assert sorted(json.dumps(dict(r.config)) for r in invalid) == sorted(
        json.dumps(dict(r.config)) for r in rows if _unaligned(dict(r.config))
    )
    assert len(invalid) == 3 and all(r.status == "ok" for r in rows if r not in invalid)
    for r in invalid:
        assert "[lower]" in r.error and "lowering for CUDA" in r.error
        assert "missing rule?" in r.error and TRANSFER_RULE in r.error

    again = cli_here(capsys, "tune", str(job), "--allow-import", "--db", db, "--device",
                     "interpret", "--trials", "30", "--results-dir", str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    with Store(db) as store:
        assert len(store.trials()) == 12
    [name] = optuna.get_all_study_names(storage=db)
    trials = optuna.load_study(study_name=name, storage=db).trials
    told = [json.dumps(t.params, sort_keys=True) for t in trials if t.system_attrs.get("autotune_outcome")]
    assert len(told) == 12 == len(set(told))


# -- tuning from Python ------------------------------------------------------------------------


@pytest.mark.slow
def test_tune_from_python_with_the_kernel_object(tmp_path, monkeypatch):
    """autotune.tune(KERNEL) stores under the kernel's import path, where the CLI's `best`
    and the run-time lookup find it."""
    from autotune.queries import best as best_queries
    from tests.user_kernel_missing_rule import KERNEL

    db = f"sqlite:///{tmp_path}/api.db"
    [report] = autotune.tune(KERNEL, [MISSING_SHAPE], dtype="float32", trials=2, db=db,
                             device="interpret")
    assert report.problem.kernel == MISSING and report.best_config is not None
    # On a machine with a GPU, interpret-mode results are served only when asked for by
    # device; on one without, they are what it holds.
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    assert autotune.best_config(MISSING, MISSING_SHAPE, "float32", db=db) is None
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    assert autotune.best_config(MISSING, MISSING_SHAPE, "float32", db=db) == dict(
        report.best_config)
    assert autotune.best_config(MISSING, MISSING_SHAPE, "float32", db=db,
                                device="interpret") == dict(report.best_config)
    assert autotune.lookup_config(KERNEL, MISSING_SHAPE, "float32", db=db, device="interpret") == (
        report.best_config, "exact"
    )


def test_tune_refuses_a_kernel_workers_cannot_import(tmp_path):
    """A kernel object that is no module's global cannot reach the worker processes: a clear
    error before anything runs."""
    from tests.user_kernel_missing_rule import KERNEL

    local = dataclasses.replace(KERNEL, name="local_copy", build=lambda p, c, o: None)
    with pytest.raises(JobError, match="declare it as a global of a module"):
        autotune.tune(local, [MISSING_SHAPE], dtype="float32", db=f"sqlite:///{tmp_path}/x.db",
                      device="interpret")
    assert not (tmp_path / "x.db").exists()

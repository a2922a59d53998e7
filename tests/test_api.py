"""The public API: pinned names, lazy loading, and no jax on the query path."""

from __future__ import annotations

import subprocess
import sys

import pytest

import autotune

PUBLIC = [
    "Aligned", "AutotuneError", "Bool", "BoundSpace", "BuildOptions", "Choice", "Config",
    "Constraint", "Env", "JobError", "Kernel", "KernelNotFoundError", "MBARRIER_BYTES",
    "NoValidConfigError",
    "NothingTunedError", "Outcome", "PowerOfTwo", "Problem", "SMEM_ALIGNMENT_BYTES", "SMEM_LIMIT_BYTES", "Space",
    "SpaceError", "StorageError", "TrialResult", "Violation", "WARPGROUP_SIZE", "WARP_SIZE",
    "__version__", "best_config", "best_result", "check_space", "elems_per_bytes", "get_kernel",
    "interpret_params", "is_aligned_transfer", "list_results", "lookup_config", "parse_shape", "per_128_bytes", "profile_params", "profiler_smem_bytes",
    "results_frame", "smem_aligned", "threads", "transfer_bytes", "tune", "tuned",
]


def test_public_api_is_pinned():
    """An accidental export or removal changes __all__ and fails here."""
    assert sorted(autotune.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(autotune, name) is not None, name


def test_importing_and_querying_never_imports_jax(tmp_path):
    """`import autotune` and a best_config query load neither jax nor optuna's samplers' deps."""
    code = (
        "import sys, autotune\n"
        f"r = autotune.best_config('hopper_matmul', {{'m': 64, 'n': 64, 'k': 64}}, 'bf16', db='sqlite:///{tmp_path}/x.db')\n"
        "assert r is None\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_unknown_attribute_is_an_attribute_error():
    """A misspelt name raises AttributeError naming it."""
    try:
        autotune.best_cofig  # noqa: B018
    except AttributeError as e:
        assert "best_cofig" in str(e)
    else:
        raise AssertionError("no error")


def test_the_cli_and_the_api_share_one_run_path(tmp_path, monkeypatch):
    """`autotune tune` and `autotune.tune` both run through `autotune.api.run_tuning` (the
    store, the engine and the job runner assembled once), with the job each built."""
    import autotune.api as api
    from autotune import cli

    seen = []

    class Reached(Exception):
        pass

    def spy(job, **kw):
        seen.append((job.problems[0].problem.kernel, kw["device"], kw["db"]))
        raise Reached

    monkeypatch.setattr(api, "run_tuning", spy)
    db = f"sqlite:///{tmp_path}/a.db"
    with pytest.raises(Reached):
        autotune.tune("softmax", [{"rows": 64, "cols": 512}], dtype="float32", trials=1, db=db,
                      device="interpret", progress=False)
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float32"\n'
                   'shape = { rows = 64, cols = 512 }\n')
    with pytest.raises(Reached):
        cli.main(["tune", str(job), "--db", db, "--device", "interpret", "--quiet",
                  "--results-dir", str(tmp_path / "results")])
    assert seen == [("softmax", "interpret", db)] * 2


def test_tune_prints_no_optuna_study_lines(tmp_path, monkeypatch):
    """autotune.tune() is silent about Optuna's "A new study created ..." (a library does not
    print its bookkeeping); the caller's Optuna verbosity is restored afterwards."""
    import logging
    from contextlib import contextmanager

    import optuna

    from autotune import api
    from tests.test_cli import _FakeEngine  # the CLI tests' in-process engine and toy kernel

    @contextmanager
    def fake_open_engine(device="auto", **kwargs):
        yield _FakeEngine("gpu")

    monkeypatch.setattr(api, "open_engine", fake_open_engine)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep = Keep()
    optuna_root = logging.getLogger("optuna")
    optuna_root.addHandler(keep)
    optuna.logging.set_verbosity(optuna.logging.INFO)  # Optuna's default
    try:
        api.tune("cli_toy", [{"m": 512}], dtype="float32", trials=2,
                 db=f"sqlite:///{tmp_path}/t.db", progress=False)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna_root.removeHandler(keep)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    assert not [r for r in records if "A new study created" in r.getMessage()], records


def test_detect_device_starts_no_jax_where_the_driver_lists_no_gpu(monkeypatch):
    """On a machine whose NVIDIA driver lists no GPU, detect_device answers "interpret"
    without starting jax in a child process (the quickstart's first seconds on a CPU); where
    it lists one, jax is asked."""
    from autotune import api
    from autotune.queries import best as best_queries

    def probed():
        raise AssertionError("jax must not be started to find no GPU")

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    monkeypatch.setattr(api, "count_gpus", probed)
    assert api.detect_device() == "interpret"
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    monkeypatch.setattr(api, "count_gpus", lambda: 1)
    assert api.detect_device() == "gpu"

def test_gpus_are_counted_without_a_child_where_the_driver_or_the_plugins_answer(monkeypatch):
    """count_gpus starts no child importing jax (1.65 s) when no CUDA plugin of jax is
    installed (0) or NVML answers with no CUDA_VISIBLE_DEVICES to apply; it asks jax in a child
    only where NVML is missing or a visibility list is set."""
    import autotune.api as api

    children = []
    monkeypatch.setattr(api, "_jax_gpu_count", lambda: children.append(1) or 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(api, "_cuda_plugin_installed", lambda: False)
    assert api.count_gpus() == 0 and not children
    monkeypatch.setattr(api, "_cuda_plugin_installed", lambda: True)
    monkeypatch.setattr(api, "_nvml_gpu_count", lambda: 2)
    assert api.count_gpus() == 2 and not children
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert api.count_gpus() == 3 and len(children) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(api, "_nvml_gpu_count", lambda: None)
    assert api.count_gpus() == 3 and len(children) == 2


def test_nvml_missing_reads_as_unknown(monkeypatch):
    """Without libnvidia-ml the NVML count is None (unknown), never an error."""
    import ctypes

    import autotune.api as api

    def missing(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert api._nvml_gpu_count() is None

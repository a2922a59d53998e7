"""XLA's autotune picks pinned across processes (autotune.evaluation.xla_autotune)."""

from __future__ import annotations

from autotune.evaluation import xla_autotune as m


def test_the_flag_is_added_once_and_a_users_folder_is_kept():
    assert m.pinned_xla_flags("", "/r/x") == "--xla_gpu_per_fusion_autotune_cache_dir=/r/x"
    assert m.pinned_xla_flags("--xla_dump_to=/d", "/r/x") == (
        "--xla_dump_to=/d --xla_gpu_per_fusion_autotune_cache_dir=/r/x")
    mine = "--xla_gpu_per_fusion_autotune_cache_dir=/mine"
    assert m.pinned_xla_flags(mine, "/r/x") == mine


def test_the_folder_is_jaxs_own_in_the_compilation_cache_else_in_scratch(tmp_path):
    cache = tmp_path / "jax_cache"
    folder = cache / "xla_gpu_per_fusion_autotune_cache_dir"
    assert m.autotune_cache_folder(str(cache), tmp_path / "logs") == folder
    assert folder.is_dir()
    assert m.autotune_cache_folder(None, tmp_path / "logs") == tmp_path / "logs" / "xla_autotune"


def test_pin_in_sets_xla_flags_from_the_source_environment():
    env: dict[str, str] = {}
    m.pin_in(env, "/f", source={"XLA_FLAGS": "--a=1"})
    assert env == {"XLA_FLAGS": "--a=1 --xla_gpu_per_fusion_autotune_cache_dir=/f"}


def test_gpu_workers_get_the_pin_and_interpret_workers_do_not(tmp_path, monkeypatch):
    """The engine's GPU workers start with XLA_FLAGS naming one autotune folder (so every
    worker times the same baseline program); interpret workers are left alone."""
    import threading

    from autotune.engine import workers
    from autotune.engine.messages import WorkerSpec
    from autotune.space.outcomes import DeviceKind

    seen: list[dict[str, str]] = []

    class Stop(Exception):
        pass

    def fake_popen(*args, env, **kwargs):
        seen.append(env)
        raise Stop

    monkeypatch.setattr(workers.subprocess, "Popen", fake_popen)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for mode in (DeviceKind.GPU, DeviceKind.INTERPRET):
        spec = WorkerSpec(mode=mode, iterations=20, compile_threads=1, allow_import=False,
                          log_level=0, cache="cold", keep_compiled=5,
                          compilation_cache=str(tmp_path / "jax_cache"))
        pool = workers.WorkerPool(threading.Lock(), slots=[None], spec=spec, log_dir=tmp_path)
        try:
            pool.spawn(0)
        except Stop:
            pass
    gpu_env, interpret_env = seen
    assert gpu_env["XLA_FLAGS"] == (
        "--xla_gpu_per_fusion_autotune_cache_dir="
        f"{tmp_path / 'jax_cache' / 'xla_gpu_per_fusion_autotune_cache_dir'}")
    assert "XLA_FLAGS" not in interpret_env


def test_flagged_folder_reads_the_last_folder_named():
    assert m.flagged_folder("") is None
    assert m.flagged_folder("--xla_dump_to=/d") is None
    assert m.flagged_folder(
        "--xla_gpu_per_fusion_autotune_cache_dir=/a --xla_gpu_per_fusion_autotune_cache_dir=/b"
    ) == "/b"


_FOLDERS_OF_COMPILES = """
import sys
from autotune._jax_compat import autotune_folder_of_compiles
from autotune.engine.worker import use_compilation_cache
before = autotune_folder_of_compiles()
use_compilation_cache(sys.argv[1])
print(before)
print(autotune_folder_of_compiles())
"""


def _in_fresh_process(program, cache, xla_flags):
    """What ``program`` prints, line by line, run with ``cache`` as its argument in a fresh
    process whose ``XLA_FLAGS`` is ``xla_flags`` (None: unset): XLA reads its flags once, at
    start."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run([sys.executable, "-c", program, str(cache)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def _folders_of_compiles(tmp_path, xla_flags):
    """(the folder a compile uses with the compilation cache off, with it on)."""
    off, on = _in_fresh_process(_FOLDERS_OF_COMPILES, tmp_path / "jax_cache", xla_flags)
    return off, on


def test_workers_and_verify_compile_with_one_autotune_folder(tmp_path):
    """The job's workers turn JAX's compilation cache on, ``autotune verify`` does not: with the
    engine's pin both compile with the same autotune folder, so the baseline's GEMM is
    autotuned once and every process times that pick. (With the folder beside JAX's own they
    kept two, and verify autotuned the baseline again.)"""
    folder = m.autotune_cache_folder(str(tmp_path / "jax_cache"), tmp_path / "logs")
    off, on = _folders_of_compiles(tmp_path, m.pinned_xla_flags("", folder))
    assert off == on == str(folder)


def test_a_users_folder_holds_with_the_compilation_cache_on(tmp_path):
    mine = tmp_path / "mine"
    off, on = _folders_of_compiles(tmp_path, f"--xla_gpu_per_fusion_autotune_cache_dir={mine}")
    assert off == on == str(mine)


_USERS_PROGRAM = """
import sys
import jax
from autotune._jax_compat import autotune_folder_of_compiles
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
print(autotune_folder_of_compiles())
"""


def test_a_program_with_the_jobs_compilation_cache_reads_its_picks(tmp_path):
    """A user's program that turns JAX's compilation cache on in the job's folder (the one line
    docs/user_kernels.md gives) compiles its baseline with the job's autotune folder, so it
    runs the XLA program the job timed."""
    cache = tmp_path / "jax_cache"
    (folder,) = _in_fresh_process(_USERS_PROGRAM, cache, None)
    assert folder == str(m.autotune_cache_folder(str(cache), tmp_path / "logs"))

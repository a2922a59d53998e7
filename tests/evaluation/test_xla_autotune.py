"""XLA's autotune picks pinned across processes (autotune.evaluation.xla_autotune)."""

from __future__ import annotations

from autotune.evaluation import xla_autotune as m


def test_the_flag_is_added_once_and_a_users_folder_is_kept():
    assert m.pinned_xla_flags("", "/r/x") == "--xla_gpu_per_fusion_autotune_cache_dir=/r/x"
    assert m.pinned_xla_flags("--xla_dump_to=/d", "/r/x") == (
        "--xla_dump_to=/d --xla_gpu_per_fusion_autotune_cache_dir=/r/x")
    mine = "--xla_gpu_per_fusion_autotune_cache_dir=/mine"
    assert m.pinned_xla_flags(mine, "/r/x") == mine


def test_the_folder_sits_beside_the_compilation_cache_else_in_scratch(tmp_path):
    cache = tmp_path / "jax_cache"
    assert m.autotune_cache_folder(str(cache), tmp_path / "logs") == cache / "xla_autotune"
    assert (cache / "xla_autotune").is_dir()
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
        f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path / 'jax_cache' / 'xla_autotune'}")
    assert "XLA_FLAGS" not in interpret_env

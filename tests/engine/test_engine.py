"""Tests for autotune.engine (dispatcher, worker, typed messages, layout): pipelining, isolation of crashes and hangs, several GPUs.

Real worker processes throughout; the fake evaluator crashes, hangs and sleeps on demand.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.engine import dispatcher as engine_mod
from autotune.engine import tasks as tasks_mod
from autotune.engine.dispatcher import Engine, EngineError, default_timeout_s
from autotune.errors import KernelNotFoundError
from autotune.space.outcomes import Outcome, TrialResult
from autotune.space.problem import Config, Problem

FAKE = "tests.kernels_for_tests:FAKE"
SCALE_ADD = "tests.kernels_for_tests:SCALE_ADD"
PROBLEM = Problem(FAKE, {"n": 1}, "float32")


def fake_engine(**kwargs):
    options = dict(compile_threads=3, trial_timeout_s=1.5, compile_timeout_s=1.5, allow_import=True)
    options.update(kwargs)
    return Engine("fake", **options)


def cfg(mode="ok", stage="run", cost_us=10, **extra):
    return Config(mode=mode, stage=stage, cost_us=cost_us, **extra)


def resolve_counting(futures, timeout=60):
    """Results of the futures, checking each resolved exactly once (one callback call)."""
    calls = collections.Counter()
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _, i=i: calls.update([i]))
    results = [f.result(timeout=timeout) for f in futures]
    time.sleep(0.2)
    assert all(calls[i] == 1 for i in range(len(futures))), calls
    return results


def test_fault_injection_every_future_resolves_once_with_the_right_outcome():
    """Segfaults, aborts, raises, hangs, wrong results and poison among ok configs."""
    plan = [
        (cfg(cost_us=1), Outcome.OK),
        (cfg("segfault", "run"), Outcome.CRASHED),
        (cfg(cost_us=2), Outcome.OK),
        (cfg("abort", "compile"), Outcome.CRASHED),
        (cfg(cost_us=3), Outcome.OK),
        (cfg("raise", "lower"), Outcome.INVALID),
        (cfg("raise", "compile"), Outcome.COMPILE_ERROR),
        (cfg("raise", "run"), Outcome.COMPILE_ERROR),
        (cfg(cost_us=4), Outcome.OK),
        (cfg("hang", "run"), Outcome.TIMEOUT),
        (cfg(cost_us=5), Outcome.OK),
        (cfg("wrong"), Outcome.WRONG_RESULT),
        (cfg("hang", "compile"), Outcome.TIMEOUT),
        (cfg(cost_us=6), Outcome.OK),
        (cfg("poison"), Outcome.CRASHED),
        (cfg(cost_us=7), Outcome.OK),
        (cfg("segfault", "compile"), Outcome.CRASHED),
        (cfg("abort", "time"), Outcome.CRASHED),
        (cfg(cost_us=8), Outcome.OK),
    ]
    with fake_engine() as eng:
        futures = [eng.submit(FAKE, PROBLEM, c) for c, _ in plan]
        results = resolve_counting(futures)
        for (config, want), result in zip(plan, results, strict=True):
            assert isinstance(result, TrialResult)
            assert result.outcome is want, (config, result.error)
            if want is Outcome.OK:
                assert result.median_us == pytest.approx(config["cost_us"], rel=0.01)
        # ... and it keeps going afterwards.
        after = [eng.submit(FAKE, PROBLEM, cfg(cost_us=c)) for c in (11, 12)]
        assert [f.result(timeout=30).outcome for f in after] == [Outcome.OK] * 2
        stats = eng.stats()
    assert stats.submitted == stats.resolved == len(plan) + 2
    assert stats.crashes >= 4 and stats.timeouts >= 1  # one kill may time out two hung configs


def test_crash_report_names_signal_stage_and_stderr():
    """A crash result says how the worker died, in which stage, with its stderr tail."""
    with fake_engine() as eng:
        result = eng.submit(FAKE, PROBLEM, cfg("segfault", "check")).result(timeout=30)
    assert result.outcome is Outcome.CRASHED
    assert "SIGSEGV" in result.error and "last stage: check" in result.error
    assert "Segmentation fault" in result.error  # faulthandler's line, from the stderr tail


def test_neighbours_of_a_crash_are_rerun_not_blamed():
    """Several configs compiling when one segfaults: each re-runs alone; only it is CRASHED."""
    plan = [cfg(cost_us=i, compile_ms=1000) for i in range(5)]
    plan.insert(2, cfg("segfault", "compile", compile_ms=200))  # dies while 3 others compile
    with fake_engine(compile_threads=4, compile_timeout_s=10) as eng:
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
        stats = eng.stats()
    outcomes = [r.outcome for r in results]
    assert outcomes == [Outcome.OK] * 2 + [Outcome.CRASHED] + [Outcome.OK] * 3
    assert "only one executing" in results[2].error
    assert stats.isolated_reruns >= 2  # the culprit and at least one neighbour re-ran alone


def test_timeout_blames_only_the_hung_config():
    """A run past its limit while the worker still answers: TIMEOUT for it, OK for the rest."""
    plan = [cfg(cost_us=1, compile_ms=200), cfg("hang", "run"), cfg(cost_us=2, compile_ms=200)]
    with fake_engine(trial_timeout_s=1.0) as eng:
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.TIMEOUT, Outcome.OK]
    assert "limit 1.0 s" in results[1].error and "[run]" in results[1].error


def test_wedged_worker_reruns_suspects_instead_of_blaming_the_overdue_one():
    """A compile holding the GIL stalls a neighbour's run: the neighbour is re-run, not blamed."""
    plan = [cfg(run_ms=600, cost_us=1), cfg("wedge", "compile", compile_ms=100)]
    with fake_engine(compile_threads=2, trial_timeout_s=2.0, compile_timeout_s=2.0) as eng:
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.TIMEOUT]


def test_default_timeout_is_derived_from_what_was_seen(monkeypatch):
    """Without a limit given, a hang times out at max(floor, 10 x the slowest stage seen)."""
    monkeypatch.setitem(tasks_mod.TIMEOUT_FLOORS, "fake", (1.0, 1.0))
    assert default_timeout_s(None, floor_s=30) == 30
    assert default_timeout_s(5.0, floor_s=30) == 50
    with fake_engine(trial_timeout_s=None, compile_timeout_s=None) as eng:
        assert eng.submit(FAKE, PROBLEM, cfg(run_ms=150)).result(timeout=30).ok
        hung = eng.submit(FAKE, PROBLEM, cfg("hang")).result(timeout=30)
    assert hung.outcome is Outcome.TIMEOUT
    limit = float(re.search(r"limit ([0-9.]+) s", hung.error).group(1))
    assert 1.4 <= limit <= 3.0, hung.error  # 10 x the ~0.15 s run seen, above the 1 s floor


def test_poisoned_device_retires_the_worker_and_reruns_its_neighbours():
    """After a run that leaves the device unusable, a fresh worker takes the remaining work."""
    plan = [cfg("poison", run_ms=100)] + [cfg(cost_us=i, compile_ms=100) for i in range(1, 4)]
    with fake_engine() as eng:
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
        stats = eng.stats()
    assert [r.outcome for r in results] == [Outcome.CRASHED] + [Outcome.OK] * 3
    assert "device failed" in results[0].error
    assert stats.worker_starts >= 2 and stats.crashes == 0  # retired, not crashed


def test_pipeline_overlaps_compiles_with_runs():
    """Later configs compile while earlier ones are timed; runs never overlap; total well
    below the sequential sum."""
    n, compile_s, run_s = 8, 0.4, 0.15
    plan = [cfg(cost_us=i, compile_ms=compile_s * 1000, run_ms=run_s * 1000) for i in range(n)]
    with fake_engine(compile_threads=4) as eng:
        eng.device_info()  # started
        start = time.monotonic()
        results = [f.result(timeout=60) for f in [eng.submit(FAKE, PROBLEM, c) for c in plan]]
        wall = time.monotonic() - start
        timeline = eng.timeline()
    assert all(r.ok for r in results)
    spans = collections.defaultdict(dict)
    for e in timeline:
        spans[e.task_id].setdefault(e.stage, e.t)
    compiles = [(s["build"], s["compiled"]) for s in spans.values()]
    runs = sorted((s["run"], s["done"]) for s in spans.values())
    overlapping = sum(
        1
        for (c0, c1) in compiles
        for (r0, r1) in runs
        if c0 < r1 and r0 < c1 and (c0, c1) != (r0, r1)
    )
    assert overlapping >= 3, (compiles, runs)
    assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(runs)), runs  # one at a time
    sequential = n * (compile_s + run_s)
    assert wall < 0.6 * sequential, (wall, sequential)


def test_several_gpus_share_the_work():
    """One worker per GPU, pinned with CUDA_VISIBLE_DEVICES; every GPU gets work."""
    plan = [cfg(cost_us=i, run_ms=100) for i in range(12)]
    with fake_engine(gpus=[0, 1, 2], compile_threads=2) as eng:
        # Every worker started before the work comes: on a loaded machine a worker that
        # starts late finds the queue empty (its peers took all 12), which is right but is
        # not what this test checks (CI once saw exactly that).
        deadline = time.monotonic() + 60
        while len(eng.device_infos()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        results = [f.result(timeout=60) for f in [eng.submit(FAKE, PROBLEM, c) for c in plan]]
        infos = eng.device_infos()
        stats = eng.stats()
        timeline = eng.timeline()
    assert all(r.ok for r in results)
    assert {g: info.name for g, info in infos.items()} == {
        g: f"fake-gpu (CUDA_VISIBLE_DEVICES={g})" for g in (0, 1, 2)
    }
    assert sorted(stats.by_worker) == [0, 1, 2] and sum(stats.by_worker.values()) == 12
    assert min(stats.by_worker.values()) >= 2
    assert {e.gpu for e in timeline} == {0, 1, 2}


def test_a_crash_on_one_gpu_leaves_the_others_running():
    """Only the crashed GPU's worker is replaced; the culprit alone is CRASHED."""
    plan = [cfg(cost_us=i, run_ms=50) for i in range(8)]
    plan.insert(3, cfg("segfault", "run"))
    with fake_engine(gpus=[0, 1], compile_threads=2) as eng:
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
        stats = eng.stats()
    assert [r.outcome for r in results].count(Outcome.CRASHED) == 1
    assert results[3].outcome is Outcome.CRASHED
    # Replaced once per death: the crash itself, and once more if it had neighbours in flight
    # and had to be re-run alone to be identified.
    assert stats.crashes in (1, 2) and stats.worker_starts == 2 + stats.crashes


def device_spans(timeline):
    """Per task, (worker, got the GPU, done) from its last device event on."""
    spans = {}
    for e in timeline:
        if e.stage == "device":
            spans[e.task_id] = [e.worker, e.t, None]
        elif e.stage == "done" and e.task_id in spans:
            spans[e.task_id][2] = e.t
    return {t: tuple(s) for t, s in spans.items() if s[2] is not None}


def assert_one_at_a_time(spans):
    ordered = sorted((t0, t1) for _, t0, t1 in spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)), ordered


def test_device_busy_time_is_the_union_of_the_device_spans_per_gpu():
    """device_busy_s: per GPU, the union of each task's span from ``device`` to ``done``
    (overlaps counted once, a task never done not at all), summed over the GPUs; ``tasks``
    keeps only the tasks named."""
    E = tasks_mod.StageEvent
    timeline = [E(1, 0, 0, "build", -5.0), E(1, 0, 0, "device", 0.0), E(2, 1, 0, "device", 1.0),
                E(1, 0, 0, "done", 2.0), E(2, 1, 0, "done", 3.5), E(3, 2, 1, "device", 10.0),
                E(4, 3, 1, "device", 10.5), E(3, 2, 1, "done", 11.0)]
    assert tasks_mod.device_busy_s(timeline) == 3.5 + 1.0
    assert tasks_mod.device_busy_s(timeline, {1, 3}) == 2.0 + 1.0
    assert tasks_mod.device_busy_s(timeline, set()) == 0.0


def test_a_config_goes_to_a_free_worker_that_has_worked_on_its_problem():
    """Of the equally loaded workers, the one that has run the problem takes its next config,
    and warm_problems() names the problems of the workers next in line."""
    p0, p1, p2 = (Problem(FAKE, {"n": n}, "float32") for n in (10, 1, 2))
    with fake_engine(workers_per_gpu=2, compile_threads=1) as eng:
        eng.warm_up(FAKE, p0, cfg())  # both workers ready, both have run p0
        first = [eng.submit(FAKE, p, cfg(compile_ms=300)) for p in (p1, p2)]
        [f.result(timeout=60) for f in first]
        assert eng.warm_problems() == {p0, p1, p2}  # both idle: either may take the next
        later = [eng.submit(FAKE, p, cfg(compile_ms=300)) for p in (p2, p1)]
        [f.result(timeout=60) for f in later]
        busy = eng.submit(FAKE, p1, cfg(run_ms=1500))
        time.sleep(0.5)
        assert eng.warm_problems() == {p0, p2}  # the idle worker is next; it has not run p1
        busy.result(timeout=60)
        timeline = eng.timeline()
    ran_on = {e.task_id: e.worker for e in timeline if e.stage == "done"}
    ids = sorted(ran_on)[2:]  # after the warm-ups
    assert ran_on[ids[0]] != ran_on[ids[1]]
    # p2 then p1 were submitted to two idle workers: each went to the one that had run it.
    assert ran_on[ids[2]] == ran_on[ids[1]] and ran_on[ids[3]] == ran_on[ids[0]]


def test_a_worker_warms_its_device_up_under_the_gpus_lock(tmp_path):
    """_warm_device calls the evaluator's warm_device holding the GPU's lock (another process
    could not take it meanwhile), and a failure there is left for the first trial."""
    import fcntl
    import os

    from autotune.engine.worker import _Worker

    lock_path = tmp_path / "gpu-0.lock"
    worker = _Worker.__new__(_Worker)
    worker._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    held = []

    class Evaluator:
        def warm_device(self):
            other = os.open(lock_path, os.O_RDWR)
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(other)

    worker.evaluator = Evaluator()
    worker._warm_device()
    assert held == [True]

    class Failing:
        def warm_device(self):
            raise RuntimeError("no CUPTI")

    worker.evaluator = Failing()
    worker._warm_device()  # logged, not raised
    os.close(worker._lock_fd)


def test_a_gpu_worker_imports_the_kernel_language_before_its_first_config():
    """GpuEvaluator.warm_host imports Pallas' Mosaic GPU modules (a fresh process's first build
    waited 0.25-0.4 s for them on the H200); the worker calls it, then queues the device part
    for its main thread, and a failure is left for the first config."""
    import subprocess
    import sys

    from autotune.engine.worker import _Worker

    code = ("import sys; from autotune.evaluation.pipeline import GpuEvaluator; "
            "assert 'jax.experimental.pallas.mosaic_gpu' not in sys.modules; "
            "GpuEvaluator().warm_host(); "
            "assert 'jax.experimental.pallas.mosaic_gpu' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    import queue

    from autotune.engine import worker as worker_mod

    worker = _Worker.__new__(_Worker)
    worker._ready = queue.Queue()
    calls = []

    class Evaluator:
        def warm_host(self):
            calls.append(1)
            raise ImportError("no pallas")

    worker.evaluator = Evaluator()
    worker._warm_host()  # logged, not raised; the device part is still queued for the main thread
    assert calls == [1] and worker._ready.get_nowait() is worker_mod._WARM_DEVICE


def test_workers_of_one_gpu_compile_in_parallel_and_time_one_at_a_time():
    """workers_per_gpu=3: compiles overlap across worker processes; device stages never do."""
    n, compile_s, run_s = 9, 0.5, 0.1
    plan = [cfg(cost_us=i, compile_ms=compile_s * 1000, run_ms=run_s * 1000) for i in range(n)]
    with fake_engine(workers_per_gpu=3, compile_threads=1) as eng:
        assert eng.workers == 3 and eng.parallelism == 6
        assert [r.outcome for r in eng.warm_up(FAKE, PROBLEM, cfg())] == [Outcome.OK] * 3
        start = time.monotonic()
        results = [f.result(timeout=60) for f in [eng.submit(FAKE, PROBLEM, c) for c in plan]]
        wall = time.monotonic() - start
        timeline = eng.timeline()
        pids = {w.pid for w in eng._pool.handles.values() if w is not None}
    assert [r.median_us for r in results] == pytest.approx(list(range(n)), rel=0.01)
    assert len(pids) == 3
    warm_ups = {e.task_id: e.worker for e in timeline if e.stage == "done" and e.task_id < 3}
    assert sorted(warm_ups.values()) == [0, 1, 2]  # one warm-up on each worker
    spans = {e: s for e, s in device_spans(timeline).items() if e >= 3}
    assert_one_at_a_time(spans.values())
    compiles = collections.defaultdict(dict)
    for e in timeline:
        if e.task_id >= 3 and e.stage in ("build", "compiled"):
            compiles[e.task_id][e.stage] = (e.worker, e.t)
    pairs = [
        (a, b)
        for a, b in itertools.combinations(compiles.values(), 2)
        if a["build"][0] != b["build"][0]
        and a["build"][1] < b["compiled"][1]
        and b["build"][1] < a["compiled"][1]
    ]
    assert len(pairs) >= 3, compiles  # compiling in different processes at the same time
    assert {w for w, _, _ in spans.values()} == {0, 1, 2}
    assert wall < 0.6 * n * (compile_s + run_s), wall


# An engine in a process of its own: it starts a config that wedges its worker (a call that
# never returns and never releases the GIL), prints the worker's pid, then is SIGKILLed.
_WEDGED_ENGINE = """
import os, signal, sys, time
from autotune.engine.dispatcher import Engine
from autotune.space.problem import Config, Problem
engine = Engine("fake", compile_threads=1, trial_timeout_s=600, compile_timeout_s=600,
                allow_import=True)
future = engine.submit("tests.kernels_for_tests:FAKE", Problem("tests.kernels_for_tests:FAKE",
                       {"n": 1}, "float32"), Config(mode="wedge", stage="run", cost_us=10))
while not any(e.stage == "run" for e in engine.timeline()):
    time.sleep(0.05)
print(engine._pool.live()[0].pid, flush=True)
time.sleep(0.5)  # the worker is inside the wedged call
os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_wedged_worker_dies_with_its_killed_engine():
    """A worker wedged in a call that holds the GIL never sees its pipe close; when its engine's
    process is killed, the kernel kills it too, so that it does not spin on holding the GPU and
    its lock (every later job on that GPU would wait for it)."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _WEDGED_ENGINE], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    pid = int(proc.stdout.split()[0])
    try:
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), f"worker {pid} outlived its engine"
    finally:
        if _running(pid):
            os.killpg(pid, signal.SIGKILL)  # its own session: its process group


def test_a_worker_dying_while_it_holds_the_gpu_does_not_block_the_others():
    """A segfault and a hang while holding the GPU's lock: the OS releases it; the rest is OK."""
    plan = [cfg(cost_us=i, compile_ms=100, run_ms=100) for i in range(10)]
    plan.insert(2, cfg("segfault", "time", run_ms=100))
    plan.insert(6, cfg("hang", "time", run_ms=100))
    with fake_engine(workers_per_gpu=3, compile_threads=1, trial_timeout_s=1.5) as eng:
        futures = [eng.submit(FAKE, PROBLEM, c) for c in plan]
        dying = {futures[2].task_id, futures[6].task_id}
        # Which config takes the GPU's lock first is the OS's choice, so the two that die may be
        # the last to hold it: two more configs are sent once both are inside their timing.
        deadline = time.monotonic() + 30
        while not dying <= {e.task_id for e in eng.timeline() if e.stage == "time"}:
            assert time.monotonic() < deadline, "the dying configs never reached their timing"
            time.sleep(0.01)
        futures += [eng.submit(FAKE, PROBLEM, cfg(cost_us=10 + i, run_ms=100)) for i in range(2)]
        results = resolve_counting(futures)
        stats = eng.stats()
        timeline = eng.timeline()
    outcomes = [r.outcome for r in results]
    assert outcomes[2] is Outcome.CRASHED and outcomes[6] is Outcome.TIMEOUT
    assert outcomes[:2] + outcomes[3:6] + outcomes[7:] == [Outcome.OK] * 12
    assert "SIGSEGV" in results[2].error and "last stage: time" in results[2].error
    assert "got the GPU" in results[6].error
    assert stats.crashes >= 1 and stats.timeouts == 1
    # The configs sent last held the GPU after both deaths, one at a time.
    deaths = [e.t for e in timeline if e.stage == "time" and e.task_id in dying]
    late = {f.task_id for f in futures[-2:]}
    assert all(e.t > max(deaths) for e in timeline if e.stage == "device" and e.task_id in late)
    assert {e.task_id for e in timeline if e.stage == "device"} >= late
    assert_one_at_a_time(device_spans(timeline).values())


def test_waiting_for_the_gpu_is_not_a_timeout():
    """Configs queueing for the GPU longer than the run limit still end OK: the limit counts
    from when the lock is held."""
    limit_s, run_ms = 1.0, 250
    plan = [cfg(cost_us=i, run_ms=run_ms) for i in range(16)]
    with fake_engine(workers_per_gpu=4, compile_threads=1, trial_timeout_s=limit_s) as eng:
        eng.warm_up(FAKE, PROBLEM, cfg())
        results = resolve_counting([eng.submit(FAKE, PROBLEM, c) for c in plan])
        timeline = eng.timeline()
        stats = eng.stats()
    assert [r.outcome for r in results] == [Outcome.OK] * len(plan), [r.error for r in results]
    assert stats.timeouts == 0 and stats.worker_starts == 4
    compiled = {e.task_id: e.t for e in timeline if e.stage == "compiled"}
    waits = [e.t - compiled[e.task_id] for e in timeline if e.stage == "device"]
    assert max(waits) > 1.5 * limit_s, waits  # some waited well past the limit for the GPU
    assert_one_at_a_time(device_spans(timeline).values())


def test_default_layout_processes_on_a_gpu_host_threads_on_a_small_one():
    """8 workers x 1 thread on a 16-core 1-GPU host, 1 worker x threads on 2 cores; a lock per GPU."""
    from autotune.engine.layout import default_layout as layout

    assert layout("gpu", 1, 16) == (8, 1)
    assert layout("gpu", 1, 64) == (8, 2)
    assert layout("gpu", 8, 128) == (8, 1)
    assert layout("gpu", 1, 2) == (1, 2)  # today's engine: one worker, threads
    assert layout("gpu", 4, 16) == (2, 1)
    assert layout("interpret", 1, 16) == (8, 1)
    assert layout("fake", 1, 16) == (1, 8)
    assert layout("gpu", 1, 16, workers_per_gpu=1) == (1, 8)
    assert layout("gpu", 1, 16, compile_threads=3) == (8, 3)
    # GPU memory: half of it for the workers, WORKER_GPU_MEMORY_MIB each; given counts win.
    assert layout("gpu", 1, 16, gpu_memory_mib=143_771) == (8, 1)  # H200: the cores decide
    assert layout("gpu", 1, 16, gpu_memory_mib=16_384) == (2, 2)
    assert layout("gpu", 1, 16, gpu_memory_mib=4_096) == (1, 8)
    assert layout("gpu", 1, 16, workers_per_gpu=6, gpu_memory_mib=16_384) == (6, 1)
    with fake_engine(gpus=[0, 1], workers_per_gpu=2, compile_threads=1) as eng:
        assert (eng.workers, eng.parallelism) == (4, 8)
        results = [
            f.result(timeout=60)
            for f in [eng.submit(FAKE, PROBLEM, cfg(run_ms=50)) for _ in range(8)]
        ]
        timeline = eng.timeline()
    assert all(r.ok for r in results)
    assert {(e.worker, e.gpu) for e in timeline} <= {(0, 0), (1, 0), (2, 1), (3, 1)}
    for gpu in (0, 1):
        on_gpu = {e.task_id for e in timeline if e.gpu == gpu}
        assert_one_at_a_time(s for t, s in device_spans(timeline).items() if t in on_gpu)


def test_interpret_workers_share_the_cpu_device():
    """Two interpret-mode worker processes: real kernels compile in both, run one at a time."""
    problem = Problem(SCALE_ADD, {"n": 512}, "float32")
    with Engine(
        "interpret", workers_per_gpu=2, compile_threads=1, allow_import=True, iterations=2
    ) as eng:
        # Blocks 128 and 256 are the ones that lower for CUDA (interpret mode checks that first).
        warm = eng.warm_up(SCALE_ADD, problem, Config(block=256))
        futures = [eng.submit(SCALE_ADD, problem, Config(block=b)) for b in (128, 256, 128)]
        results = [f.result(timeout=120) for f in futures]
        timeline = eng.timeline()
    assert [r.outcome for r in warm + results] == [Outcome.OK] * 5
    assert {e.worker for e in timeline if e.stage == "device"} == {0, 1}
    assert_one_at_a_time(device_spans(timeline).values())


def test_errors_that_are_not_the_configs_fail_the_future():
    """An unknown kernel, or an import path without allow_import, raises from the future."""
    with fake_engine() as eng:
        with pytest.raises(KernelNotFoundError, match="cannot import"):
            eng.submit("no_such_module:K", PROBLEM, cfg()).result(timeout=30)
        assert eng.submit(FAKE, PROBLEM, cfg()).result(timeout=30).ok
    with fake_engine(allow_import=False) as eng:
        with pytest.raises(KernelNotFoundError, match="allow-import"):
            eng.submit(FAKE, PROBLEM, cfg()).result(timeout=30)


def test_baseline_and_trace_run_on_a_worker(tmp_path):
    """The baseline is timed and the trace parsed by the worker, through the engine. Its
    error against the reference is computed when it is timed, not when a round re-times it."""
    with fake_engine() as eng:
        first = eng.baseline(FAKE, PROBLEM)
        assert first.median_us == 100.0 and first.rel_error == 0.0
        again = eng.retime(FAKE, PROBLEM, None, iterations=3)
        assert again.ok and again.rel_error is None and len(again.samples_us) == 3
        wrong = Problem(FAKE, {**PROBLEM.dims, "baseline_wrong": 1}, PROBLEM.dtype)
        assert eng.baseline(FAKE, wrong).outcome is Outcome.WRONG_RESULT
        assert eng.trace(FAKE, PROBLEM, cfg(cost_us=3), tmp_path, 8) == {
            "body": (3.0, 2),
            "kernel": (5.0, 2),
        }
        with pytest.raises(EngineError, match="crashed"):
            eng.trace(FAKE, PROBLEM, cfg("segfault", "run"), tmp_path, 8)
        assert eng.device_info().kind == "fake"


def test_a_baseline_is_prepared_on_a_compile_thread_before_it_takes_the_gpu():
    """A baseline's host work (Evaluator.prepare) runs before the worker takes the GPU's lock:
    its stages are ``prepare``, ``prepared``, then ``device`` (the lock) and ``run``."""
    with fake_engine() as eng:
        before = {e.task_id for e in eng.timeline()}
        assert eng.baseline(FAKE, PROBLEM).ok
        stages = [e.stage for e in eng.timeline() if e.task_id not in before]
    assert stages == ["prepare", "prepared", "device", "run", "done"], stages


def test_close_with_cancel_drops_queued_work_and_refuses_more():
    """Closing cancels what has not started; every future ends; later submits raise."""
    eng = fake_engine(compile_threads=1)
    futures = [eng.submit(FAKE, PROBLEM, cfg(run_ms=200)) for _ in range(10)]
    futures[0].result(timeout=30)
    eng.close(cancel_pending=True)
    assert all(f.done() for f in futures)
    assert any(f.cancelled() for f in futures)
    assert all(f.result().ok for f in futures if not f.cancelled())
    with pytest.raises(EngineError, match="closed"):
        eng.submit(FAKE, PROBLEM, cfg())


def test_cancelled_future_is_skipped():
    """A future cancelled before it starts is never run nor resolved again."""
    with fake_engine(compile_threads=1) as eng:
        futures = [eng.submit(FAKE, PROBLEM, cfg(run_ms=100)) for _ in range(6)]
        assert futures[-1].cancel()
        assert all(f.result(timeout=30).ok for f in futures[:-1])
    assert futures[-1].cancelled()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "tpu"}, "mode"),
        ({"gpus": [0, 0]}, "distinct"),
        ({"gpus": [-1]}, "non-negative"),
        ({"trial_timeout_s": 0}, "trial_timeout_s"),
        ({"compile_threads": 0}, "compile_threads"),
        ({"workers_per_gpu": 0}, "workers_per_gpu"),
        ({"iterations": 0}, "iterations"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, match):
    """Arguments are checked before any worker starts, with the rule in the message."""
    with pytest.raises(ValueError, match=match):
        Engine(**{"mode": "fake", **kwargs})


def test_workers_that_cannot_start_break_the_engine_clearly(monkeypatch):
    """GPU mode without a GPU: the workers' own error surfaces as an EngineError.

    The engine gives up after the first failed start here (each GPU worker imports jax before
    it finds no GPU, 2-3 s); the retries before giving up are
    test_a_worker_that_dies_at_startup_is_one_line_naming_its_log's."""
    from autotune.engine import workers

    monkeypatch.setattr(workers, "MAX_STARTUP_FAILURES", 1)
    with Engine("gpu", allow_import=True) as eng:
        future = eng.submit(FAKE, PROBLEM, cfg())
        with pytest.raises(EngineError, match="No GPU visible"):
            eng.device_info(timeout_s=120)
        with pytest.raises(EngineError, match="failed to start"):
            future.result(timeout=120)
        with pytest.raises(EngineError):
            eng.submit(FAKE, PROBLEM, cfg())


def test_a_worker_that_dies_at_startup_is_one_line_naming_its_log(monkeypatch, tmp_path):
    """A worker that cannot even import (here: a module that does not exist) breaks the engine
    with one line: the error's last line and the worker's log, which holds the traceback."""
    from autotune.engine import workers

    monkeypatch.setattr(workers, "BOOT", "import autotune_no_such_module")
    with Engine("fake", log_dir=tmp_path) as eng:
        with pytest.raises(EngineError) as info:
            eng.device_info(timeout_s=120)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert "failed to start 3 times" in message
    assert "ModuleNotFoundError: No module named 'autotune_no_such_module'" in message
    log_path = re.search(r"worker log (\S+?)\)", message).group(1)
    assert log_path.startswith(str(tmp_path)) and "Traceback" in open(log_path).read()


def test_interpret_engine_evaluates_a_real_kernel():
    """Interpret mode in a worker: the real Pallas kernel is OK, its wrong twin is caught."""
    problem = Problem(SCALE_ADD, {"n": 512}, "float32")
    wrong = Problem(SCALE_ADD + "_WRONG", {"n": 512}, "float32")
    with Engine("interpret", compile_threads=2, allow_import=True, iterations=2) as eng:
        ok = eng.submit(SCALE_ADD, problem, Config(block=128))
        bad = eng.submit(SCALE_ADD + "_WRONG", wrong, Config(block=128))
        invalid = eng.submit(SCALE_ADD, problem, Config(block=96))
        assert ok.result(timeout=120).outcome is Outcome.OK
        # One checked run per config in interpret mode: its wall-clock time is the one sample.
        assert ok.result().timing == "wallclock" and len(ok.result().samples_us) == 1
        assert bad.result(timeout=120).outcome is Outcome.WRONG_RESULT
        assert invalid.result(timeout=120).outcome is Outcome.INVALID
        assert eng.device_info().kind == "interpret"


def test_workers_keep_compiles_in_the_persistent_compilation_cache(tmp_path, monkeypatch):
    """``compilation_cache``: every worker compiles through JAX's persistent cache in that
    folder (here every compile is kept; by default only those over 1 s), and a second engine
    finds there what the first compiled."""
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("JAX_LOG_COMPILES", "1")  # cache hits and misses logged as warnings
    problem = Problem(SCALE_ADD, {"n": 512}, "float32")
    folder = tmp_path / "jax_cache"

    def run(logs):
        with Engine("interpret", compile_threads=1, allow_import=True, iterations=1,
                    compilation_cache=folder, log_dir=str(tmp_path / logs)) as eng:
            assert eng.submit(SCALE_ADD, problem, Config(block=128)).result(timeout=120).ok
        return "".join(p.read_text() for p in (tmp_path / logs).glob("worker-*.log"))

    assert "Persistent compilation cache hit" not in run("first")
    first = {p.name for p in folder.iterdir()}
    assert first, "nothing was written to the compilation cache"
    assert "Persistent compilation cache hit" in run("second")
    assert {p.name for p in folder.iterdir()} == first  # everything found, nothing new


def test_the_compilation_cache_is_on_for_gpus_and_named_by_choice(tmp_path):
    from autotune.api import compilation_cache_folder

    results = str(tmp_path / "results")
    assert compilation_cache_folder("auto", results_dir=results, device="gpu") == str(
        tmp_path / "results" / "jax_cache")
    assert compilation_cache_folder("auto", results_dir=results, device="interpret") is None
    assert compilation_cache_folder("off", results_dir=results, device="gpu") is None
    assert compilation_cache_folder("/x/c", results_dir=results, device="interpret") == "/x/c"


def test_public_api():
    """``__all__`` lists exactly the public names."""
    assert sorted(engine_mod.__all__) == sorted(
        ["Engine", "EngineError", "StageEvent", "EngineStats", "default_timeout_s"]
    )


def test_confirm_interleaves_rounds_on_the_kept_executables():
    """The confirmation round times every program once per round, in rotating order, each on
    the worker that timed it, from the executable it kept: nothing is compiled again."""
    configs = [cfg(cost_us=c, noise=1) for c in (100, 103)]
    problem = Problem(FAKE, {"n": 1, "baseline_us": 150}, "float32")
    with fake_engine(workers_per_gpu=2, cache="cold") as eng:
        assert eng.cache_policy == "cold"
        first = [f.result() for f in [eng.submit(FAKE, problem, c) for c in configs]]
        assert all(r.ok and r.cache == "cold" for r in first)
        eng.baseline(FAKE, problem)
        before = {e.task_id for e in eng.timeline()}
        table = eng.confirm(FAKE, problem, configs, rounds=3, iterations=40,
                            medians_us=[r.median_us for r in first])
        events = [e for e in eng.timeline() if e.task_id not in before]
        # A round added later (adaptive rounds): one count of runs per program.
        (more,) = eng.confirm(FAKE, problem, configs, rounds=1, first_round=3,
                              iterations=[10, 20, 30], medians_us=[r.median_us for r in first])
        with pytest.raises(ValueError, match="one iteration count per program"):
            eng.confirm(FAKE, problem, configs, rounds=1, iterations=[10, 20])
    assert [len(r.samples_us) for r in more] == [10, 20, 30]
    assert [[len(r.samples_us) for r in row] for row in table] == [[40, 40, 40]] * 3
    assert [round(r.median_us) for r in table[0]] == [100, 103, 150]
    assert all(r.cache == "cold" for row in table for r in row)
    assert not [e for e in events if e.stage in ("build", "lower", "compile")]
    # One program at a time, in the order of round_order: A B base, B base A, base A B.
    order = [e.task_id for e in events if e.stage == "time"]
    assert len(order) == 9 and order == sorted(order)


def test_confirm_rounds_of_two_problems_run_at_once_on_one_engine():
    """Two threads confirm two problems on one engine at once (the job runs up to
    ``CONCURRENT_ROUNDS`` rounds so): each gets its own table, every program timed on the
    executable its worker kept, nothing compiled again, and their re-time tasks interleave."""
    from concurrent.futures import ThreadPoolExecutor

    problems = [Problem(FAKE, {"n": n, "baseline_us": 150}, "float32") for n in (1, 2)]
    # Each timing takes 15 ms, so that the two rounds' tasks overlap.
    configs = [cfg(mode="sleep", stage="time", sleep_ms=15, cost_us=c, noise=1)
               for c in (100, 120)]
    with fake_engine(workers_per_gpu=2, cache="cold") as eng:
        medians = {}
        for problem in problems:
            medians[problem] = [f.result().median_us
                                for f in [eng.submit(FAKE, problem, c) for c in configs]]
            eng.baseline(FAKE, problem)
        before = {e.task_id for e in eng.timeline()}
        with ThreadPoolExecutor(2) as pool:
            tables = list(pool.map(
                lambda p: eng.confirm(FAKE, p, configs, rounds=4, iterations=30,
                                      medians_us=medians[p]), problems))
        events = [e for e in eng.timeline() if e.task_id not in before]
    for table in tables:
        assert [[round(r.median_us) for r in row] for row in table] == [[100, 120, 150]] * 4
    assert not [e for e in events if e.stage in ("build", "lower", "compile")]
    timed = [e.problem for e in sorted(events, key=lambda e: e.t) if e.stage == "time"]
    assert len(timed) == 24
    switches = sum(1 for a, b in zip(timed, timed[1:]) if a != b)
    assert switches > 1, timed


def test_confirm_interleaved_times_each_round_as_one_task_on_the_worker_that_timed_most():
    """``confirm(..., interleaved=True)``: each round is one task, on the worker that timed
    most of the round's programs last; it compiles in the first round what it did not keep
    (here everything: the workers keep no search executable) and keeps it for the later rounds
    and later calls; every program gets the mean of the counts of runs; the true times come
    back in the programs' order whatever the rotation."""
    configs = [cfg(cost_us=c) for c in (100, 103, 106)]
    problem = Problem(FAKE, {"n": 5, "baseline_us": 150}, "float32")
    with fake_engine(workers_per_gpu=2, cache="cold", keep_compiled=0) as eng:
        eng.warm_up(FAKE, problem, cfg(cost_us=1))  # both workers are up
        for config, worker in zip(configs, (0, 1, 1), strict=True):
            eng.retime(FAKE, problem, config, iterations=5, worker=worker)
        before = {e.task_id for e in eng.timeline()}
        table = eng.confirm(FAKE, problem, configs, rounds=3, iterations=[40, 20, 30, 30],
                            interleaved=True)
        (more,) = eng.confirm(FAKE, problem, configs, rounds=1, first_round=3, iterations=10,
                              interleaved=True)
        events = [e for e in eng.timeline() if e.task_id not in before]
        with pytest.raises(ValueError, match="interleaved or as a program calls it"):
            eng.confirm(FAKE, problem, configs, rounds=1, iterations=5, interleaved=True,
                        program=True)
    rounds = sorted({e.task_id for e in events})
    assert len(rounds) == 4 and {e.kind for e in events} == {"round"}
    assert {e.worker for e in events} == {1}
    compiled = [e.task_id for e in events if e.stage == "compile"]
    assert compiled == [rounds[0]] * 3
    assert [[len(r.samples_us) for r in row] for row in table] == [[30] * 4] * 3
    assert [len(r.samples_us) for r in more] == [10] * 4
    assert all(r.median_us == pytest.approx(t, rel=0.02)
               for row in [*table, more] for r, t in zip(row, (100, 103, 106, 150), strict=True))


def test_an_interleaved_round_that_fails_is_timed_one_program_at_a_time():
    """A round whose task crashes its worker is timed again one program at a time, which
    names the program that crashed; the later rounds leave it out and are one task again."""
    configs = [cfg(cost_us=100), cfg("segfault", "time")]
    problem = Problem(FAKE, {"n": 6, "baseline_us": 150}, "float32")
    with fake_engine(workers_per_gpu=1) as eng:
        assert eng.submit(FAKE, problem, configs[0]).result().ok
        before = {e.task_id for e in eng.timeline()}
        table = eng.confirm(FAKE, problem, configs, rounds=2, iterations=5, interleaved=True)
        kinds = collections.Counter(
            (e.kind, e.stage) for e in eng.timeline() if e.task_id not in before)
    assert [[r.outcome for r in row] for row in table] == [
        [Outcome.OK, Outcome.CRASHED, Outcome.OK]] * 2
    assert [round(r.median_us) for r in table[1] if r.ok] == [100, 150]
    # Round 1 one task (crashed), then three retimes; round 2 one task again.
    assert kinds[("round", "time")] == 2 and kinds[("round", "done")] == 1
    assert kinds[("retime", "time")] == 3


def test_a_program_check_waits_until_no_compile_thread_runs_python():
    """A program check (``retime(..., program=True)``) times the host's clock, which a compile
    thread tracing Python beside it would slow (it takes the GIL at every call): the check
    starts once the config lowering in the other thread reaches XLA's compile. A plain retime
    (CUPTI's clock) does not wait."""
    config = cfg(cost_us=100)
    problem = Problem(FAKE, {"n": 8}, "float32")
    started = {}
    with fake_engine(workers_per_gpu=1, compile_threads=2, compile_timeout_s=10,
                     trial_timeout_s=10) as eng:
        median = eng.submit(FAKE, problem, config).result().median_us
        for program in (True, False):
            slow = eng.submit(FAKE, problem, cfg("sleep", "lower", sleep_ms=1500,
                                                 cost_us=int(program)))
            while not any(e.task_id == slow.task_id and e.stage == "lower"
                          for e in eng.timeline()):
                time.sleep(0.01)
            before = {e.task_id for e in eng.timeline()}
            assert eng.retime(FAKE, problem, config, iterations=3, program=program,
                              median_us=median).ok
            assert slow.result().ok
            events = eng.timeline()
            (timed,) = [e.t for e in events if e.task_id not in before and e.kind == "retime"
                        and e.stage == "time"]
            (compiling,) = [e.t for e in events if e.task_id == slow.task_id
                            and e.stage == "compile"]
            started[program] = timed - compiling
    assert started[True] >= 0 and started[False] < -1.0, started


def test_a_program_check_waits_for_python_work_without_holding_the_gpu():
    """A program check that waits for its worker's compile threads' Python work (above) does
    not hold the GPU's lock meanwhile: the GPU's other worker times while it waits."""
    import concurrent.futures

    config = cfg(cost_us=100)
    slow_config = cfg("sleep", "lower", sleep_ms=1500, cost_us=101)
    problem = Problem(FAKE, {"n": 8}, "float32")
    with fake_engine(workers_per_gpu=2, compile_threads=2, compile_timeout_s=10,
                     trial_timeout_s=10) as eng, concurrent.futures.ThreadPoolExecutor(2) as pool:
        median = eng.submit(FAKE, problem, config).result().median_us
        for worker in (0, 1):  # each worker keeps the config
            assert eng.retime(FAKE, problem, config, iterations=3, worker=worker,
                              median_us=median).ok
        before = {e.task_id for e in eng.timeline()}
        # Worker 0 lowers a config for 1.5 s, and has a program check to time meanwhile.
        slow = pool.submit(eng.retime, FAKE, problem, slow_config, iterations=3, worker=0)
        while not any(e.task_id not in before and e.stage == "lower" for e in eng.timeline()):
            time.sleep(0.01)
        check = pool.submit(eng.retime, FAKE, problem, config, iterations=3, program=True,
                            median_us=median, worker=0)
        while len({e.task_id for e in eng.timeline()} - before) < 2:  # the check, waiting
            time.sleep(0.01)
        time.sleep(0.1)
        seen = {e.task_id for e in eng.timeline()}
        assert eng.retime(FAKE, problem, config, iterations=3, worker=1).ok
        assert slow.result().ok and check.result().ok
        events = eng.timeline()
    (lowering,) = {e.task_id for e in events if e.task_id not in before and e.stage == "lower"}
    (compiling,) = [e.t for e in events if e.task_id == lowering and e.stage == "compile"]
    (checked,) = [e.t for e in events if e.task_id in seen - before - {lowering}
                  and e.stage == "device"]
    (other,) = [e.t for e in events if e.task_id not in seen and e.worker == 1
                and e.stage == "device"]
    assert checked >= compiling, (checked, compiling)
    assert other < compiling - 0.5, (other, compiling)


def test_the_host_gate_waits_for_python_work_at_most_its_timeout():
    """A compile thread stuck in its Python stages delays a program check by the gate's
    timeout at most; while the check times, no other compile thread starts its Python work,
    and it starts as soon as the check ends."""
    import threading

    from autotune.engine.worker import _HostGate

    gate = _HostGate()
    gate.enter()  # a compile thread that does not leave its Python stages
    entered = threading.Event()
    start = time.monotonic()
    with gate.quiet(0.3):
        waited = time.monotonic() - start
        other = threading.Thread(target=lambda: (gate.enter(), entered.set()))
        other.start()
        assert not entered.wait(0.2)
    assert entered.wait(5)
    other.join()
    gate.leave()
    gate.leave()
    assert 0.3 <= waited < 5


def test_retime_on_a_named_worker_times_there_and_compiles_what_it_did_not_keep():
    """``retime(..., worker=w)`` times on worker slot ``w``, whichever timed the config
    before: a config it never compiled is compiled there (the baseline too); a slot out of
    range is refused by name."""
    config = cfg(cost_us=100)
    problem = Problem(FAKE, {"n": 4, "baseline_us": 150}, "float32")
    with fake_engine(workers_per_gpu=2, cache="cold") as eng:
        eng.warm_up(FAKE, problem, cfg(cost_us=1))  # both workers are up
        first = eng.submit(FAKE, problem, config).result()
        (searched,) = [e.worker for e in eng.timeline() if e.stage == "time"
                       and e.kind == "trial" and e.problem == problem][-1:]
        other = 1 - searched
        seen = {}
        for who, program in (("config", config), ("baseline", None)):
            before = {e.task_id for e in eng.timeline()}
            result = eng.retime(FAKE, problem, program, iterations=10, worker=other,
                                median_us=first.median_us)
            events = [e for e in eng.timeline() if e.task_id not in before]
            seen[who] = ({e.worker for e in events if e.stage == "time"},
                         any(e.stage == "compile" for e in events), result.ok)
        for bad in (2, -1, True, "0"):
            with pytest.raises(ValueError, match="worker must be a worker slot, 0 to 1"):
                eng.retime(FAKE, problem, config, iterations=10, worker=bad)
    assert seen["config"] == ({other}, True, True)
    assert seen["baseline"][0] == {other} and seen["baseline"][2]


def test_confirm_program_times_the_program_check_on_the_workers():
    """``confirm(..., program=True)``: the same interleaved rounds, each program timed as a
    program calls it on the worker that kept it (PROGRAM_BLOCKS per-call times, what a call
    costs beyond its kernel included: the config's ``call_us``, the shape's
    ``baseline_call_us``); nothing compiled again."""
    from autotune.evaluation.timing import PROGRAM_BLOCKS
    from autotune.space.outcomes import PROGRAM_METHOD

    config = cfg(cost_us=100, call_us=7)
    problem = Problem(FAKE, {"n": 3, "baseline_us": 95, "baseline_call_us": 15}, "float32")
    with fake_engine(workers_per_gpu=1, cache="cold") as eng:
        assert eng.submit(FAKE, problem, config).result().ok
        eng.baseline(FAKE, problem)
        before = {e.task_id for e in eng.timeline()}
        table = eng.confirm(FAKE, problem, [config], rounds=2, iterations=[40, 40],
                            program=True)
        events = [e for e in eng.timeline() if e.task_id not in before]
    assert [[len(r.samples_us) for r in row] for row in table] == [[PROGRAM_BLOCKS] * 2] * 2
    assert all(r.timing == PROGRAM_METHOD and r.cache == "cold" for row in table for r in row)
    assert [round(r.median_us) for r in table[0]] == [107, 110]
    assert not [e for e in events if e.stage in ("build", "lower", "compile")]


def test_an_engine_in_interpret_mode_refuses_the_cold_policy():
    """Cold timing needs a GPU's L2: asking for it in interpret mode fails before any worker."""
    with pytest.raises(ValueError, match="needs a GPU"):
        Engine("interpret", cache="cold")


@pytest.mark.parametrize("interleaved", [False, True])
def test_confirm_times_every_program_on_one_gpu(interleaved):
    """With several GPUs, the confirmation round times every program on the fastest config's
    GPU, compiling there what another GPU timed, so no two GPUs are compared (one task a round
    or not)."""
    configs = [cfg(cost_us=c, compile_ms=300) for c in (100, 101, 102, 103)]
    problem = Problem(FAKE, {"n": 2}, "float32")
    with fake_engine(gpus=[0, 1], workers_per_gpu=1, compile_threads=1) as eng:
        eng.warm_up(FAKE, problem, cfg(cost_us=1))  # both workers are up
        futures = [eng.submit(FAKE, problem, c) for c in configs]
        assert all(f.result().ok for f in futures)
        search_gpus = {e.gpu for e in eng.timeline() if e.stage == "time"}
        before = {e.task_id for e in eng.timeline()}
        table = eng.confirm(FAKE, problem, configs, rounds=2, iterations=5,
                            interleaved=interleaved)
        gpus = {e.gpu for e in eng.timeline() if e.task_id not in before and e.stage == "time"}
    assert search_gpus == {0, 1}  # the search used both
    assert len(gpus) == 1 and all(r.ok for row in table for r in row)


def test_pipe_messages_are_frozen_dataclasses_that_pickle():
    """Every message between the engine and a worker is a frozen dataclass, read by field, and
    survives the pipe (pickle)."""
    import dataclasses
    import pickle
    import typing

    from autotune.engine import messages as m
    from autotune.space.outcomes import DeviceInfo

    kinds = typing.get_args(m.ToWorker) + typing.get_args(m.FromWorker)
    assert {k.__name__ for k in kinds} == {
        "RunTask", "Stop", "Ready", "Fatal", "Retire", "Heartbeat", "StageReached", "Result",
        "Failed",
    }
    for kind in (*kinds, m.WorkerSpec, m.TaskMsg):
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, kind
    samples = [
        m.Stop(),
        m.Ready(DeviceInfo(name="cpu", kind="interpret"), 123),
        m.StageReached(7, "compile", 1.5),
        m.Failed(7, m.EngineError("boom"), "Traceback ...", 2.0),
    ]
    for msg in samples:
        back = pickle.loads(pickle.dumps(msg))
        assert type(back) is type(msg)
    assert pickle.loads(pickle.dumps(samples[2])) == samples[2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        samples[2].stage = "run"  # type: ignore[misc]


def test_the_engine_owns_a_task_queue_and_a_worker_pool_not_mixins():
    """Engine is no mixin: it owns a TaskQueue and a WorkerPool, objects of their own that
    share its one lock."""
    from autotune.engine.tasks import TaskQueue
    from autotune.engine.workers import WorkerPool

    assert Engine.__mro__ == (Engine, object)
    with fake_engine(workers_per_gpu=1) as eng:
        assert isinstance(eng._tasks, TaskQueue) and isinstance(eng._pool, WorkerPool)
        assert eng._tasks.lock is eng._pool.lock is eng._lock
        assert eng.submit(FAKE, PROBLEM, cfg()).result(timeout=60).ok
        assert eng.stats().worker_starts == eng._pool.worker_starts == 1


def test_the_task_queue_works_alone_without_worker_processes():
    """TaskQueue stands alone: urgent work goes first, a crash with two configs executing
    re-runs both alone, and each future resolves once (no process is started)."""
    import multiprocessing
    import threading

    from autotune.engine.tasks import TaskQueue
    from autotune.engine.workers import WorkerHandle

    queue = TaskQueue(threading.Lock(), mode="fake", capacity=2, trial_timeout_s=None,
                      compile_timeout_s=None)
    trial = queue.submit("trial", FAKE, PROBLEM, cfg(), {})
    baseline = queue.submit("baseline", FAKE, PROBLEM, None, {}, urgent=True)
    ours, theirs = multiprocessing.Pipe()
    w = WorkerHandle(slot=0, gpu=None, process=None, conn=ours, log_path="", started=0.0,
                     state="ready")
    queue.dispatch([w])
    assert [theirs.recv().task.kind for _ in range(2)] == ["baseline", "trial"]
    for task in w.tasks.values():
        task.stage = "compile"
    held = list(w.tasks.values())
    w.tasks.clear()
    queue.blame_crash(w, held, how="died with SIGSEGV", tail="")
    assert len(queue.isolation) == 2 and queue.isolated_reruns == 2 and queue.crashes == 1
    queue.fail_all(EngineError("stopped"), [w])
    queue.fail_all(EngineError("again"), [w])  # nothing left to fail twice
    assert str(trial.exception(timeout=1)) == str(baseline.exception(timeout=1)) == "stopped"
    assert queue.resolved == 2

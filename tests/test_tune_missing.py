"""``autotune.tuned(tune_missing=...)``: tuning a shape with nothing stored, where the program
runs, once over processes (the fake engine: no GPU, no worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import pytest

import autotune
from autotune import api
from autotune.errors import JobError
from autotune.queries import best as best_queries
from autotune.queries import lookup
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.storage.store import Store
from tests.kernels_for_tests import toy_matmul

REPO = Path(__file__).resolve().parents[1]


TOY = toy_matmul("runtime_toy", default_config=lambda p: {"bm": 64, "stages": 8},
                 shape_of=lambda x, *rest: {"m": x.shape[0]})
DEFAULT = {"bm": 64, "stages": 8}


class SlowEngine:
    """Completes each config after ``delay_s`` (or once ``gate`` is set); fastest at bm=256,
    stages=1; counts the engines opened in ``opened``."""

    parallelism = 2

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None,
                 cache_policy: str = "warm") -> None:
        self.delay_s, self.gate, self.cache_policy = delay_s, gate, cache_policy

    def device_info(self):
        return DeviceInfo(name="Fake H200", kind="gpu", compute_capability="9.0")

    def submit(self, kernel_name, problem, config):
        if self.gate is not None:
            self.gate.wait(30)
        time.sleep(self.delay_s)
        t = 100.0 + abs(config["bm"] - 256) / 8 + config["stages"]
        future: Future = Future()
        future.set_result(TrialResult.timed([t, t], compile_s=0.01, rel_error=0.0, timing="fake"))
        return future

    def baseline(self, kernel_name, problem):
        return TrialResult.timed([150.0], compile_s=0.0, rel_error=None, timing="fake")

    def trace(self, *args, **kwargs):
        return {}


def use_fake_engine(opened: list, monkeypatch=None, **engine_kw) -> None:
    """Makes autotune.api open a :class:`SlowEngine` (recorded in ``opened``); for the
    test's duration with ``monkeypatch``, else for the process (the race's children)."""

    @contextmanager
    def fake_open_engine(device="auto", **kwargs):
        opened.append(device)
        # Times with the policy asked for, as the real engine does (cold: an L2 flush).
        yield SlowEngine(cache_policy=kwargs.get("cache") or "warm", **engine_kw)

    if monkeypatch is None:
        api.open_engine = fake_open_engine  # type: ignore[assignment]
    else:
        monkeypatch.setattr(api, "open_engine", fake_open_engine)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A fresh database, results folder and caches; the fake engine counts its openings."""
    monkeypatch.setenv("AUTOTUNE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    lookup.clear_cache()
    api._TUNINGS.clear()
    opened: list = []
    yield types.SimpleNamespace(db=f"sqlite:///{tmp_path}/rt.db", opened=opened,
                                engine=lambda **kw: use_fake_engine(opened, monkeypatch, **kw))
    for tuning in list(api._TUNINGS.values()):
        tuning.done.wait(30)
    api._TUNINGS.clear()
    lookup.clear_cache()


def _array(m):
    return types.SimpleNamespace(shape=(m, m), dtype="float32")


def body(x, *, config=None):
    return dict(config) if config is not None else None


def test_tune_missing_is_off_unless_asked(fresh):
    """Without tune_missing a shape with nothing stored runs with the default config and no
    engine is ever opened."""
    fresh.engine()
    fn = autotune.tuned("runtime_toy", db=fresh.db)(body)
    assert fn(_array(512)) == DEFAULT
    assert fresh.opened == [] and not api._TUNINGS


def test_tune_missing_block_tunes_stores_serves_and_the_next_process_tunes_nothing(fresh):
    """block=True: the first call of a missing shape tunes it (the trial budget asked for),
    stores the results and runs with the stored best config; later calls, and a later process
    (fresh caches, a new decorator), serve the stored answer without tuning again."""
    fresh.engine()
    fn = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=4, block=True)(body)
    got = fn(_array(512))
    best = autotune.best_config("runtime_toy", {"m": 512}, "float32", db=fresh.db)
    assert got == best and got != DEFAULT
    assert fresh.opened and len(fresh.opened) == 1
    with Store(fresh.db) as store:
        (summary,) = store.summaries()
        assert summary.total == 4
    assert fn(_array(512)) == best and len(fresh.opened) == 1
    # The next process: nothing in memory, the answer is in the database.
    lookup.clear_cache()
    api._TUNINGS.clear()
    again = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=True, block=True)(body)
    assert again(_array(512)) == best
    assert len(fresh.opened) == 1 and not api._TUNINGS


def test_tune_missing_in_the_background_serves_the_default_until_stored(fresh):
    """block=False: while the shape tunes on its background thread the calls run with the
    default config at once; the first call after the results are stored runs with them."""
    gate = threading.Event()
    fresh.engine(gate=gate)
    fn = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=3)(body)
    start = time.monotonic()
    assert fn(_array(512)) == DEFAULT
    assert fn(_array(512)) == DEFAULT
    assert time.monotonic() - start < 5
    (tuning,) = api._TUNINGS.values()
    assert not tuning.done.is_set()
    gate.set()
    assert tuning.done.wait(30) and tuning.tuned_here
    best = autotune.best_config("runtime_toy", {"m": 512}, "float32", db=fresh.db)
    assert best is not None and fn(_array(512)) == best
    assert len(fresh.opened) == 1


def test_tune_missing_under_jit(fresh):
    """Under jax.jit the lookup runs at trace time on static shapes: block=True traces with the
    tuned config; block=False traces at once with the lookup's answer meanwhile (the default:
    512's winner does not divide 192), nothing tuning in the trace, and a later trace gets
    the tuned config."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    fresh.engine()

    @autotune.tuned("runtime_toy", db=fresh.db, tune_missing=4, block=True)
    def scale(x, *, config=None):
        return x * config["bm"] + config["stages"]

    x = jnp.ones((512, 512), jnp.float32)
    best = None
    out = jax.jit(lambda x: scale(x))(x)
    best = autotune.best_config("runtime_toy", {"m": 512}, "float32", db=fresh.db)
    assert float(out[0, 0]) == best["bm"] + best["stages"]

    gate = threading.Event()
    fresh.engine(gate=gate)

    @autotune.tuned("runtime_toy", db=fresh.db, tune_missing=3)
    def scale_bg(x, *, config=None):
        return x * config["bm"] + config["stages"]

    y = jnp.ones((192, 192), jnp.float32)
    out = jax.jit(lambda y: scale_bg(y))(y)  # traced while the shape tunes
    assert float(out[0, 0]) == DEFAULT["bm"] + DEFAULT["stages"]
    gate.set()
    for tuning in api._TUNINGS.values():
        assert tuning.done.wait(30)
    tuned_now = autotune.best_config("runtime_toy", {"m": 192}, "float32", db=fresh.db)
    assert tuned_now != DEFAULT
    out = jax.jit(lambda y: scale_bg(y) + 0)(y)  # a new trace
    assert float(out[0, 0]) == tuned_now["bm"] + tuned_now["stages"]


@pytest.mark.parametrize("value", ["slow", 0, -3, 2.5, "block"])
def test_tune_missing_refuses_what_it_does_not_know(value):
    """A tune_missing that is not True, an effort name or a trial count is a JobError naming
    the choices, at decoration."""
    with pytest.raises(JobError, match="tune_missing=.*quick"):
        autotune.tuned("runtime_toy", tune_missing=value)
    with pytest.raises(JobError, match="block"):
        autotune.tuned("runtime_toy", tune_missing=True, block="yes")


def test_the_efforts_are_the_clis(fresh):
    """tune_missing=True is the quick effort; names are the CLI's --effort budgets."""
    from autotune.cli import EFFORTS

    assert api._budget(True) == api._Budget(*EFFORTS["quick"])
    assert api._budget("full") == api._Budget(*EFFORTS["full"])
    assert api._budget(7) == api._Budget(7, None)
    assert api._budget(False) is None


def test_a_claim_is_held_once_and_a_dead_owners_claim_is_taken_over(fresh):
    """Of two claims on one problem the second fails while the first is held; after release
    it succeeds; a claim whose owner process on this host is gone is taken over."""
    problem = TOY.problem({"m": 512}, "float32")
    release = api._claim(fresh.db, problem)
    assert release is not None
    assert api._claim(fresh.db, problem) is None
    release()
    again = api._claim(fresh.db, problem)
    assert again is not None
    storage = api._optuna_storage(fresh.db)  # a plain sqlite URL
    held = storage.get_study_id_from_name(f"{api.CLAIM_PREFIX}{problem.key()}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import socket

    storage.set_study_user_attr(held, "owner", f"{socket.gethostname()}:{gone}")
    taken = api._claim(fresh.db, problem)
    assert taken is not None
    taken()


RACE = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
from tests import test_tune_missing as t
from autotune import api
from autotune.queries import best
best.host_has_gpu = lambda: False
opened = []
t.use_fake_engine(opened, delay_s=0.15)
fn = api.tuned("runtime_toy", db={db!r}, tune_missing=4, block=True)(t.body)
if {go!r}:  # imported: say so, then wait for the test's go
    open({go!r} + ".ready-" + str(os.getpid()), "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.005)
config = fn(t._array(512))
print(json.dumps({{"tuned": bool(opened), "config": config}}))
"""


def test_two_processes_meeting_one_missing_shape_tune_it_once(tmp_path):
    """Two processes call the same missing shape at the same moment on one SQLite file:
    exactly one tunes it (one engine opened, the budget stored once), both run with the
    stored best config, and a third process serves it without tuning."""
    db = f"sqlite:///{tmp_path}/race.db"
    env = {**os.environ, "AUTOTUNE_RESULTS_DIR": str(tmp_path / "results")}
    go = str(tmp_path / "go")  # both wait, imported, until it exists
    procs = [subprocess.Popen([sys.executable, "-c", RACE.format(repo=str(REPO), db=db, go=go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=env) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready-*"))) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.01)
    Path(go).touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["tuned"] for o in outs) == [False, True], outs
    best = autotune.best_config("runtime_toy", {"m": 512}, "float32", db=db)
    assert best is not None and all(o["config"] == best for o in outs), (outs, best)
    with Store(db) as store:
        (summary,) = store.summaries()
        assert summary.total == 4
    third = subprocess.run([sys.executable, "-c", RACE.format(repo=str(REPO), db=db, go="")],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout.strip().splitlines()[-1]) == {"tuned": False, "config": best}


def test_a_background_tuning_never_runs_twice_in_a_process(fresh):
    """Two decorators of one kernel in one process share one tuning of a missing shape."""
    fresh.engine()
    one = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=2)(body)
    two = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=2, block=True)(body)
    one(_array(512))
    got = two(_array(512))
    assert len(fresh.opened) == 1 and len(api._TUNINGS) == 1
    assert got == autotune.best_config("runtime_toy", {"m": 512}, "float32", db=fresh.db)




def test_tune_missing_tunes_under_the_cache_policy_it_serves(fresh):
    """tuned(cache="warm", tune_missing=...) tunes a missing shape with warm timings and serves
    them; a decorator asking for cold results finds none of that policy stored, so it counts
    the shape as missing and tunes it again, under cold; each then serves its own policy's."""
    fresh.engine()
    warm = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=4, block=True,
                          cache="warm")(body)
    assert warm(_array(512)) != DEFAULT and len(fresh.opened) == 1
    assert lookup.stored_here("runtime_toy", {"m": 512}, "float32", db=fresh.db, cache="warm")
    assert not lookup.stored_here("runtime_toy", {"m": 512}, "float32", db=fresh.db,
                                  cache="cold")
    cold = autotune.tuned("runtime_toy", db=fresh.db, tune_missing=4, block=True,
                          cache="cold")(body)
    assert cold(_array(512)) != DEFAULT and len(fresh.opened) == 2
    with Store(fresh.db) as store:
        assert sorted(s.cache_policy for s in store.summaries()) == ["cold", "warm"]

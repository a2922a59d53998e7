"""Run-time lookup: exact, nearest and default configs, the cache, and the decorator."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sqlite3
import threading
import time
import types

import pytest

import autotune
from autotune.errors import StorageError
from autotune.queries import best as queries
from autotune.queries import lookup
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config
from autotune.storage.store import Store

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
INTERPRET = DeviceInfo("cpu-interpret (x86_64)", "interpret")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
KERNEL = get_kernel("hopper_matmul")
SMALL = {"m": 64, "n": 64, "k": 64}
MID = {"m": 128, "n": 128, "k": 128}
BIG = {"m": 256, "n": 256, "k": 256}
TIE_KERNEL = {"m": 192, "n": 192, "k": 192}


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

    calls = []
    real = queries.best_result

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(queries, "best_result", counted)
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == first
    assert calls == []  # answered from memory
    lookup.clear_cache()
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == first
    assert len(calls) == 1  # asked the database again


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

    with caplog.at_level(logging.INFO, logger="autotune.queries.lookup"):
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
    with caplog.at_level(logging.INFO, logger="autotune.queries.lookup"):
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


# --------------------------------------------------------------------------- a database that cannot answer
# The run-time lookup runs inside the user's program: whatever happens to its database, it
# answers (the exported table, else the default) within a bounded time, warns once and does
# not ask the broken database again on every call; strict=True raises instead.

FALLBACK = {"fallback": 1}  # a cheap default: the times below are the database's alone
TIMEOUT_S = 1.0
BOUND_S = 2 * TIMEOUT_S + 2.0  # the lookup's own bound, plus room for a busy machine


def _garbage(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(bytes(range(256)) * 64)
    return f"sqlite:///{path}"


def _text_file(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    return f"sqlite:///{path}"


def _folder(tmp_path):
    (tmp_path / "folder.db").mkdir()
    return f"sqlite:///{tmp_path}/folder.db"


def _bad_url(tmp_path):
    return "nosuchdriver://u:s3cret@host/db"


def _refused(tmp_path):
    return "postgresql://u:s3cret@127.0.0.1:1/x"


UNUSABLE = {"garbage bytes": _garbage, "a text file": _text_file, "a folder": _folder,
            "an unknown URL scheme": _bad_url, "a refused connection": _refused}


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "autotune.queries.lookup" and r.levelno == logging.WARNING]


def _timed_lookup(shape, db, **kwargs):
    start = time.monotonic()
    answer = lookup.lookup_config("hopper_matmul", shape, "bfloat16", db=db, default=FALLBACK,
                                  timeout_s=TIMEOUT_S, **kwargs)
    return answer, time.monotonic() - start


@pytest.mark.parametrize("make", list(UNUSABLE), ids=list(UNUSABLE))
def test_unusable_database_answers_the_default_and_warns_once(make, tmp_path, caplog, campaign):
    """A damaged file, a text file, a folder, a bad URL or a refused connection: the lookup
    answers the default in bounded time, with one WARNING naming the reason, password hidden."""
    url = UNUSABLE[make](tmp_path)
    before = sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*"))
    with caplog.at_level(logging.INFO, logger="autotune"):
        answer, elapsed = _timed_lookup(BIG, url)
        for shape in (MID, SMALL, BIG):
            assert _timed_lookup(shape, url)[0] == (Config(FALLBACK), "default")
    campaign.add(faults=1)
    assert answer == (Config(FALLBACK), "default")
    assert elapsed < BOUND_S
    (warning,) = _warnings(caplog)
    assert "cannot answer the run-time lookup" in warning.getMessage()
    assert "s3cret" not in caplog.text
    assert sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*")) == before


def test_damaged_pages_answer_the_default_and_leave_the_file_as_it_was(tmp_path, configs,
                                                                      caplog, campaign):
    """A database whose data pages are garbage (its schema intact, rollback-journal mode):
    the lookup answers the default and does not write a byte to the file."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)] + [({"m": 64 * i, "n": 64, "k": 64}, ok, 1.0, GPU)
                                         for i in range(2, 60)])
    path = tmp_path / "a.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for i in range(2, len(data) // page):  # every page but the schema's
        data[i * page:(i + 1) * page] = bytes([i % 251]) * page
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="autotune"):
        answer, elapsed = _timed_lookup(BIG, url)
    campaign.add(faults=1)
    assert answer == (Config(FALLBACK), "default")
    assert elapsed < BOUND_S
    assert len(_warnings(caplog)) == 1
    assert path.read_bytes() == bytes(data)


def test_locked_database_answers_within_the_timeout(tmp_path, configs, caplog, campaign):
    """Another process holds an exclusive lock (rollback-journal mode): the lookup waits
    timeout_s, not SQLite's 30 s, then answers the default."""
    from tests.fault_driver import hold_lock

    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])
    with sqlite3.connect(tmp_path / "a.db") as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    holder = hold_lock(tmp_path / "a.db", 30)
    try:
        with caplog.at_level(logging.WARNING, logger="autotune"):
            answer, elapsed = _timed_lookup(BIG, url)
    finally:
        holder.kill()
        holder.wait()
    campaign.add(faults=1)
    assert answer == (Config(FALLBACK), "default")
    assert elapsed < BOUND_S
    assert "locked" in _warnings(caplog)[0].getMessage()


def test_read_only_folder_answers_without_raising(tmp_path, configs, caplog, campaign):
    """A WAL database in a folder nothing may be created in (really: ``chattr +i`` as root):
    no SQLite shared-memory file can be made, so the lookup answers the default."""
    from tests.fault_driver import set_read_only

    folder = tmp_path / "ro"
    folder.mkdir()
    url = f"sqlite:///{folder}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])
    assert sorted(p.name for p in folder.iterdir()) == ["a.db"]
    set_read_only(folder / "a.db", True)
    try:
        if os.access(folder, os.W_OK) and os.geteuid() != 0:
            pytest.skip("the folder cannot be made read-only here")
        with caplog.at_level(logging.WARNING, logger="autotune"):
            answer, elapsed = _timed_lookup(BIG, url)
    finally:
        set_read_only(folder / "a.db", False)
    campaign.add(faults=1)
    assert answer == (Config(FALLBACK), "default")
    assert elapsed < BOUND_S
    assert len(_warnings(caplog)) == 1


@pytest.fixture
def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never says a word (a hung
    PostgreSQL server, as far as a client can tell)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()


def test_hung_postgresql_server_answers_within_the_bound(silent_server, caplog, campaign):
    """A server that accepts and never answers: the lookup answers the default within
    2 x timeout_s (it used to wait forever), and never shows the password."""
    url = f"postgresql://autotune:s3cret@127.0.0.1:{silent_server}/test"
    result: list = []
    with caplog.at_level(logging.WARNING, logger="autotune"):
        worker = threading.Thread(target=lambda: result.append(_timed_lookup(BIG, url)),
                                  daemon=True)
        worker.start()
        worker.join(60)
    campaign.add(faults=1)
    assert result, "the lookup did not return within 60 s"
    answer, elapsed = result[0]
    assert answer == (Config(FALLBACK), "default")
    assert elapsed < BOUND_S
    (warning,) = _warnings(caplog)
    assert "***" in warning.getMessage() and "s3cret" not in caplog.text


def test_strict_raises_storage_error_naming_the_reason(tmp_path):
    """strict=True: a database that cannot answer raises StorageError with the reason."""
    url = _garbage(tmp_path)
    with pytest.raises(StorageError, match="not an SQLite database.*strict=True"):
        _timed_lookup(BIG, url, strict=True)
    with pytest.raises(StorageError, match="strict=True"):  # remembered: not asked again
        _timed_lookup(MID, url, strict=True)


def test_a_failed_database_is_not_asked_again_until_the_retry_interval(tmp_path, configs,
                                                                        monkeypatch, caplog):
    """After a failure, lookups answer at once without touching the database; once the retry
    interval has passed it is asked again, and answers again once repaired."""
    ok, _ = configs
    good = tmp_path / "good.db"  # the repair, made beforehand: swapping it in takes no time
    _fill(f"sqlite:///{good}", [(BIG, ok, 50.0, GPU)])
    path = tmp_path / "a.db"
    path.write_bytes(b"\x00" * 4096 + b"not a database" * 100)
    url = f"sqlite:///{path}"
    asked = []
    real = queries.best_result
    monkeypatch.setattr(queries, "best_result", lambda *a, **k: asked.append(1) or real(*a, **k))
    monkeypatch.setenv(lookup.RETRY_ENV, "1.5")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert _timed_lookup(BIG, url)[0][1] == "default"
        for shape in (MID, SMALL, BIG, {"m": 512, "n": 512, "k": 512}):
            assert _timed_lookup(shape, url)[0][1] == "default"
        assert len(asked) == 1
        os.replace(good, path)
        assert _timed_lookup(BIG, url)[0][1] == "default"  # still within the interval
        time.sleep(1.6)
        assert _timed_lookup(BIG, url)[0] == (ok, "exact")
    assert len(asked) == 2
    assert len(_warnings(caplog)) == 1


def test_exported_table_is_the_fallback_when_valid(tmp_path, configs, caplog):
    """With the database unusable, a valid config of the exported table (``TUNED`` of
    ``autotune export --format python``) is answered; an invalid one is not."""
    from autotune.queries.exchange import render

    ok, not_small = configs
    records = [
        {"kernel": "hopper_matmul", "shape": dict(_problem(s).dims), "dtype": "bfloat16",
         "device": "NVIDIA H200", "device_kind": "gpu", "median_us": 1.0, "jax_version": "",
         "config": dict(c)}
        for s, c in ((BIG, ok), (SMALL, not_small))
    ]
    namespace: dict = {}
    exec(render(records, "python"), namespace)  # noqa: S102 - the exported module itself
    url = _garbage(tmp_path)
    module = types.SimpleNamespace(TUNED=namespace["TUNED"])
    assert _timed_lookup(BIG, url, table=module)[0] == (ok, "table")
    assert _timed_lookup(BIG, url, table=namespace["TUNED"])[0] == (ok, "table")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert _timed_lookup(SMALL, url, table=module)[0] == (Config(FALLBACK), "default")
    assert "not valid" in caplog.text


def test_decorator_passes_strict_table_and_timeout(tmp_path, configs):
    """tuned(..., table=, strict=, timeout_s=) reaches the lookup."""
    ok, _ = configs
    url = _garbage(tmp_path)

    @autotune.tuned("hopper_matmul", db=url, table={("hopper_matmul", tuple(sorted(
        _problem(BIG).dims.items())), "bfloat16"): dict(ok)}, timeout_s=TIMEOUT_S)
    def matmul(a, b, *, config=None):
        return config

    assert matmul(_Array((256, 256)), _Array((256, 256))) == ok

    @autotune.tuned("hopper_matmul", db=url, strict=True, timeout_s=TIMEOUT_S)
    def strict(a, b, *, config=None):
        return config

    with pytest.raises(StorageError):
        strict(_Array((256, 256)), _Array((256, 256)))


def test_healthy_database_on_both_backends_is_read_read_only(db_url, configs, campaign):
    """On SQLite and PostgreSQL, a healthy database answers as before through the read-only,
    time-bounded connection (PostgreSQL: the URL's own options kept)."""
    ok, other = configs
    _fill(db_url, [(BIG, ok, 50.0, GPU), (MID, other, 40.0, GPU)])
    assert lookup.lookup_config("hopper_matmul", BIG, "bf16", db=db_url,
                                timeout_s=TIMEOUT_S) == (ok, "exact")
    assert lookup.lookup_config("hopper_matmul", {"m": 128, "n": 128, "k": 256}, "bf16",
                                db=db_url)[1] == "nearest"


def _confirmed(url, shape, config, kernel_us, baseline_us, device=GPU, cache="warm"):
    """A search trial of ``config`` and a confirmation of it against the baseline, 3 rounds,
    timed under ``cache``."""
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    problem = _problem(shape)
    with Store(url) as store:
        tid = store.record_trial(problem, config, timed(kernel_us[0]), device=device,
                                 software=SOFTWARE, cache=cache).id
        confirmation = analyse_confirmation(
            [Candidate(dict(config), tuple((t,) * 5 for t in kernel_us), trial_id=tid)],
            tuple((t,) * 5 for t in baseline_us))
        store.record_confirmation(problem, confirmation, trial_ids=[tid], device=device,
                                  software=SOFTWARE, cache=cache, iterations=5,
                                  baseline_name="xla")


def test_tuned_routes_to_the_implementation_the_verdict_puts_ahead(tmp_path, configs):
    """With baseline=fn: the baseline runs for a shape whose confirmed speedup lies wholly below
    1.0 and for a tie (its interval holding 1.0) whose estimate puts the baseline ahead; the
    kernel where the interval lies above 1.0, for a tie whose estimate puts the kernel ahead,
    and where nothing is confirmed for the shape (a nearest answer); prefer="kernel" always
    runs the kernel; a given config is used as is. ``faster`` still says what was measured
    ("tie"), ``runs`` the route."""
    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))  # XLA faster
    _confirmed(url, MID, everywhere, (100.2, 100.4, 100.1), (99.9, 100.5, 100.0))  # a tie, XLA ahead
    _confirmed(url, TIE_KERNEL, everywhere, (100.0, 100.2, 99.9), (99.8, 100.4, 100.1))  # kernel ahead
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))  # kernel faster
    calls = []

    def xla(a, b, **kw):
        calls.append(("xla", a.shape[0], kw))
        return "xla"

    def kernel_fn(a, b, *, config=None, **kw):
        calls.append(("kernel", a.shape[0], config))
        return "kernel"

    def arrays(n):
        return (types.SimpleNamespace(shape=(n, n), dtype="bfloat16"),
                types.SimpleNamespace(shape=(n, n), dtype="bfloat16"))

    fast = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    assert [fast(*arrays(n)) for n in (64, 128, 192, 256, 512)] == [
        "xla", "xla", "kernel", "kernel", "kernel"]
    assert [c[:2] for c in calls] == [
        ("xla", 64), ("xla", 128), ("kernel", 192), ("kernel", 256), ("kernel", 512)]
    assert fast(*arrays(64), precision="high") == "xla" and calls[-1] == ("xla", 64, {"precision": "high"})
    assert fast(*arrays(64), config={"tile_m": 64}) == "kernel"
    forced = autotune.tuned("hopper_matmul", db=url, baseline=xla, prefer="kernel")(kernel_fn)
    assert forced(*arrays(64)) == "kernel"
    plain = autotune.tuned("hopper_matmul", db=url)(kernel_fn)
    assert plain(*arrays(64)) == "kernel"
    choice = lookup.lookup_choice("hopper_matmul", SMALL, "bfloat16", db=url)
    assert (choice.config, choice.source, choice.faster, choice.runs) == (
        everywhere, "exact", "baseline", "baseline")
    tie = lookup.lookup_choice("hopper_matmul", MID, "bfloat16", db=url)
    assert (tie.source, tie.faster, tie.runs) == ("exact", "tie", "baseline")
    tie = lookup.lookup_choice("hopper_matmul", TIE_KERNEL, "bfloat16", db=url)
    assert (tie.source, tie.faster, tie.runs) == ("exact", "tie", "kernel")
    big = lookup.lookup_choice("hopper_matmul", BIG, "bfloat16", db=url)
    assert (big.faster, big.runs) == ("kernel", "kernel")
    near = lookup.lookup_choice("hopper_matmul", {"m": 512, "n": 512, "k": 512}, "bfloat16", db=url)
    assert (near.source, near.faster, near.runs) == ("nearest", "tie", "kernel")
    with pytest.raises(ValueError, match="prefer must be one of"):
        autotune.tuned("hopper_matmul", prefer="xla")


def test_tuned_routes_by_the_timings_of_the_cache_policy_asked_for(tmp_path, configs):
    """A problem whose cold and warm confirmations disagree (the baseline faster with the L2
    flushed, the kernel faster back to back): ``cache="cold"`` routes to the baseline,
    ``cache="warm"`` to the kernel at the warm winner's config, None to the cold answer (cold
    results come first); a shape with nothing of the policy asked for is answered as if nothing
    were stored; a policy that does not exist is refused at decoration, naming the value."""
    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, not_small = configs
    _confirmed(url, MID, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2), cache="cold")
    _confirmed(url, MID, not_small, (80.0, 80.2, 80.1), (90.0, 90.3, 89.9), cache="warm")
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9), cache="warm")

    def arrays(n):
        return (types.SimpleNamespace(shape=(n, n), dtype="bfloat16"),
                types.SimpleNamespace(shape=(n, n), dtype="bfloat16"))

    def kernel_fn(a, b, *, config=None):
        return ("kernel", config)

    def xla(a, b):
        return ("xla", None)

    cold = autotune.tuned("hopper_matmul", db=url, baseline=xla, cache="cold")(kernel_fn)
    warm = autotune.tuned("hopper_matmul", db=url, baseline=xla, cache="warm")(kernel_fn)
    either = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    assert cold(*arrays(128)) == ("xla", None)
    assert warm(*arrays(128)) == ("kernel", not_small)
    assert either(*arrays(128)) == ("xla", None)
    assert lookup.lookup_choice("hopper_matmul", MID, "bfloat16", db=url, cache="warm").faster \
        == "kernel"
    assert lookup.lookup_choice("hopper_matmul", MID, "bfloat16", db=url, cache="cold").faster \
        == "baseline"
    # 256^3 has warm results only: cold asks find nothing exact (the nearest is a tie).
    assert lookup.lookup_choice("hopper_matmul", BIG, "bfloat16", db=url, cache="cold").source \
        != "exact"
    assert lookup.stored_here("hopper_matmul", BIG, "bfloat16", db=url, cache="warm")
    assert not lookup.stored_here("hopper_matmul", BIG, "bfloat16", db=url, cache="cold")
    with pytest.raises(autotune.JobError, match=r"cache=.*'hot'"):
        autotune.tuned("hopper_matmul", db=url, cache="hot")


def test_tuned_baseline_true_calls_the_kernels_own_baseline(tmp_path, configs, monkeypatch):
    """baseline=True takes the kernel's own baseline for the problem (made once, cached)."""
    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    made = []

    def fake_baseline(problem):
        made.append(problem)
        return lambda a, b: f"baseline of {problem.dims['m']}"

    monkeypatch.setattr(lookup, "_kernel", lambda k: dataclasses_replace(KERNEL, baseline=fake_baseline))
    fn = autotune.tuned("hopper_matmul", db=url, baseline=True)(lambda a, b, *, config=None: "kernel")
    a = types.SimpleNamespace(shape=(64, 64), dtype="bfloat16")
    assert fn(a, a) == fn(a, a) == "baseline of 64"
    assert len(made) == 1


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")


def test_another_gpus_winner_is_a_labelled_fallback_never_a_measurement_here(
        tmp_path, configs, monkeypatch, caplog):
    """In a process on an H100, the H200's winners are never served as "exact" or "nearest":
    the H100's own exact or nearest answer comes first, even when slower; with nothing of the
    H100 stored, the H200's answer is "other_device", logged naming this GPU; an exported
    table for the problem beats it."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, other = configs
    monkeypatch.setattr(lookup, "_this_gpu", lambda: H100.name)
    _fill(url, [(BIG, other, 10.0, GPU)])
    with caplog.at_level(logging.INFO, logger="autotune.queries.lookup"):
        assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == (other, "other_device")
    assert "nothing stored for this NVIDIA H100 80GB HBM3" in caplog.text
    lookup.clear_cache()
    table = {("hopper_matmul", tuple(sorted(BIG.items())), "bfloat16"): dict(ok)}
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url, table=table) == (ok, "table")
    lookup.clear_cache()
    _fill(url, [(MID, ok, 30.0, H100)])  # the H100's nearest beats the H200's exact
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == (ok, "nearest")
    lookup.clear_cache()
    _fill(url, [(BIG, ok, 50.0, H100)])
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == (ok, "exact")
    lookup.clear_cache()
    monkeypatch.setattr(lookup, "_this_gpu", lambda: None)  # no GPU here: any GPU's, as before
    assert lookup.lookup_config("hopper_matmul", BIG, "bfloat16", db=url) == (other, "exact")


def test_this_gpu_never_imports_jax(monkeypatch):
    """The lookup asks only a JAX the program already imported which GPU it runs on."""
    import sys

    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert lookup._this_gpu() is None
    assert "jax" not in sys.modules


def test_a_timed_out_retry_never_leaves_a_second_blocked_thread(monkeypatch, campaign):
    """A database whose driver call blocks for good: each retry after the interval finds the
    first helper thread still blocked and answers the fallback at once, without starting (and
    leaving behind) another blocked thread; once that thread returns, asking works again."""
    import threading

    from autotune.queries import lookup as lk

    monkeypatch.setenv(lk.RETRY_ENV, "0")
    release = threading.Event()
    asked = []

    def hang(timeout_s):
        asked.append(timeout_s)
        release.wait(30)
        return "answer"

    where = "sqlite:///hung-forever.db"
    lk.clear_cache()
    try:
        for _ in range(5):
            campaign.add(faults=1)
            with pytest.raises(lk._Unavailable):
                lk._ask_database(where, strict=False, timeout_s=0.05, ask=hang)
        blocked = [t for t in threading.enumerate() if t.name == "autotune-lookup" and t.is_alive()]
        assert len(asked) == 1 and len(blocked) == 1, (asked, blocked)
        release.set()
        blocked[0].join(5)
        assert lk._ask_database(where, strict=False, timeout_s=1, ask=lambda t: "answer") == "answer"
    finally:
        release.set()
        lk.clear_cache()


def test_the_exported_table_carries_the_choice_and_routes_like_the_database(tmp_path, configs):
    """The python export's CHOICE says which implementation wins each problem (baseline,
    kernel, tie) and which runs (the baseline for the tie too) with the words and interval; its
    choose() answers ("baseline", name) where the baseline is faster or tied, else ("kernel",
    config); and tuned(table=module, baseline=fn) with the database gone routes every shape
    exactly as the database-backed decorator does."""
    from autotune.queries import exchange

    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))  # XLA faster
    _confirmed(url, MID, everywhere, (100.2, 100.4, 100.1), (99.9, 100.5, 100.0))  # a tie, XLA ahead
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))  # kernel faster
    records = exchange.export_records(url)
    by_m = {r["shape"]["m"]: r for r in records}
    assert [by_m[m]["faster"] for m in (64, 128, 256)] == ["baseline", "tie", "kernel"]
    assert [by_m[m]["runs"] for m in (64, 128, 256)] == ["baseline", "baseline", "kernel"]
    assert by_m[64]["baseline_name"] == "xla" and by_m[64]["speedup_high"] < 1.0
    assert by_m[64]["choice"].startswith("xla is ") and "faster (interval" in by_m[64]["choice"]
    assert "the kernel's best config is" in by_m[64]["choice"]
    assert by_m[256]["choice"].startswith("the kernel is ")
    assert by_m[128]["choice"].startswith("no faster than xla (within the measured noise: ")
    assert ": xla runs; the kernel's best config is" in by_m[128]["choice"]
    module = types.ModuleType("tuned_table")
    exec(compile(exchange.render(records, "python"), "tuned_table.py", "exec"), module.__dict__)
    key = ("hopper_matmul", tuple(sorted(SMALL.items())), "bfloat16")
    assert module.CHOICE["default"][key]["faster"] == "baseline"
    mid_key = ("hopper_matmul", tuple(sorted(MID.items())), "bfloat16")
    assert (module.CHOICE["default"][mid_key]["faster"],
            module.CHOICE["default"][mid_key]["runs"]) == ("tie", "baseline")
    assert module.choose("hopper_matmul", SMALL, "bf16") == ("baseline", "xla")
    assert module.choose("hopper_matmul", BIG, "bf16") == ("kernel", dict(everywhere))
    assert module.choose("hopper_matmul", MID, "bf16") == ("baseline", "xla")
    assert module.choose("hopper_matmul", {"m": 1, "n": 1, "k": 1}, "bf16") is None

    def arrays(n):
        return (types.SimpleNamespace(shape=(n, n), dtype="bfloat16"),
                types.SimpleNamespace(shape=(n, n), dtype="bfloat16"))

    def kernel_fn(a, b, *, config=None):
        return ("kernel", dict(config))

    def xla(a, b):
        return ("xla", None)

    from_db = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    lookup.clear_cache()
    gone = f"sqlite:///{tmp_path}/gone.db"
    from_table = autotune.tuned("hopper_matmul", db=gone, table=module, baseline=xla)(kernel_fn)
    for n in (64, 128, 256):
        assert from_table(*arrays(n)) == from_db(*arrays(n)), n
    assert [from_table(*arrays(n)) for n in (64, 128, 256)] == [
        ("xla", None), ("xla", None), ("kernel", dict(everywhere))]
    assert lookup.lookup_choice("hopper_matmul", SMALL, "bfloat16", db=gone,
                                table=module).faster == "baseline"
    tie = lookup.lookup_choice("hopper_matmul", MID, "bfloat16", db=gone, table=module)
    assert (tie.source, tie.faster, tie.runs) == ("table", "tie", "baseline")
    # A bare TUNED dict carries no choice: the kernel runs.
    bare = autotune.tuned("hopper_matmul", db=gone, table=module.TUNED, baseline=xla)(kernel_fn)
    assert bare(*arrays(64)) == ("kernel", dict(everywhere))


def test_a_program_check_tie_routes_to_the_baseline_where_cupti_puts_the_kernel_ahead(
        tmp_path, configs):
    """The H200's miss (benchmarks/RESULTS.md §19): the confirmation (CUPTI kernel times) puts
    the kernel ahead, the program check ties (its interval holds 1.0, its median below 1.0).
    The tie decides: faster "tie", runs "baseline", and the baseline runs through the
    database, best_result and its dict, the export's record, CHOICE and choose(), and
    tuned(table=module) with the database gone."""
    from autotune.queries import exchange

    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))  # kernel, CUPTI
    _program_check(url, BIG, everywhere, (100.0, 99.0, 101.5), (99.5, 100.5, 99.0))  # a tie
    best = queries.best_result("hopper_matmul", BIG, "bfloat16", db=url)
    verdict = best.verdict_figures
    assert best.confirmed_speedup > 1.0 and best.speedup_low > 1.0
    assert verdict.source == "program-check" and verdict.speedup < 1.0
    assert verdict.low <= 1.0 <= verdict.high
    assert (best.faster, best.runs) == ("tie", "baseline")
    payload = best.to_dict()
    assert (payload["faster"], payload["runs"]) == ("tie", "baseline")
    assert payload["choice"].startswith("no faster than xla (within the measured noise: ")
    assert ": xla runs; the kernel's best config is" in payload["choice"]
    choice = lookup.lookup_choice("hopper_matmul", BIG, "bfloat16", db=url)
    assert (choice.config, choice.source, choice.faster, choice.runs) == (
        everywhere, "exact", "tie", "baseline")
    calls = []

    def xla(a, b):
        calls.append("xla")
        return "xla"

    def kernel_fn(a, b, *, config=None):
        calls.append("kernel")
        return "kernel"

    assert autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)(*_arrays(256)) == "xla"
    assert autotune.tuned("hopper_matmul", db=url, baseline=xla, prefer="kernel")(kernel_fn)(
        *_arrays(256)) == "kernel"
    assert calls == ["xla", "kernel"]
    records = exchange.export_records(url)
    assert [(r["faster"], r["runs"], r["verdict_source"]) for r in records] == [
        ("tie", "baseline", "program-check")]
    module = types.ModuleType("tuned_table")
    exec(compile(exchange.render(records, "python"), "tuned_table.py", "exec"), module.__dict__)
    assert module.choose("hopper_matmul", BIG, "bf16") == ("baseline", "xla")
    lookup.clear_cache()
    gone = f"sqlite:///{tmp_path}/gone.db"
    from_table = autotune.tuned("hopper_matmul", db=gone, table=module, baseline=xla)(kernel_fn)
    assert from_table(*_arrays(256)) == "xla"
    queries.close_stores()


def test_a_program_check_tie_runs_the_kernel_only_where_cupti_agrees(tmp_path, configs):
    """The H100's miss (benchmarks/RESULTS.md §19): the program check ties with its estimate
    above 1.0 while the confirmation (CUPTI kernel times) puts the baseline ahead. Where the two
    disagree the baseline runs, through best_result and its dict, lookup_choice, tuned, the
    export's record and its CHOICE with the database gone; where CUPTI also puts the kernel
    ahead, the same tie runs the kernel."""
    from autotune.queries import exchange

    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, BIG, everywhere, (100.0, 100.2, 100.1), (92.0, 92.1, 92.2))  # XLA, CUPTI
    _program_check(url, BIG, everywhere, (99.0, 100.5, 99.5), (100.0, 99.0, 101.5))  # a tie
    _confirmed(url, MID, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))  # kernel, CUPTI
    _program_check(url, MID, everywhere, (99.0, 100.5, 99.5), (100.0, 99.0, 101.5))  # a tie
    best = queries.best_result("hopper_matmul", BIG, "bfloat16", db=url)
    verdict = best.verdict_figures
    assert verdict.source == "program-check" and verdict.speedup > 1.0
    assert verdict.low <= 1.0 <= verdict.high and verdict.other == best.confirmed_speedup < 1.0
    assert (best.faster, best.runs) == ("tie", "baseline")
    payload = best.to_dict()
    assert (payload["faster"], payload["runs"]) == ("tie", "baseline")
    assert ": xla runs; the kernel's best config is" in payload["choice"]
    agreed = queries.best_result("hopper_matmul", MID, "bfloat16", db=url)
    assert (agreed.faster, agreed.runs, agreed.verdict_figures.other > 1.0) == (
        "tie", "kernel", True)
    assert ": the kernel runs with config" in agreed.to_dict()["choice"]
    choice = lookup.lookup_choice("hopper_matmul", BIG, "bfloat16", db=url)
    assert (choice.source, choice.faster, choice.runs) == ("exact", "tie", "baseline")

    def xla(a, b):
        return "xla"

    def kernel_fn(a, b, *, config=None):
        return "kernel"

    routed = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    assert (routed(*_arrays(256)), routed(*_arrays(128))) == ("xla", "kernel")
    records = {r["shape"]["m"]: r for r in exchange.export_records(url)}
    assert (records[256]["runs"], records[128]["runs"]) == ("baseline", "kernel")
    module = types.ModuleType("tuned_table")
    exec(compile(exchange.render(list(records.values()), "python"), "tuned_table.py", "exec"),
         module.__dict__)
    assert module.choose("hopper_matmul", BIG, "bf16") == ("baseline", "xla")
    lookup.clear_cache()
    gone = f"sqlite:///{tmp_path}/gone.db"
    from_table = autotune.tuned("hopper_matmul", db=gone, table=module, baseline=xla)(kernel_fn)
    assert (from_table(*_arrays(256)), from_table(*_arrays(128))) == ("xla", "kernel")
    queries.close_stores()


def test_without_a_verdict_for_exactly_the_problem_the_kernel_runs(tmp_path, configs,
                                                                   monkeypatch):
    """No verdict, no route to the baseline: a nearest answer (its neighbour's verdict the
    baseline faster, or a tie), a default answer, another GPU's answer, a bare TUNED dict and
    a CHOICE entry without runs or an interval (an older export) saying "tie" all run the
    kernel. An older entry without runs but with its interval is routed by that interval (a
    tie, by its estimate); one without an interval runs the baseline only where it says the
    baseline is faster; the table's own choose() routes such entries by "faster"."""
    from autotune.queries import exchange

    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))  # XLA faster
    _confirmed(url, MID, everywhere, (100.2, 100.4, 100.1), (99.9, 100.5, 100.0))  # a tie, XLA ahead

    def xla(a, b):
        return "xla"

    def kernel_fn(a, b, *, config=None):
        return "kernel"

    def both(shape, **kw):
        """(lookup_choice's source, faster, runs; what tuned(baseline=xla) runs)."""
        lookup.clear_cache()
        choice = lookup.lookup_choice("hopper_matmul", shape, "bfloat16", **kw)
        arrays = (types.SimpleNamespace(shape=(shape["m"], shape["k"]), dtype="bfloat16"),
                  types.SimpleNamespace(shape=(shape["k"], shape["n"]), dtype="bfloat16"))
        ran = autotune.tuned("hopper_matmul", baseline=xla, **kw)(kernel_fn)(*arrays)
        return choice.source, choice.faster, choice.runs, ran

    assert both(SMALL, db=url) == ("exact", "baseline", "baseline", "xla")
    assert both(MID, db=url) == ("exact", "tie", "baseline", "xla")
    # Nearest SMALL (XLA faster there) and nearest MID (a tie there): not this problem's verdict.
    assert both({"m": 64, "n": 64, "k": 128}, db=url) == ("nearest", "tie", "kernel", "kernel")
    assert both({"m": 128, "n": 128, "k": 64}, db=url) == ("nearest", "tie", "kernel", "kernel")
    empty = f"sqlite:///{tmp_path}/empty.db"
    with Store(empty):
        pass
    assert both(SMALL, db=empty) == ("default", "tie", "kernel", "kernel")
    with monkeypatch.context() as mp:  # an H100 here; the H200's verdicts are not its own
        mp.setattr(lookup, "_this_gpu", lambda: H100.name)
        assert both(SMALL, db=url) == ("other_device", "tie", "kernel", "kernel")
        assert both(MID, db=url) == ("other_device", "tie", "kernel", "kernel")
    # Exported tables, read with the database gone.
    records = exchange.export_records(url)
    gone = f"sqlite:///{tmp_path}/gone.db"
    module = types.ModuleType("tuned_table")
    exec(compile(exchange.render(records, "python"), "tuned_table.py", "exec"), module.__dict__)
    assert both(MID, db=gone, table=module) == ("table", "tie", "baseline", "xla")
    assert both(MID, db=gone, table=module.TUNED) == ("table", "tie", "kernel", "kernel")
    entries = module.CHOICE["default"]
    small_key, mid_key = (("hopper_matmul", tuple(sorted(s.items())), "bfloat16")
                          for s in (SMALL, MID))
    for entry in entries.values():  # an export older than "runs": its interval still there
        del entry["runs"]
    assert both(MID, db=gone, table=module) == ("table", "tie", "baseline", "xla")
    assert both(SMALL, db=gone, table=module) == ("table", "baseline", "baseline", "xla")
    for entry in entries.values():  # nor an interval: no verdict to route by
        entry.update(speedup=None, speedup_low=None, speedup_high=None)
    assert both(MID, db=gone, table=module) == ("table", "tie", "kernel", "kernel")
    assert both(SMALL, db=gone, table=module) == ("table", "baseline", "baseline", "xla")
    assert module.choose("hopper_matmul", MID, "bf16") == ("kernel", dict(everywhere))
    assert module.choose("hopper_matmul", SMALL, "bf16") == ("baseline", "xla")
    entries[mid_key] = "tie"  # a hand-written entry: the word alone
    entries[small_key] = "baseline"
    assert both(MID, db=gone, table=module) == ("table", "tie", "kernel", "kernel")
    assert both(SMALL, db=gone, table=module) == ("table", "baseline", "baseline", "xla")
    queries.close_stores()


def test_the_cached_call_is_answered_per_signature_and_forgotten_with_the_cache(tmp_path, configs):
    """A repeated call of a cached shape never asks the lookup again (one dict hit keyed on the
    arrays' shapes and dtypes); another dtype or shape is its own entry; a positional that is
    not an array is part of the key; clear_cache() forgets the decorator's answers too."""
    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])
    asked = []
    real = lookup._choose

    def counting(*args, **kw):
        asked.append(args[1])
        return real(*args, **kw)

    import pytest as _pytest

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(lookup, "_choose", counting)
        fn = autotune.tuned("hopper_matmul", db=url)(lambda a, b, *rest, config=None: config)
        a = types.SimpleNamespace(shape=(256, 256), dtype="bfloat16")
        for _ in range(5):
            assert fn(a, a) == ok
        assert len(asked) == 1
        fn(a, a, True)  # a non-array positional: its own key
        fn(a, a, True)
        assert len(asked) == 2
        small = types.SimpleNamespace(shape=(64, 64), dtype="bfloat16")
        fn(small, small)
        assert len(asked) == 3
        lookup.clear_cache()
        assert fn(a, a) == ok and len(asked) == 4
        fn(a, a, [1])  # unhashable: answered, never cached
        fn(a, a, [1])
        assert len(asked) == 6


def test_under_jit_the_decorator_runs_when_the_program_is_traced_only(tmp_path, configs):
    """Under jax.jit the decorator (the call's signature, its cached answer, the route) runs
    while the program is traced; the compiled program's later calls never enter it, so a
    jitted program pays nothing per call for it, where an eager call pays about a microsecond
    (docs/guarantees.md, "The choice is cached per call signature")."""
    import jax
    import jax.numpy as jnp

    url = f"sqlite:///{tmp_path}/a.db"
    ok, _ = configs
    _fill(url, [(BIG, ok, 50.0, GPU)])
    entered = []

    def body(a, b, *, config=None):
        entered.append(dict(config))
        return a + b

    fn = autotune.tuned("hopper_matmul", db=url)(body)
    program = jax.jit(lambda a, b: fn(a, b) * 2)
    a = jnp.ones((256, 256), jnp.bfloat16)
    for _ in range(3):
        jax.block_until_ready(program(a, a))
    assert entered == [dict(ok)]
    fn(a, a)  # eager: the decorator runs at every call
    fn(a, a)
    assert entered == [dict(ok)] * 3


def _program_check(url, shape, config, kernel_us, baseline_us, *, confirmation_id=None,
                   cache="warm"):
    """A program check (a verification row of method PROGRAM_METHOD) of ``shape``'s newest
    confirmation of ``cache`` (or of ``confirmation_id``): ``config`` and the baseline, 3 paired
    rounds of these times. Returns the confirmation id it is tied to."""
    from autotune.space.outcomes import PROGRAM_METHOD
    from autotune.tuning.verify import VerifyTarget, analyse

    problem = _problem(shape)
    with Store(url) as store:
        if confirmation_id is None:
            confirmation_id = store.confirmations(problem, cache=cache, limit=1)[0].id
        stored = next(c for c in store.confirmations(problem) if c.id == confirmation_id)
        target = VerifyTarget(problem, Config(config), (), stored.speedup, None, None, "xla",
                              confirmation_id)
        check = analyse(target, [(t,) for t in kernel_us], [(t,) for t in baseline_us],
                        method=PROGRAM_METHOD, calls=20)
        store.record_verification(problem, check, device=GPU, software=SOFTWARE)
    return confirmation_id


def _arrays(n):
    return (types.SimpleNamespace(shape=(n, n), dtype="bfloat16"),
            types.SimpleNamespace(shape=(n, n), dtype="bfloat16"))


def test_the_program_check_decides_the_route_over_the_confirmation(db_url, configs):
    """On SQLite (read through the stdlib reader) and PostgreSQL (through a Store): where the
    confirmation (CUPTI kernel times) puts XLA ahead beyond its interval but the program check
    puts the kernel ahead, lookup_choice says "kernel" and tuned(baseline=fn) runs the kernel;
    the reverse routes to the baseline; a program check of an OLDER confirmation never answers
    for the newer one (its CUPTI verdict decides); a verification of another method is no
    program check. best_result carries both figures and names the source."""
    url = db_url
    everywhere, _ = configs
    # 64^3: XLA faster by CUPTI (5%), the kernel faster as a program calls them (10%).
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    _program_check(url, SMALL, everywhere, (90.0, 90.5, 90.2), (100.0, 99.5, 100.2))
    # 256^3: the kernel faster by CUPTI, XLA faster as a program calls them.
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))
    _program_check(url, BIG, everywhere, (100.0, 100.4, 100.2), (95.0, 95.3, 95.1))
    # 128^3: an older round's check (the kernel faster) under a newer round (XLA faster by
    # CUPTI, no check of its own; a verification of another method tied to it is no check).
    _confirmed(url, MID, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    older = _program_check(url, MID, everywhere, (90.0, 90.5, 90.2), (100.0, 99.5, 100.2))
    _confirmed(url, MID, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    with Store(url) as store:
        newer = store.confirmations(_problem(MID), limit=1)[0].id
        from autotune.tuning.verify import VerifyTarget, analyse

        other = analyse(VerifyTarget(_problem(MID), everywhere, (), None, None, None, "xla",
                                     newer),
                        [(80.0,)] * 3, [(100.0,)] * 3, method="cupti-independent", calls=1)
        store.record_verification(_problem(MID), other, device=GPU, software=SOFTWARE)
    assert newer != older

    def choice(shape):
        return lookup.lookup_choice("hopper_matmul", shape, "bfloat16", db=url)

    assert (choice(SMALL).config, choice(SMALL).faster) == (everywhere, "kernel")
    assert choice(BIG).faster == "baseline"
    assert choice(MID).faster == "baseline"  # the older round's check is ignored
    calls = []

    def xla(a, b):
        calls.append(("xla", a.shape[0]))
        return "xla"

    def kernel_fn(a, b, *, config=None):
        calls.append(("kernel", a.shape[0]))
        return "kernel"

    fast = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    assert [fast(*_arrays(n)) for n in (64, 128, 256)] == ["kernel", "xla", "xla"]
    assert calls == [("kernel", 64), ("xla", 128), ("xla", 256)]

    small = queries.best_result("hopper_matmul", SMALL, "bfloat16", db=url)
    assert small.confirmed_speedup < 1.0 and small.speedup_high < 1.0  # CUPTI: XLA faster
    assert small.program_speedup == pytest.approx(100.2 / 90.2) and small.program_speedup_low > 1
    assert small.verdict_figures.source == "program-check" and small.faster == "kernel"
    assert small.verdict == "11.1% faster than xla"
    assert small.confirmation_verdict.startswith("slower than xla")
    mid = queries.best_result("hopper_matmul", MID, "bfloat16", db=url)
    assert mid.program_check_id is None and mid.verdict_figures.source == "confirmation"
    queries.close_stores()


def test_the_export_carries_the_program_checks_verdict_through_json_python_and_import(
        tmp_path, configs):
    """Exports carry no verification rows: the program check's verdict travels as the
    records' "faster" and "choice", beside both figures (program_speedup* and the confirmed
    speedup) and verdict_source; the JSON export imports back (its new keys are known); the
    python table's CHOICE and choose() follow the program check, and tuned(table=module) with
    the database gone routes every shape as the database did."""
    import json

    from autotune.queries import exchange

    url = f"sqlite:///{tmp_path}/r.db"
    everywhere, _ = configs
    _confirmed(url, SMALL, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    _program_check(url, SMALL, everywhere, (90.0, 90.5, 90.2), (100.0, 99.5, 100.2))
    _confirmed(url, BIG, everywhere, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))
    _program_check(url, BIG, everywhere, (100.0, 100.4, 100.2), (95.0, 95.3, 95.1))
    _confirmed(url, MID, everywhere, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))  # no check
    records = exchange.export_records(url)
    by_m = {r["shape"]["m"]: r for r in records}
    assert [by_m[m]["faster"] for m in (64, 128, 256)] == ["kernel", "baseline", "baseline"]
    assert [by_m[m]["verdict_source"] for m in (64, 128, 256)] == \
        ["program-check", "confirmation", "program-check"]
    assert by_m[64]["confirmed_speedup"] < 1.0 and by_m[64]["speedup_high"] < 1.0
    assert by_m[64]["program_speedup"] == pytest.approx(100.2 / 90.2)
    assert by_m[64]["program_speedup_low"] > 1.0
    assert by_m[64]["choice"].startswith("the kernel is 11.1% faster than xla")
    assert by_m[128]["program_speedup"] is None
    text = exchange.render(records, "json")
    assert [r["faster"] for r in json.loads(text)["records"]] == [r["faster"] for r in records]
    path = tmp_path / "export.json"
    path.write_text(text)
    assert exchange.import_json(path, f"sqlite:///{tmp_path}/imported.db") == (3, 0)
    assert [by_m[m]["runs"] for m in (64, 128, 256)] == ["kernel", "baseline", "baseline"]
    csv_text = exchange.render(records, "csv")
    assert csv_text.splitlines()[0].endswith(
        "program_speedup,program_speedup_low,program_speedup_high,verdict_source,runs")
    module = types.ModuleType("tuned_table")
    exec(compile(exchange.render(records, "python"), "tuned_table.py", "exec"), module.__dict__)
    key = ("hopper_matmul", tuple(sorted(SMALL.items())), "bfloat16")
    entry = module.CHOICE["default"][key]
    assert (entry["faster"], entry["source"]) == ("kernel", "program-check")
    assert entry["speedup"] == pytest.approx(100.2 / 90.2) and entry["speedup_low"] > 1.0
    assert module.choose("hopper_matmul", SMALL, "bf16") == ("kernel", dict(everywhere))
    assert module.choose("hopper_matmul", BIG, "bf16") == ("baseline", "xla")

    def kernel_fn(a, b, *, config=None):
        return "kernel"

    def xla(a, b):
        return "xla"

    from_db = autotune.tuned("hopper_matmul", db=url, baseline=xla)(kernel_fn)
    expected = [from_db(*_arrays(n)) for n in (64, 128, 256)]
    assert expected == ["kernel", "xla", "xla"]
    lookup.clear_cache()
    gone = f"sqlite:///{tmp_path}/gone.db"
    from_table = autotune.tuned("hopper_matmul", db=gone, table=module, baseline=xla)(kernel_fn)
    assert [from_table(*_arrays(n)) for n in (64, 128, 256)] == expected
    queries.close_stores()

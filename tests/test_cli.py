"""The command line: spaces, tune (interpret mode, end to end; a fake engine for the rest),
best, results, exit codes, and the first-contact conventions of issue 14 (did-you-mean errors,
broken pipes, global flags, one result schema, progress, dry runs, interpret honesty, Optuna)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path

import optuna
import pytest

from autotune import cli
from autotune.cli import main
from autotune.space.kernel import bundled_kernels
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Config
from autotune.storage.store import Store
from tests.cli_in_process import cli_here
from tests.kernels_for_tests import toy_matmul, unbuilt

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m autotune ARGS`` in a fresh process, from the repo root."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=full_env, check=False,
    )


def test_spaces_lists_bundled_kernels_name_first(capsys):
    """`autotune spaces` prints one bundled kernel per line, name first."""
    assert main(["spaces"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == bundled_kernels()


def test_spaces_json_uses_tuning_config_names(capsys):
    """--json prints kernel, shape, dtype, device (its facts), valid, raw and configs with
    TuningConfig field names."""
    assert main(["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--dtype", "bf16",
                 "--sample", "7", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"kernel", "shape", "dtype", "device", "valid", "raw", "configs"}
    assert data["dtype"] == "bfloat16" and data["shape"] == {"m": 4096, "n": 4096, "k": 4096}
    assert 0 < data["valid"] < data["raw"] and len(data["configs"]) == 7
    fields = {"tile_m", "tile_n", "tile_k", "max_concurrent_steps", "epi_tile_n", "epi_tile_m",
              "grid_minor_dim", "grid_tile_width", "wg_dimension", "cluster_dimension"}
    for config in data["configs"]:
        assert set(config) == fields
        assert config["grid_minor_dim"] in ("M", "N") and config["cluster_dimension"] in (None, "M", "N")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["spaces", "nope", "--shape", "m=1"], "Unknown kernel 'nope'"),
        (["spaces", "hopper_matmul", "--shape", "m=4096"], "needs shape key"),
        (["spaces", "hopper_matmul", "--shape", "m=4096;n=1"], "not key=value"),
        (["spaces", "hopper_matmul", "--shape", "m=100,n=4096,k=4096", "--dtype", "bf16"], "No valid config"),
        (["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--dtype", "float12"], "Unknown dtype"),
        (["spaces", "hopper_attention", "--shape", "batch=1,seq_q=1024,seq_kv=1024,heads_q=8,heads_kv=8,head_dim=128",
          "--dtype", "bf16"], "No valid config"),
        (["tune", "does-not-exist.toml"], "does not exist"),
        (["tune", "examples/quickstart.toml", "--trials", "0"], "--trials must be a positive"),
        (["tune", "examples/quickstart.toml", "--sampler", "annealing"], "--sampler 'annealing' is unknown"),
        (["tune", "examples/quickstart.toml", "--gpus", "0,x"], "--gpus must be"),
        (["best", "hopper_matmul", "--shape", "m=1", "--dtype", "f12"], "Unknown dtype"),
    ],
)
def test_bad_input_exits_2_with_a_named_rule(argv, message, capsys, monkeypatch, tmp_path):
    """Bad input: exit code 2 and a message naming the field, the value and what is allowed."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("AUTOTUNE_DB", f"sqlite:///{tmp_path}/never.db")
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never.db").exists()


def test_best_exits_1_when_nothing_is_tuned(tmp_path, capsys):
    """`autotune best` on an empty database exits 1 with a clear message."""
    code = main(["best", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--dtype", "bf16",
                 "--db", f"sqlite:///{tmp_path}/empty.db"])
    assert code == 1 and "nothing tuned" in capsys.readouterr().err


def test_best_json_with_nothing_tuned_prints_null(tmp_path, capsys):
    """`best --json` with nothing tuned prints valid JSON (null) on stdout, the reason on
    stderr, exit 1 (it printed nothing, which a JSON reader cannot parse)."""
    code = main(["best", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--dtype", "bf16",
                 "--db", f"sqlite:///{tmp_path}/empty.db", "--json"])
    captured = capsys.readouterr()
    assert code == 1 and json.loads(captured.out) is None and "nothing tuned" in captured.err


def test_bad_db_url_exits_2(tmp_path, capsys):
    """An unusable --db URL is a clear error with exit code 2."""
    code = main(["results", "--db", "notadialect://x"])
    assert code == 2
    assert "notadialect" in capsys.readouterr().err


@pytest.mark.slow
def test_interpret_job_end_to_end(tmp_path, capsys):
    """A whole job in interpret mode: stored, best/results answer, a re-run measures nothing new.

    The first tune runs as a user runs it (``python -m autotune``, its own process); the
    queries and the re-run after it run through the same command line in this process
    (:func:`cli_here`): what they answer does not depend on the process."""
    db = f"sqlite:///{tmp_path}/e2e.db"
    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntrials = 3\nseed = 0\n'  # the quickstart's softmax: 408 valid configs
        '[[problem]]\nkernel = "softmax"\ndtype = "float32"\nshape = { rows = 32, cols = 512 }\n'
    )
    first = run_cli("tune", str(job), "--db", db, "--device", "interpret")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "invalid" in first.stdout and "softmax" in first.stdout
    with Store(db) as store:
        rows = store.trials()
    assert len(rows) == 3 and all(r.status == "ok" for r in rows), [(r.status, r.error[-300:]) for r in rows]
    assert {r.device.kind for r in rows} == {"interpret"}

    from autotune.queries.best import host_has_gpu

    # GPU results only on a machine with a GPU; on this one's CPU, the interpret results.
    plain = cli_here(capsys, "best", "softmax", "--shape", "rows=32,cols=512", "--dtype", "f32", "--db", db)
    assert plain.returncode == (1 if host_has_gpu() else 0), plain.stderr
    best = cli_here(capsys, "best", "softmax", "--shape", "rows=32,cols=512", "--dtype", "f32", "--db", db,
                    "--json", "--device", "interpret")
    assert best.returncode == 0, best.stderr
    payload = json.loads(best.stdout)
    assert payload["config"] in [dict(r.config) for r in rows]
    assert payload["device_kind"] == "interpret"

    listing = cli_here(capsys, "results", "--db", db)
    assert listing.returncode == 0 and "softmax" in listing.stdout

    again = cli_here(capsys, "tune", str(job), "--db", db, "--device", "interpret")
    assert again.returncode == 0, again.stderr[-3000:]
    with Store(db) as store:
        assert len(store.trials()) == 3
    study_names = optuna.get_all_study_names(storage=db)
    assert len(study_names) == 1
    study = optuna.load_study(study_name=study_names[0], storage=db)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 3


@pytest.mark.slow
@pytest.mark.extended
def test_sigkill_mid_job_then_rerun_loses_nothing(tmp_path):
    """SIGKILL in the middle of a job, then a re-run: finished trials kept, none twice, none RUNNING.

    In interpret mode, so the workers compile and run a real kernel. Left out of the default
    run (``-m extended``): the default run keeps this guarantee in the fault campaign, which
    kills the real CLI, runner, store, Optuna and worker processes with the fake evaluator:
    tests/test_faults.py::test_sigkill_of_tuner_and_workers_at_a_random_moment (``kill -9`` of
    tuner and workers mid-job, then a re-run) and test_sigkill_at_a_chosen_point_then_rerun_completes
    (seven points of a trial's life); interpret-mode jobs run end to end in
    test_interpret_job_end_to_end."""
    db = f"sqlite:///{tmp_path}/kill.db"
    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntrials = 6\nseed = 1\niterations = 2\n'
        '[[problem]]\nkernel = "softmax"\ndtype = "float32"\nshape = { rows = 64, cols = 512 }\n'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", "tune", str(job), "--db", db, "--device", "interpret"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 400
    stored = 0
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if Path(f"{tmp_path}/kill.db").exists():
            try:
                with Store(db) as store:
                    stored = len(store.trials())
            except Exception:  # noqa: BLE001 - the schema may be mid-creation
                stored = 0
            if stored >= 2:
                break
    assert proc.poll() is None, "the job finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with Store(db) as store:
        before = {Config(r.config).digest(): r.median_us for r in store.trials()}
    assert len(before) >= 2

    rerun = run_cli("tune", str(job), "--db", db, "--device", "interpret")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    with Store(db) as store:
        rows = store.trials()
    after = {Config(r.config).digest(): r.median_us for r in rows}
    assert len(rows) == 6 == len(after), "a config was measured twice or a trial lost"
    assert all(after[k] == v for k, v in before.items()), "a finished trial was replaced"
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage=db)[0], storage=db)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.parametrize("argv", [
    ["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--sample", "300000"],
    ["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--sample", "10001"],
    ["spaces", "softmax", "--shape", "rows=64,cols=1024", "--sample", "-1"],
    ["check", "softmax", "--shape", "rows=64,cols=1024", "--sample", "1001"],
])
def test_sample_sizes_past_the_maximum_exit_2_at_once(argv, capsys, campaign):
    """`spaces --sample N` and `check --sample N` above their documented maximum (10,000 and
    1,000) exit 2 with the limit named, instead of running for minutes."""
    campaign.add(bad_inputs=1)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--sample must be 0 to" in err and argv[-1] in err


def test_spaces_sample_at_the_maximum_returns_distinct_valid_configs(capsys):
    """`spaces --sample 10000` on a space of 10^5 valid configs returns 10,000 distinct valid
    ones (benchmarks time it; here only correctness)."""
    from autotune.space.kernel import get_kernel

    assert main(["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--sample", "10000",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    configs = doc["configs"]
    assert len(configs) == 10_000 and len({json.dumps(c, sort_keys=True) for c in configs}) == 10_000
    kernel = get_kernel("hopper_matmul")
    bound = kernel.bind(kernel.problem(doc["shape"], doc["dtype"]))
    assert all(bound.is_valid(c) for c in configs[::97])
# -- issue 14: first contact and daily use ------------------------------------------------------



CLI_TOY = toy_matmul("cli_toy", baseline=lambda p: unbuilt)


class _FakeEngine:
    """Completes each config at once; with ``crash``, configs with stages == 8 'crash' (as a
    worker would)."""

    parallelism = 2

    def __init__(self, kind="gpu", crash=False):
        self.kind = kind
        self.crash = crash

    def device_info(self):
        return DeviceInfo(name="cpu-interpret (test)" if self.kind == "interpret" else "Fake H200",
                          kind=self.kind, compute_capability="" if self.kind == "interpret" else "9.0")

    def submit(self, kernel_name, problem, config):
        future: Future = Future()
        if self.crash and config["stages"] == 8:
            result = TrialResult.failed(Outcome.CRASHED, "died with SIGFPE")
            result = dataclasses.replace(result, log_path="/tmp/logs/worker-0-1.log")
        else:
            t = 100.0 + abs(config["bm"] - 256) / 8 + config["stages"]
            result = TrialResult.timed([t, t], compile_s=0.01, rel_error=0.0, timing="fake")
        future.set_result(result)
        return future

    def baseline(self, kernel_name, problem):
        return TrialResult.timed([150.0], compile_s=0.0, rel_error=None, timing="fake")

    def trace(self, *args, **kwargs):
        return {}


@pytest.fixture
def fake_tune(monkeypatch, tmp_path):
    """`autotune tune` with the fake engine (kind chosen per test) on a fresh database."""
    import autotune.api

    state = {"kind": "gpu", "crash": False}

    @contextmanager
    def fake_open_engine(device="auto", **kwargs):
        yield _FakeEngine(state["kind"], state["crash"])

    monkeypatch.setattr(autotune.api, "open_engine", fake_open_engine)
    from autotune.queries import best as best_queries

    # The machine is what the fake engine says it is: a GPU one unless it runs interpreted.
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: state["kind"] == "gpu")
    db = f"sqlite:///{tmp_path}/cli.db"
    job = tmp_path / "job.toml"

    def write(trials=6, crash=False, kind="gpu"):
        state["kind"] = kind
        state["crash"] = crash
        job.write_text(
            f'[defaults]\ntrials = {trials}\nsampler = "{"brute" if crash else "tpe"}"\nseed = 0\n'
            '[[problem]]\nkernel = "cli_toy"\ndtype = "float32"\nshape = { m = 512 }\n'
        )
        return str(job)

    return write, db, tmp_path


def test_version_names_autotune_and_jax(capsys):
    """`autotune --version` prints autotune's version and the jax, optuna and Python versions."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("autotune ") and "jax " in out and "optuna " in out


@pytest.mark.parametrize("argv", [
    ["-v", "results", "--db", "DB"], ["results", "-v", "--db", "DB"],
    ["--db", "DB", "results", "-v"], ["results", "--db", "DB", "--verbose"],
])
def test_global_flags_accepted_before_and_after_the_command(argv):
    """-v and --db work before and after the subcommand, and one given before is not reset."""
    args = cli._parser().parse_args(argv)
    assert args.verbose is True and args.db == "DB" and args.quiet is False


@pytest.mark.parametrize("argv, allowed, suggestion", [
    (["best", "hoper_matmul", "--shape", "m=1,n=1,k=1"], "the kernels are", "'hopper_matmul'"),
    (["best", "hopper_matmul", "--shape", "m=1,n=1,kk=1"], "its keys are m, n, k", "'k'"),
    (["best", "hopper_matmul", "--shape", "m=1,n=1,k=1", "--dtype", "bfloat61"], "expected one of", "'bfloat16'"),
    (["spaces", "softmaxx", "--shape", "rows=1"], "bundled kernels are", "'softmax'"),
    (["check", "hopper_matmul", "--shape", "m=1,n=1,kk=1"], "its keys are", "'k'"),
    (["results", "--kernel", "sofmax"], "the kernels are", "'softmax'"),
    (["export", "--kernel", "hopper_matmull"], "the kernels are", "'hopper_matmul'"),
    (["report", "--kernel", "hoppermatmul"], "the kernels are", "'hopper_matmul'"),
    (["tune", "examples/quickstart.toml", "--sampler", "tpee"], "expected one of", "'tpe'"),
])
def test_unknown_names_exit_2_with_allowed_values_and_did_you_mean(argv, allowed, suggestion, capsys,
                                                                   monkeypatch, tmp_path):
    """An unknown kernel, shape key, dtype or sampler in any command: exit 2, the allowed
    values and a "did you mean" (never "nothing tuned")."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("AUTOTUNE_DB", f"sqlite:///{tmp_path}/never.db")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert allowed in err and f"Did you mean {suggestion}" in err, err
    assert "nothing tuned" not in err
    assert not (tmp_path / "never.db").exists()


def test_attention_shape_error_lists_the_optional_causal_key(capsys):
    """The --shape error of the attention kernel names every key, the optional `causal` too."""
    assert main(["spaces", "hopper_attention", "--shape", "batch=1"]) == 2
    assert "optionally causal (default false)" in capsys.readouterr().err


def test_rule_descriptions_are_rendered_with_values(capsys):
    """`autotune spaces KERNEL` shows every rule with its values filled in, never a template."""
    assert main(["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--dtype", "bf16",
                 "--sample", "1"]) == 0
    out = capsys.readouterr().out
    rules = [line for line in out.splitlines() if line.lstrip().startswith("rule ")]
    assert len(rules) > 10
    assert not [line for line in rules if "{" in line or "}" in line], rules
    assert "m=4096 must be divisible by the cluster tile" in out


@pytest.mark.parametrize("command", [
    f"{sys.executable} -m autotune spaces | head -1",
    f"{sys.executable} -m autotune spaces --json | head -c 10",
])
def test_broken_pipe_ends_quietly(command):
    """A reader that goes away (`| head`) ends the command quietly: no traceback, exit 141."""
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
                          check=False)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 141)
    assert proc.stdout


def test_broken_pipe_exit_code_is_141(monkeypatch):
    """main() turns a BrokenPipeError into exit code 141 (128 + SIGPIPE), pointing stdout at
    devnull so the interpreter's last flush cannot raise again."""
    def boom(argv):
        raise BrokenPipeError

    dup2_calls = []
    monkeypatch.setattr(cli, "_main", boom)
    monkeypatch.setattr(cli.os, "dup2", lambda fd, fd2: dup2_calls.append(fd2))
    monkeypatch.setattr(cli.sys, "stdout", open(os.devnull, "w"))  # noqa: SIM115
    assert main(["spaces"]) == cli.EXIT_PIPE == 141
    assert dup2_calls == [cli.sys.stdout.fileno()]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["results"], ["export"], ["spaces"]])
def test_output_that_cannot_be_written_exits_2_naming_why(command, tmp_path):
    """stdout that cannot be written (`> /dev/full`: no space left) gives one `autotune:
    error:` line naming why, and exit 2; no traceback."""
    with open("/dev/full", "w") as full:  # noqa: PTH123
        proc = subprocess.run([sys.executable, "-m", "autotune", "--db", str(tmp_path / "none.db"),
                               *command], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("autotune: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr


def test_spaces_json_without_a_kernel_lists_kernels(capsys):
    """`autotune spaces --json` prints the bundled kernels as JSON, with optional shape keys."""
    assert main(["spaces", "--json"]) == 0
    kernels = {k["kernel"]: k for k in json.loads(capsys.readouterr().out)}
    assert list(kernels) == bundled_kernels()
    assert kernels["hopper_attention"]["optional_shape_keys"] == {"causal": False}


def test_sampler_help_shows_the_default_auto(capsys):
    """`tune --help` names the sampler's default, auto, and the exit codes are in the docs."""
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "else auto)" in out and "auto, ranked, tpe" in out


def test_effort_maps_to_trials_and_patience():
    """--effort quick/full set trials and patience; explicit --trials/--patience win."""
    from autotune.tuning.jobs import load_job

    job = load_job(str(REPO / "examples/quickstart.toml"))
    quick = cli._job_overrides(cli._parser().parse_args(["tune", "x", "--effort", "quick"]), job)
    assert {(s.budget.trials, s.budget.patience) for s in quick.problems} == {cli.EFFORTS["quick"]}
    mixed = cli._job_overrides(cli._parser().parse_args(["tune", "x", "--effort", "full", "--trials", "7"]), job)
    assert {(s.budget.trials, s.budget.patience) for s in mixed.problems} == {(7, cli.EFFORTS["full"][1])}


def test_one_schema_for_a_result_in_best_results_and_export(fake_tune, capsys):
    """best --json, results --json and export --format json name a result's fields alike."""
    from autotune.storage.rows import RESULT_FIELDS

    write, db, _ = fake_tune
    assert main(["tune", write(trials=4), "--db", db, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["best", "cli_toy", "--shape", "m=512", "--dtype", "f32", "--db", db, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert main(["results", "--db", db, "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert main(["export", "--db", db]) == 0
    (record,) = json.loads(capsys.readouterr().out)["records"]
    for payload in (best, summary, record):
        assert set(RESULT_FIELDS) <= set(payload), payload
    assert best["config"] == summary["config"] == record["config"]
    assert best["median_us"] == summary["median_us"] == record["median_us"]
    assert best["trial_id"] == summary["trial_id"] == record["trial_id"]


def test_tune_prints_the_database_and_one_line_per_trial_when_piped(fake_tune, capsys):
    """Not on a terminal: the resolved database, one line per finished trial (n/N, status,
    time, best so far), and a last line saying none crashed."""
    write, db, tmp_path = fake_tune
    assert main(["tune", write(trials=3), "--db", db]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"autotune: database sqlite:///{tmp_path}/cli.db")
    trials = [line for line in err if ": trial " in line]
    assert [line.split(": trial ")[1].split()[0] for line in trials] == ["1/3", "2/3", "3/3"]
    assert all(" ok " in line and "best " in line for line in trials)
    assert err[-1].startswith("autotune: done:") and "none crashed" in err[-1]


def test_crashed_trials_exit_3_and_name_the_worker_log(fake_tune, capsys):
    """A job in which trials crashed says so in its last line, with the worker logs, exit 3."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=8, crash=True), "--db", db]) == cli.EXIT_CRASHED == 3
    err = capsys.readouterr().err.splitlines()
    crash_lines = [line for line in err if " crashed " in line and ": trial " in line]
    assert crash_lines and all("worker log /tmp/logs/worker-0-1.log" in line for line in crash_lines)
    assert "crashed in this run" in err[-1] and "/tmp/logs/worker-0-1.log" in err[-1]


def test_jsonl_progress_is_one_json_object_per_line(fake_tune, capsys):
    """--jsonl: every stdout line is a JSON object: start, trials, done, then a summary."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3), "--db", db, "--jsonl"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["start", "trial", "trial", "trial", "done", "summary"]
    assert {e["status"] for e in events if e["event"] == "trial"} == {"ok"}
    assert events[-1]["config"] is not None and events[-1]["median_us"] > 0


def test_a_finished_problem_is_skipped_with_its_stored_best_time(fake_tune, capsys):
    """Re-running a finished job: the skip line and the skip event show the stored best time
    (the summary's), not "best -"."""
    write, db, _ = fake_tune
    job = write(trials=3)
    assert main(["tune", job, "--db", db, "-q"]) == 0
    capsys.readouterr()
    with Store(db) as store:
        best = min(t.median_us for t in store.trials())
    assert main(["tune", job, "--db", db]) == 0
    (skip,) = [line for line in capsys.readouterr().err.splitlines() if ": skip " in line]
    assert skip.endswith(f"skip 3/3, best {best:.1f} us (already tuned)"), skip
    assert main(["tune", job, "--db", db, "--jsonl"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["skip", "summary"]
    assert events[0]["best_us"] == events[1]["median_us"] == best


def test_workers_that_cannot_start_end_tune_with_one_line_naming_the_log_and_the_fix(
        tmp_path, capsys, monkeypatch):
    """`tune --device gpu` where jax sees no GPU: the workers fail at startup; tune exits 2 with
    one line naming what failed, `--device interpret` and the worker log (which holds the
    traceback), and no traceback on the terminal.

    Through the command line in the test's process (its workers are processes of their own),
    and the engine gives up after the first failed start: each GPU worker imports jax before it
    finds no GPU (the retries are
    tests/engine/test_engine.py::test_a_worker_that_dies_at_startup_is_one_line_naming_its_log's)."""
    from autotune.engine import workers

    monkeypatch.setattr(workers, "MAX_STARTUP_FAILURES", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float32"\nshape = { rows = 64, cols = 512 }\n')
    done = cli_here(capsys, "tune", str(job), "--device", "gpu", "--db", f"sqlite:///{tmp_path}/a.db",
                    "--results-dir", str(tmp_path / "results"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("autotune: database ") and len(lines) == 2, done.stderr
    assert lines[1].startswith("autotune: error: Engine workers (mode 'gpu') failed to start")
    assert "No GPU visible to jax" in lines[1] and "--device interpret" in lines[1]
    log_path = lines[1].split("worker log ")[1].rstrip(")")
    assert log_path.startswith(str(tmp_path / "results" / "logs"))
    assert "Traceback" in Path(log_path).read_text()


def test_quiet_prints_no_progress(fake_tune, capsys):
    """--quiet: no progress and no database line; the results table only."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3), "--db", db, "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "cli_toy" in captured.out


def test_dry_run_measures_nothing_and_estimates_from_stored_trials(fake_tune, capsys):
    """--dry-run prints per problem the valid space, budget, device and database, and an
    estimate from the trials already stored for the kernel; it stores nothing."""
    write, db, tmp_path = fake_tune
    job = write(trials=6)
    assert main(["tune", job, "--db", db, "--dry-run", "--device", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "dry run: device gpu" in out and f"{tmp_path}/cli.db (no such file yet" in out
    assert "6 trials" in out and "unknown (no stored trials" in out
    assert not (tmp_path / "cli.db").exists()
    assert main(["tune", job, "--db", db, "--trials", "2", "-q"]) == 0
    capsys.readouterr()
    assert main(["tune", job, "--db", db, "--dry-run", "--device", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "4 to go" in out and "median of 2 stored" in out
    with Store(db) as store:
        assert len(store.trials()) == 2


def test_dry_run_jsonl_prints_one_json_object_per_problem(fake_tune, capsys):
    """--dry-run --jsonl: one JSON object per problem on stdout (no table), the database on
    stderr; nothing is created."""
    write, db, tmp_path = fake_tune
    assert main(["tune", write(trials=6), "--db", db, "--dry-run", "--jsonl", "--device", "gpu"]) == 0
    captured = capsys.readouterr()
    (record,) = [json.loads(line) for line in captured.out.splitlines()]
    assert record["kernel"] == "cli_toy" and record["shape"] == {"m": 512} and record["device"] == "gpu"
    assert record["budget"]["trials"] == 6 and record["valid"] > 0 and record["stored"] == 0
    assert record["estimate_s"] is None and record["skipped"] is None
    assert f"{tmp_path}/cli.db" in captured.err
    assert not (tmp_path / "cli.db").exists()


@pytest.mark.parametrize("jsonl", [[], ["--jsonl"]], ids=["table", "jsonl"])
def test_dry_run_prints_nothing_before_a_late_bad_problem(jsonl, tmp_path, capsys):
    """A problem late in the job that cannot run (here: none of its configs runs in interpret
    mode) stops the dry run before anything is printed: no header, no earlier problem's line."""
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float32"\nshape = { rows = 64, cols = 512 }\n'
                   '[[problem]]\nkernel = "hopper_matmul"\ndtype = "bfloat16"\n'
                   'shape = { m = 64, n = 32, k = 64 }\n')
    code = main(["tune", str(job), "--db", f"sqlite:///{tmp_path}/a.db", "--device", "interpret",
                 "--dry-run", *jsonl])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "[interpret_two_tiles]" in captured.err


def test_gpus_without_a_gpu_or_in_interpret_mode_exit_2(fake_tune, capsys, monkeypatch):
    """--gpus where interpret mode would run (--device auto and jax sees no GPU) exits 2 naming
    the way out; with --device gpu the ids are taken as given, nothing probed."""
    import autotune.api

    write, db, tmp_path = fake_tune
    job = write(trials=2)
    monkeypatch.setattr(autotune.api, "count_gpus", lambda: 0)
    assert main(["tune", job, "--db", db, "--gpus", "0,1"]) == 2
    err = capsys.readouterr().err
    assert "--gpus 0,1: jax sees no GPU" in err and "--device gpu" in err
    assert not (tmp_path / "cli.db").exists()

    def probed():
        raise AssertionError("--device gpu must not probe for GPUs")

    from autotune.queries import best as best_queries

    monkeypatch.setattr(autotune.api, "count_gpus", probed)
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)  # read from the driver
    assert main(["tune", job, "--db", db, "--gpus", "0,1", "--device", "gpu", "--dry-run"]) == 0
    assert "dry run: device gpu (gpus 0,1)" in capsys.readouterr().out


def test_dry_run_for_a_gpu_on_a_machine_without_one_exits_2(fake_tune, capsys, monkeypatch):
    """`tune --device gpu --dry-run` on a machine without a GPU says so and exits 2 (it said
    "device gpu" and exit 0, and the real run then stopped at its start)."""
    from autotune.queries import best as best_queries

    write, db, tmp_path = fake_tune
    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    assert main(["tune", write(trials=2), "--db", db, "--device", "gpu", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "this machine has no GPU" in captured.err and "--device interpret" in captured.err
    assert captured.out == "" and not (tmp_path / "cli.db").exists()


def test_interpret_rows_are_labelled_and_left_out_of_best_and_export(fake_tune, capsys,
                                                                      monkeypatch):
    """Interpret-mode results: no TFLOP/s or speedup in the summary, labelled in `results`,
    and on a machine with a GPU `best`/`export` leave them out unless asked for with
    --device interpret."""
    from autotune.queries import best as best_queries

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3, kind="interpret"), "--db", db, "-q"]) == 0
    out = capsys.readouterr().out
    table = out.split("\ninterpret: ")[0]
    assert "TFLOP/s" not in table and "speedup" not in table and "wall us (interpret)" in table
    assert "not GPU timings" in out
    assert main(["results", "--db", db]) == 0
    assert "[interpret]" in capsys.readouterr().out
    assert main(["best", "cli_toy", "--shape", "m=512", "--dtype", "f32", "--db", db]) == 1
    assert "--device interpret" in capsys.readouterr().err
    assert main(["best", "cli_toy", "--shape", "m=512", "--dtype", "f32", "--db", db,
                 "--device", "interpret", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] is None
    assert main(["export", "--db", db]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["records"] == [] and "left out 1 interpret" in captured.err
    assert main(["export", "--db", db, "--device", "interpret"]) == 0
    assert len(json.loads(capsys.readouterr().out)["records"]) == 1


def test_without_a_gpu_best_and_export_answer_with_interpret_results_labelled(
        fake_tune, capsys, monkeypatch):
    """On a machine without a GPU whose database holds only interpret results, `best`
    (text and --json) and `export` answer with them, labelled as interpret results, exit 0;
    `--device gpu` still asks for GPU results only."""
    from autotune.queries import best as best_queries

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: False)
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3, kind="interpret"), "--db", db, "-q"]) == 0
    capsys.readouterr()
    best = ["best", "cli_toy", "--shape", "m=512", "--dtype", "f32", "--db", db]
    assert main(best) == 0
    captured = capsys.readouterr()
    assert "interpret mode: a functional run on the CPU" in captured.out
    assert "spread" not in captured.out  # one checked run: no spread to show
    assert "no GPU on this machine" in captured.err and "--device gpu" in captured.err
    assert main([*best, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["device_kind"] == "interpret" and payload["speedup"] is None
    assert main([*best, "--device", "gpu"]) == 1
    capsys.readouterr()
    assert main(["export", "--db", db]) == 0
    captured = capsys.readouterr()
    [record] = json.loads(captured.out)["records"]
    assert record["device_kind"] == "interpret" and "exported 1 interpret-mode" in captured.err


def test_results_best_and_report_print_the_database(fake_tune, capsys):
    """`results`, `best` and `report` name the resolved database on stderr."""
    write, db, tmp_path = fake_tune
    assert main(["tune", write(trials=2), "--db", db, "-q"]) == 0
    capsys.readouterr()
    for argv in (["results"], ["best", "cli_toy", "--shape", "m=512", "--dtype", "f32"],
                 ["report", "--out", str(tmp_path / "report")]):
        assert main([*argv, "--db", db]) == 0
        assert f"autotune: database sqlite:///{tmp_path}/cli.db" in capsys.readouterr().err


def test_tuned_study_reads_through_optunas_public_api(fake_tune):
    """A tuned study, read with Optuna's public API only: readable name, metric median_us,
    user attributes, and trial numbers equal to those the store (and report) records."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=4), "--db", db, "-q"]) == 0
    (summary,) = optuna.get_all_study_summaries(storage=db)
    assert summary.study_name == "cli_toy[m=512; float32] @ Fake H200"
    study = optuna.load_study(study_name=summary.study_name, storage=db)
    assert study.metric_names == ["median_us"]
    attrs = study.user_attrs
    assert (attrs["kernel"], attrs["shape"], attrs["dtype"], attrs["device"]) == (
        "cli_toy", {"m": 512}, "float32", "Fake H200")
    assert "jax" in attrs["software"] and "autotune" in attrs["software"]
    complete = {t.number: t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    with Store(db) as store:
        stored = {r.optuna_trial_number: r.median_us for r in store.trials()}
    assert stored == complete


def test_python_export_is_keyed_by_device_with_a_default(fake_tune, capsys, tmp_path):
    """`export --format python`: TUNED keyed by device name and 'default'; lookup by device
    name, by compute capability, and by default for an unknown device."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3), "--db", db, "-q"]) == 0
    capsys.readouterr()
    out = tmp_path / "tuned.py"
    assert main(["export", "--format", "python", "--db", db, "--out", str(out)]) == 0
    namespace: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)  # noqa: S102 - our own export
    assert set(namespace["TUNED"]) == {"Fake H200", "default"}
    key = ("cli_toy", (("m", 512),), "float32")
    config = namespace["TUNED"]["Fake H200"][key]
    assert namespace["lookup"]("cli_toy", {"m": 512}, "float32", "Fake H200") == config
    assert namespace["lookup"]("cli_toy", {"m": 512}, "f32", "9.0") == config
    assert namespace["lookup"]("cli_toy", {"m": 512}, "float32", "NVIDIA B200") == config
    assert namespace["lookup"]("cli_toy", {"m": 1024}, "float32") is None


def test_shell_completion_is_optional(monkeypatch, capsys):
    """Without argcomplete the CLI runs as usual; with it, the parser is handed to
    argcomplete.autocomplete (the `[completion]` extra)."""
    import types

    monkeypatch.setitem(sys.modules, "argcomplete", None)  # not installed
    assert main(["spaces"]) == 0
    seen = []
    fake = types.SimpleNamespace(autocomplete=lambda parser: seen.append(parser.prog))
    monkeypatch.setitem(sys.modules, "argcomplete", fake)
    assert main(["spaces"]) == 0
    assert seen == ["autotune"]
    assert 'completion = ["argcomplete' in (REPO / "pyproject.toml").read_text()


def test_tune_refuses_a_cold_cache_in_interpret_mode(tmp_path, capsys):
    """`--cache cold --device interpret` exits 2 naming the rule and the way out; nothing runs."""
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float32"\n'
                   'shape = { rows = 64, cols = 512 }\n')
    code = main(["tune", str(job), "--device", "interpret", "--cache", "cold",
                 "--db", f"sqlite:///{tmp_path}/t.db", "--results-dir", str(tmp_path / "r")])
    assert code == 2
    assert "cache = 'cold' needs a GPU" in capsys.readouterr().err


# ------------------------------------------------------------------ the edges of the database

MATMUL_DIMS = {"m": 256, "n": 256, "k": 256}
MATMUL_SHAPE = "m=256,n=256,k=256"


def _export(tmp_path: Path) -> str:
    """An export file holding one valid hopper_matmul result on an H200."""
    from autotune.space.kernel import get_kernel
    from autotune.space.problem import Problem

    problem = Problem("hopper_matmul", MATMUL_DIMS, "bfloat16")
    (config,) = get_kernel(problem.kernel).valid_space(problem).sample(1, seed=1)
    record = {"kernel": problem.kernel, "shape": dict(problem.dims), "dtype": problem.dtype,
              "device": "NVIDIA H200", "device_kind": "gpu", "compute_capability": "9.0",
              "driver": "570.86", "median_us": 70.0, "jax_version": "0.11.2",
              "software": {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"},
              "config": dict(config)}
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"format": "autotune-export", "version": 1, "records": [record]}))
    return str(path)


def _matmul_job(tmp_path: Path) -> str:
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "hopper_matmul"\ndtype = "bfloat16"\n'
                   "shape = { m = 256, n = 256, k = 256 }\n")
    return str(job)


ODD_NAME = "odd?name#1%:x .db"


def test_a_bare_db_path_is_exactly_that_file_whatever_its_characters(tmp_path, monkeypatch, capsys):
    """`--db PATH`, db=PATH and $AUTOTUNE_DB=PATH name the SQLite file of exactly that name,
    with ?, #, %, : and a space in it: `import` writes it, `results`, `best` and the Python
    queries (which open it read-only, as an SQLite URI) read it, and no other file appears."""
    import autotune

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_DB", raising=False)
    expected = {"export.json", ODD_NAME, ODD_NAME + "-wal", ODD_NAME + "-shm"}
    assert main(["import", _export(tmp_path), "--db", ODD_NAME, "-q"]) == 0
    assert (tmp_path / ODD_NAME).is_file()
    assert {p.name for p in tmp_path.iterdir()} <= expected
    capsys.readouterr()
    assert main(["results", "--db", ODD_NAME, "--json", "-q"]) == 0
    assert [r["kernel"] for r in json.loads(capsys.readouterr().out)] == ["hopper_matmul"]
    assert main(["best", "hopper_matmul", "--shape", MATMUL_SHAPE, "--db", ODD_NAME, "-q"]) == 0
    assert autotune.best_config("hopper_matmul", MATMUL_DIMS, "bfloat16", db=ODD_NAME) is not None
    monkeypatch.setenv("AUTOTUNE_DB", str(tmp_path / ODD_NAME))
    assert autotune.best_config("hopper_matmul", MATMUL_DIMS, "bfloat16") is not None
    assert {p.name for p in tmp_path.iterdir()} <= expected


def test_import_into_an_in_memory_database_exits_2(tmp_path, capsys):
    """`import --db sqlite://` is refused (the import would vanish at exit): exit 2, one line
    naming the database and the way out."""
    assert main(["import", _export(tmp_path), "--db", "sqlite://"]) == 2
    err = capsys.readouterr().err
    assert "autotune: error: The database sqlite:// is in memory" in err and "Give a file" in err


@pytest.mark.parametrize("kind", ["an empty file", "another program's database"])
def test_read_only_queries_never_write_a_database_without_autotune_tables(kind, tmp_path, capsys):
    """`best`, `results`, `export`, `report`, `status` and the Python queries on an SQLite
    file without autotune's tables answer "nothing stored" (`status`: exit 2, one line) and
    leave the file byte for byte as it was, with no file beside it."""
    import sqlite3

    import autotune

    path = tmp_path / "app.db"
    if kind == "an empty file":
        path.write_bytes(b"")
    else:
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE notes (text TEXT)")
            conn.execute("INSERT INTO notes VALUES ('mine')")
            conn.commit()
    before, db, job = path.read_bytes(), str(path), _matmul_job(tmp_path)
    assert main(["best", "hopper_matmul", "--shape", MATMUL_SHAPE, "--db", db]) == 1
    assert "nothing tuned" in capsys.readouterr().err
    assert main(["results", "--db", db]) == 0
    assert "no results stored" in capsys.readouterr().out
    assert main(["export", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == []
    assert main(["report", "--db", db, "--out", str(tmp_path / "report")]) == 1
    assert main(["status", job, "--db", db]) == 2
    err = capsys.readouterr().err
    assert "holds no autotune tables" in err.splitlines()[-1] and "Traceback" not in err
    assert autotune.best_config("hopper_matmul", MATMUL_DIMS, "bfloat16", db=db) is None
    assert autotune.list_results(db) == []
    assert autotune.lookup_config("hopper_matmul", MATMUL_DIMS, "bfloat16", db=db,
                                  strict=True)[1] == "default"
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "job.toml"]


def test_a_folder_as_the_database_exits_2_naming_it(tmp_path, capsys):
    """`--db FOLDER` (and db=FOLDER): exit 2, one line naming the folder and the fix (a file
    in it); nothing is created in it."""
    from autotune.errors import StorageError
    from autotune.queries.best import best_config

    folder = tmp_path / "dbs"
    folder.mkdir()
    export, job = _export(tmp_path), _matmul_job(tmp_path)
    for argv in (["results"], ["best", "hopper_matmul", "--shape", MATMUL_SHAPE],
                 ["import", export], ["status", job], ["export"]):
        assert main([*argv, "--db", str(folder), "-q"]) == 2, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (f"autotune: error: The database {folder} is a folder, not a file: name a "
                        f"file in it, e.g. {folder / 'autotune.db'}."), argv
    with pytest.raises(StorageError, match="is a folder"):
        best_config("hopper_matmul", MATMUL_DIMS, "bfloat16", db=str(folder))
    assert not list(folder.iterdir())


def test_status_of_a_database_only_import_wrote_shows_what_there_is(tmp_path, capsys):
    """`status` on a database with autotune's tables but no Optuna tables (made by `import`)
    shows the stored results and no studies, hosts or trials in flight."""
    db = str(tmp_path / "imported.db")
    assert main(["import", _export(tmp_path), "--db", db, "-q"]) == 0
    job = _matmul_job(tmp_path)
    capsys.readouterr()
    assert main(["status", job, "--db", db, "--json", "-q"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["hosts"] == []
    (problem,) = status["problems"]
    assert (problem["done"], problem["in_flight"], problem["best_us"]) == (1, 0, 70.0)
    assert problem["state"] == "imported"  # stored, no study here: not "waiting"
    assert main(["status", job, "--db", db]) == 0
    captured = capsys.readouterr()
    assert "hosts with a live heartbeat: none" in captured.out and "Traceback" not in captured.err


def test_export_then_import_keeps_the_spread(fake_tune, tmp_path, capsys):
    """An export carries each result's spread and `import` stores it (it stored 0.0%: the
    median alone has none); a bad spread is refused with the rest of the file."""
    write, db, _ = fake_tune
    assert main(["tune", write(trials=3), "--db", db, "-q"]) == 0
    out = tmp_path / "e.json"
    assert main(["export", "--db", db, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    data["records"][0]["spread"] = 0.478  # as measured on a noisy GPU
    out.write_text(json.dumps(data))
    target = f"sqlite:///{tmp_path}/target.db"
    assert main(["import", str(out), "--db", target]) == 0
    with Store(target) as store:
        [row] = store.trials()
    assert row.spread == pytest.approx(0.478)
    capsys.readouterr()
    assert main(["best", "cli_toy", "--shape", "m=512", "--dtype", "f32", "--db", target]) == 0
    assert "spread 47.8%" in capsys.readouterr().out
    data["records"][0]["spread"] = -1
    out.write_text(json.dumps(data))
    assert main(["import", str(out), "--db", f"sqlite:///{tmp_path}/bad.db"]) == 2
    assert "spread" in capsys.readouterr().err and not (tmp_path / "bad.db").exists()


def test_revalidate_on_a_missing_database_exits_1_and_creates_nothing(tmp_path, capsys):
    """`revalidate` on an SQLite file that does not exist: exit 1, one line saying nothing is
    stored there; the file is not created."""
    db = tmp_path / "missing.db"
    assert main(["revalidate", "--db", str(db), "--device", "interpret", "-q"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"autotune: nothing stored in sqlite:///{db} (no such file yet)")
    assert not list(tmp_path.iterdir())


def test_an_unexpected_exception_is_one_line_naming_the_file_that_holds_its_traceback(
    tmp_path, monkeypatch, capsys
):
    """A bug (an exception no handler expects) ends the command with exit 70 and one line that
    names the exception and a file holding its traceback and the command line, secrets masked;
    ``-v`` prints the traceback too. Never a traceback alone on the terminal."""
    import tempfile

    import autotune.cli as cli

    def bug(args):
        raise RuntimeError("boom at postgresql://me:S3cret@db/tune")

    monkeypatch.setattr(cli, "_results", bug)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for argv, verbose in ((["results"], False), (["results", "-v"], True)):
        monkeypatch.setattr(sys, "argv", ["autotune", *argv, "--db", str(tmp_path / "x.db")])
        with pytest.raises(SystemExit) as ended:
            cli.run()
        assert ended.value.code == cli.EXIT_BUG == 70
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert last.startswith("autotune: internal error: RuntimeError: boom at ")
        assert "S3cret" not in err and "This is a bug in autotune" in last
        (report,) = tmp_path.glob("autotune-bug-*.txt")
        text = report.read_text()
        assert str(report) in last and "Traceback" in text and "in bug" in text
        assert "S3cret" not in text and "'results'" in text
        assert ("Traceback" in err) is verbose
        report.unlink()


def test_verify_prints_stored_and_retimed_speedups_and_stores_a_row(tmp_path, capsys, monkeypatch):
    """`verify`: per problem stored for this device, the winner and baseline re-timed (here by a
    fake second method), the stored and re-timed speedups, their difference and the verdict in
    words; exit 0; the row is stored. A missing database exits 1; a bad --rounds exits 2."""
    from autotune.evaluation.pipeline import interpret_device_info
    from autotune.space.outcomes import TrialResult
    from autotune.space.problem import Config, Problem
    from autotune.storage.store import Store
    from autotune.tuning import verify

    db = f"sqlite:///{tmp_path}/v.db"
    problem = Problem("softmax", {"rows": 16, "cols": 256}, "float32")
    device = interpret_device_info()
    software = {"jax": "9", "jaxlib": "9", "autotune": "0"}
    with Store(db) as store:
        store.record_trial(problem, Config(block_rows=8), TrialResult.timed(
            [100.0], compile_s=0.1, rel_error=0.0, timing="wallclock"), device=device,
            software=software)
        store.record_baseline(problem, "xla", [150.0], device=device, software=software)

    def fake(**kwargs):
        return lambda target, rounds, calls: ([(100.0,)] * rounds, [(160.0,)] * rounds, [])

    monkeypatch.setattr(verify, "timing_on_this_machine", fake)
    assert main(["verify", "--db", db, "--device", "interpret", "-q"]) == 0
    out = capsys.readouterr().out
    assert "1.5000" in out and "1.6000" in out and "+6.67%" in out
    assert "+0.00%, +6.67%" in out  # the winner re-timed as stored, the baseline 6.67% slower
    assert "60.0% faster than xla" in out
    assert main(["verify", "--db", db, "--device", "interpret", "--json", "-q"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["speedup"] == pytest.approx(1.6) and row["stored_speedup"] == pytest.approx(1.5)
    assert row["winner_moved"] == pytest.approx(0.0)
    assert row["baseline_moved"] == pytest.approx(160 / 150 - 1)
    assert row["rounds"] == verify.ROUNDS == 15  # the default (benchmarks/RESULTS.md §12)
    with Store(db) as store:
        assert len(store.verifications(problem)) == 2
    assert main(["verify", "--db", str(tmp_path / "none.db"), "--device", "interpret", "-q"]) == 1
    assert main(["verify", "--db", db, "--rounds", "0", "-q"]) == 2
    assert "--rounds must be 1 or more, got 0" in capsys.readouterr().err


def test_a_confirmed_speedup_says_faster_no_faster_or_slower_in_the_tables():
    """`tune` and `results` tables: a confirmed speedup carries a word from its interval."""
    import types

    def row(low, high):
        return types.SimpleNamespace(speedup_low=low, speedup_high=high)

    assert cli._speedup_text(1.02, 0.002, True, row(1.01, 1.03)) == "1.020 ±0.2% (confirmed, faster)"
    assert cli._speedup_text(1.001, 0.004, True, row(0.997, 1.005)).endswith("(confirmed, no faster)")
    assert cli._speedup_text(0.965, 0.002, True, row(0.96, 0.97)).endswith("(confirmed, slower)")
    assert cli._speedup_text(0.99, None, False) == "0.990"
    assert cli._speedup_text(None, None, True) == "-"


@pytest.mark.parametrize("kernel, shape, dtype", [
    ("hopper_matmul", "m=256,n=256,k=256", "bf16"),
    ("hopper_matmul", "m=256,n=256,k=256", "f16"),
    ("hopper_attention", "batch=1,seq_q=128,seq_kv=128,heads_q=1,heads_kv=1,head_dim=64", "f16"),
])
def test_spaces_lists_dtype_rules_without_refusing_the_dtype_it_has(kernel, shape, dtype, capsys):
    """`autotune spaces` lists a kernel's dtype rule for a supported dtype without saying the
    dtype is refused (it said "supports bfloat16 and float16 inputs, not bfloat16")."""
    assert main(["spaces", kernel, "--shape", shape, "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    full = {"bf16": "bfloat16", "f16": "float16"}[dtype]
    assert f"not {full}" not in out and f"so {full} inputs fail" not in out
    assert f"(here {full})" in out


def test_verbose_does_not_flood_with_alembic_plugin_lines(tmp_path):
    """`-v` logs autotune's steps, not alembic's plumbing (a dozen "setup plugin ..." lines
    per database opened); a schema upgrade is logged by autotune itself."""
    db = f"sqlite:///{tmp_path}/v.db"
    with Store(db):
        pass
    done = run_cli("-v", "results", "--db", db)
    assert done.returncode == 0, done.stderr
    assert "alembic" not in done.stderr, done.stderr


def test_shell_completion_completes_kernel_names_dtypes_and_samplers():
    """Shell completion (argcomplete, `autotune[completion]`) completes the kernel argument and
    --kernel with the bundled kernels' names, --dtype with dtypes, --sampler with samplers."""
    import argparse

    parser = cli._parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    def completer(command, dest):
        action = next(a for a in subs.choices[command]._actions if a.dest == dest)
        return action.completer

    for command in ("spaces", "best", "check"):
        assert completer(command, "kernel")(prefix="hop") == ["hopper_matmul", "hopper_attention"]
    for command in ("results", "export", "report", "revalidate"):
        assert "softmax" in completer(command, "kernel")(prefix="")
    assert completer("best", "dtype")(prefix="bf") == ["bfloat16"]
    assert completer("tune", "sampler")(prefix="c") == ["cmaes"]


def test_shell_completion_of_a_kernel_name_end_to_end(tmp_path):
    """With argcomplete installed, `autotune best hop<TAB>` completes to the bundled kernels
    (the shell's request, as argcomplete's bash hook sends it)."""
    pytest.importorskip("argcomplete")
    line = "autotune best hop"
    out = tmp_path / "completions.txt"
    done = run_cli(env={"_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line,
                        "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out)})
    assert done.returncode == 0, done.stderr
    assert sorted(out.read_text().split()) == ["hopper_attention", "hopper_matmul"]


def test_the_reading_commands_start_without_optuna_or_jax(tmp_path):
    """`spaces`, `results` and `best` import neither Optuna nor jax (half a second of each
    command's start-up on 2 cores); the commands that open studies set Optuna's verbosity."""
    db = f"sqlite:///{tmp_path}/r.db"
    code = (
        "import sys\nfrom autotune import cli\n"
        f"for argv in (['spaces'], ['results', '--db', {db!r}],\n"
        f"             ['best', 'softmax', '--shape', 'rows=32,cols=512', '--db', {db!r}]):\n"
        "    cli.main(argv)\n"
        "assert 'optuna' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    assert cli._OPTUNA_COMMANDS == {"tune", "status", "report", "revalidate"}

@pytest.mark.parametrize("argv", [["--version"], ["best", "hopper_matmul", "--shape", "m=1,n=1,k=1"],
                                  ["results", "--kernel", "hopper_matmul"]])
def test_light_commands_import_no_optuna_numpy_or_jax(tmp_path, argv):
    """Building the parser (sampler names from a static list), --version, best and results
    import none of Optuna, numpy, jax, alembic (issue 36: --version took 0.95 s of CPU)."""
    import subprocess
    import sys

    db = tmp_path / "light.db"
    from autotune.storage.store import Store

    Store(f"sqlite:///{db}").close()
    code = ("import sys\nfrom autotune.cli import main\n"
            f"try:\n    main({argv + ['--db', str(db)] if argv[0] != '--version' else argv!r})\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('optuna', 'numpy', 'jax', 'alembic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def stored_best(tmp_path):
    """A database with a confirmed hopper_matmul result (trials of two jax versions, a
    baseline, a confirmation round that finds the kernel faster and its program check that
    finds XLA faster) and an unconfirmed one, as `autotune best` reads them."""
    from autotune.space.kernel import get_kernel
    from autotune.space.outcomes import PROGRAM_METHOD
    from autotune.tuning.confirmation import Candidate, analyse_confirmation
    from autotune.tuning.verify import VerifyTarget, analyse

    kernel = get_kernel("hopper_matmul")
    gpu = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")
    new = {"jax": "0.10.2", "jaxlib": "0.10.2", "autotune": "0.1.0"}
    db = tmp_path / "best.db"
    shapes = ({"m": 1024, "n": 1024, "k": 512}, {"m": 2048, "n": 1024, "k": 512})
    with Store(f"sqlite:///{db}") as store:
        for n, dims in enumerate(shapes):
            problem = kernel.problem(dims, "bfloat16")
            configs = kernel.valid_space(problem).sample(12, seed=n)
            ids = []
            for i, config in enumerate(configs):
                t = 40.0 + 3 * ((i * 7) % 12)
                software = new if i % 3 else {**new, "jax": "0.9.0", "jaxlib": "0.9.0"}
                result = TrialResult.timed([t, t * 1.01, t * 0.99], compile_s=0.1, rel_error=1e-3,
                                           timing="cupti")
                ids.append(store.record_trial(problem, config, result, device=gpu,
                                              software=software, cache="warm").id)
            store.record_baseline(problem, "xla", [60.0, 61.0], device=gpu, software=new,
                                  cache="warm")
            if n == 0:
                best = store.best(problem, n=2, versions={"jax": "0.10.2"})
                rounds = lambda c: ((c, c * 1.001), (c * 1.002, c))  # noqa: E731
                confirmation = analyse_confirmation(
                    [Candidate(dict(r.config), rounds(r.median_us)) for r in best],
                    rounds(60.0), default_config=None)
                cid = store.record_confirmation(
                    problem, confirmation, trial_ids=[r.id for r in best], device=gpu,
                    software=new, cache="warm", iterations=2, baseline_name="xla")
                # Its program check: XLA 3.4% faster as a program calls them.
                crowned = store.trial(store.confirmations(problem)[0].crowned_trial_id)
                target = VerifyTarget(problem, crowned.config, (), confirmation.speedup, None,
                                      None, "xla", cid)
                store.record_verification(problem, analyse(
                    target, [(62.0,), (62.2,), (62.1,)], [(60.0,), (60.1,), (59.9,)],
                    method=PROGRAM_METHOD, calls=20), device=gpu, software=new)
    return db, [",".join(f"{k}={v}" for k, v in dims.items()) for dims in shapes]


def test_best_answers_alike_through_sqlite3_and_through_a_store(stored_best, monkeypatch, capsys):
    """`autotune best` reads a plain SQLite file through the stdlib reader (no SQLAlchemy,
    benchmarks/RESULTS.md §17); what it prints (text, --json, -q, device and cache filters,
    nothing tuned) is what it printed reading through a Store, byte for byte."""
    from autotune.queries import best as best_queries

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    db, shapes = stored_best
    runs = [[*base, *extra] for base in
            (["best", "hopper_matmul", "--shape", s, "--dtype", "bf16", "--db", str(db)]
             for s in [*shapes, "m=64,n=64,k=64"])
            for extra in ([], ["--json"], ["-q"], ["--device", "h100"], ["--device", "gpu", "--json"],
                          ["--cache", "cold"], ["--device", "interpret"])]

    def outputs():
        best_queries.close_stores()
        out = []
        for argv in runs:
            code = main(argv)
            captured = capsys.readouterr()
            out.append((code, captured.out, captured.err))
        return out

    opened = []
    real_open = best_queries.SQLiteReader.open
    monkeypatch.setattr(best_queries.SQLiteReader, "open",
                        lambda *a: opened.append(1) or real_open(*a))
    light = outputs()
    assert opened and sum(code == 0 for code, _, _ in light) >= 8
    assert any('"confirmed": true' in out for _, out, _ in light)
    monkeypatch.setattr(best_queries, "plain_sqlite_file", lambda db: None)  # through a Store
    opened.clear()
    assert outputs() == light and not opened
    best_queries.close_stores()


def test_best_shows_the_confirmation_and_the_program_check_and_which_decided(
        stored_best, monkeypatch, capsys):
    """`autotune best` of a problem whose confirmation (CUPTI kernel times) finds the kernel
    faster but whose program check finds XLA faster: --json carries both figures
    (confirmed_speedup with its interval, program_speedup with its), verdict_source
    "program-check", and faster/choice/verdict from the program check; the text shows the GPU
    time's verdict, the program's, and that the program check decides the route. Alike through
    the stdlib reader and a Store. An unconfirmed problem has neither."""
    from autotune.queries import best as best_queries

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    db, shapes = stored_best
    argv = ["best", "hopper_matmul", "--shape", shapes[0], "--dtype", "bf16", "--db", str(db)]
    for through_store in (False, True):
        if through_store:
            monkeypatch.setattr(best_queries, "plain_sqlite_file", lambda db: None)
        best_queries.close_stores()
        assert main([*argv, "--json"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["confirmed_speedup"] > 1.0 and payload["speedup_low"] > 1.0
        assert payload["program_speedup"] == pytest.approx(60.1 / 62.2)  # the median round
        assert payload["program_speedup_low"] <= payload["program_speedup"] \
            <= payload["program_speedup_high"] < 1.0
        assert payload["program_check_id"] is not None
        assert (payload["verdict_source"], payload["faster"]) == ("program-check", "baseline")
        assert payload["choice"].startswith("xla is 3.5% faster (interval ")
        assert payload["verdict"] == "slower than xla: xla is 3.5% faster"
        assert main(argv) == 0
        out = capsys.readouterr().out
        gpu_time = f"{100 * (payload['confirmed_speedup'] - 1):.1f}% faster than xla"
        assert f"  GPU time (CUPTI, kernels only): the tuned kernel is {gpu_time}\n" in out
        assert "  as a program calls them: xla is 3.5% faster (interval " in out
        assert "  the program check decides the route: xla runs\n" in out
        assert "the tuned kernel is slower" not in out
        assert main(["best", "hopper_matmul", "--shape", shapes[1], "--dtype", "bf16", "--db",
                     str(db), "--json"]) == 0
        plain = json.loads(capsys.readouterr().out)
        assert plain["program_speedup"] is None and plain["verdict_source"] is None
        assert plain["faster"] == "tie"
    best_queries.close_stores()


def test_best_says_which_implementation_runs_for_a_confirmed_tie(tmp_path, monkeypatch, capsys):
    """`autotune best` of a problem whose confirmation (no program check) ties with XLA (its
    interval holds 1.0) says that XLA runs, in the text and in --json (faster "tie", runs
    "baseline", the choice in words); one whose confirmation puts the kernel ahead says the
    kernel runs."""
    from autotune.queries import best as best_queries
    from autotune.space.kernel import get_kernel
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    monkeypatch.setattr(best_queries, "host_has_gpu", lambda: True)
    kernel = get_kernel("hopper_matmul")
    gpu = DeviceInfo("NVIDIA H100 80GB HBM3", "gpu", "9.0", "570.86")
    software = {"jax": "0.10.2", "jaxlib": "0.10.2", "autotune": "0.1.0"}
    db = tmp_path / "tie.db"
    shapes = {"m=1024,n=1024,k=512": ((100.2, 100.4, 100.1), (99.9, 100.5, 100.0)),  # a tie, XLA ahead
              "m=2048,n=1024,k=512": ((90.0, 90.2, 90.1), (100.0, 100.3, 99.9))}  # the kernel
    with Store(f"sqlite:///{db}") as store:
        for text, (kernel_us, baseline_us) in shapes.items():
            dims = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
            problem = kernel.problem(dims, "bfloat16")
            config = next(iter(kernel.valid_space(problem).sample(1, seed=0)))
            tid = store.record_trial(problem, config, TrialResult.timed(
                [kernel_us[0]], compile_s=0.1, rel_error=1e-3, timing="cupti"), device=gpu,
                software=software, cache="warm").id
            store.record_baseline(problem, "xla", [baseline_us[0]], device=gpu,
                                  software=software, cache="warm")
            confirmation = analyse_confirmation(
                [Candidate(dict(config), tuple((t,) * 5 for t in kernel_us), trial_id=tid)],
                tuple((t,) * 5 for t in baseline_us))
            store.record_confirmation(problem, confirmation, trial_ids=[tid], device=gpu,
                                      software=software, cache="warm", iterations=5,
                                      baseline_name="xla")
    best_queries.close_stores()
    tie, kernel_wins = shapes
    argv = ["best", "hopper_matmul", "--shape", tie, "--dtype", "bf16", "--db", str(db)]
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["verdict_source"], payload["faster"], payload["runs"]) == (
        "confirmation", "tie", "baseline")
    assert payload["speedup_low"] <= 1.0 <= payload["speedup_high"]
    assert ": xla runs; the kernel's best config is" in payload["choice"]
    assert main(argv) == 0
    assert "  the tuned kernel is no faster than xla (within the measured noise); xla runs\n" \
        in capsys.readouterr().out
    argv[3] = kernel_wins
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["faster"], payload["runs"]) == ("kernel", "kernel")
    assert main(argv) == 0
    assert "faster than xla; the kernel runs\n" in capsys.readouterr().out
    best_queries.close_stores()


def test_best_of_a_stored_result_imports_no_sqlalchemy(stored_best):
    """`autotune best` answering from a stored, confirmed result imports none of SQLAlchemy,
    alembic, Optuna, numpy, jax (importing SQLAlchemy was most of its CPU time: RESULTS.md §17)."""
    db, shapes = stored_best
    code = ("import sys\nfrom autotune.cli import main\n"
            f"rc = main(['best', 'hopper_matmul', '--shape', {shapes[0]!r}, '--dtype', 'bf16', "
            f"'--db', {str(db)!r}, '--device', 'gpu'])\n"
            "heavy = ('sqlalchemy', 'alembic', 'optuna', 'numpy', 'jax', 'jaxlib', 'pandas')\n"
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "confirmed" in done.stdout and done.stdout.strip().splitlines()[-1] == "0 []"

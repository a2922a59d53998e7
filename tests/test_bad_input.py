"""Bad input campaign: every malformed job file, command line and API call gets a clear error.

Each case names the three things its message must hold: the field, the value, and what is
allowed. On the command line the exit code is 2 and the last line is ``autotune: error: ...``
(no traceback); nothing is written: the database file is not created, an existing one keeps
its rows, and no results folder appears. Hypothesis fuzzes the job-file and ``--shape`` parsers
for crashes. The security rules (job files are data, imports need a flag, SQL only through bound
parameters, names never lead out of the results directory) are checked at the end.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autotune
import autotune.queries.exchange
from autotune.cli import main
from autotune.errors import AutotuneError, JobError
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store
from autotune.tuning.jobs import load_job

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "autotune"

SOFTMAX = 'kernel = "softmax"\ndtype = "float32"\nshape = { rows = 64, cols = 512 }'


def job(problem: str = SOFTMAX, *, defaults: str = "", top: str = "") -> str:
    """A job file's text: top-level keys, [defaults] settings and one [[problem]]."""
    return f"{top}\n[defaults]\n{defaults}\n\n[[problem]]\n{problem}\n"


def softmax(shape: str = "rows = 64, cols = 512", dtype: str = '"float32"', extra: str = "") -> str:
    return f'kernel = "softmax"\ndtype = {dtype}\nshape = {{ {shape} }}\n{extra}'


class Bad(NamedTuple):
    """A malformed input and what its error message must name."""

    id: str
    input: Any
    field: str
    value: str
    allowed: str


# --------------------------------------------------------------------------- the cases

JOB_FILES = [
    Bad("toml syntax", "[[problem]\nkernel = ", "line 1", "Expected ']]'", "not valid TOML"),
    Bad("toml duplicate key", 'name = "a"\nname = "b"\n', "line 2", "Cannot overwrite a value",
        "not valid TOML"),
    Bad("not utf-8", b"\xff\xfe[[problem]]\n", "byte 0xff", "offset 0", "UTF-8 text"),
    Bad("unknown top-level key", job(top="jobs = 1"), "top-level key", "'jobs'",
        "allowed: [defaults], [[problem]], name"),
    Bad("unknown setting (typo)", job(defaults="trails = 3"), "[defaults]", "'trails'",
        "allowed: trials"),
    Bad("unknown problem key", job(SOFTMAX + "\nshaep = 1"), "unknown key", "'shaep'",
        "allowed: confirm_interleave, confirm_iterations, confirm_rounds, confirm_top, dtype"),
    Bad("defaults not a table", 'defaults = 3\n[[problem]]\n' + SOFTMAX, "[defaults]", "int 3",
        "allowed settings: trials"),
    Bad("problem not an array of tables", "problem = 1\n", "'problem'", "got 1",
        "array of tables"),
    Bad("no problem", 'name = "empty"\n', "[[problem]]", "no [[problem]] entries",
        "at least one"),
    Bad("kernel missing", job('dtype = "f32"\nshape = { rows = 64, cols = 512 }'), "'kernel'",
        "got None", "one of hopper_matmul"),
    Bad("kernel not a string", job('kernel = 5\ndtype = "f32"\nshape = { rows = 64, cols = 512 }'),
        "'kernel'", "got 5", "package.module:NAME"),
    Bad("unknown kernel", job(softmax().replace('"softmax"', '"softmax2"')), "Unknown kernel",
        "'softmax2'", "bundled kernels are hopper_matmul"),
    Bad("import path without the flag", job(softmax().replace('"softmax"', '"os:system"')),
        "Kernel", "'os:system'", "--allow-import"),
    Bad("unknown shape key", job(softmax("rows = 64, cols = 512, depth = 2")), "shape key",
        "['depth']", "its keys are rows, cols"),
    Bad("missing shape key", job(softmax("rows = 64")), "shape key", "['cols']",
        "Example: --shape rows=1024,cols=1024"),
    Bad("zero size", job(softmax("rows = 0, cols = 512")), "shape key rows", "rows=0",
        "positive integer"),
    Bad("negative size", job(softmax("rows = -64, cols = 512")), "shape key rows", "rows=-64",
        "positive integer"),
    Bad("huge size", job(softmax("rows = 4611686018427387904, cols = 512")), "shape key rows",
        "rows=4611686018427387904", "at most 2147483647"),
    Bad("fractional size", job(softmax("rows = 64.5, cols = 512")), "shape key rows",
        "rows=64.5", "positive integer"),
    Bad("size as a string", job(softmax('rows = "64", cols = 512')), "shape key rows",
        "rows='64'", "positive integer"),
    Bad("size as a boolean", job(softmax("rows = true, cols = 512")), "shape key rows",
        "rows=True", "positive integer"),
    Bad("shape not a table", job('kernel = "softmax"\ndtype = "f32"\nshape = 64'), "'shape'",
        "got 64", "a table like { m = 4096, n = 4096 }"),
    Bad("shape and shapes", job(softmax() + "\nshapes = [{ rows = 64, cols = 256 }]"),
        "'shape'", "'shapes'", "either"),
    Bad("empty shapes", job('kernel = "softmax"\ndtype = "f32"\nshapes = []'), "'shapes'",
        "got []", "non-empty array"),
    Bad("shape with no valid config", job(softmax("rows = 64, cols = 100")), "chunk_cols",
        "cols=100", "multiple of"),
    Bad("unknown dtype", job(softmax(dtype='"float12"')), "dtype", "'float12'",
        "expected one of float64"),
    Bad("unsupported dtype", job(softmax(dtype='"int8"')), "supported_dtype", "not int8",
        "supports dtype float32, bfloat16"),
    Bad("dtype not a string", job(softmax(dtype="16")), "'dtype'", "got 16",
        'a string like "bfloat16"'),
    Bad("zero trials", job(defaults="trials = 0"), "trials", "= 0", "positive whole number"),
    Bad("huge trials", job(defaults="trials = 10000000000"), "trials", "10000000000",
        "positive whole number"),
    Bad("negative seconds", job(defaults="seconds = -5"), "seconds", "-5", "positive number"),
    Bad("infinite seconds", job(defaults="seconds = inf"), "seconds", "inf", "positive number"),
    Bad("NaN seconds", job(defaults="seconds = nan"), "seconds", "nan", "positive number"),
    Bad("unknown sampler", job(defaults='sampler = "annealing"'), "sampler", "'annealing'",
        "one of "),
    Bad("fractional seed", job(defaults="seed = 1.5"), "seed", "1.5", "whole number"),
    Bad("negative seed", job(defaults="seed = -1"), "seed", "-1", "0 to 2**32 - 1"),
    Bad("seed past 2**32 - 1", job(SOFTMAX + "\nseed = 4294967296"), "seed", "4294967296",
        "0 to 2**32 - 1"),
    Bad("zero iterations", job(defaults="iterations = 0"), "iterations", "= 0", "1 to 10000"),
    Bad("negative trace_top_k", job(defaults="trace_top_k = -1"), "trace_top_k", "-1",
        "0 to 100"),
    Bad("contradictory budget: trace more than measured", job(defaults="trials = 2\ntrace_top_k = 5"),
        "trace_top_k", "= 5 is more than trials = 2", "0 to 2"),
    Bad("problem listed twice", job(SOFTMAX) + "\n[[problem]]\n" + SOFTMAX + "\n", "problem #2",
        "listed twice", "each kernel, shape and dtype once"),
    Bad("name that is a path", job(top='name = "../../etc/cron.d/x"'), "name",
        "'../../etc/cron.d/x'", "one file name"),
    Bad("empty name", job(top='name = ""'), "'name'", "got ''", "non-empty string"),
]

# Placeholders: {job} a valid job file, {tmp} the test's folder.
CLI = [
    Bad("--shape separator", ["spaces", "softmax", "--shape", "rows=64;cols=512"], "--shape item",
        "'rows=64;cols=512'", "key=value"),
    Bad("--shape empty item", ["spaces", "softmax", "--shape", "rows=64,,cols=512"],
        "--shape item", "''", "key=value"),
    Bad("--shape not a number", ["spaces", "softmax", "--shape", "rows=abc,cols=512"],
        "--shape value", "rows='abc'", "expected e.g. 4096, 4k or 2**12"),
    Bad("--shape key twice", ["spaces", "softmax", "--shape", "rows=64,rows=128"], "--shape",
        "'rows'", "give each key once"),
    Bad("--shape too large", ["spaces", "softmax", "--shape", "rows=2**99,cols=512"],
        "--shape value", "rows=2**99", "at most 2147483647"),
    Bad("--shape zero", ["spaces", "softmax", "--shape", "rows=0,cols=512"], "--shape value",
        "rows=0", "positive integer"),
    Bad("--shape missing key", ["check", "softmax", "--shape", "rows=64"], "shape key",
        "['cols']", "Example: --shape rows=1024,cols=1024"),
    Bad("--dtype unknown", ["spaces", "softmax", "--shape", "rows=64,cols=512", "--dtype",
                            "float12"], "dtype", "'float12'", "expected one of float64"),
    Bad("--sample negative", ["spaces", "softmax", "--shape", "rows=64,cols=512", "--sample", "-1"],
        "--sample", "-1", "0 to 10000"),
    Bad("--sample huge", ["spaces", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096", "--sample",
                          "300000"], "--sample", "300000", "0 to 10000"),
    Bad("kernel path escape", ["spaces", "../../etc:passwd", "--shape", "rows=1",
                               "--allow-import"], "Kernel", "'../../etc:passwd'",
        "'package.module:NAME'"),
    Bad("kernel empty module", ["check", ":x", "--shape", "rows=1", "--allow-import"], "Kernel",
        "':x'", "'package.module:NAME'"),
    Bad("--db unknown dialect", ["results", "--db", "notadialect://x"], "database URL",
        "notadialect", "Expected sqlite:///PATH or postgresql://"),
    Bad("--db empty", ["results", "--db", ""], "database URL", "got ''", "such as 'sqlite:///"),
    Bad("--db bad port", ["results", "--db", "postgresql://u@host:notaport/db"], "database URL",
        "notaport", "expected e.g."),
    Bad("--db in memory", ["tune", "{job}", "--db", "sqlite://", "--device", "interpret"],
        "database", "in memory", "Give a file"),
    Bad("job file missing", ["tune", "{tmp}/missing.toml"], "Job file", "missing.toml",
        "TOML job file"),
    Bad("job file is a folder", ["tune", "{tmp}"], "Job file", "is a directory",
        "TOML job file"),
    Bad("--trials zero", ["tune", "{job}", "--trials", "0"], "--trials", "got 0",
        "positive whole number"),
    Bad("--trials huge", ["tune", "{job}", "--trials", "99999999999"], "--trials", "99999999999",
        "up to 1000000"),
    Bad("--trials not a number", ["tune", "{job}", "--trials", "x"], "--trials", "'x'",
        "int value"),
    Bad("--time-budget infinite", ["tune", "{job}", "--time-budget", "inf"], "--time-budget",
        "got inf", "positive, finite number"),
    Bad("--time-budget negative", ["tune", "{job}", "--time-budget", "-5"], "--time-budget",
        "-5", "positive, finite number"),
    Bad("--patience negative", ["tune", "{job}", "--patience", "-3"], "--patience", "got -3",
        "0 or more"),
    Bad("--sampler unknown", ["tune", "{job}", "--sampler", "annealing"], "--sampler",
        "'annealing'", "expected one of"),
    Bad("--gpus not ids", ["tune", "{job}", "--gpus", "0,x"], "--gpus", "'0,x'",
        "'all' or ids like 0,1"),
    Bad("--gpus repeated", ["tune", "{job}", "--gpus", "0,0"], "--gpus", "'0,0'",
        "distinct non-negative ids"),
    Bad("--gpus in interpret mode", ["tune", "{job}", "--gpus", "0,1", "--device", "interpret"],
        "--gpus", "0,1", "--device interpret runs on the CPU"),
    Bad("--device unknown", ["tune", "{job}", "--device", "cpu"], "--device", "'cpu'",
        "choose from"),
    Bad("import file missing", ["import", "{tmp}/missing.json"], "cannot read",
        "missing.json", "JSON export"),
    Bad("import not JSON", ["import", "{job}"], "is not JSON", "job.toml", "--format json"),
    Bad("import record without shape", ["import", "{tmp}/export.json"], "record 0",
        "no 'shape'", "each record needs kernel, shape"),
    Bad("export --out in a missing folder", ["export", "--out", "{tmp}/no/such/dir/x.json"],
        "--out", "no/such/dir/x.json", "existing, writable folder"),
    Bad("export --format unknown", ["export", "--format", "xml"], "--format", "'xml'",
        "choose from"),
    Bad("unknown command", ["optimise"], "command", "'optimise'", "choose from"),
]


def _tune_softmax(db: str, **kwargs: Any) -> Any:
    args = {"dtype": "float32", "trials": 2, "db": db, "device": "interpret"}
    args.update(kwargs)
    problems = args.pop("problems", [{"rows": 64, "cols": 512}])
    return autotune.tune(args.pop("kernel", "softmax"), problems, **args)


API: list[Bad] = [
    Bad("tune() trials zero", lambda db: _tune_softmax(db, trials=0), "trials", "= 0",
        "positive whole number"),
    Bad("tune() NaN seconds", lambda db: _tune_softmax(db, seconds=float("nan")), "seconds",
        "nan", "positive number"),
    Bad("tune() no problems", lambda db: _tune_softmax(db, problems=[]), "problems", "got []",
        "non-empty list of shapes"),
    Bad("tune() one shape, not a list", lambda db: _tune_softmax(db, problems={"rows": 64}),
        "problems", "{'rows': 64}", "non-empty list of shapes"),
    Bad("tune() device", lambda db: _tune_softmax(db, device="cpu"), "device", "'cpu'",
        "auto, gpu or interpret"),
    Bad("tune() dtype not a string", lambda db: _tune_softmax(db, dtype=16), "'dtype'", "got 16",
        'a string like "bfloat16"'),
    Bad("tune() seed", lambda db: _tune_softmax(db, seed=2**32), "seed", str(2**32),
        "0 to 2**32 - 1"),
    Bad("tune() sampler", lambda db: _tune_softmax(db, sampler="annealing"), "sampler",
        "'annealing'", "one of"),
    Bad("tune() in-memory database", lambda db: _tune_softmax("sqlite://"), "database",
        "in memory", "Give a file"),
    Bad("tune() unknown kernel", lambda db: _tune_softmax(db, kernel="softmax2"), "kernel",
        "'softmax2'", "bundled kernels are"),
    Bad("best_config() shape text", lambda db: autotune.best_config(
        "softmax", "rows=64;cols=512", "f32", db=db), "--shape item", "'rows=64;cols=512'",
        "key=value"),
    Bad("best_config() negative size", lambda db: autotune.best_config(
        "softmax", {"rows": -1, "cols": 512}, "f32", db=db), "shape['rows']", "got -1",
        "positive integer"),
    Bad("best_config() dtype", lambda db: autotune.best_config(
        "softmax", {"rows": 64, "cols": 512}, "float12", db=db), "dtype", "'float12'",
        "expected one of"),
    Bad("Problem() huge size", lambda db: Problem("softmax", {"rows": 2**40, "cols": 1}, "f32"),
        "shape['rows']", str(2**40), "up to 2147483647"),
    Bad("Store() unknown dialect", lambda db: Store("notadialect://x"), "database URL",
        "notadialect", "Expected sqlite:///PATH"),
    Bad("import_records() negative time", lambda db: autotune.queries.exchange.import_records([{
        "kernel": "softmax", "shape": {"rows": 64, "cols": 512}, "dtype": "f32",
        "device": "NVIDIA H200", "median_us": -1.0, "config": {}}], db), "median_us",
        "got -1.0", "must be a positive, finite number"),
    *(Bad(f"import_records() implausible time {value!r}",
          lambda db, value=value: autotune.queries.exchange.import_records([{
              "kernel": "softmax", "shape": {"rows": 64, "cols": 512}, "dtype": "f32",
              "device": "NVIDIA H200", "median_us": value, "config": {}}], db),
          "median_us", repr(value), "not a plausible time") for value in (1e300, 1e-9, 2e10)),
    Bad("Store() on a named pipe", lambda db: Store(_fifo(db)), "database", "named pipe",
        "regular file"),
    Bad("best_config() on a folder", lambda db: autotune.best_config(
        "softmax", {"rows": 64, "cols": 512}, "f32", db=str(_outside(db))),
        "database", "folder", "name a file"),
    Bad("lookup strict on a device", lambda db: autotune.lookup_config(
        "softmax", {"rows": 64, "cols": 512}, "f32", db="/dev/null", strict=True),
        "/dev/null", "character device", "regular file"),
]


def _outside(db: str) -> Path:
    """The test's own folder: above the database's folder, which must not be created."""
    return Path(db.removeprefix("sqlite:///")).parent.parent


def _fifo(db: str) -> str:
    """A named pipe beside ``db`` (a path): what a database path must never be."""
    path = _outside(db) / "pipe.db"
    if not path.exists():
        os.mkfifo(path)
    return str(path)


# --------------------------------------------------------------------------- running a case


def _message(err: str) -> str:
    """The CLI's error message: from its "autotune: error:" line to the end (a message may
    list several bad records, one per line)."""
    lines = err.strip().splitlines()
    assert lines, "no error message at all"
    starts = [i for i, line in enumerate(lines) if line.startswith("autotune: error: ")]
    return "\n".join(lines[starts[-1]:]) if starts else lines[-1]


def assert_names(message: str, case: Bad) -> None:
    """The message names the field, the value and what is allowed."""
    for what, part in (("field", case.field), ("value", case.value), ("allowed", case.allowed)):
        assert part in message, f"the message does not name the {what} {part!r}:\n{message}"


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``autotune ARGV`` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own errors
            code = e.code
    return int(code or 0), err.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty folder as the current directory; the default database would land in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_DB", f"sqlite:///{tmp_path}/db/autotune.db")
    (tmp_path / "job.toml").write_text(job())
    (tmp_path / "export.json").write_text(json.dumps({
        "format": "autotune-export", "version": 1,
        "records": [{"kernel": "softmax", "dtype": "float32", "device": "x", "median_us": 1.0,
                     "config": {}}],
    }))
    return tmp_path


def assert_nothing_written(tmp_path: Path) -> None:
    """No database (default or named), no results folder."""
    assert not (tmp_path / "db").exists(), "a database was created"
    assert not (tmp_path / "results").exists(), "a results folder was created"
    assert not list(tmp_path.glob("*.db*")), "a database was created"


def _cli_argv(case: Bad, tmp_path: Path) -> list[str]:
    return [a.replace("{job}", str(tmp_path / "job.toml")).replace("{tmp}", str(tmp_path))
            for a in case.input]


@pytest.mark.parametrize("case", JOB_FILES, ids=[c.id for c in JOB_FILES])
def test_bad_job_file_exits_2_naming_field_value_and_rule(case, workdir, campaign):
    """A malformed job file: `autotune tune` exits 2, names field, value and rule, writes nothing."""
    path = workdir / "bad.toml"
    path.write_bytes(case.input if isinstance(case.input, bytes) else case.input.encode())
    code, err = run_cli(["tune", str(path), "--device", "interpret"])
    campaign.add(bad_inputs=1)
    assert code == 2, err
    assert "Traceback" not in err
    message = _message(err)
    assert message.startswith("autotune: error: "), err
    assert str(path) in message or "problem #" in message or "job:" in message, message
    assert_names(message, case)
    with pytest.raises(JobError):
        load_job(path)
    assert_nothing_written(workdir)


@pytest.mark.parametrize("case", CLI, ids=[c.id for c in CLI])
def test_bad_command_line_exits_2_naming_field_value_and_rule(case, workdir, campaign):
    """A malformed argument: exit code 2, the field, value and rule named, nothing written."""
    code, err = run_cli(_cli_argv(case, workdir))
    campaign.add(bad_inputs=1)
    assert code == 2, err
    assert "Traceback" not in err
    message = _message(err)
    assert message.startswith("autotune: error: "), err
    assert_names(message, case)
    assert_nothing_written(workdir)


@pytest.mark.parametrize("case", API, ids=[c.id for c in API])
def test_bad_api_call_raises_naming_field_value_and_rule(case, tmp_path, campaign):
    """A malformed API call raises an AutotuneError (a ValueError where it is one) naming the
    field, value and rule; no database is created."""
    db = f"sqlite:///{tmp_path}/db/autotune.db"
    with pytest.raises((AutotuneError, ValueError)) as info:
        case.input(db)
    campaign.add(bad_inputs=1)
    assert_names(str(info.value), case)
    assert not (tmp_path / "db").exists()


def _counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            tables = [t for t in sa.inspect(conn).get_table_names() if t.startswith("at_")]
            return {t: conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar() for t in tables}
    finally:
        engine.dispose()


def test_bad_input_leaves_an_existing_database_as_it_was(workdir):
    """Every bad job file and argument run against a database holding a trial: same rows after."""
    url = os.environ["AUTOTUNE_DB"]
    with Store(url) as store:
        store.record_trial(Problem("softmax", {"rows": 64, "cols": 512}, "float32"),
                           Config(block_rows=8), TrialResult.timed([1.0], compile_s=0.1,
                                                                   rel_error=0.0, timing="fake"),
                           device=DeviceInfo("NVIDIA H200", "gpu"), software={"jax": "0.10.2"})
    before = _counts(url)
    assert before["at_trials"] == 1
    for case in JOB_FILES:
        path = workdir / "bad.toml"
        path.write_bytes(case.input if isinstance(case.input, bytes) else case.input.encode())
        assert run_cli(["tune", str(path), "--device", "interpret"])[0] == 2, case.id
    for case in CLI:
        argv = _cli_argv(case, workdir)
        if "--db" not in argv and argv[0] in ("tune", "results", "export", "import", "best"):
            argv += ["--db", url]
        assert run_cli(argv)[0] == 2, case.id
    assert _counts(url) == before
    assert not (workdir / "results").exists()


def test_the_campaign_has_thirty_distinct_inputs():
    """At least 30 distinct malformed inputs over job files, the command line and the API."""
    ids = [c.id for c in JOB_FILES + CLI + API]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    assert len(JOB_FILES) >= 10 and len(CLI) >= 10 and len(API) >= 10


# --------------------------------------------------------------------------- fuzzing

_SIZES = st.one_of(st.sampled_from([8, 64, 256, 512, 1024, 100, 0, -1, 2**31, 2**62]),
                   st.integers(-3, 2**34))
_VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "0.5", "-0.0", "true", "false", "[]", "{}",
                     '"softmax"', '"hopper_matmul"', '"os:system"', '"../x:y"', '":x"', '"f32"',
                     '"bfloat16"', '"float12"', '"int8"', '"tpe"', '"brute"', '""', "1979-05-27",
                     '["f32", "f16"]', '[{ rows = 8, cols = 256 }]', "{ m = 128, n = 128, k = 64 }",
                     '"../../etc/x"']),
    st.builds(lambda r, c: f"{{ rows = {r}, cols = {c} }}", _SIZES, _SIZES),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12).map(
        lambda t: json.dumps(t, ensure_ascii=False)),
)
_BASE_PROBLEM = {"kernel": '"softmax"', "dtype": '"float32"', "shape": "{ rows = 64, cols = 512 }"}
_PROBLEM_KEYS = ["kernel", "dtype", "dtypes", "shape", "shapes", "trials", "seconds", "sampler",
                 "seed", "iterations", "trace_top_k", "bogus"]
_SETTING_KEYS = ["trials", "seconds", "sampler", "seed", "iterations", "trace_top_k", "trails"]
_PROBLEM = st.tuples(
    st.sets(st.sampled_from(list(_BASE_PROBLEM)), max_size=1),
    st.dictionaries(st.sampled_from(_PROBLEM_KEYS), _VALUES, max_size=2),
).map(lambda t: {**{k: v for k, v in _BASE_PROBLEM.items() if k not in t[0]}, **t[1]})


def _toml(top: dict, defaults: dict, problems: list, junk: str) -> str:
    lines = [f"{k} = {v}" for k, v in top.items()]
    if defaults:
        lines += ["[defaults]", *(f"{k} = {v}" for k, v in defaults.items())]
    for problem in problems:
        lines += ["[[problem]]", *(f"{k} = {v}" for k, v in problem.items())]
    return "\n".join(lines) + "\n" + junk


_JOB_TEXT = st.builds(
    _toml,
    st.one_of(st.just({}), st.just({}), st.dictionaries(st.sampled_from(["name", "bogus"]),
                                                        _VALUES, max_size=1)),
    st.dictionaries(st.sampled_from(_SETTING_KEYS), _VALUES, max_size=2),
    st.lists(_PROBLEM, min_size=1, max_size=2),
    st.sampled_from(["", "", "", "", "[defaults]", "x", "= 1", "[[problem]]\n"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JOB_TEXT)
def test_fuzz_job_files_only_ever_raise_job_error(tmp_path_factory, text):
    """Arbitrary job-file text either loads or raises JobError: no crash (imports allowed, so
    import paths are parsed too)."""
    path = tmp_path_factory.getbasetemp() / "fuzz.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_job(path, allow_import=True)
    except JobError as e:
        assert str(e)


_SIZE_TEXT = st.one_of(
    st.sampled_from(["64", "512", "256", "8", "4k", "2**9", "1_024", "1024"]),
    st.integers(-5, 2**40).map(str),
    st.sampled_from(["2**99", "0**0", "1**99", "0**99", "true", "١٢٣", "²", "-1", "", "=", "1.5",
                     " 8 ", "4K", "k", "2**31", "2147483647", "2147483648"]),
)
_SHAPE_TEXT = st.one_of(
    st.text(max_size=30),
    st.builds(lambda r, c, sep: f"rows={r}{sep}cols={c}", _SIZE_TEXT, _SIZE_TEXT,
              st.sampled_from([",", ",", ", ", ";", ",,"])),
    st.lists(
        st.tuples(st.sampled_from(["rows", "cols", "rows", "cols", "m", "x", "", "1a", " rows"]),
                  _SIZE_TEXT),
        max_size=4,
    ).map(lambda items: ",".join(f"{k}={v}" for k, v in items)),
)


@settings(max_examples=300, deadline=None)
@given(_SHAPE_TEXT)
def test_fuzz_shape_on_the_command_line_exits_0_or_2(text):
    """Any --shape text: `autotune spaces softmax --shape TEXT` answers (0) or refuses (2)."""
    code, err = run_cli(["spaces", "softmax", f"--shape={text}", "--dtype", "f32", "--sample", "0",
                         "--json"])
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        assert _message(err).startswith("autotune: error: ")


# --------------------------------------------------------------------------- security


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A module that leaves a file behind when it is imported, importable from tmp_path."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "marker_kernels.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nKERNEL = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("marker_kernels", None)
    yield marker
    sys.modules.pop("marker_kernels", None)


def test_job_files_are_data_and_never_import_without_the_flag(workdir, marker_module, campaign):
    """A job file naming code (an import path, a Python expression) imports and runs nothing
    without --allow-import; the flag is what allows the import."""
    for kernel in ("marker_kernels:KERNEL", "__import__('marker_kernels')",
                   "marker_kernels.KERNEL"):
        path = workdir / "code.toml"
        path.write_text(job(softmax().replace('"softmax"', json.dumps(kernel))))
        for argv in (["tune", str(path)], ["spaces", kernel, "--shape", "rows=1"],
                     ["check", kernel, "--shape", "rows=1"]):
            code, err = run_cli(argv)
            campaign.add(bad_inputs=1)
            assert code == 2, err
            assert not marker_module.exists() and "marker_kernels" not in sys.modules, argv
    with pytest.raises(JobError, match="--allow-import"):
        _tune_softmax(f"sqlite:///{workdir}/db/x.db", kernel="marker_kernels:KERNEL")
    assert not marker_module.exists()
    code, err = run_cli(["spaces", "marker_kernels:KERNEL", "--shape", "rows=1", "--allow-import"])
    assert code == 2 and "not an autotune.Kernel" in err  # imported, because the flag says so
    assert marker_module.exists()
    assert_nothing_written(workdir)


_SAFE_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def _sql_calls(tree: ast.AST) -> list[ast.Call]:
    sql_functions = {"execute", "exec_driver_sql", "executescript", "executemany", "text"}
    return [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and node.args
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in sql_functions
    ]


def _built_from_variables(arg: ast.AST) -> bool:
    """SQL text assembled at run time from anything but constants (UPPER_CASE names)."""
    if isinstance(arg, ast.JoinedStr):
        names = [n.id for v in arg.values if isinstance(v, ast.FormattedValue)
                 for n in ast.walk(v.value) if isinstance(n, ast.Name)]
        return any(not _SAFE_NAME.match(n) and n != "int" for n in names)
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod | ast.Add):
        return True
    if isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "format":
        return True
    return False


def test_all_sql_goes_through_sqlalchemy_with_bound_parameters():
    """No SQL text in the package is assembled from variables (f-strings, %, +, format): values
    always travel as bound parameters. The only f-strings hold module constants."""
    offenders = []
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for call in _sql_calls(ast.parse(path.read_text(), str(path))):
            if _built_from_variables(call.args[0]):
                offenders.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert not offenders, f"SQL built from variables: {offenders}"


INJECTIONS = [
    "x'); DROP TABLE at_trials; --",
    "\" OR 1=1 --",
    "'; DELETE FROM at_configs WHERE '1'='1",
    "Robert'); DROP TABLE studies;--",
]


def test_injection_payloads_are_stored_verbatim_as_bound_parameters(db_url):
    """Names, configs, errors and versions holding SQL are stored and read back verbatim; the
    SQL sent to the database never contains them (they are bound parameters), tables survive."""
    statements: list[str] = []
    with Store(db_url) as store:
        sa.event.listen(store.engine, "before_cursor_execute",
                        lambda conn, cursor, statement, *a: statements.append(statement))
        for i, payload in enumerate(INJECTIONS):
            problem = Problem(payload, {"m": 64 + i}, "f32")
            result = TrialResult.failed(autotune.space.outcomes.Outcome.COMPILE_ERROR, payload)
            store.record_trial(problem, Config(tile=payload, n=i), result,
                               device=DeviceInfo(payload, "gpu", payload[:32], payload),
                               software={"jax": payload, "extra": payload}, worker=payload,
                               study_name=payload)
        rows = store.trials()
        assert store.problems(INJECTIONS[0]) and store.trials(kernel=INJECTIONS[1])
    assert len(rows) == len(INJECTIONS)
    for row, payload in zip(rows, INJECTIONS, strict=True):
        assert row.problem.kernel == payload and row.config["tile"] == payload
        assert row.error == payload and row.device.name == payload
        assert row.software["jax"] == payload and row.worker == payload
    assert statements and not [s for s in statements for p in INJECTIONS if p in s]
    assert autotune.best_config(INJECTIONS[0], {"m": 64}, "f32", db=db_url) is None


def _gpu_run(tmp_path: Path, name: str) -> tuple[Any, Any, Any]:
    """A tiny job of a kernel called ``name`` on a fake GPU (which traces its best config)."""
    import dataclasses

    from autotune.space.kernel import register
    from autotune.tuning.jobs import Budget, Job, ProblemSpec
    from tests.tuning.test_tuner import TOY, FakeEngine

    kernel = dataclasses.replace(TOY, name=name, default_config=None)
    register(kernel)
    engine = FakeEngine()
    engine._device = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570")
    problem = kernel.problem({"m": 1024, "n": 1024}, "bf16")
    spec = ProblemSpec(problem, Budget(trials=2), sampler="random", trace_top_k=1)
    return Job("j", (spec,)), engine, tmp_path / "results"


@pytest.mark.parametrize("name", ["../../escape", "/etc/cron.d/x", "a\x00b", "..", "a/./b"])
def test_a_kernel_name_leading_out_of_the_results_folder_is_refused_before_measuring(
    name, tmp_path, campaign
):
    """A kernel whose name would put its traces outside results/ is refused before anything is
    measured or stored, and nothing is written outside."""
    from autotune.tuning.tuner import run_job

    job_, engine, results = _gpu_run(tmp_path, name)
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        with pytest.raises(JobError, match="cannot be used in a path") as info:
            run_job(job_, store=store, engine=engine, results_dir=results)
        campaign.add(bad_inputs=1)
        assert repr(name) in str(info.value)
        assert engine.measured == [] and store.trials() == []
    assert not results.exists()
    assert {p.name for p in tmp_path.iterdir()} <= {"t.db", "t.db-wal", "t.db-shm"}


def test_an_import_path_kernel_name_traces_under_the_results_folder(tmp_path):
    """The names that are allowed (``package.module:NAME``) land under results/traces/."""
    from autotune.tuning.tuner import run_job

    job_, engine, results = _gpu_run(tmp_path, "my_kernels.matmul:KERNEL")
    out_dirs: list[Path] = []

    def trace(kernel_name, problem, config, out_dir, profile_space):
        out_dirs.append(Path(out_dir))
        Path(out_dir).mkdir(parents=True)  # as the evaluator that writes the trace does
        return {}

    engine.trace = trace
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        run_job(job_, store=store, engine=engine, results_dir=results)
        assert len(store.trials()) == 2
    [out_dir] = out_dirs
    assert out_dir.relative_to(results / "traces" / "my_kernels.matmul:KERNEL")
    (kernel_dir,) = (results / "traces").iterdir()
    assert kernel_dir.name == "my_kernels.matmul:KERNEL" and any(kernel_dir.rglob("*"))

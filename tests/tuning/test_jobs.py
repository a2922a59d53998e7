"""Job files: the documented form works; every malformed input names the field and value."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.errors import JobError
from autotune.space.kernel import Kernel, register
from autotune.tuning.jobs import load_job, parse_job
from tests.space.test_space import toy_space


def _unused(*args, **kwargs):  # the job parser never builds or runs a kernel
    raise AssertionError("not called")


TOY = Kernel(
    name="toy_kernel",
    space=toy_space(),
    shape_keys=("m", "n"),
    dtypes=("bfloat16", "float16"),
    build=_unused,
    make_inputs=_unused,
    reference=_unused,
)
register(TOY)

GOOD = """
[defaults]
trials = 32
sampler = "tpe"
seed = 0

[[problem]]
kernel = "toy_kernel"
dtype = "bfloat16"
shape = { m = 1024, n = 768 }

[[problem]]
kernel = "toy_kernel"
dtypes = ["bfloat16", "float16"]
shapes = [{ m = 512, n = 768 }, { m = 256, n = 256 }]
trials = 8
seconds = 30
"""


def test_documented_form_expands_problems(tmp_path):
    """The issue's job form parses; shapes x dtypes expand; problem settings override defaults."""
    path = tmp_path / "job.toml"
    path.write_text(GOOD)
    job = load_job(path)
    assert job.name == "job"
    assert len(job.problems) == 5
    first, last = job.problems[0], job.problems[-1]
    assert first.budget.trials == 32 and first.budget.seconds is None and first.sampler == "tpe"
    assert last.budget.trials == 8 and last.budget.seconds == 30.0
    assert last.problem.dtype == "float16" and last.problem.dims == {"m": 256, "n": 256}


def test_known_good_switch_parses():
    """``known_good`` defaults to true and a problem may switch it off."""
    job = parse_job(tomllib.loads(GOOD.replace("seed = 0", "seed = 0\nknown_good = false")))
    assert all(not spec.known_good for spec in job.problems)
    assert all(spec.known_good for spec in parse_job(tomllib.loads(GOOD)).problems)


def _job(problem: str, defaults: str = "") -> dict:
    return tomllib.loads(f"{defaults}\n[[problem]]\n{problem}\n")


BASE = 'kernel = "toy_kernel"\ndtype = "bfloat16"\nshape = { m = 1024, n = 768 }'

BAD_JOBS = [
    ("unknown top key", {"problem": [], "jobs": 1}, "unknown top-level key"),
    ("no problems", {"defaults": {"trials": 3}}, "no \\[\\[problem\\]\\]"),
    ("empty problems", {"problem": []}, "no \\[\\[problem\\]\\]"),
    ("problem not table", {"problem": [1]}, "array of tables"),
    ("defaults not table", {"defaults": 3, "problem": []}, "\\[defaults\\] must be a table"),
    ("unknown default", _job(BASE, "[defaults]\ntrails = 3"), "unknown key\\(s\\) \\['trails'\\] in \\[defaults\\]"),
    ("unknown problem key", _job(BASE + "\nshaep = 1"), "unknown key\\(s\\) \\['shaep'\\]"),
    ("missing kernel", _job('dtype = "bf16"\nshape = { m = 1 }'), "'kernel' must name a kernel"),
    ("unknown kernel", _job('kernel = "nope"\ndtype = "bf16"\nshape = { m = 1 }'), "Unknown kernel 'nope'"),
    ("import path without flag", _job('kernel = "os:path"\ndtype = "bf16"\nshape = { m = 1 }'), "--allow-import"),
    ("missing shape", _job('kernel = "toy_kernel"\ndtype = "bf16"'), "'shape' is missing"),
    ("shape and shapes", _job(BASE + "\nshapes = [{ m = 1, n = 1 }]"), "either 'shape' or 'shapes'"),
    ("shape not table", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = 3'), "'shape' must be a table"),
    ("missing dtype", _job('kernel = "toy_kernel"\nshape = { m = 1024, n = 768 }'), "'dtype' is missing"),
    ("unknown dtype", _job('kernel = "toy_kernel"\ndtype = "float12"\nshape = { m = 1024, n = 768 }'), "Unknown dtype 'float12'"),
    ("unsupported dtype", _job('kernel = "toy_kernel"\ndtype = "float32"\nshape = { m = 1024, n = 768 }'), "supported_dtype.*not float32"),
    ("unknown shape key", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = 1024, n = 768, q = 1 }'), "no shape key\\(s\\) \\['q'\\]"),
    ("missing shape key", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = 1024 }'), "needs shape key\\(s\\) \\['n'\\]"),
    ("zero size", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = 0, n = 768 }'), "m=0 must be a positive integer"),
    ("negative size", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = -64, n = 768 }'), "m=-64 must be a positive integer"),
    ("float size", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = 10.5, n = 768 }'), "must be an int|positive integer"),
    ("string size", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = "big", n = 768 }'), "m='big' must be a positive integer"),
    ("no valid config", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshape = { m = 100, n = 768 }'), "No valid config.*bm_domain"),
    ("zero trials", _job(BASE + "\ntrials = 0"), "trials = 0 is not allowed"),
    ("huge trials", _job(BASE + "\ntrials = 10000000000"), "trials = 10000000000 is not allowed"),
    ("bool trials", _job(BASE + "\ntrials = true"), "trials = True is not allowed"),
    ("negative seconds", _job(BASE + "\nseconds = -5"), "seconds = -5 is not allowed"),
    ("inf seconds", _job(BASE + "\nseconds = inf"), "seconds = inf is not allowed"),
    ("unknown sampler", _job(BASE + '\nsampler = "annealing"'), "sampler = 'annealing' is not allowed.*one of auto, ranked, tpe"),
    ("string known_good", _job(BASE + '\nknown_good = "no"'), "known_good = 'no' is not allowed.*true .*or false"),
    ("float seed", _job(BASE + "\nseed = 1.5"), "seed = 1.5 is not allowed"),
    ("negative patience", _job(BASE + "\npatience = -1"), "patience = -1 is not allowed.*0: never stop early"),
    ("float patience", _job(BASE + "\npatience = 2.5"), "patience = 2.5 is not allowed"),
    ("zero iterations", _job(BASE + "\niterations = 0"), "iterations = 0 is not allowed"),
    ("empty shapes", _job('kernel = "toy_kernel"\ndtype = "bf16"\nshapes = []'), "'shapes' must be a non-empty array"),
    ("duplicate problem", {"problem": [tomllib.loads(BASE), tomllib.loads(BASE)]}, "listed twice"),
    ("bad name", {"name": "", "problem": [tomllib.loads(BASE)]}, "'name' must be a non-empty string"),
    ("unknown cache", {"cache": "hot", "problem": [tomllib.loads(BASE)]}, "cache = 'hot' is not allowed.*cold, warm or auto"),
    ("negative confirm_top", _job(BASE + "\nconfirm_top = -1"), "confirm_top = -1 is not allowed.*0: none"),
    ("zero confirm_rounds", _job(BASE + "\nconfirm_rounds = 0"), "confirm_rounds = 0 is not allowed"),
    ("float confirm_iterations", _job(BASE + "\nconfirm_iterations = 2.5"), "confirm_iterations = 2.5 is not allowed"),
    ("unknown confirm_interleave", _job(BASE + '\nconfirm_interleave = "rounds"'), "confirm_interleave = 'rounds' is not allowed.*\"blocks\".*or \"calls\""),
]


@pytest.mark.parametrize("data, match", [b[1:] for b in BAD_JOBS], ids=[b[0] for b in BAD_JOBS])
def test_bad_job_names_field_and_value(data, match):
    """Each malformed job raises JobError naming the field, the value and what is allowed."""
    with pytest.raises(JobError, match=match):
        parse_job(data)


def test_missing_and_malformed_files(tmp_path):
    """A missing file and invalid TOML are reported with the path."""
    with pytest.raises(JobError, match="does not exist"):
        load_job(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[problem]\nkernel = ")
    with pytest.raises(JobError, match="is not valid TOML"):
        load_job(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(JobError):
        load_job(binary)


@settings(max_examples=150, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(
        ["problem", "defaults", "kernel", "dtype", "shape", "shapes", "trials", "m", "n", "seconds", "sampler"]),
        children, max_size=4),
    max_leaves=12,
))
def test_fuzz_job_parser_never_crashes(data):
    """Arbitrary data either parses or raises JobError: never another exception."""
    if not isinstance(data, dict):
        data = {"problem": data}
    try:
        parse_job(data)
    except JobError:
        pass


def test_a_job_past_the_problem_limit_is_refused(monkeypatch, campaign):
    """A job expanding to more problems than MAX_PROBLEMS is refused with a clear error
    before any space is checked, naming the limit."""
    from autotune.tuning import jobs
    campaign.add(bad_inputs=1)
    monkeypatch.setattr(jobs, "MAX_PROBLEMS", 10)
    shapes = [{"rows": 64 * i, "cols": 1024} for i in range(1, 7)]
    data = {"problem": [{"kernel": "softmax", "dtypes": ["float32", "float16"], "shapes": shapes}]}
    with pytest.raises(JobError, match="past 10 problems"):
        parse_job(data)
    assert len(parse_job({"problem": [{**data["problem"][0], "dtypes": ["float32"]}]}).problems) == 6


def test_an_oversized_job_file_is_refused(tmp_path, monkeypatch, campaign):
    """A job file larger than MAX_JOB_BYTES is refused before it is parsed."""
    from autotune.tuning import jobs
    campaign.add(bad_inputs=1)
    monkeypatch.setattr(jobs, "MAX_JOB_BYTES", 100)
    path = tmp_path / "big.toml"
    path.write_text("# " + "x" * 200 + '\n[[problem]]\nkernel = "softmax"\n')
    with pytest.raises(JobError, match="more than the 100 bytes a job file may be"):
        load_job(path)


def test_a_large_job_is_checked_and_every_problem_kept():
    """A 2,000-problem job (every bundled kernel's kind of space) loads with each problem
    checked; benchmarks/job_check.py measures how fast (10,000 problems)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from job_check import job_text

    job = parse_job(tomllib.loads(job_text(2000)))
    assert len(job.problems) == 2000 and len(set(s.problem for s in job.problems)) == 2000


def test_cache_and_confirmation_settings_are_read():
    """``cache`` is the job's policy (``auto`` and absent: None, decided by the device); the
    confirmation settings default to the device's count of configs (None: 5 on a GPU, none in
    interpret mode), adaptive rounds and runs sized by each program's time (None: both), and
    may be set per problem."""
    job = parse_job({"cache": "warm", "problem": [tomllib.loads(BASE + "\nconfirm_top = 0")]})
    assert job.cache == "warm" and job.problems[0].confirm_top == 0
    auto = parse_job({"cache": "auto", "problem": [tomllib.loads(BASE)]})
    spec = auto.problems[0]
    assert auto.cache is None
    assert (spec.confirm_top, spec.confirm_rounds, spec.confirm_iterations) == (None, None, None)
    assert spec.confirm_interleave is None
    calls = parse_job({"defaults": {"confirm_interleave": "calls"},
                       "problem": [tomllib.loads(BASE)]})
    assert calls.problems[0].confirm_interleave == "calls"


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "examples").rglob("*.toml")),
                         ids=lambda p: p.name)
def test_every_example_job_file_loads(path):
    """Each job file under examples/ is a valid job: its fields parse and every problem has valid
    configs (a shape no tile divides is refused at load time, not on the GPU)."""
    job = load_job(path, allow_import=True)
    assert job.problems


@pytest.mark.parametrize("name, extra", [("cmaes", "cmaes"), ("gp", "gp")])
def test_a_sampler_whose_package_is_missing_is_refused_up_front(name, extra, tmp_path,
                                                                monkeypatch, capsys):
    """A sampler that needs a package which is not installed (cmaes; torch and scipy for gp)
    is refused when the job is read, `--dry-run` included, naming the extra that installs it
    (it passed --dry-run, then failed mid-run); exit 2, nothing created."""
    import importlib.util

    from autotune import cli
    from autotune.tuning import samplers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda m, *a: None if m in ("cmaes", "torch") else real(m, *a))
    job = tmp_path / "job.toml"
    job.write_text(f'[defaults]\nsampler = "{name}"\n[[problem]]\nkernel = "softmax"\n'
                   'dtype = "float32"\nshape = { rows = 32, cols = 512 }\n')
    with pytest.raises(JobError, match=rf"pip install 'autotune\[{extra}\]'"):
        load_job(job)
    db = f"sqlite:///{tmp_path}/a.db"
    for argv in (["tune", str(job), "--dry-run", "--db", db],
                 ["tune", "examples/quickstart.toml", "--sampler", name, "--dry-run", "--db", db]):
        assert cli.main(argv) == 2
        assert f"autotune[{extra}]" in capsys.readouterr().err
    assert not (tmp_path / "a.db").exists()
    assert {e.name for e in samplers.ENTRIES if e.packages} == {"cmaes", "gp"}

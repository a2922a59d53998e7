"""`autotune report`: the plots per problem and index.html, on a fake-GPU job and a real
interpret-mode job; safe file names; clear errors."""

from __future__ import annotations

import html.parser
import os
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest

from autotune import cli
from autotune.errors import NothingTunedError
from autotune.queries import report
from autotune.space.kernel import Kernel, register
from autotune.space.outcomes import DeviceInfo, Outcome, TrialResult
from autotune.space.problem import Problem
from autotune.space.search_space import Aligned, Choice, PowerOfTwo, Space
from autotune.storage.store import Store
from autotune.tuning.jobs import Budget, Job, ProblemSpec
from autotune.tuning.tuner import run_job
from tests.cli_in_process import cli_here

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _unused(*args, **kwargs):
    raise AssertionError("the fake engine never builds kernels")


TOY = Kernel(
    name="report_toy",
    space=Space(params=(
        Aligned("bm", unit=64, low=64, high=256, divides="m"),
        Aligned("bn", unit=64, low=64, high=256, divides="n"),
        PowerOfTwo("stages", low=1, high=4),
        Choice("order", ("M", "N")),
    )),
    shape_keys=("m", "n"),
    dtypes=("bfloat16",),
    build=_unused,
    make_inputs=_unused,
    reference=_unused,
    flops=lambda p: 2 * p["m"] * p["n"] * 4096,
    bytes_moved=lambda p: 2 * (p["m"] + p["n"]) * 4096 + 2 * p["m"] * p["n"],
    baseline=lambda p: _unused,
)
register(TOY)
PROBLEM = TOY.problem({"m": 4096, "n": 4096}, "bf16")


class FakeH200:
    """Times configs from a smooth landscape; one config in five fails; traces the best."""

    parallelism = 2

    def device_info(self) -> DeviceInfo:
        return DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")

    def submit(self, kernel_name, problem, config) -> Future:
        future: Future = Future()
        us = 170 + abs(config["bm"] - 128) / 2 + abs(config["bn"] - 256) / 4 + 9 * config["stages"]
        if config["order"] == "N" and config["stages"] == 4:
            future.set_result(TrialResult.failed(Outcome.COMPILE_ERROR, "smem"))
        else:
            future.set_result(TrialResult.timed([us, us + 1], compile_s=0.1, rel_error=0.0, timing="fake"))
        return future

    def baseline(self, kernel_name, problem) -> TrialResult:
        return TrialResult.timed([180.0], compile_s=0.0, rel_error=None, timing="fake")

    def trace(self, kernel_name, problem, config, out_dir, profile_space):
        return {"load": (40.0, 64), "mma": (110.0, 64), "epilogue": (12.0, 8)}


def _fake_job(url: str, trials: int = 24) -> None:
    job = Job("r", (ProblemSpec(PROBLEM, Budget(trials=trials), sampler="tpe", seed=0, trace_top_k=2),))
    with Store(url) as store:
        run_job(job, store=store, engine=FakeH200())


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.links |= {v for k, v in attrs if k in ("href", "src") and v}


def _check_pngs(out: Path, written: report.Report) -> set[str]:
    """Every image exists, is a PNG, and index.html links it; returns the image kinds."""
    parser = _Links()
    parser.feed(written.index.read_text())
    kinds = set()
    for page in written.pages:
        for kind, rel in page.images.items():
            path = out / rel
            assert path.read_bytes()[:8] == PNG_MAGIC, path
            assert path.resolve().is_relative_to(out.resolve())
            assert rel in parser.links
            kinds.add(kind)
    return kinds


def test_report_of_a_gpu_job_draws_every_plot(tmp_path):
    """A traced fake-H200 job gets all five plots, with H200 ceilings, and an index linking them."""
    url = f"sqlite:///{tmp_path}/r.db"
    _fake_job(url)
    out = tmp_path / "report"
    written = report.write_report(url, out_dir=out)
    assert _check_pngs(out, written) == {"convergence", "importance", "distribution", "roofline",
                                         "regions"}
    [page] = written.pages
    assert page.notes == () and page.tflops is not None and page.gbps is not None
    text = written.index.read_text()
    assert "report_toy" in text and "NVIDIA H200" in text and "180.0 µs" in text
    assert written.index == out / "index.html"


def test_report_cli_and_notes_without_study_or_ceilings(tmp_path, capsys):
    """Imported interpret results: no study (importance noted), the interpret caveat and no
    roofline (no throughput from functional runs), and no CPU XLA baseline time beside an
    interpreted kernel's (an older version stored one), exit 0."""
    url = f"sqlite:///{tmp_path}/r.db"
    device = DeviceInfo("cpu-interpret (test)", "interpret")
    with Store(url) as store:
        store.record_baseline(PROBLEM, "xla", [3.25], device=device, software={"jax": "x"})
        for i, bm in enumerate((64, 128, 256)):
            config = {"bm": bm, "bn": 64, "stages": 1, "order": "M"}
            store.record_trial(PROBLEM, config, TrialResult.timed([1000.0 + 100 * i], compile_s=1.0,
                               rel_error=0.0, timing="wallclock"), device=device, software={"jax": "x"})
    out = tmp_path / "out"
    assert cli.main(["report", "--db", url, "--out", str(out)]) == 0
    assert "wrote 2 plot(s) of 1 problem(s)" in capsys.readouterr().out
    text = (out / "index.html").read_text()
    assert "no Optuna studies" in text and "Interpret mode: these are functional runs" in text
    assert "3.25" not in text and "xla" not in text
    assert not (out / "roofline.png").exists() and "roofline" not in str(list(out.rglob("*.png")))


def test_file_names_from_the_database_stay_inside_the_report(tmp_path):
    """Kernel and device names with path characters become plain folder names under --out."""
    url = f"sqlite:///{tmp_path}/r.db"
    evil = Problem("../../etc/x", {"n": 1}, "float32")
    with Store(url) as store:
        store.record_trial(evil, {"b": 1}, TrialResult.timed([5.0], compile_s=None, rel_error=None,
                           timing="fake"), device=DeviceInfo("/../../dev", "fake"), software={})
    out = tmp_path / "deep" / "out"
    written = report.write_report(url, out_dir=out)
    [page] = written.pages
    assert "/" not in page.folder and not page.folder.startswith(".")
    assert (out / page.folder).is_dir() and list((tmp_path / "deep").iterdir()) == [out]
    assert {p.name for p in tmp_path.iterdir() if not p.name.startswith("r.db")} == {"deep"}
    assert "FLOP and byte counts are not known" in " ".join(page.notes)


def test_nothing_stored_and_missing_matplotlib_are_clear_errors(tmp_path, monkeypatch, capsys):
    """An empty database raises NothingTunedError; without matplotlib the extra is named."""
    with pytest.raises(NothingTunedError, match="nothing stored"):
        report.write_report(f"sqlite:///{tmp_path}/none.db", out_dir=tmp_path / "o")
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "o").exists()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'autotune\[report\]'"):
        report.write_report(f"sqlite:///{tmp_path}/none.db", out_dir=tmp_path / "o")
    assert cli.main(["report", "--db", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "autotune[report]" in capsys.readouterr().err


def test_device_peaks_table():
    """H200 and H100 have peaks (PCIe told apart); interpret mode and unknown GPUs none."""
    assert report.device_peaks("NVIDIA H200", "gpu").hbm_tbps == 4.8
    assert report.device_peaks("NVIDIA H200", "gpu").tflops["bfloat16"] == 989.0
    assert report.device_peaks("NVIDIA H100 PCIe", "gpu").hbm_tbps == 2.0
    assert report.device_peaks("NVIDIA H100 80GB HBM3", "gpu").hbm_tbps == 3.35
    assert report.device_peaks("cpu-interpret (NVIDIA H200)", "interpret") is None
    assert report.device_peaks("NVIDIA GeForce RTX 4090", "gpu") is None
    assert report.device_peaks("NVIDIA H20", "gpu").tflops["bfloat16"] == 148.0


@pytest.mark.slow
def test_report_of_an_interpret_mode_job(tmp_path, capsys):
    """A real interpret-mode job (a tiny Pallas kernel), then `autotune report`: the plots and
    index.html are written; interpret rows get no roofline (they are not GPU timings).

    The job runs as a user runs it (``python -m autotune``, its own process); the report
    after it runs through the same command line in this process (:func:`cli_here`): what it
    writes does not depend on the process."""
    db = f"sqlite:///{tmp_path}/i.db"
    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntrials = 4\nseed = 0\niterations = 2\n'
        '[[problem]]\nkernel = "tests.kernels_for_tests:SCALE_ADD"\ndtype = "float32"\n'
        'shape = { n = 1024 }\n'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                              text=True, timeout=600, cwd=REPO, env=env, check=False)

    tuned = run("tune", str(job), "--db", db, "--device", "interpret", "--allow-import",
                "--results-dir", str(tmp_path / "results"))
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    out = tmp_path / "report"
    done = cli_here(capsys, "report", "--db", db, "--out", str(out), "--allow-import")
    assert done.returncode == 0, done.stderr[-3000:]
    [folder] = [p for p in out.iterdir() if p.is_dir()]
    names = {p.name for p in folder.iterdir()}
    assert {"convergence.png", "distribution.png"} <= names
    assert names <= {"convergence.png", "distribution.png", "importance.png"}
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in folder.iterdir())
    text = (out / "index.html").read_text()
    for name in names:
        assert f'{folder.name}/{name}' in text
    assert "cpu-interpret" in text and "Interpret mode: these are functional runs" in text
    # Two of SCALE_ADD's four blocks do not lower here: too few complete trials is a note.
    assert "importance.png" not in names and "importances need at least 10" in text


def test_no_importance_plot_below_ten_trials(tmp_path):
    """Parameter importances need 10 complete trials: with 9 trials the page notes why; with
    more (resumed to 24) the plot is drawn."""
    url = f"sqlite:///{tmp_path}/r.db"
    _fake_job(url, trials=9)
    written = report.write_report(url, out_dir=tmp_path / "nine")
    [page] = written.pages
    assert "importance" not in page.images
    assert any("importances need at least 10" in note for note in page.notes)
    _fake_job(url)
    [page] = report.write_report(url, out_dir=tmp_path / "more").pages
    assert "importance" in page.images


def test_convergence_numbers_trials_as_optuna_does(tmp_path):
    """The convergence plot's x axis is Optuna's trial number (what optuna-dashboard shows)."""
    url = f"sqlite:///{tmp_path}/r.db"
    _fake_job(url, trials=6)
    with Store(url) as store:
        rows = store.trials(PROBLEM)
    fig = report._convergence(rows, None, "t")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Optuna trial number"
    xs = sorted(int(x) for x, _y in ax.collections[0].get_offsets())
    assert xs == sorted(r.optuna_trial_number for r in rows if r.ok)


def _interpret_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/links.db"
    device = DeviceInfo("cpu-interpret (test)", "interpret")
    with Store(url) as store:
        store.record_trial(PROBLEM, {"bm": 64, "bn": 64, "stages": 1, "order": "M"},
                           TrialResult.timed([1000.0], compile_s=1.0, rel_error=0.0,
                                             timing="wallclock"), device=device, software={})
    return url


@pytest.mark.parametrize("where", ["index.html", "problem folder", "plot in the problem folder"])
def test_report_never_writes_through_a_link_left_in_its_folder(where, tmp_path, capsys, campaign):
    """A symbolic link another user left in the report folder (as index.html, as a problem's
    folder, as a plot) is refused with exit 2 naming the link; the file it points at is left
    as it was (report --out used to write through it)."""
    url = _interpret_db(tmp_path)
    out = tmp_path / "shared"
    first = report.write_report(url, out_dir=tmp_path / "probe")  # the names report uses
    [page] = first.pages
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out.mkdir()
    if where == "index.html":
        (out / "index.html").symlink_to(victim)
    elif where == "problem folder":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (out / page.folder).symlink_to(elsewhere)
        victim = elsewhere
    else:
        (out / page.folder).mkdir()
        (out / page.folder / "convergence.png").symlink_to(victim)
    campaign.add(bad_inputs=1)
    assert cli.main(["report", "--db", url, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "Traceback" not in err, err
    if victim.is_dir():
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "precious"


def test_the_index_says_which_implementation_runs_per_problem(tmp_path):
    """Where a confirmation round ran, the index's 'runs' column says which implementation the
    decorator runs, in words: the baseline named with its margin where it is confirmed faster,
    the baseline named where the two tie (the kernel no faster), the kernel with its margin
    where it is faster, and the kernel's best config every way."""
    from tests.queries.test_lookup import BIG, KERNEL, MID, SMALL, _confirmed, _problem

    url = f"sqlite:///{tmp_path}/r.db"
    small, mid, big = (KERNEL.bind(_problem(s)) for s in (SMALL, MID, BIG))
    config = next(c for c in small if big.is_valid(c))
    _confirmed(url, SMALL, config, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    _confirmed(url, BIG, config, (90.0, 90.2, 90.1), (100.0, 100.3, 99.9))
    _confirmed(url, MID, config, (100.2, 100.4, 100.1), (99.9, 100.5, 100.0))  # a tie, XLA ahead
    text = report.write_report(url, out_dir=tmp_path / "report").index.read_text()
    assert "<th>runs</th>" in text
    import re

    assert re.search(r"xla is 5\.\d% faster \(interval 5\.\d% to 5\.\d%\): it runs; the "
                     r"kernel&#x27;s best config is \{", text)
    assert re.search(r"the kernel is 1\d\.\d% faster than xla \(interval", text)
    assert re.search(r"no faster than xla \(within the measured noise: [-+]\d\.\d% to "
                     r"[-+]\d\.\d%\): xla runs; the kernel&#x27;s best config is \{", text)


def test_the_index_runs_column_follows_the_program_check(tmp_path):
    """Where the confirmation has a program check, the 'runs' column says what the decorator
    runs by it (verdict_figures), marked "as a program calls them": here the confirmation finds
    XLA 5% faster, the program check the kernel 11.1% faster."""
    from tests.queries.test_lookup import KERNEL, SMALL, _confirmed, _problem, _program_check

    url = f"sqlite:///{tmp_path}/r.db"
    config = next(iter(KERNEL.bind(_problem(SMALL))))
    _confirmed(url, SMALL, config, (100.0, 101.0, 100.5), (95.0, 95.5, 95.2))
    _program_check(url, SMALL, config, (90.0, 90.5, 90.2), (100.0, 99.5, 100.2))
    text = report.write_report(url, out_dir=tmp_path / "report").index.read_text()
    assert "the kernel is 11.1% faster than xla (interval" in text
    assert "(as a program calls them)" in text
    assert "xla is 5." not in text


def test_a_problems_notes_say_how_many_configs_were_raced_out_of_its_round(tmp_path):
    """The problem page's note on its confirmation round counts the configs raced out (timed
    in fewer rounds than the round's own) beside those timed in every round."""
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    url = f"sqlite:///{tmp_path}/r.db"
    gpu = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
    configs = [{"bm": 128, "bn": 256, "stages": 2, "order": "M"},
               {"bm": 64, "bn": 256, "stages": 2, "order": "M"}]
    with Store(url) as store:
        ids = [store.record_trial(PROBLEM, c, TrialResult.timed([us], compile_s=0.1,
                                                                rel_error=0.0, timing="fake"),
                                  device=gpu, software={"jax": "0.11.2"}, cache="cold").id
               for c, us in zip(configs, (190.0, 200.0), strict=True)]
        confirmation = analyse_confirmation(
            [Candidate(configs[0], tuple((190.0, 190.5) for _ in range(7)), trial_id=ids[0]),
             Candidate(configs[1], tuple((200.0, 200.5) for _ in range(5)), trial_id=ids[1])],
            tuple((180.0, 180.5) for _ in range(7)))
        store.record_confirmation(PROBLEM, confirmation, trial_ids=ids, device=gpu,
                                  software={"jax": "0.11.2"}, cache="cold", iterations=2,
                                  baseline_name="xla")
    [page] = report.write_report(url, out_dir=tmp_path / "report").pages
    [note] = [n for n in page.notes if n.startswith("Confirmation round")]
    assert note.startswith("Confirmation round (7 interleaved rounds of 2 runs, 2 configs "
                           "(1 raced out) and the baseline, cold cache): crowned ")

"""The sampler registry (autotune.tuning.samplers): one module per sampler behind one
interface; adding a sampler is one module and one registry line, and every entry point (job
files, ``--sampler``, ``autotune.tune``) sees it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.cli import main
from autotune.errors import JobError
from autotune.storage.store import Store
from autotune.tuning import names, samplers, sampling
from autotune.tuning.samplers.base import MODES, Request, Sampler
from tests import test_cli

REPO = Path(__file__).resolve().parents[2]
fake_tune = test_cli.fake_tune  # the fixture: `autotune tune` with a fake engine, fresh database


# -- a toy sampler: the whole of what adding one takes (its module is this test's) ---------------


class _Lowest(optuna.samplers.BaseSampler):
    """Proposes the lowest value of every tunable (the wrapper repairs a taken one to its
    nearest free neighbour); counts its proposals."""

    calls = 0

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, dist: BaseDistribution) -> Any:
        type(self).calls += 1
        if isinstance(dist, IntDistribution):
            return dist.low
        assert isinstance(dist, CategoricalDistribution)
        return dist.choices[0]


class Toy(Sampler):
    def base(self, request: Request) -> optuna.samplers.BaseSampler:
        return _Lowest()


SAMPLER = Toy()
TOY = samplers.Entry("toy", __name__, "the lowest value of every tunable (a test's)")


@pytest.fixture
def toy():
    """The toy sampler, registered for one test."""
    samplers.register(TOY)
    _Lowest.calls = 0
    yield TOY
    samplers.unregister("toy")


def test_a_registered_sampler_tunes_a_job_on_the_fake_engine(toy, fake_tune):
    """One registry line makes a new sampler usable: ``--sampler toy`` runs a job with it (the
    first trial is its proposal, every trial valid and distinct), and a job file may name it."""
    write, db, _ = fake_tune
    job = write(trials=5)
    assert main(["tune", job, "--sampler", "toy", "--db", db, "--quiet"]) == 0
    assert _Lowest.calls > 0
    with Store(db) as store:
        rows = sorted(store.trials(), key=lambda r: r.id)
    configs = [dict(r.config) for r in rows]
    assert configs[0] == {"bm": 64, "stages": 1}  # the toy's raw proposal, valid and free
    assert len(configs) == 5 and len({tuple(sorted(c.items())) for c in configs}) == 5
    Path(job).write_text(Path(job).read_text().replace('sampler = "tpe"', 'sampler = "toy"'))
    from autotune.tuning.jobs import load_job

    assert {s.sampler for s in load_job(job).problems} == {"toy"}


def test_the_command_line_sees_a_registered_sampler(toy, fake_tune, capsys):
    """`tune --help` lists it and ``--sampler`` accepts it; once unregistered, it is refused by
    name like any unknown sampler."""
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert re.search(r"brute,\s+toy", capsys.readouterr().out)
    assert "toy" in names.SAMPLERS
    write, db, _ = fake_tune
    job = write(trials=2)
    assert main(["tune", job, "--sampler", "toy", "--db", db, "--dry-run"]) == 0
    samplers.unregister("toy")
    try:
        assert main(["tune", job, "--sampler", "toy", "--db", db, "--dry-run"]) == 2
        assert "--sampler 'toy' is unknown; expected one of auto" in capsys.readouterr().err
    finally:
        samplers.register(TOY)


def test_a_sampler_needing_a_missing_package_is_refused_naming_the_extra(fake_tune, capsys):
    """An entry's ``packages`` are checked before anything runs: the error names the extra."""
    samplers.register(samplers.Entry("toy_extra", __name__, "needs a package", extra="toyx",
                                     packages=("autotune_no_such_module",)))
    try:
        write, db, _ = fake_tune
        assert main(["tune", write(trials=2), "--sampler", "toy_extra", "--db", db, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert "autotune[toyx]" in err and "autotune_no_such_module" in err
        with pytest.raises(JobError, match=r"pip install 'autotune\[toyx\]'"):
            sampling.valid_sampler("toy_extra", _space(), seed=0)
    finally:
        samplers.unregister("toy_extra")


def test_registering_a_taken_name_or_building_an_unknown_one_is_refused():
    """A duplicate name is refused (unregister first); an unknown one lists the known ones."""
    with pytest.raises(ValueError, match="'tpe' is already registered"):
        samplers.register(samplers.Entry("tpe", __name__, "a second tpe"))
    with pytest.raises(JobError, match="Unknown sampler 'annealing': expected one of auto, ranked"):
        samplers.load("annealing")
    with pytest.raises(JobError, match="Unknown sampler"):
        samplers.unregister("annealing")


def test_a_module_without_a_sampler_is_refused_by_name():
    """An entry whose module defines no SAMPLER (a Sampler instance) says what it must define."""
    samplers.register(samplers.Entry("hollow", "autotune.errors", "no SAMPLER"))
    try:
        with pytest.raises(TypeError, match="module autotune.errors must define SAMPLER"):
            samplers.load("hollow")
    finally:
        samplers.unregister("hollow")


@pytest.mark.parametrize("entry", samplers.ENTRIES, ids=lambda e: e.name)
def test_every_entry_is_a_module_implementing_the_interface(entry):
    """Each registry line names a module under autotune/tuning/samplers/ (named for its
    sampler) whose SAMPLER implements the interface with a valid draw mode."""
    assert entry.module == f"autotune.tuning.samplers.{entry.name}"
    assert (REPO / "autotune/tuning/samplers" / f"{entry.name}.py").is_file()
    impl = samplers.load(entry.name)
    assert isinstance(impl, Sampler) and impl.mode in MODES
    assert 0.0 <= impl.local_share <= 1.0
    assert entry.summary and (entry.extra is None) == (not entry.packages)


def test_the_names_are_the_registry_and_read_without_importing_a_sampler():
    """names.SAMPLERS is the registry's list, live; importing it (as the command line's parser
    does) imports neither Optuna, numpy nor any sampler module."""
    assert tuple(names.SAMPLERS) == samplers.names() == tuple(e.name for e in samplers.ENTRIES)
    code = ("import sys, autotune.tuning.names as n; assert 'auto' in n.SAMPLERS; "
            "bad = [m for m in sys.modules if m in ('optuna', 'numpy') "
            "or m.startswith('autotune.tuning.samplers.')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_docs_list_every_sampler_from_the_registry():
    """docs/cli.md's sampler table is the registry's entries (name, summary, extra), in order."""
    text = (REPO / "docs/cli.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+?) \| (.*?) \|$", text, flags=re.M)
    expected = [(e.name, e.summary, f"`autotune[{e.extra}]`" if e.extra else "")
                for e in samplers.ENTRIES]
    assert rows == expected


def _space():
    from autotune.space.problem import Problem
    from autotune.space.search_space import Choice, Space

    space = Space(params=(Choice("a", (1, 2, 4), ordered=True), Choice("b", ("x", "y"))))
    return space.bind(Problem("names", {"n": 1}, "float32"))

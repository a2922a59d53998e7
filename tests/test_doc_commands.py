"""Every shell command of README.md and docs/*.md runs as written on a CPU-only machine.

The commands are read from the fenced ``bash`` blocks: each line (continuations joined) that
starts with ``autotune`` or ``python3 -m autotune``, and the README's first block, whose lines
install then run (the install is the environment's; the rest runs). Each command is one of:

* a synopsis (``[optional]`` parts, placeholders such as ``JOB.toml`` or ``KERNEL``): its
  subcommand exists and its ``--help`` exits 0 (``tests/test_readme.py`` checks each flag);
* a command naming the reader's own module or job (``my_kernels:KERNEL``, ``my-op.toml`` in
  docs/user_kernels.md):
  listed in :data:`READERS_OWN`; the README's "tune your own kernel" steps run the same
  commands on ``examples/user_kernels/bias_gelu.py``;
* runnable: run with ``python -m autotune`` from a scratch folder holding a copy of
  ``examples/`` (so nothing is written into the checkout), the database in that folder, and
  exit 0 required. The default run runs those that need nothing tuned before them (``spaces``,
  ``check`` with ``--sample 2``); the ``extended`` run runs every one in order as written, and
  the README's quickstart (its first command, about a minute).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
_PLACEHOLDERS = re.compile(r"\[|\.\.\.|\bJOB\.toml\b|(?<![:\w])KERNEL\b|\bFILE\b|\bCOMMAND\b|\bNAME\b|\bURL\b")
# Commands naming a module of the reader's (docs/user_kernels.md's my_kernels.py, whose
# functions are "..."): not runnable here; the README runs the same steps on bias_gelu.
READERS_OWN = ("my_kernels:KERNEL", "my-op.toml")


def _commands(path: Path) -> list[str]:
    """The autotune commands of ``path``'s bash blocks, continuations joined, comments cut."""
    out = []
    for block in _BLOCK.findall(path.read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" # ")[0].strip()
            for part in (p.strip() for p in line.split("&&")):
                if part.startswith(("autotune ", "python3 -m autotune ")):
                    out.append(part)
    return out


def _kind(command: str) -> str:
    if any(name in command for name in READERS_OWN):
        return "readers_own"
    return "synopsis" if _PLACEHOLDERS.search(command) else "runnable"


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    return words[3:] if words[0] == "python3" else words[1:]


def _all() -> dict[Path, list[str]]:
    return {path: _commands(path) for path in DOCS}


def test_the_docs_hold_commands_of_each_kind():
    """The extraction finds the README's runnable steps, its synopses, and the reader's-own
    commands of docs/user_kernels.md (a change to the docs that hides them fails here)."""
    found = _all()
    readme = found[REPO / "README.md"]
    kinds = [_kind(c) for c in readme]
    assert kinds.count("runnable") >= 5 and kinds.count("synopsis") >= 10, readme
    assert "autotune tune examples/quickstart.toml" in readme and "autotune results" in readme
    assert all(_kind(c) != "runnable" for c in found[REPO / "docs" / "user_kernels.md"])


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_synopsis_names_a_command_whose_help_exits_0(path, capsys):
    """A synopsis line names a subcommand that exists; its --help exits 0."""
    for command in _commands(path):
        if _kind(command) != "synopsis":
            continue
        words = [w for w in _argv(command) if not w.startswith(("[", "-"))]
        name = words[0] if words else None
        argv = [name, "--help"] if name and name.isalpha() and name.upper() != name else ["--help"]
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0, (path.name, command)
    capsys.readouterr()


def _scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder with a copy of examples/ (the commands' relative paths), and the environment
    that runs this checkout's autotune there against a database in the folder."""
    shutil.copytree(REPO / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOTUNE_DB": str(tmp_path / "autotune.db"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    return tmp_path, env


def _run(command: str, cwd: Path, env: dict[str, str], *,
         tiny: bool) -> subprocess.CompletedProcess:
    argv = _argv(command)
    if tiny and argv[0] == "tune":
        argv += ["--trials", "1"]  # a tiny budget: the command's path, not its length
    if tiny and argv[0] == "check":
        argv += ["--sample", "2"]
    return subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def _runnable(path: Path, *, quickstart: bool) -> list[str]:
    first = _commands(path)[:2] if path.name == "README.md" else []
    return [c for c in _commands(path) if _kind(c) == "runnable" and (c in first) == quickstart]


# Commands that need nothing tuned before them, and cost seconds: in the default run.
CHEAP = ("spaces", "check", "results", "export")


@pytest.mark.parametrize("path", [p for p in DOCS if _runnable(p, quickstart=False)],
                         ids=lambda p: p.name)
def test_the_cheap_runnable_commands_exit_0_on_a_cpu(path, tmp_path):
    """Each runnable command that needs nothing tuned before it (the README's `spaces` and
    `check` steps) exits 0 on this CPU-only machine, `check` with a tiny sample."""
    cwd, env = _scratch(tmp_path)
    cheap = [c for c in _runnable(path, quickstart=False) if _argv(c)[0] in CHEAP]
    assert cheap
    for command in cheap:
        done = _run(command, cwd, env, tiny=True)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])


@pytest.mark.extended
@pytest.mark.parametrize("path", [p for p in DOCS if _runnable(p, quickstart=False)],
                         ids=lambda p: p.name)
def test_every_runnable_command_exits_0_on_a_cpu_as_written(path, tmp_path):
    """Every runnable command (the README's "tune your own kernel" steps: spaces, check, tune,
    best) exits 0 in order, as written, on this CPU-only machine (about a minute; the
    interpret-mode tests of the example cover the same path in the default run)."""
    cwd, env = _scratch(tmp_path)
    for command in _runnable(path, quickstart=False):
        done = _run(command, cwd, env, tiny=False)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])


@pytest.mark.extended
def test_the_readme_quickstart_exits_0_on_a_cpu(tmp_path):
    """The README's first command after the install: `autotune tune examples/quickstart.toml
    && autotune results` exits 0 (about a minute on 2 cores; docs/quickstart.md)."""
    cwd, env = _scratch(tmp_path)
    commands = _runnable(REPO / "README.md", quickstart=True)
    assert commands == ["autotune tune examples/quickstart.toml", "autotune results"]
    for command in commands:
        argv = _argv(command)
        done = subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    assert "[interpret]" in done.stdout or "gpu" in done.stdout

"""The README and the command line agree: every flag of every subcommand's --help is in the
README's usage block and every flag there exists; the README links only to files in the
repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune import cli

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
GLOBAL = {"-v", "--verbose", "-q", "--quiet", "--db", "--version"}
COMMANDS = ["spaces", "tune", "status", "best", "results", "check", "export", "import", "revalidate", "report",
            "verify", "db"]
FLAG = re.compile(r"(?:^|(?<=[\s\[(|,]))(--?[A-Za-z][A-Za-z0-9-]*)")


def _usage_block() -> str:
    section = README.split("### Command line", 1)[1]
    return section.split("```bash", 1)[1].split("```", 1)[0]


def _readme_lines() -> dict[str, set[str]]:
    """Flags per command in the usage block (continuation lines joined; comments dropped)."""
    block = _usage_block().replace("\\\n", " ")
    out: dict[str, set[str]] = {}
    for line in block.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "autotune":
            continue
        command = words[1] if len(words) > 1 and words[1] in COMMANDS else ""
        out.setdefault(command, set()).update(FLAG.findall(" ".join(words[1:])))
    return out


def _help_flags(argv: list[str], capsys) -> set[str]:
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    text = capsys.readouterr().out
    options = text.split("options:", 1)[1] if "options:" in text else text
    return {f for f in re.findall(r"^\s+(-[-\w, ]+?)(?:\s[A-Z{]|\s\s|$)", options, re.M)
            for f in re.findall(r"--?[A-Za-z][\w-]*", f)} - {"-h", "--help"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_flag_is_in_the_readme_and_back(command, capsys):
    """Each subcommand's --help flags (global ones aside) are its README usage line's flags."""
    readme = _readme_lines()
    assert command in readme, f"no `autotune {command}` line in the README's usage block"
    helped = _help_flags([command], capsys)
    assert helped - GLOBAL == readme[command] - GLOBAL, (
        f"in --help only: {sorted(helped - readme[command] - GLOBAL)}; "
        f"in the README only: {sorted(readme[command] - helped - GLOBAL)}")


def test_global_flags_are_in_the_readme(capsys):
    """The top-level flags (--version, -v, -q, --db) are on the README's global line."""
    helped = _help_flags([], capsys)
    assert helped == _readme_lines()[""] == GLOBAL


def test_readme_links_only_to_files_in_the_repository():
    """Every relative link of the README names a file or folder of the repository, and no
    path leads out of it."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert local, "the README links to no files at all"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README links to missing files: {missing}"
    outside = re.findall(r"(?<![\w.])\.\./[\w./-]*|/work/[\w./-]*", README)
    assert not outside, f"README cites paths outside the repository: {outside}"

"""The docs name tests by path (``tests/<folder>/test_x.py::test_name``); every one exists."""

from __future__ import annotations

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "benchmarks" / "RESULTS.md", *sorted((REPO / "docs").glob("*.md"))]
NAMED = re.compile(r"tests/[\w/]*?test_\w+\.py(?:::\w+\*?)?")  # name* : any name so begun


def test_every_test_named_in_the_docs_exists():
    """Each ``tests/...test_x.py`` (and ``::test_name``) in the README and docs/ is a real test
    file (and a test function in it), so moving tests cannot leave a doc pointing nowhere."""
    missing = []
    defined_in: dict[pathlib.Path, set[str]] = {}  # each file parsed once, however often named
    for doc in DOCS:
        if not doc.exists():
            continue
        for ref in sorted(set(NAMED.findall(doc.read_text()))):
            path, _, name = ref.partition("::")
            file = REPO / path
            if not file.is_file():
                missing.append(f"{doc.relative_to(REPO)}: {ref} (no such file)")
                continue
            if name:
                if file not in defined_in:
                    defined_in[file] = {n.name for n in ast.walk(ast.parse(file.read_text()))
                                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                defined = defined_in[file]
                found = (any(d.startswith(name[:-1]) for d in defined) if name.endswith("*")
                         else name in defined)
                if not found:
                    missing.append(f"{doc.relative_to(REPO)}: {ref} (no such test)")
    assert not missing, "\n".join(missing)


def _exit_codes(doc: pathlib.Path, heading: str) -> set[int]:
    """The codes in the first column of the table under ``heading`` in ``doc``."""
    text = doc.read_text().split(heading, 1)[1]
    codes = set()
    for line in text.splitlines()[1:]:
        if line.startswith("#"):
            break
        cell = line.split("|")[1].strip() if line.startswith("|") else ""
        if cell.isdigit():
            codes.add(int(cell))
    return codes


def test_the_exit_codes_agree_between_the_docs_and_the_code():
    """docs/guarantees.md and docs/cli.md list the same exit codes, and they are exactly the
    codes the CLI uses (its EXIT_ constants, and 128 + SIGTERM from autotune.interrupts)."""
    import signal

    from autotune import cli

    guarantees = _exit_codes(REPO / "docs" / "guarantees.md", "## Exit codes")
    usage = _exit_codes(REPO / "docs" / "cli.md", "## Errors and exit codes")
    used = {v for k, v in vars(cli).items() if k.startswith("EXIT_") and isinstance(v, int)}
    used.add(128 + signal.SIGTERM)
    assert guarantees == usage == used, (sorted(guarantees), sorted(usage), sorted(used))


def test_the_campaign_counts_in_the_docs_are_the_measured_ones():
    """docs/guarantees.md states the reliability campaign's counts as benchmarks/campaign.py
    last measured them (docs/campaign.json), and they meet the goals: at least 200
    bad inputs, at least 60 faults, no trial lost or stored twice."""
    import json

    measured = json.loads((REPO / "docs" / "campaign.json").read_text())
    text = (REPO / "docs" / "guarantees.md").read_text()
    found = re.search(r"\*\*(\d+)\s+bad\s+inputs\s+tried,\s+(\d+)\s+faults\s+injected,\s+"
                      r"(\d+)\s+trials\s+lost,\s+(\d+)\s+duplicates\*\*", text)
    assert found, "docs/guarantees.md does not state the campaign's counts"
    stated = [int(n) for n in found.groups()]
    assert stated == [measured[k] for k in ("bad_inputs", "faults", "lost", "duplicates")], (
        stated, measured)
    assert measured["bad_inputs"] >= 200 and measured["faults"] >= 60
    assert measured["lost"] == measured["duplicates"] == 0


RESULTS = REPO / "benchmarks" / "RESULTS.md"
# A citation of a RESULTS.md section: ``benchmarks/RESULTS.md §4`` (backquotes allowed).
CITATION = re.compile(r"RESULTS\.md`?\s*§(\d+)")
# Older ways of citing (by the word "section", by a quoted title, "RESULTS §N"): no longer used.
OLD_CITATION = re.compile(r"RESULTS(?:\.md`?,?\s*(?:sections?\s+\d|\"[A-Z])|\s+§)")
CITING = [REPO / "README.md", *sorted(p for folder in ("autotune", "search_spaces", "benchmarks", "docs",
                                                       "examples", "tests")
                                      for p in (REPO / folder).rglob("*")
                                      if p.suffix in (".py", ".md", ".toml", ".sh") and p != RESULTS)]


def _results_sections() -> dict[int, str]:
    """``{number: body}`` of the ``## N. Title`` sections of benchmarks/RESULTS.md."""
    parts = re.split(r"^## (\d+)\. .*$", RESULTS.read_text(), flags=re.M)
    return {int(n): body for n, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_cited_results_section_exists():
    """Code, docs, examples and tests cite RESULTS.md sections as ``RESULTS.md §N``, and every
    N cited (there and inside RESULTS.md itself) is a section of it."""
    sections = _results_sections()
    missing, old = [], []
    for path in CITING:
        text = path.read_text()
        missing += [f"{path.relative_to(REPO)}: §{n}" for n in CITATION.findall(text)
                    if int(n) not in sections]
        old += [f"{path.relative_to(REPO)}: {m.group(0)!r}" for m in OLD_CITATION.finditer(text)
                if path.name != "test_docs.py"]
    missing += [f"RESULTS.md: §{n}" for n in re.findall(r"§(\d+)", RESULTS.read_text())
                if int(n) not in sections]
    assert not missing, "cited sections that RESULTS.md does not have:\n" + "\n".join(missing)
    assert not old, "cite a section as 'RESULTS.md §N':\n" + "\n".join(old)


def test_results_states_each_claim_with_its_command_and_stays_short():
    """benchmarks/RESULTS.md: sections numbered 1..N in order, each stating its claim and the
    command that reproduces it; no work-session diary; under 500 lines."""
    sections = _results_sections()
    text = RESULTS.read_text()
    assert list(sections) == list(range(1, len(sections) + 1))
    for number, body in sections.items():
        assert "Claim:" in body and "```\n" in body, f"§{number} needs its claim and command"
    assert not re.search(r"\b[Ss]ession \d|\bAgain on\b|\b20\d\d-\d\d-\d\d\b", text)
    assert len(text.splitlines()) < 500


SCRIPTS_GOAL = 300_000  # bytes: "benchmarks/ under 300 KB of scripts"


def test_the_benchmark_scripts_stay_under_300_kb():
    """benchmarks/ holds scripts, not a lab notebook: its .py and .sh files together stay
    under SCRIPTS_GOAL (300 KB). Code two scripts
    share lives once (the package, or benchmarks/common.py); notes go to docs/, results to
    RESULTS.md."""
    scripts = sorted((p for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")),
                     key=lambda p: -p.stat().st_size)
    size = sum(p.stat().st_size for p in scripts)
    largest = ", ".join(f"{p.name} {p.stat().st_size:,}" for p in scripts[:3])
    assert size < SCRIPTS_GOAL, (
        f"benchmarks/ scripts (.py, .sh) total {size:,} bytes, not under {SCRIPTS_GOAL:,} "
        f"(300 KB): put shared code "
        f"in one place (the package or benchmarks/common.py) and remove what nothing cites. "
        f"Largest: {largest}")

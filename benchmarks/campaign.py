"""Counts the reliability campaign: bad inputs tried and faults injected by every test that
takes the ``campaign`` fixture, with trials lost and stored twice (both must be 0).

    python3 benchmarks/campaign.py            # runs the campaign's test files, prints the counts
    python3 benchmarks/campaign.py -n 4       # the same over 4 pytest-xdist workers

It runs pytest on the test files that use the fixture (found by reading them), with
``$AUTOTUNE_CAMPAIGN_OUT`` set so that the session writes its totals, and stores them in
``docs/campaign.json``; ``docs/guarantees.md`` states them, and
``tests/test_docs.py::test_the_campaign_counts_in_the_docs_are_the_measured_ones`` checks that
the two agree and that the goals hold (at least 200 bad inputs, 60 faults, 0 lost or
duplicated).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "campaign.json"


def campaign_files() -> list[str]:
    """The test files with a test that takes the ``campaign`` fixture."""
    takes = re.compile(r"def test_\w+\([^)]*\bcampaign\b")
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                  if takes.search(p.read_text(encoding="utf-8")))


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "counts.json"
        env = {**os.environ, "AUTOTUNE_CAMPAIGN_OUT": str(out)}
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              *argv, *campaign_files()], cwd=REPO, env=env, check=False)
        if not out.exists():
            print("campaign: the session wrote no counts", file=sys.stderr)
            return run.returncode or 1
        counts = json.loads(out.read_text())
    counts["files"] = campaign_files()
    counts["pytest_exit"] = run.returncode
    OUT.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    print(f"campaign: {counts['bad_inputs']} bad inputs tried, {counts['faults']} faults injected, "
          f"{counts['lost']} trials lost, {counts['duplicates']} duplicates (pytest exit "
          f"{run.returncode}); written to {OUT.relative_to(REPO)}")
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

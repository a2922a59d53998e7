"""The search-efficiency replay as a regression check (benchmarks/search_efficiency.py).

Replays the default sampler over recorded H200 ground truth (benchmarks/data/) with the
settings of the committed reference (benchmarks/data/replay_reference.json) and fails when the
default needs far more trials than the reference recorded: a search regression, not a timing
test. Re-record the reference with the command in benchmarks/RESULTS.md section 3 when a change
to the sampler is meant to move these numbers.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
REFERENCE = json.loads((DATA / "replay_reference.json").read_text())


def _replay_module():
    spec = importlib.util.spec_from_file_location("search_efficiency", ROOT / "benchmarks" / "search_efficiency.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("search_efficiency", module)
    spec.loader.exec_module(module)
    return module


def allowed(recorded: float, budget: int) -> float:
    """A wide margin: half again the recorded median, plus two trials."""
    return min(recorded * 1.5 + 2, budget + 1)


@pytest.mark.slow
def test_default_sampler_needs_no_more_trials_than_recorded():
    replay = _replay_module()
    files = [str(DATA / name) for name in REFERENCE["files"]]
    rows = replay.run(files, seeds=REFERENCE["seeds"], budget=REFERENCE["budget"], samplers=REFERENCE["samplers"])
    got = {f"{r['problem']} | {r['sampler']}": r for r in rows}
    assert set(got) == set(REFERENCE["median_trials"])
    worse = []
    for key, recorded in REFERENCE["median_trials"].items():
        for threshold, median in recorded.items():
            now = got[key][threshold][0]
            if now > allowed(median, REFERENCE["budget"]) and median <= REFERENCE["budget"]:
                worse.append(f"{key} within {float(threshold):.1%}: {now:g} trials, recorded {median:g}")
    assert not worse, "the default sampler got slower to find the best:\n" + "\n".join(worse)


def test_stop_rule_matches_the_tuner():
    """The replay's early-stop rule counts trials as the tuner's patience does."""
    replay = _replay_module()
    curve = [5, 4, 3, 3, 3, 3, 2, 2, 2, 2, 2]
    assert replay.stop_at(curve, 3) == 6  # best at trial 3, three trials without a better one
    assert replay.stop_at(curve, 10) == len(curve)

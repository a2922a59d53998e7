"""benchmarks/common.py: the pieces several benchmark scripts share."""

from __future__ import annotations

import pytest

from benchmark_scripts import load


def test_a_problem_written_kernel_shape_dtype_is_parsed_or_refused_by_name():
    common = load("common")
    kernel, problem = common.parse_problem("softmax:rows=64,cols=512:float32")
    assert kernel.name == "softmax" and dict(problem.dims) == {"rows": 64, "cols": 512}
    assert problem.dtype == "float32"
    with pytest.raises(SystemExit, match="expected KERNEL:SHAPE:DTYPE"):
        common.parse_problem("softmax:rows=64,cols=512")
    assert common.fmt(None, ".1f") == "-" and common.fmt(2.345, ".1f") == "2.3"


def test_the_ask_path_is_timed_once_per_ask_against_the_stored_trials():
    """ask_latency.py's measurement through the shared helpers: over a study holding the stored
    trials, every ask is answered (none refused) and timed, wall and CPU, in milliseconds."""
    ask_latency = load("ask_latency")
    times = ask_latency.measure("random", stored=40, asks=5)
    assert len(times) == 5 and all(wall >= 0 and cpu >= 0 for wall, cpu in times)

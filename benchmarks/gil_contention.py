"""How long storing a result takes on a job's loop while the ranked samplers make ready on
their thread, at Python's default switch interval and at the job's (issue 16, first trial).

    python3 benchmarks/gil_contention.py --out $OUT/gil_contention.json

A job's loop stores each result (``Store.record_trial``: a handful of SQLite statements, each
of which lets go of the GIL) while the ranked samplers of ``examples/gpu_evidence.toml``'s four
hopper_matmul problems climb on their cost model (pure Python, on the one preparer thread
that the scheduler starts once every problem is open: :meth:`RankedSampler.prepare`). Every
statement must win the GIL back from the climbing thread, which Python takes from it only
after the switch interval. Each case runs in a fresh process: stores back to back on the main
thread for as long as the climbs last (``--stores`` of them without climbs), and prints the
median, 90th percentile and maximum time of one store and how long the four climbs took.
The job's process runs at :data:`autotune.tuning.tuner.JOB_SWITCH_INTERVAL_S`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
interval, climbs, stores = float(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
problems = int(sys.argv[5])
sys.setswitchinterval(interval)
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.kernel import get_kernel
from autotune.space.problem import Config
from autotune.storage.store import Store
from autotune.tuning.sampling import valid_sampler

kernel = get_kernel("hopper_matmul")
shapes = [dict(m=4096, n=4096, k=4096), dict(m=8192, n=3584, k=4096),
          dict(m=4096, n=14336, k=4096), dict(m=256, n=8192, k=8192)]
samplers = [valid_sampler("ranked", kernel.valid_space(kernel.problem(s, "bfloat16")), seed=0,
                          estimate=kernel.cost_model) for s in shapes[:problems]]
problem = kernel.problem(shapes[0], "bfloat16")
configs = kernel.valid_space(problem).sample(4000, seed=1)
device = DeviceInfo(name="NVIDIA H200", kind="gpu")
with Store(f"sqlite:///{tempfile.mkdtemp()}/gil.db") as store:
    store.record_trial(problem, Config(configs[-1]), TrialResult.timed([1.0], compile_s=1.0,
                       rel_error=0.0, timing="cupti"), device=device, software={})
    start = time.perf_counter()
    if climbs:
        for s in samplers:
            s.prepare()
    took, climbed = [], None
    for i, config in enumerate(configs[:-1]):
        t = time.perf_counter()
        store.record_trial(problem, Config(config), TrialResult.timed([100.0 + i], compile_s=1.0,
                           rel_error=0.0, timing="cupti"), device=device, software={})
        took.append(time.perf_counter() - t)
        if climbs and all(s.ready() for s in samplers):
            climbed = time.perf_counter() - start
            break
        if not climbs and len(took) >= stores:
            break
took_ms = sorted(1000 * t for t in took)
print(json.dumps({"switch_interval_ms": 1000 * interval, "climbs": climbs, "stores": len(took),
                  "median_ms": statistics.median(took_ms),
                  "p90_ms": took_ms[int(0.9 * (len(took_ms) - 1))], "max_ms": took_ms[-1],
                  "climbs_s": climbed}))
"""


def run_case(interval_s: float, climbs: bool, stores: int, problems: int = 4) -> dict[str, object]:
    """One case in a fresh process; ``problems``: how many of the four problems' samplers
    climb (the tests run one)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), repr(interval_s), "1" if climbs else "0",
         str(stores), str(problems)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", type=int, default=100, help="stores timed without climbs")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each case")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from autotune.tuning.tuner import JOB_SWITCH_INTERVAL_S

    rows = []
    print(f"{'switch interval':>16} {'climbs':>7} {'stores':>7} {'median ms':>10} {'p90 ms':>8} "
          f"{'max ms':>8} {'climbs s':>9}")
    for _ in range(args.repeat):
        for interval in (sys.getswitchinterval(), JOB_SWITCH_INTERVAL_S):
            for climbs in (False, True):
                r = run_case(interval, climbs, args.stores)
                rows.append(r)
                climbed = "-" if r["climbs_s"] is None else f"{r['climbs_s']:.2f}"
                print(f"{r['switch_interval_ms']:>13g} ms {str(climbs):>7} {r['stores']:>7} "
                      f"{r['median_ms']:>10.1f} {r['p90_ms']:>8.1f} {r['max_ms']:>8.1f} "
                      f"{climbed:>9}")
    for interval in sorted({r["switch_interval_ms"] for r in rows}, reverse=True):
        quiet = [r["median_ms"] for r in rows if r["switch_interval_ms"] == interval and not r["climbs"]]
        busy = [r["median_ms"] for r in rows if r["switch_interval_ms"] == interval and r["climbs"]]
        print(f"at {interval:g} ms: a store takes {statistics.median(busy) / statistics.median(quiet):.1f}x "
              "as long while the samplers climb")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

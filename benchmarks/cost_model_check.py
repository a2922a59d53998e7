"""How well a kernel's cost model ranks what was measured on the GPU (CPU only, seconds).

    python3 benchmarks/cost_model_check.py [--kernel K] [--device NAME] [--ground-truth FILES]
        [--live FILES] [--constants NAME=VALUE,...] [--json OUT]

Reads every measurement of the kernel on ``--device`` (the package's, or ground-truth files and
live runs' JSON or ``--jsonl`` files), under its facts. Per problem: the configs
measured, the estimate's rank correlation (Spearman) with the times over all and within 30% of
the fastest, the measured gap of the model's first *family* (configs whose estimates share an
``ESTIMATE_TWIN``-wide bucket in log time) and how many families it ranks ahead of the fastest
config's; ``family_outliers``: configs within 30% of the fastest measured 3% or more above
their family's median (docs/ranked_sampler.md).

``--constants`` checks the model with some constants changed, for a kernel whose module
defines ``cost_model(**constants)`` (``hopper_matmul``: the fields of ``Hopper``, e.g.
``--constants stage_transfer=loaded,l2_latency=2000``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from autotune.devices import profile_for_name, using_profile  # noqa: E402
from autotune.replay.ground_truth import devices, load_ground_truth, load_live, recorded_us  # noqa: E402
from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.problem import Config, Problem  # noqa: E402
from autotune.tuning.samplers.ranked import ESTIMATE_TWIN  # noqa: E402

# The device whose measurements the cost models' constants were fitted on.
DEVICE = "NVIDIA H200"
NEAR = 1.3  # "near the best": within 30% of the fastest measured
OUTLIER = 0.03  # a config measured this much above its family's median (family_outliers)


def ground_truth(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Problems of ground-truth files: {"source", "kernel", "shape", "dtype", "times"}, where
    times maps a config's canonical JSON to its recorded time (``autotune.replay.ground_truth.recorded_us``:
    the median of its re-timed rounds, else its median; failures left out)."""
    out = []
    for path in paths:
        with _reading(path, "a ground-truth file (benchmarks/ground_truth.py)"):
            data = json.loads(Path(path).read_text())
            out.append(_recorded(data))
    return out


def _recorded(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ground-truth problem as :func:`ground_truth` gives it."""
    return {"source": "ground truth", "kernel": data["kernel"], "shape": data["shape"],
            "dtype": data["dtype"], "times": {_key(r["config"]): recorded_us(r) for r in data["results"]
                                              if r["status"] == "ok" and r["median_us"]}}


@contextlib.contextmanager
def _reading(path: str, what: str) -> Iterator[None]:
    """A file that cannot be read, or is not ``what``, stops the script naming it."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"{path}: not {what} ({type(e).__name__}: {e})") from None


def live(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Problems measured by live jobs, from the JSON written by the live runs (``{run: {"trials":
    {problem: [{"config", "status", "median_us"}, ...]}}}``) or from ``--jsonl`` progress files
    (``"event": "trial"`` lines): each config's median over the runs that measured it."""
    seen: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    shapes: dict[tuple[str, str, str], tuple[str, dict[str, int], str]] = {}

    def add(kernel: str, shape: Mapping[str, int], dtype: str, config: Mapping[str, Any],
            ok: bool, time_us: float | None) -> None:
        key = (kernel, json.dumps(dict(shape), sort_keys=True), dtype)
        shapes[key] = (kernel, dict(shape), dtype)
        times = seen.setdefault(key, {}).setdefault(_key(config), [])
        if ok and time_us:
            times.append(float(time_us))

    for path in paths:
        with _reading(path, "a live run's trials (JSON of runs, or --jsonl progress)"):
            text = Path(path).read_text()
            if path.endswith(".jsonl"):
                for line in text.splitlines():
                    event = json.loads(line) if line.strip() else {}
                    if event.get("event") == "trial":
                        add(event["kernel"], event["shape"], event["dtype"], event["config"],
                            event.get("status") == "ok", event.get("time_us"))
                continue
            for run in json.loads(text).values():
                for name, trials in run["trials"].items():
                    kernel, shape, dtype = _parse_problem(name)
                    for t in trials:
                        add(kernel, shape, dtype, t["config"], t["status"] == "ok", t.get("median_us"))
    return [{"source": "live", "kernel": kernel, "shape": shape, "dtype": dtype,
             "times": {c: statistics.median(ts) for c, ts in seen[key].items() if ts}}
            for key, (kernel, shape, dtype) in sorted(shapes.items())]


def _parse_problem(name: str) -> tuple[str, dict[str, int], str]:
    """``hopper_matmul[k=4096,m=64,n=4096; bfloat16]`` -> kernel, shape, dtype."""
    kernel, _, rest = name.partition("[")
    dims, _, dtype = rest.rstrip("]").partition(";")
    shape = {k: int(v) for k, v in (part.split("=") for part in dims.split(","))}
    return kernel, shape, dtype.strip()


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation; NaN with fewer than three values or no spread."""
    if len(a) < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else math.nan


def families(estimates: Sequence[float]) -> list[list[int]]:
    """Indices grouped into families of near-equal estimates: buckets ESTIMATE_TWIN wide in log
    time (not chained, so a family never spans more than that), best-estimated first."""
    buckets: dict[int, list[int]] = {}
    for i, e in enumerate(estimates):
        buckets.setdefault(math.floor(math.log(e) / ESTIMATE_TWIN), []).append(i)
    return [buckets[b] for b in sorted(buckets)]


def family_figures(estimates: Sequence[float], times: Sequence[float]) -> dict[str, Any]:
    """The model's families (:func:`families`) against the measured times: how many, the
    measured gap to the fastest of the first family (its fastest and its median member), and
    how many families the model ranks ahead of the fastest config's."""
    best = min(times)
    fastest = times.index(best)
    groups = families(estimates)
    first = [times[i] for i in groups[0]]
    return {
        "families": len(groups),
        "first_family_gap": min(first) / best - 1,
        "first_family_median_gap": statistics.median(first) / best - 1,
        "families_ahead": next(n for n, g in enumerate(groups) if fastest in g),
    }


def family_outliers(estimates: Sequence[float], times: Sequence[float], near: Iterable[int]) -> int:
    """How many of the configs ``near`` measured ``OUTLIER`` (3%) or more above the median of
    their family (:func:`families`: configs the model cannot tell apart, which mostly measure
    alike): a single timing taken in a slow moment of the GPU, which a re-time
    (``ground_truth.py --retime``) settles."""
    median = {}
    for group in families(estimates):
        family_median = statistics.median(times[i] for i in group)
        median.update((i, family_median) for i in group)
    return sum(times[i] >= median[i] * (1 + OUTLIER) for i in near)


def check(problem: Problem, configs: Sequence[Mapping[str, Any]], times: Sequence[float],
          estimate: Callable[[Problem, Mapping[str, Any]], float]) -> dict[str, Any]:
    """One problem's figures: configs measured, rank correlations (all, near the best), the
    model's families against the times (:func:`family_figures`), and the configs near the best
    measured far above their family (:func:`family_outliers`)."""
    estimates = [float(estimate(problem, c)) for c in configs]
    best = min(times)
    near = [i for i, t in enumerate(times) if t <= best * NEAR]
    return {
        "problem": str(problem), "configs": len(configs),
        "rho": spearman(estimates, times),
        "rho_near": spearman([estimates[i] for i in near], [times[i] for i in near]),
        **family_figures(estimates, times),
        "family_outliers": family_outliers(estimates, times, near),
    }


def parse_constants(text: str) -> dict[str, Any]:
    """``"a=1,b=x"`` -> {"a": 1.0, "b": "x"}: numbers as floats, the rest as strings."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"--constants: expected NAME=VALUE, got {part!r}")
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def model_with(kernel: Any, constants: Mapping[str, Any]) -> Callable[[Problem, Mapping[str, Any]], float]:
    """The kernel's cost model, or the one its module's ``cost_model(**constants)`` makes."""
    if not constants:
        return kernel.cost_model
    module = sys.modules.get(getattr(kernel.cost_model, "__module__", ""), None)
    factory = getattr(module, "cost_model", None)
    if not callable(factory):
        raise SystemExit(f"--constants: kernel {kernel.name!r}'s cost model has no "
                         "cost_model(**constants) beside it to change them with")
    try:
        return factory(**constants)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--constants: {e}") from None


Measured = tuple[str, Problem, list[dict[str, Any]], list[float]]


def packaged(kernel_name: str, device: str = DEVICE) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The package's ground truth and live measurements of the kernel on ``device``, as
    :func:`ground_truth` and :func:`live` give those of files."""
    truth = [_recorded(p) for p in load_ground_truth(device, kernel_name)]
    runs = [{"source": "live", "kernel": e["kernel"], "shape": e["shape"], "dtype": e["dtype"],
             "times": {_key(c): t for c, t in e["times"]}} for e in load_live(device, kernel_name)]
    return truth, runs


def measured(kernel_name: str, truth: Sequence[str] | None = None, runs: Sequence[str] | None = None,
             *, device: str = DEVICE) -> list[Measured]:
    """(source, problem, configs, times) for every problem of the kernel measured in the
    ground-truth files and live runs (None: the package's of ``device``); only configs valid
    under today's rules (an older run may hold one a rule now refuses)."""
    kernel = get_kernel(kernel_name)
    known_truth, known_runs = packaged(kernel_name, device) if truth is None or runs is None else ([], [])
    out = []
    for rec in ((ground_truth(truth) if truth is not None else known_truth)
                + (live(runs) if runs is not None else known_runs)):
        if rec["kernel"] != kernel_name:
            continue
        problem = kernel.problem(rec["shape"], rec["dtype"])
        bound = kernel.bind(problem)
        pairs = [(json.loads(c), t) for c, t in rec["times"].items()]
        pairs = [(c, t) for c, t in pairs if bound.is_valid(Config(c))]
        if pairs:
            out.append((rec["source"], problem, [c for c, _ in pairs], [t for _, t in pairs]))
    if not out:
        where = (f"none of {device!r} in the package (it holds {', '.join(devices())}: give one as "
                 "--device)" if truth is None and runs is None else "none in the files given")
        print(f"[measurements] nothing to check: no valid {kernel_name} config measured; {where}",
              file=sys.stderr)
        raise SystemExit(2)
    return out


def run(kernel_name: str, truth: Sequence[str] | None = None, runs: Sequence[str] | None = None,
        constants: Mapping[str, Any] | None = None, device: str = DEVICE) -> list[dict[str, Any]]:
    kernel = get_kernel(kernel_name)
    if kernel.cost_model is None:
        raise SystemExit(f"kernel {kernel_name!r} declares no cost_model: nothing to check")
    estimate = model_with(kernel, constants or {})
    with on_device(device):
        return [{"source": source, **check(problem, configs, times, estimate)}
                for source, problem, configs, times in measured(kernel_name, truth, runs, device=device)]


def on_device(device: str) -> contextlib.AbstractContextManager[Any]:
    """The cost model sees ``device``'s facts (its profile), as on that GPU."""
    return using_profile(profile_for_name(device))


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    print("| source | problem | configs | families | rho (all) | rho (within 30%) "
          "| first family: gap of its fastest / median | families ranked ahead of the fastest "
          f"| near the best, {OUTLIER:.0%} or more above their family's median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['source']} | {r['problem']} | {r['configs']} | {r['families']} | {r['rho']:.2f} "
              f"| {r['rho_near']:.2f} | {r['first_family_gap']:.1%} / {r['first_family_median_gap']:.1%} "
              f"| {r['families_ahead']} | {r['family_outliers']} |")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", default="hopper_matmul")
    ap.add_argument("--ground-truth", nargs="*", default=None,
                    help="per-shape ground-truth files (default: the package's, of --device)")
    ap.add_argument("--live", nargs="*", default=None,
                    help="live runs, JSON or .jsonl (default: the package's, of --device)")
    ap.add_argument("--constants", default="",
                    help="check the model with these constants changed: NAME=VALUE,...")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--device", default=DEVICE, help=f"whose measurements (default {DEVICE})")
    args = ap.parse_args(argv)
    rows = run(args.kernel, args.ground_truth, args.live, parse_constants(args.constants), args.device)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Ground truth for the search-efficiency replay: measure every valid config of a problem.

    python3 benchmarks/ground_truth.py --kernel hopper_matmul --shape m=4096,n=4096,k=4096 \
        --dtype bf16 --max 600 --seconds 240

Measures the problem's valid configs (a uniform sample of ``--max`` when there are more) by the
project's own measurement (the engine), and the baseline. Then, each marked by its ``"stage"``:
``--climb`` every one-tunable neighbour of the default and of the best so far
(``neighbourhood``); ``--estimated N`` the cost model's N best (``estimated``); ``--grid N``
(``hopper_matmul``) every grid-order variant of its N first choices (``grid``); ``--live DB ...``
every config jobs stored there for the problem on this device (``live``, timed here);
``--vendor N`` the first N of NVIDIA's matmul heuristics (``vendor``, benchmarks/vendor_prior.py).

``--out auto`` (default, on a GPU) stores the problem in this device's ground truth
(``autotune/replay/data/<device>/<kernel>.json.gz``, docs/replay.md); ``--out DIR`` writes
``DIR/<kernel>__<shape>__<dtype>.json`` for ``pack_ground_truth.py``. Stops submitting after
``--seconds``. ``--extend`` adds to the problem's record (nothing measured twice); ``--files F
...`` extends these per-shape files, one engine for all.

``--retime FRACTION``: the configs within FRACTION of the best again (at most
``--retime-max``), ``--rounds`` interleaved rounds (``retimed_us``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_model_check import model_with, parse_constants  # noqa: E402

from autotune._jax_compat import jax_versions  # noqa: E402
from autotune.engine.dispatcher import Engine  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.replay.ground_truth import (  # noqa: E402
    RETIMED,
    find_problem,
    ground_truth_path,
    recorded_us,
    save_ground_truth,
)
from autotune.replay.runner import live_measured  # noqa: E402
from autotune.space.kernel import get_kernel  # noqa: E402
from autotune.space.problem import Config, Problem, parse_shape  # noqa: E402
from autotune.space.search_space import BoundSpace  # noqa: E402
from autotune.storage.store import Store  # noqa: E402
from autotune.tuning.confirmation import sized_iterations  # noqa: E402
from autotune.tuning.samplers.ranked import DEFAULT_CANDIDATES, climb_estimate  # noqa: E402


def estimated_configs(kernel: Any, space: BoundSpace, n: int, *, seed: int = 0,
                      skip: Iterable[Mapping[str, Any]] = (),
                      estimate: Callable[[Problem, Mapping[str, Any]], float] | None = None) -> list[Config]:
    """The ``n`` best configs by ``estimate`` (default: ``kernel.cost_model``) that the ranked
    sampler's climb finds from a uniform draw (and the kernel's default), best first, none of
    ``skip``."""
    estimate = estimate or kernel.cost_model
    if estimate is None:
        raise SystemExit(f"--estimated: kernel {kernel.name!r} declares no cost_model")
    skipped = {Config(c).digest() for c in skip}
    start = space.sample(DEFAULT_CANDIDATES, seed=seed)
    if kernel.default_config is not None:
        start.append(kernel.default_config(space.problem))
    found = climb_estimate(space, estimate, start, keep=n + len(skipped),
                           accept=lambda c: Config(c).digest() not in skipped)
    return [Config(c) for c in found[:n]]


def vendor_configs(kernel: Any, space: BoundSpace, n: int, device: Any) -> list[Config]:
    """The first ``n`` configurations of NVIDIA's matmul heuristics for ``device`` (on a fake
    or interpreted device: the current device profile's), as valid configs of ``space``."""
    from vendor_heuristics import VendorModel, VendorPriorError

    from autotune.devices import current_device

    if kernel.name != "hopper_matmul":
        raise SystemExit(f"--vendor: NVIDIA's matmul heuristics map onto hopper_matmul, not {kernel.name!r}")
    try:
        model = VendorModel(device.name if device.kind == "gpu" else current_device())
    except VendorPriorError as error:
        raise SystemExit(f"--vendor: {error}") from None
    return [c for c, _ in model.ranked(space, n)][:n]


def merge(previous: Mapping[str, Any] | None, payload: dict[str, Any], problem: Problem) -> dict[str, Any]:
    """``payload`` with ``previous``'s results (and re-times) first (``--extend``): the counts
    cover both, the time spent is the sum. Refuses a file of another problem."""
    if previous is None:
        return payload
    theirs = (previous.get("kernel"), previous.get("shape"), previous.get("dtype"))
    if theirs != (payload["kernel"], payload["shape"], payload["dtype"]):
        raise SystemExit(f"--extend: the file holds {theirs}, not {problem}; give the matching "
                         "--kernel/--shape/--dtype or another --out")
    results = list(previous["results"]) + payload["results"]
    return {**payload,
            **({"retimes": previous["retimes"]} if "retimes" in previous else {}),
            "sampled": bool(previous.get("sampled")) or payload["sampled"],
            "uniform_sample": sum(r["stage"] == "uniform" for r in results),
            "measured": len(results),
            "seconds": round(float(previous.get("seconds", 0)) + payload["seconds"], 1),
            "date": payload["date"] if previous.get("date") == payload["date"]
            else f"{previous.get('date')}, {payload['date']}",
            "baseline": payload["baseline"] or previous.get("baseline"),
            "results": results}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel")
    ap.add_argument("--shape")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max", type=int, default=600, help="measure a uniform sample above this many")
    ap.add_argument("--climb", type=int, default=0,
                    help="then, for up to this many rounds, measure every one-tunable neighbour of "
                         "the kernel's default and of the --centres best configs so far")
    ap.add_argument("--centres", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=240, help="stop submitting after this long")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--estimated", type=int, default=0,
                    help="then measure this many of the best configs by the kernel's cost model")
    ap.add_argument("--grid", type=int, default=0, help="hopper_matmul: then every grid-order "
                    "variant of the cost model's this many first choices")
    ap.add_argument("--live", nargs="+", metavar="DB", help="then what jobs stored there "
                    "measured of the problem on this device")
    ap.add_argument("--vendor", type=int, default=0, help="then measure this many of the first "
                    "configurations of NVIDIA's matmul heuristics (hopper_matmul)")
    ap.add_argument("--constants", default="",
                    help="--estimated with the cost model's constants changed: NAME=VALUE,... "
                         "(benchmarks/cost_model_check.py)")
    ap.add_argument("--retime", type=float, metavar="FRACTION",
                    help="then time again, in interleaved rounds, every config of the file within "
                         "this fraction of its best (e.g. 0.08), appending the rounds' medians to "
                         "its record (retimed_us)")
    ap.add_argument("--rounds", type=int, help="--retime's rounds (default 5)")
    ap.add_argument("--retime-max", type=int, help="--retime at most this many configs, the "
                    f"fastest (default {RETIME_MAX})")
    ap.add_argument("--extend", action="store_true",
                    help="add to the output file instead of replacing it (its configs are skipped)")
    ap.add_argument("--device", default="gpu", choices=("gpu", "interpret", "fake"),
                    help="fake: the fake evaluator (every config 100 us), to test this script")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="auto",
                    help="auto (default): the package's ground truth of this device "
                         "(autotune/replay/data/<device>/<kernel>.json.gz); or a folder for "
                         "per-shape files")
    ap.add_argument("--files", nargs="+", metavar="FILE",
                    help="instead of --kernel/--shape/--dtype: extend each of these ground-truth "
                         "files (their problems, one engine for all; implies --extend)")
    args = ap.parse_args(argv)
    if args.max < 0 or args.estimated < 0:
        raise SystemExit(f"--max and --estimated must be 0 or more (got {args.max}, {args.estimated})")
    if args.vendor < 0:
        raise SystemExit(f"--vendor must be 0 or more (got {args.vendor})")
    if args.grid < 0:
        raise SystemExit(f"--grid must be 0 or more (got {args.grid})")
    if args.vendor:
        from vendor_heuristics import VendorPriorError, check_installed

        try:
            check_installed()
        except VendorPriorError as error:
            raise SystemExit(f"--vendor: {error}") from None
    if args.constants and not args.estimated:
        raise SystemExit("--constants changes the cost model that --estimated follows; give --estimated N too")
    if bool(args.files) == bool(args.kernel and args.shape):
        raise SystemExit("give either --kernel and --shape (and --dtype), or --files")
    check_retime(args)
    for db in args.live or ():
        try:
            Store(db, read_only=True).close()
        except AutotuneError as e:
            raise SystemExit(f"--live: {e}") from None

    # Everything is checked before anything is measured: a bad name, value or file stops here.
    jobs: list[tuple[Any, Problem, Path, dict[str, Any] | None, Any]] = []
    for source in args.files or [None]:
        if source is None:
            kernel = get_kernel(args.kernel)
            problem = kernel.problem(parse_shape(args.shape), args.dtype)
            shape_tag = problem.shape_text.replace(",", "_").replace("=", "")
            path = Path(args.out) / f"{kernel.name}__{shape_tag}__{problem.dtype}.json"
            previous = (json.loads(path.read_text()) if args.out != "auto" and args.extend
                        and path.exists() else None)
        else:
            path = Path(source)
            try:
                previous = json.loads(path.read_text())
                kernel = get_kernel(previous["kernel"])
                problem = kernel.problem(previous["shape"], previous["dtype"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"--files: {source} is not a ground-truth file "
                                 f"({type(e).__name__}: {e})") from None
        if args.grid and kernel.name != "hopper_matmul":
            raise SystemExit(f"--grid: hopper_matmul's grid order, not {kernel.name!r}'s")
        estimate = model_with(kernel, parse_constants(args.constants)) if args.estimated or args.grid else None
        if (args.estimated or args.grid) and estimate is None:
            raise SystemExit(f"--estimated: kernel {kernel.name!r} declares no cost_model")
        jobs.append((kernel, problem, path, previous, estimate))

    # The executables of the configs re-timed stay on the workers (Engine.confirm times them).
    with Engine(mode=args.device, iterations=args.iterations,
                keep_compiled=max(5, args.retime_max)) as engine:
        info = engine.device_info()
        jobs = on_this_device(jobs, info.name, args, gpu=info.kind == "gpu")
        for kernel, problem, path, previous, estimate in jobs:
            record(engine, kernel, problem, path, previous, estimate, args)


def on_this_device(jobs: list[Any], device: str, args: argparse.Namespace, *,
                   gpu: bool) -> list[Any]:
    """The jobs' files in ``device``'s folder (``--out auto``), and on a GPU a file of another
    device refused: one file never mixes two devices' times. The fake device (tests) stands in
    for the device of the files it is given, and needs ``--out DIR`` for new ones."""
    out = []
    for kernel, problem, path, previous, estimate in jobs:
        if args.out == "auto" and not args.files:
            if not gpu:
                raise SystemExit(f"--out auto is the folder of the GPU's device; on the {device} "
                                 "device give --out DIR")
            path = ground_truth_path(device, kernel.name)
            previous = (find_problem(device, kernel.name, problem.dims, problem.dtype)
                        if args.extend else None)
        recorded = (previous or {}).get("device")
        if gpu and recorded and recorded != device:
            raise SystemExit(f"{path}: measured on {recorded}, but this device is {device}: "
                             "one file never mixes two devices; record this device's in "
                             f"{ground_truth_path(device, kernel.name)} (--out auto)")
        out.append((kernel, problem, path, previous, estimate))
    return out


RETIME_MAX = 96
RETIME_ROUNDS = 5


def check_retime(args: argparse.Namespace) -> None:
    """--retime, --rounds and --retime-max, checked before anything is measured (defaults
    filled in)."""
    if args.retime is None:
        if args.rounds is not None or args.retime_max is not None:
            raise SystemExit("--rounds and --retime-max set how --retime re-times; give "
                             "--retime FRACTION too (e.g. --retime 0.08)")
        args.retime_max = 0
        return
    if not 0 < args.retime <= 1:
        raise SystemExit(f"--retime {args.retime}: the fraction above the file's best to re-time "
                         "within must be above 0 and at most 1; give e.g. --retime 0.08")
    args.rounds = RETIME_ROUNDS if args.rounds is None else args.rounds
    args.retime_max = RETIME_MAX if args.retime_max is None else args.retime_max
    for flag, value in (("--rounds", args.rounds), ("--retime-max", args.retime_max)):
        if value < 1:
            raise SystemExit(f"{flag} {value}: must be at least 1")


def write(path: Path, payload: Mapping[str, Any]) -> None:
    """Writes ``payload`` beside ``path``, then renames it: an interrupted write leaves the old
    file whole. A packaged file (``.json.gz``) gets the problem merged in."""
    if path.name.endswith(".json.gz"):
        save_ground_truth([payload], root=path.parents[1])
        return
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(payload, indent=1))
    os.replace(partial, path)


def retime(engine: Engine, kernel: Any, problem: Problem, payload: dict[str, Any],
           compiled: set[str], args: argparse.Namespace) -> None:
    """Times every ok config of ``payload`` within ``args.retime`` of its best again (at most
    ``args.retime_max``, the fastest), ``args.rounds`` interleaved rounds (``Engine.confirm``),
    and appends each round's median to its record (``retimed_us``); a config whose re-timing
    fails gets ``retime_error`` instead. Configs not in ``compiled`` (digests of those measured
    by this engine) are measured once first, so that the workers hold their executables."""
    started = time.monotonic()
    ok = sorted((r for r in payload["results"] if r["status"] == "ok" and r["median_us"]),
                key=recorded_us)
    best = recorded_us(ok[0]) if ok else 0.0
    chosen = [r for r in ok if recorded_us(r) <= best * (1 + args.retime)][: args.retime_max]
    medians = {id(r): recorded_us(r) for r in chosen}
    earlier = {id(r): engine.submit(kernel.name, problem, Config(r["config"]))
               for r in chosen if Config(r["config"]).digest() not in compiled}
    timed = []
    for r in chosen:
        first = earlier[id(r)].result() if id(r) in earlier else None
        if first is not None and not first.ok:
            r["retime_error"] = (first.error or first.outcome.value)[-300:]
            continue
        if first is not None:
            medians[id(r)] = first.median_us
        timed.append(r)
    table = engine.confirm(kernel.name, problem, [Config(r["config"]) for r in timed],
                           rounds=args.rounds, baseline=False,
                           iterations=[sized_iterations(recorded_us(r)) for r in timed],
                           medians_us=[medians[id(r)] for r in timed]) if timed else []
    for n, r in enumerate(timed):
        rounds = [row[n] for row in table]
        failed = next((t for t in rounds if not t.ok), None)
        if failed is not None:
            r["retime_error"] = (failed.error or failed.outcome.value)[-300:]
        else:
            r.setdefault(RETIMED, []).extend(t.median_us for t in rounds)
            r.pop("retime_error", None)
    failures = sum("retime_error" in r for r in chosen)
    payload.setdefault("retimes", []).append({
        "fraction": args.retime, "rounds": args.rounds, "configs": len(chosen),
        "failed": failures, "seconds": round(time.monotonic() - started, 1),
        "device": engine.device_info().name, "date": dt.date.today().isoformat()})
    print(f"{problem}: re-timed {len(chosen) - failures} of the {len(chosen)} configs within "
          f"{args.retime:.0%} of the best, {args.rounds} rounds"
          + (f" ({failures} failed: retime_error)" if failures else ""), flush=True)


def record(engine: Engine, kernel: Any, problem: Problem, path: Path, previous: dict[str, Any] | None,
           estimate: Any, args: argparse.Namespace) -> None:
    """Measures one problem's configs (the stages ``args`` asks for) and writes its file."""
    space = kernel.valid_space(problem)
    valid = space.count()
    sampled = valid > args.max
    configs = space.sample(args.max, seed=args.seed) if sampled else list(space)
    print(f"{problem}: {valid} valid configs; measuring {'a uniform sample of ' if sampled else ''}{len(configs)}"
          + (f", then up to {args.climb} rounds of neighbourhoods" if sampled and args.climb else "")
          + (f", then the cost model's {args.estimated} first choices" if args.estimated else ""),
          flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)

    start = time.monotonic()
    results: list[dict] = []
    measured: set[str] = {Config(r["config"]).digest() for r in (previous or {}).get("results", ())}

    def measure(batch: list, stage: str) -> None:
        """Measure ``batch`` (skipping configs already measured), appending to ``results``."""
        futures = {}
        for config in batch:
            if config.digest() in measured:
                continue
            if time.monotonic() - start > args.seconds:
                break
            measured.add(config.digest())
            futures[engine.submit(kernel.name, problem, config)] = config
            # Keep the queue short so that the time limit stops the work, not just submission.
            while sum(not f.done() for f in futures) > 2 * max(1, engine.parallelism):
                wait([f for f in futures if not f.done()], timeout=1.0, return_when="FIRST_COMPLETED")
        remaining = [f for f in futures if not f.done()]
        wait(remaining, timeout=max(60.0, args.seconds * 0.25))
        for future, config in futures.items():
            if not future.done():
                future.cancel()
                continue
            r = future.result()
            results.append({
                "config": dict(config),
                "stage": stage,
                "status": r.outcome.value,
                "median_us": r.median_us,
                "min_us": r.min_us,
                "max_us": r.max_us,
                "compile_s": r.compile_s,
                "error": r.error[-300:] if r.error else "",
            })

    device = engine.device_info()
    baseline = engine.baseline(kernel.name, problem)
    measure(configs, "uniform")
    # Hill-climbing rounds: every valid one-tunable neighbour of the default and of the best
    # configs so far, until no new best appears. A uniform sample of a space of 10^5 configs
    # rarely holds its best; this adds the region around the best to the ground truth.
    centred: set[str] = set()
    for _ in range(args.climb if sampled else 0):
        ok = sorted((r for r in results if r["status"] == "ok"), key=recorded_us)
        centres = [Config(r["config"]) for r in ok[: args.centres]]
        if kernel.default_config is not None:
            centres.insert(0, kernel.default_config(problem))
        centres = [c for c in centres if c.digest() not in centred]
        if not centres or time.monotonic() - start > args.seconds:
            break
        for centre in centres:
            centred.add(centre.digest())
            measure([centre, *space.neighbours(centre)], "neighbourhood")
    if args.estimated:
        already = [r["config"] for r in (previous or {}).get("results", ())] + [r["config"] for r in results]
        measure(estimated_configs(kernel, space, args.estimated, seed=args.seed, skip=already,
                                  estimate=estimate), "estimated")
    if args.grid:
        from search_spaces.hopper_matmul import grid_variants

        measure(grid_variants(space, estimated_configs(kernel, space, args.grid, seed=args.seed,
                                                       estimate=estimate)), "grid")
    if args.live:
        measure([c for c, _ in live_measured(args.live, problem, device.name).values()], "live")
    if args.vendor:
        measure(vendor_configs(kernel, space, args.vendor, device), "vendor")
    elapsed = time.monotonic() - start
    ok = [r for r in results if r["status"] == "ok"]
    payload = {
        "kernel": kernel.name,
        "shape": problem.dims,
        "dtype": problem.dtype,
        "device": device.name,
        "jax": jax_versions(),
        "date": dt.date.today().isoformat(),
        "valid_count": valid,
        "sampled": sampled,
        "uniform_sample": sum(r["stage"] == "uniform" for r in results),
        "measured": len(results),
        "seconds": round(elapsed, 1),
        "iterations": args.iterations,
        "baseline": {"name": kernel.baseline_name, "median_us": baseline.median_us} if baseline.ok else None,
        "results": results,
    }
    payload = merge(previous, payload, problem)
    write(path, payload)
    if args.retime:
        # What was measured is on disk first: a re-time cut short loses only itself.
        retime(engine, kernel, problem, payload, {Config(r["config"]).digest() for r in results}, args)
        write(path, payload)
    best = min(ok, key=recorded_us) if ok else None
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    print(f"wrote {path}: {len(results)} measured in {elapsed:.0f} s ({by_status}); "
          f"best {best['median_us'] if best else None} us {best['config'] if best else ''}; "
          f"baseline {payload['baseline']}", flush=True)


if __name__ == "__main__":
    main()

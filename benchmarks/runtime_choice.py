"""Run-time choice: a program calling ``@autotune.tuned(..., baseline=...)`` against the faster
of the kernel and its baseline, per shape and cache regime, in one run (benchmarks/RESULTS.md §19).

    python3 benchmarks/runtime_choice.py --out results/runtime_choice               # a GPU: all of it
    python3 benchmarks/runtime_choice.py --out OUT --device interpret               # CPU, tiny shapes
    python3 benchmarks/runtime_choice.py --out OUT --device fake                    # seconds, no jax

Tunes the shapes with nothing stored under each ``--regimes`` policy (GPU: ``cold``, ``warm``;
``--trials`` and the confirmation, which decides the choice; ``--no-tune`` reads ``--db``). Then
per regime and shape times what a program sees: batches of ``--batch`` calls back to back, one
wait, per call; each function in turn, ``--reps`` calls each, the median batch (``cold``: input
sets over twice the L2). Functions: the decorated call (eager, under ``jax.jit``, and routed by
the other regime's timings), the kernel at the regime's best config, the baseline (on a GPU the
XLA program the jobs timed). Reported, paired by round with intervals: decorated over the faster
(goal: within 0.5%) and over the baseline (where the kernel ran, an interval wholly above 1.0 is
a miss: SLOWER); what ran; decorated over it called directly. Writes ``runtime_choice.md``/``.json``.

Devices: ``gpu`` (hopper_matmul, hopper_attention at the issue's shapes); ``interpret`` (small
matmuls on a CPU, warm only: functional); ``fake`` (no jax: two busy-waiting stand-ins, their
confirmation stored as the tuner stores it; warm only).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autotune  # noqa: E402
from autotune._paths import default_results_dir  # noqa: E402
from autotune.api import compilation_cache_folder  # noqa: E402
from autotune.queries import lookup  # noqa: E402

GOAL = 1.005  # the decorated call within 0.5% of the faster implementation

GPU_SHAPES: dict[str, tuple[str, list[dict[str, int]]]] = {
    "hopper_matmul": ("bfloat16", [
        {"m": 4096, "n": 4096, "k": 4096}, {"m": 8192, "n": 8192, "k": 1024},
        {"m": 2048, "n": 8192, "k": 4096}, {"m": 1024, "n": 1024, "k": 8192},
        {"m": 6144, "n": 3072, "k": 2048},
    ]),
    "hopper_attention": ("float16", [
        {"batch": 4, "seq_q": 2048, "seq_kv": 2048, "heads_q": 16, "heads_kv": 16, "head_dim": 128},
        {"batch": 1, "seq_q": 8192, "seq_kv": 8192, "heads_q": 16, "heads_kv": 16, "head_dim": 128},
        {"batch": 2, "seq_q": 4096, "seq_kv": 4096, "heads_q": 8, "heads_kv": 8, "head_dim": 64},
    ]),
}
INTERPRET_SHAPES = {"hopper_matmul": ("bfloat16", [{"m": 256, "n": 128, "k": 128},
                                                     {"m": 512, "n": 256, "k": 128}])}
# The fake device: (kernel us, baseline us) per shape: the baseline faster, the kernel
# faster, and a tie.
FAKE_SHAPES = {"fake_matmul": ("float32", [{"m": 64}, {"m": 128}, {"m": 192}])}
FAKE_US = {64: (60.0, 50.0), 128: (40.0, 55.0), 192: (45.0, 45.0)}


# --- the fake device


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


class _FakeArray:
    def __init__(self, m: int) -> None:
        self.shape, self.dtype = (m, m), "float32"

    def block_until_ready(self) -> _FakeArray:
        return self


def _fake_kernel() -> Any:
    from autotune.space.kernel import Kernel, register
    from autotune.space.search_space import Aligned, Space

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fake device builds nothing")

    kernel = Kernel(name="fake_matmul", space=Space(params=(Aligned("bm", unit=64, low=64,
                                                                   high=256, divides="m"),)),
                    shape_keys=("m",), dtypes=("float32",), build=never, make_inputs=never,
                    reference=never, default_config=lambda p: {"bm": 64},
                    shape_of=lambda x: {"m": x.shape[0]}, baseline_name="fake_xla")
    try:
        register(kernel)
    except Exception:  # noqa: BLE001 - registered by an earlier run in this process
        pass
    return kernel


def _fake_store(db: str, dtype: str, shapes: Sequence[Mapping[str, int]], reps: int) -> None:
    """Stores a trial and a confirmation per shape, as the tuner's confirmation round would,
    from the stand-ins' nominal times with a fixed jitter (+-0.5% in turn): a spin timed on a
    loaded CPU can make the tie a win, and the routing, not the CPU, is what is exercised."""
    from autotune.space.outcomes import DeviceInfo, TrialResult
    from autotune.storage.store import Store
    from autotune.tuning.confirmation import Candidate, analyse_confirmation

    kernel = _fake_kernel()
    device = DeviceInfo("fake device", "gpu", "9.0", "")
    software = {"jax": "", "jaxlib": "", "autotune": autotune.__version__}
    with Store(db) as store:
        for shape in shapes:
            problem = kernel.problem(shape, dtype)
            if store.best(problem, n=1):
                continue
            k_us, b_us = FAKE_US[shape["m"]]
            jitter = [1.0 + 0.005 * ((-1) ** i) for i in range(max(3, reps // 10))]
            rounds_k = [tuple(k_us * j for j in jitter[r % 2:] + jitter[:r % 2])
                        for r in range(5)]
            rounds_b = [tuple(b_us * j for j in jitter[(r + 1) % 2:] + jitter[:(r + 1) % 2])
                        for r in range(5)]
            config = {"bm": 64}
            result = TrialResult.timed([statistics.median(rounds_k[0])] * 2, compile_s=0.0,
                                       rel_error=0.0, timing="fake")
            tid = store.record_trial(problem, config, result, device=device, software=software).id
            confirmation = analyse_confirmation(
                [Candidate(config, tuple(rounds_k), trial_id=tid)], tuple(rounds_b))
            store.record_confirmation(problem, confirmation, trial_ids=[tid], device=device,
                                      software=software, cache="warm", iterations=len(rounds_k[0]),
                                      baseline_name="fake_xla")


# --- the experiment


def _implementations(kernel_name: str, problem: Any, device: str, seed: int
                     ) -> tuple[Callable[[Any], Callable[..., Any]], Callable[..., Any],
                                Callable[[int], tuple[Any, ...]]]:
    """(kernel at a config, baseline, inputs of a seed) for one problem."""
    if device == "fake":
        k_us, b_us = FAKE_US[problem.dims["m"]]

        def kernel_at(config: Any) -> Callable[..., Any]:
            return lambda x: (_spin(k_us), x)[1]

        return kernel_at, lambda x: (_spin(b_us), x)[1], lambda i: (_FakeArray(problem.dims["m"]),)
    import jax

    from autotune.space.kernel import BuildOptions, get_kernel
    from autotune.space.problem import Config

    kernel = get_kernel(kernel_name)
    built: dict[Any, Callable[..., Any]] = {}  # Config -> its jitted kernel (a dict hit per call)

    def kernel_at(config: Any) -> Callable[..., Any]:
        fn = built.get(config)
        if fn is None:
            fn = built[config] = jax.jit(kernel.build(
                problem, Config(config), BuildOptions(interpret=device == "interpret")))
        return fn

    assert kernel.baseline is not None
    baseline = jax.jit(kernel.baseline(problem))

    def inputs(i: int) -> tuple[Any, ...]:
        return tuple(kernel.make_inputs(problem, jax.random.key(seed + i)))

    return kernel_at, baseline, inputs


def _calling(kernel_at: Callable[[Any], Callable[..., Any]]) -> Callable[..., Any]:
    """The function the program decorates: the kernel at the config it is given."""

    def call(*arrays: Any, config: Any = None) -> Any:
        return kernel_at(config)(*arrays)

    return call


def _input_sets(inputs: Callable[[int], tuple[Any, ...]], regime: str, minimum: int) -> list[tuple[Any, ...]]:
    """The input sets a regime's calls rotate over (made up front, so making them is not
    timed): ``warm``, ``minimum`` sets, one per batch; ``cold``, at least ``minimum`` and as many
    as the tool's cold program check rotates (:func:`autotune.evaluation.timing.program_input_sets`:
    more than twice the GPU's L2), so a call never finds its inputs there."""
    first = inputs(0)
    count = minimum
    if regime == "cold":
        from autotune.devices import current_device
        from autotune.evaluation.timing import program_input_sets

        size = sum(int(getattr(a, "nbytes", 0)) for a in first)
        count = max(minimum, program_input_sets("cold", max(size, 1), current_device().l2_bytes))
    return [first] + [inputs(i) for i in range(1, count)]


def _time(fns: Mapping[str, Callable[..., Any]], sets: Sequence[tuple[Any, ...]], regime: str,
          reps: int, batch: int) -> dict[str, list[float]]:
    """Seconds per call of each function per round, as a program sees it: ``batch`` calls back
    to back (dispatched asynchronously, one wait for the last), the batch's time over its
    calls; each round one batch of every function, in a rotating order, until each made
    ``reps`` calls. ``warm``: a batch calls on one input set (the next set each round);
    ``cold``: each call takes the next set (see :func:`_input_sets`)."""
    for fn in fns.values():  # compile and warm
        _ready(fn(*sets[0]))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    rounds = max(1, -(-reps // batch))
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = fns[name]
            if regime == "warm":
                args = [sets[r % len(sets)]] * batch
                _ready(fn(*args[0]))  # the set in L2, as the program's previous call left it
            else:
                args = [sets[(r + i) % len(sets)] for i in range(batch)]
                _ready(fn(*sets[(r - 1) % len(sets)]))
            start = time.perf_counter()
            out = None
            for a in args:
                out = fn(*a)
            _ready(out)
            samples[name].append((time.perf_counter() - start) / batch)
    return samples


def _paired(samples: Mapping[str, Sequence[float]], name: str, against: str) -> tuple[float, float, float]:
    """``name``'s time over ``against``'s, round by round (one round's batches run within
    moments of each other, so a clock that drifts between rounds cancels): the median ratio and
    its interval (:func:`autotune.tuning.confirmation.median_interval`)."""
    from autotune.tuning.confirmation import median_interval

    ratios = [a / b for a, b in zip(samples[name], samples[against], strict=True)]
    low, high = median_interval(ratios)
    return statistics.median(ratios), low, high


def _ready(out: Any) -> Any:
    for leaf in out if isinstance(out, tuple) else (out,):
        getattr(leaf, "block_until_ready", lambda: None)()
    return out


def _tune_missing(args: argparse.Namespace, shapes: Mapping[str, Any], db: str) -> None:
    for regime in args.regimes:
        for name, (dtype, todo) in shapes.items():
            missing = [s for s in todo
                       if not lookup.stored_here(name, s, dtype, db=db, cache=regime)]
            if missing:
                print(f"tuning {name} at {len(missing)} shape(s), {args.trials} trials each, "
                      f"cache={regime}", file=sys.stderr)
                autotune.tune(name, missing, dtype=dtype, trials=args.trials, db=db,
                              device=args.device, progress=False, cache=regime)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    shapes = {"gpu": GPU_SHAPES, "interpret": INTERPRET_SHAPES, "fake": FAKE_SHAPES}[args.device]
    db = args.db or f"sqlite:///{Path(args.out).resolve()}/runtime_choice.db"
    if args.device == "fake":
        for dtype, todo in shapes.values():
            _fake_store(db, dtype, todo, args.reps)
    elif not args.no_tune:
        _tune_missing(args, shapes, db)
    if args.device == "gpu":
        import jax

        # The program runs the XLA baseline the jobs timed: JAX's compilation cache in the
        # jobs' folder holds XLA's autotune picks (docs/user_kernels.md).
        jax.config.update("jax_compilation_cache_dir", compilation_cache_folder(
            "auto", results_dir=default_results_dir(), device="gpu"))
    rows = []
    for regime in args.regimes:
        other = next((r for r in args.regimes if r != regime), None)
        for name, (dtype, todo) in shapes.items():
            kernel = _fake_kernel() if args.device == "fake" else autotune.get_kernel(name)
            for shape in todo:
                problem = kernel.problem(shape, dtype)
                kernel_at, baseline, inputs = _implementations(name, problem, args.device,
                                                               args.seed)
                choice = lookup.lookup_choice(name, shape, dtype, db=db, cache=regime)
                call = _calling(kernel_at)
                fns = {"decorated": autotune.tuned(name, db=db, baseline=baseline,
                                                   cache=regime)(call),
                       "kernel": kernel_at(choice.config), "baseline": baseline}
                if other is not None:
                    fns["decorated_other"] = autotune.tuned(name, db=db, baseline=baseline,
                                                            cache=other)(call)
                if args.device != "fake":
                    import jax

                    # Inside a jitted program the lookup runs once, at trace time.
                    fns["decorated_jit"] = jax.jit(fns["decorated"])
                    # The decorated function called with the config itself: what the decorator
                    # adds per eager call is the decorated time over this one.
                    fns["undecorated"] = functools.partial(call, config=choice.config)
                sets = _input_sets(inputs, regime, args.input_sets)
                samples = _time(fns, sets, regime, args.reps, args.batch)
                times = {name: statistics.median(s) for name, s in samples.items()}
                faster_name = min(("kernel", "baseline"), key=lambda n: times[n])
                faster = times[faster_name]
                ratio, ratio_low, ratio_high = _paired(samples, "decorated", faster_name)
                ran = choice.runs  # the route: the baseline for a tie too
                same, same_low, same_high = _paired(samples, "decorated", ran)
                vs_base = _paired(samples, "decorated", "baseline")
                rows.append({
                    "regime": regime, "kernel": name, "shape": dict(shape), "dtype": dtype,
                    "input_sets": len(sets),
                    "decorated_us": times["decorated"] * 1e6, "kernel_us": times["kernel"] * 1e6,
                    "baseline_us": times["baseline"] * 1e6, "ratio_to_faster": ratio,
                    "ratio_low": ratio_low, "ratio_high": ratio_high,
                    "ratio_to_what_ran": same, "same_low": same_low, "same_high": same_high,
                    "chosen": ran,
                    "verdict": choice.faster, "source": choice.source,
                    **_figures(name, problem.dims, dtype, db, regime),
                    "config": None if choice.config is None else dict(choice.config),
                    "within_goal": ratio <= GOAL,
                    "to_baseline": vs_base[0], "to_baseline_low": vs_base[1],
                    "to_baseline_high": vs_base[2],
                    # The goal: never slower than the baseline beyond the measured noise (the
                    # whole interval above 1.0) where the kernel ran; where the baseline ran, the
                    # ratio is the baseline against itself: the benchmark's resolution.
                    "slower_than_baseline": ran == "kernel" and vs_base[1] > 1.0,
                    "decorated_jit_us": _us(times.get("decorated_jit")),
                    "jit_ratio_to_faster": _ratio(times.get("decorated_jit"), faster),
                    "undecorated_us": _us(times.get("undecorated")),
                    "decorator_ratio": (None if "undecorated" not in samples else
                                        _paired(samples, "decorated", "undecorated")[0]),
                    "other_regime": other,
                    "other_verdict": None if other is None else lookup.lookup_choice(
                        name, shape, dtype, db=db, cache=other).faster,
                    "decorated_other_us": _us(times.get("decorated_other")),
                    "other_ratio_to_faster": _ratio(times.get("decorated_other"), faster),
                })
    return rows


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def _figures(name: str, shape: Any, dtype: str, db: str, regime: str) -> dict[str, Any]:
    """What decided the verdict (the program check or the confirmation) and both speedups."""
    from autotune.queries.best import best_result

    found = best_result(name, shape, dtype, db=db, cache=regime)
    d = found.to_dict() if found is not None else {}
    return {k: d.get(k) for k in ("verdict_source", "confirmed_speedup", "program_speedup")}


def _ratio(seconds: float | None, faster: float) -> float | None:
    return None if seconds is None else seconds / faster


def device_name(device: str) -> str:
    if device == "fake":
        return "fake device (stand-ins on the CPU, not a GPU's figures)"
    import jax

    d = jax.devices()[0]
    return f"{d.device_kind} ({d.platform}{', GPU interpret mode' if device == 'interpret' else ''})"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(rows: Sequence[Mapping[str, Any]], device: str, reps: int, batch: int) -> str:
    lines = [
        f"device: {device}; {reps} calls of each in batches of {batch} back to back, median "
        "batch, in one run, fresh random inputs; ratios paired round by round, median [interval]",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "",
        "| regime | kernel | shape | dtype | decorated (us) | kernel (us) | baseline (us) | "
        "decorated / faster | ran | decorated / what ran | verdict (decided by: confirmed / "
        "as called) | within 0.5% | decorated / baseline | "
        "under jit / faster | routed by the other regime / faster |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        other = "-" if r["other_ratio_to_faster"] is None else \
            f"{r['other_ratio_to_faster']:.4f} ({r['other_verdict']})"
        lines.append(
            f"| {r['regime']} | {r['kernel']} | {shape} | {r['dtype']} | "
            f"{r['decorated_us']:.1f} | "
            f"{r['kernel_us']:.1f} | {r['baseline_us']:.1f} | {r['ratio_to_faster']:.4f} "
            f"[{r['ratio_low']:.4f}, {r['ratio_high']:.4f}] | {r['chosen']} | "
            f"{r['ratio_to_what_ran']:.4f} [{r['same_low']:.4f}, {r['same_high']:.4f}] | "
            f"{r['verdict']} ({r['source']}; {r.get('verdict_source')}: "
            f"{_num(r.get('confirmed_speedup'))} / {_num(r.get('program_speedup'))}) | "
            f"{'yes' if r['within_goal'] else 'NO'} | "
            f"{r['to_baseline']:.4f} [{r['to_baseline_low']:.4f}, {r['to_baseline_high']:.4f}]"
            f"{' SLOWER' if r['slower_than_baseline'] else ''} | "
            f"{'-' if r['jit_ratio_to_faster'] is None else format(r['jit_ratio_to_faster'], '.4f')}"
            f" | {other} |")
    slower = [r for r in rows if r["slower_than_baseline"]]
    lines += ["", f"decorated calls that ran the kernel and were slower than the baseline "
              f"beyond the measured noise: {len(slower)} of {len(rows)}"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for runtime_choice.md/.json (and the "
                   "database when --db is not given)")
    p.add_argument("--db", help="results database (default: OUT/runtime_choice.db)")
    p.add_argument("--device", choices=("gpu", "interpret", "fake"), default="gpu")
    p.add_argument("--no-tune", action="store_true", help="read --db as it is; tune nothing")
    p.add_argument("--trials", type=int, default=16, help="trials per missing shape (16: quick)")
    p.add_argument("--reps", type=int, default=400, help="timed calls of each, per shape")
    p.add_argument("--batch", type=int, default=20, help="calls back to back per timed batch")
    p.add_argument("--input-sets", type=int, default=4, help="fresh random input sets, rotated "
                   "(cold: at least enough to hold twice the L2)")
    p.add_argument("--regimes", default=None, help="timing policies, comma-separated "
                   "(default: cold,warm on a GPU, warm elsewhere)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.trials < 1 or args.reps < 1 or args.input_sets < 1 or args.batch < 1:
        p.error("--trials, --reps, --batch and --input-sets must be 1 or more")
    regimes = (args.regimes or ("cold,warm" if args.device == "gpu" else "warm")).split(",")
    if any(r not in ("cold", "warm") for r in regimes) or len(set(regimes)) != len(regimes):
        p.error(f"--regimes takes cold and/or warm, comma-separated, but got {args.regimes!r}")
    if "cold" in regimes and args.device != "gpu":
        p.error("--regimes cold needs --device gpu (there is no L2 to miss elsewhere)")
    args.regimes = tuple(regimes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(args)
    text = table(rows, device_name(args.device), args.reps, args.batch)
    (out / "runtime_choice.md").write_text(text)
    (out / "runtime_choice.json").write_text(json.dumps(
        {"device": device_name(args.device), "reps": args.reps, "batch": args.batch,
         "rows": rows}, indent=1) + "\n")
    print(text, end="")
    print(f"written: {out / 'runtime_choice.md'}, {out / 'runtime_choice.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

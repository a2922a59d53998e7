"""Why a cold timing moves: the flush's effect per program, XLA's algorithm per process, clocks.

    python3 benchmarks/timing_study.py --out $OUT/timing_study.json          # a GPU, ~3 min

Per problem (default 4096^3 bf16 hopper_matmul) and program (the XLA baseline, the kernel's
default config, the best recorded configs), ``--rounds`` interleaved rounds, fresh random
inputs each, by the ``--methods`` (default all):

* ``cold``: the search's (``time_cold``), N x (L2 flush, program) in one CUPTI session;
* ``pair``: ``cold``, the round's programs call by call in one session;
* ``warm``: N calls back to back, no flush; ``batch``: the host's clock around N calls back to
  back, one wait, per call (median of 3 blocks); ``idle`` / ``hot``: ``batch`` after 0.2 s idle
  / 1 s of calls (a program check's short blocks / a loop at the power limit);
* ``cold_ro`` / ``iso_ro``: ``cold`` and an isolated call (flush, host sync, a CUPTI session of
  the call) after a read-only flush (a sum over 2x / 4x the L2);
* ``iso_xor``: ``autotune verify``'s (``independent.CuptiIsolatedTimer``); ``fl_xor``: its
  ``cupti-flushed``; ``cold4`` / ``iso_xor2``: ``cold`` / ``iso_xor`` with a 4x / 2x L2 flush;
* ``launches``: one warm call's launches; NVML's SM clock, power and clock reasons per block.

``--engine gpu``: each program on each engine worker (``Engine.retime(worker=...)``).
``--processes``: fresh children time the baseline warm, two sharing an autotune folder (does
XLA's pick move?). ``--pad``: inputs after a random pad. Writes ``--out``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import nvml_gpu0, parse_problem  # noqa: E402



def nvml_reading(nv: Any) -> dict[str, Any]:
    if nv is None:
        return {}
    pynvml, h = nv
    out: dict[str, Any] = {}
    for key, call in (
        ("sm_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        ("mem_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
        ("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ("temp_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        ("reasons", lambda: int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))),
    ):
        try:
            out[key] = call()
        except Exception:  # noqa: BLE001
            pass
    return out


def device_facts() -> dict[str, Any]:
    """GPU 0 as the CUDA driver (``devices.read_device``) and NVML see it (no jax)."""
    from autotune.devices import read_device

    facts: dict[str, Any] = {}
    driver = read_device(0)
    if driver is None:
        facts["error"] = "the CUDA driver could not be asked (no libcuda or no GPU 0)"
    else:
        facts.update(dataclasses.asdict(driver))
    nv = nvml_gpu0()
    if nv is not None:
        pynvml, h = nv
        for key, call in (
            ("nvml_name", lambda: pynvml.nvmlDeviceGetName(h)),
            ("max_sm_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            ("max_mem_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            ("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
            ("memory_total", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total),
        ):
            try:
                facts[key] = call()
            except Exception:  # noqa: BLE001
                pass
    return facts


def recorded_best(problem: Any, n: int) -> list[dict[str, Any]]:
    """The ``n`` best configs recorded on this device, else on the H200 (what is recorded)."""
    import jax

    from autotune.replay.ground_truth import fastest_configs

    for device in (jax.devices()[0].device_kind, "NVIDIA H200"):
        found = fastest_configs(device, problem.kernel, problem.shape, problem.dtype)[:n]
        if found:
            return found
    return []


def child_xla(args: argparse.Namespace) -> None:
    """One fresh process: compile the baseline (XLA autotunes), report its kernels and time."""
    import jax

    from autotune._jax_compat import cupti_session

    kernel, problem = parse_problem(args.problem)
    inputs = kernel.make_inputs(problem, jax.random.key(1))
    start = time.perf_counter()
    exe = jax.jit(kernel.baseline(problem)).trace(*inputs).lower().compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(exe(*inputs))
    samples = []
    names: list[str] = []
    for _ in range(args.iterations):
        launches = cupti_session(lambda: exe(*inputs))
        names = [n for n, _ in launches]
        samples.append(sum(ms for _, ms in launches) * 1000.0)
    print(json.dumps({"names": names, "compile_s": compile_s,
                      "median_us": statistics.median(samples)}))


def child_ncu(args: argparse.Namespace) -> None:
    """Under Nsight Compute: 3 x (flush, baseline) then 3 x (flush, best recorded config), so
    that ncu reads each program's L2 hit rate and DRAM bytes right after the flush."""
    import jax

    from autotune.evaluation.cold_timing import L2Flush
    from autotune.evaluation.pipeline import compile_config
    from autotune.space.kernel import BuildOptions
    from autotune.space.problem import Config

    kernel, problem = parse_problem(args.problem)
    inputs = kernel.make_inputs(problem, jax.random.key(1))
    flush = L2Flush()
    exes = [jax.jit(kernel.baseline(problem)).trace(*inputs).lower().compile()]
    best = recorded_best(problem, 1)
    if best:
        compiled = compile_config(kernel, problem, Config(best[0]), BuildOptions())
        exes.append(compiled.executable)
    for exe in exes:
        jax.block_until_ready(exe(*inputs))
        for _ in range(3):
            flush.launch()
            jax.block_until_ready(exe(*inputs))
        for _ in range(2):  # warm: no flush
            jax.block_until_ready(exe(*inputs))


def run_children(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    cache = tempfile.mkdtemp(prefix="xla-autotune-cache-")
    for i in range(args.processes + 2):
        shared = i >= args.processes
        env = dict(os.environ)
        if shared:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                f" --xla_gpu_per_fusion_autotune_cache_dir={cache}").strip()
        cmd = [sys.executable, __file__, "--child", "xla", "--problem", args.problem,
               "--iterations", "30"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        row: dict[str, Any] = {"process": i, "autotune_cache": shared, "rc": p.returncode}
        try:
            row.update(json.loads(p.stdout.strip().splitlines()[-1]))
        except Exception:  # noqa: BLE001
            row["stderr"] = p.stderr[-2000:]
        out.append(row)
        print(f"  child {i} cache={shared}: {row.get('median_us')} us {row.get('names')}",
              flush=True)
    return out


class ReadFlush:
    """An L2 flush that only reads: a sum over ``nbytes`` (L2Flush's interface)."""

    def __init__(self, nbytes: int) -> None:
        import jax
        import jax.numpy as jnp

        size = nbytes // 4
        self._buf = jax.block_until_ready(jnp.arange(size, dtype=jnp.int32))
        self._fn = jax.jit(lambda b: jnp.sum(b)).lower(
            jax.ShapeDtypeStruct((size,), jnp.int32)).compile()
        self.out: Any = None
        self.names: tuple[str, ...] | None = None

    def launch(self) -> Any:
        self.out = self._fn(self._buf)
        return self.out

    def calibrate(self, session: Any) -> None:
        if self.names is None:
            first = tuple(n for n, _ in session(self.launch))
            second = tuple(n for n, _ in session(self.launch))
            assert first == second and first, (first, second)
            self.names = first


def study(args: argparse.Namespace) -> dict[str, Any]:
    import random

    import jax
    import jax.numpy as jnp

    from autotune._jax_compat import cupti_session
    from autotune.evaluation.cold_timing import (L2Flush, l2_cache_bytes, time_cold,
                                                 time_cold_interleaved)
    from autotune.evaluation.pipeline import compile_config
    from autotune.evaluation.timing import select_kernel_time
    from autotune.space.kernel import BuildOptions
    from autotune.space.problem import Config

    kernel, problem = parse_problem(args.problem)
    l2, source = l2_cache_bytes(jax.devices()[0])
    flush2 = L2Flush()

    from autotune.evaluation.independent import CuptiFlushedTimer, CuptiIsolatedTimer

    read2, read4 = ReadFlush(2 * l2), ReadFlush(4 * l2)
    xor_timer, xor2, flush4 = CuptiIsolatedTimer(), CuptiIsolatedTimer(2 * l2), L2Flush(4 * l2)
    fl_timer = CuptiFlushedTimer()
    programs: list[tuple[str, Any, bool]] = []
    specs = kernel.make_inputs(problem, jax.random.key(0))
    programs.append(("xla", jax.jit(kernel.baseline(problem)).trace(*specs).lower().compile(),
                     True))
    configs = []
    if kernel.default_config is not None:
        configs.append(("default", dict(kernel.default_config(problem))))
    for i, c in enumerate(recorded_best(problem, args.best)):
        configs.append((f"best{i}", c))
    for i, text in enumerate(args.config or ()):
        configs.append((f"given{i}", json.loads(text)))
    for label, c in configs:
        compiled = compile_config(kernel, problem, Config(c), BuildOptions())
        if hasattr(compiled, "executable"):
            programs.append((label, compiled.executable, False))
        else:
            print(f"  {label} failed: {compiled.error[:200]}", flush=True)
    del specs

    def iso_ro(fn: Any, inputs: Any, aggregate: bool, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            jax.block_until_ready(read4.launch())
            launches = cupti_session(lambda: fn(*inputs))
            samples.append(sum(ms for _, ms in launches) * 1000.0 if aggregate
                           else select_kernel_time([launches])[0])
        return samples

    def iso_xor(fn: Any, inputs: Any, n: int, timer: Any = xor_timer) -> list[float]:
        return [timer.call_us(fn, inputs) for _ in range(n)]

    def pair(inputs: Any, order: list[int]) -> dict[str, list[float]]:
        ps = [programs[i] for i in order]
        times = time_cold_interleaved([p[1] for p in ps], [inputs] * len(ps), n, flush2,
                                      aggregate=[p[2] for p in ps], select=select_kernel_time)
        return {p[0]: t for p, t in zip(ps, times, strict=True)}

    def warm(fn: Any, inputs: Any, aggregate: bool, n: int) -> list[float]:
        jax.block_until_ready(fn(*inputs))
        launches = cupti_session(lambda: [fn(*inputs) for _ in range(n)][-1])
        per = len(launches) // n
        its = [launches[i * per:(i + 1) * per] for i in range(n)]
        if aggregate:
            return [sum(ms for _, ms in it) * 1000.0 for it in its]
        return select_kernel_time(its)

    def batch(fn: Any, inputs: Any, n: int) -> list[float]:
        out = []
        for _ in range(3):
            jax.block_until_ready(fn(*inputs))
            t0 = time.perf_counter()
            for _ in range(n):
                last = fn(*inputs)
            jax.block_until_ready(last)
            out.append((time.perf_counter() - t0) / n * 1e6)
        return out

    def settled(fn: Any, inputs: Any, n: int, idle_s: float, hot_s: float) -> list[float]:
        time.sleep(idle_s)
        end = time.perf_counter() + hot_s
        while time.perf_counter() < end:
            jax.block_until_ready([fn(*inputs) for _ in range(20)][-1])
        return batch(fn, inputs, n)

    launches = {}
    warm_inputs = kernel.make_inputs(problem, jax.random.key(99))
    for label, fn, _ in programs:
        jax.block_until_ready(fn(*warm_inputs))
        launches[label] = [(name, ms * 1000.0)
                           for name, ms in cupti_session(lambda: fn(*warm_inputs))]
    del warm_inputs
    nv = nvml_gpu0()
    rows: list[dict[str, Any]] = []
    n = args.iterations
    pads: list[Any] = []
    rng = random.Random(os.getpid())
    for r in range(args.rounds):
        if args.pad:
            pads.append(jax.block_until_ready(jnp.zeros((rng.randrange(1, 1 << 24),), jnp.int32)))
        inputs = kernel.make_inputs(problem, jax.random.key(100 + r))
        jax.block_until_ready(inputs)
        addrs = [int(a.unsafe_buffer_pointer()) for a in inputs]
        order = [(r + i) % len(programs) for i in range(len(programs))]
        wanted = set(args.methods.split(","))
        paired = pair(inputs, order) if "pair" in wanted else {}
        for i in order:
            label, fn, aggregate = programs[i]
            row: dict[str, Any] = {"round": r, "program": label, "nvml_before": nvml_reading(nv),
                                   "addrs": addrs}
            def cold(flush: Any) -> list[float]:
                return time_cold(fn, inputs, n, flush, aggregate=aggregate,
                                 select=select_kernel_time)[0]
            for method, measure in (
                ("cold", lambda: cold(flush2)),
                ("cold_ro", lambda: cold(read2)),
                ("iso_ro", lambda: iso_ro(fn, inputs, aggregate, args.isolated)),
                ("iso_xor", lambda: iso_xor(fn, inputs, args.isolated)),
                ("iso_xor2", lambda: iso_xor(fn, inputs, args.isolated, xor2)),
                ("fl_xor", lambda: fl_timer.calls_us(fn, inputs, n)),
                ("cold4", lambda: cold(flush4)),
                ("warm", lambda: warm(fn, inputs, aggregate, n)),
                ("pair", lambda: paired[label]),
                ("batch", lambda: batch(fn, inputs, n)),
                ("idle", lambda: settled(fn, inputs, n, 0.2, 0.0)),
                ("hot", lambda: settled(fn, inputs, n, 0.0, 1.0)),
            ):
                if method in wanted:
                    row[method] = measure()
            row["nvml_after"] = nvml_reading(nv)
            rows.append(row)
        del inputs
        print(f"  round {r} done", flush=True)
    return {"problem": args.problem, "l2": l2, "l2_source": source, "launches": launches,
            "programs": [p[0] for p in programs], "configs": dict(configs), "rows": rows}


def engine_study(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.api import open_engine
    from autotune.replay.ground_truth import fastest_configs as best
    from autotune.space.problem import Config

    kernel, p = parse_problem(args.problem)
    with tempfile.TemporaryDirectory() as cache, open_engine(
            args.engine, compilation_cache=cache) as eng:
        name = eng.device_info().name
        configs = [json.loads(c) for c in args.config or ()] + (best(
            name, p.kernel, p.shape, p.dtype) or best("NVIDIA H200", p.kernel, p.shape,
                                                        p.dtype))[:args.best]
        if not configs:
            raise SystemExit(f"timing_study: no config recorded for {args.problem} on {name} "
                             "or the H200: pass --config JSON")
        progs, labels = [Config(c) for c in configs] + [None], [*map(str, configs), "xla"]
        n, nw, rounds = len(progs), eng.workers, range(args.rounds)
        eng.warm_up(kernel.name, p, progs[0])
        us = [[[0.0] * nw for _ in progs] for _ in rounds]
        for r in rounds:
            for i, w in ((i % n, w % nw) for i in range(r, r + n) for w in range(r, r + nw)):
                res = eng.retime(kernel.name, p, progs[i], worker=w, median_us=1.0,
                                 iterations=args.iterations)
                us[r][i][w] = res.median_us if res.ok else float("nan")
    print(f"\n{args.problem}, {name}: per worker, each program's median over rounds over all "
          "workers' (%); speedup xla/first, median of rounds [min, max]")
    med = statistics.median
    for w in range(nw):
        off = [med(us[r][i][w] for r in rounds) / med(med(us[r][i]) for r in rounds) - 1
               for i in range(n)]
        ratios = [us[r][-1][w] / us[r][0][w] for r in rounds]
        print(f"{w:3d} " + " ".join(f"{x * 100:+7.2f}%" for x in off)
              + f"  {med(ratios):.4f} [{min(ratios):.4f}, {max(ratios):.4f}]")
    return {"problem": args.problem, "device": name, "programs": labels, "us": us}


def summarize(result: dict[str, Any]) -> None:
    methods = [m for m in ("cold", "cold4", "cold_ro", "iso_ro", "iso_xor", "iso_xor2", "fl_xor",
                           "warm", "pair", "batch", "idle", "hot") if m in result["rows"][0]]
    for prog, launched in result.get("launches", {}).items():
        print(f"{prog}: " + ", ".join(f"{name[:40]} {us:.1f}" for name, us in launched))
    print(f"\n{result['problem']}: per program and method, the median of round medians (us), "
          "the range of round medians (% of it), and first/later iteration ratio (cold)")
    print(f"{'program':10s} " + " ".join(f"{m:>22s}" for m in methods) + "   first/rest")
    base = {}
    for prog in result["programs"]:
        rows = [r for r in result["rows"] if r["program"] == prog]
        cells = []
        for m in methods:
            meds = [statistics.median(r[m]) for r in rows]
            mid = statistics.median(meds)
            base[(prog, m)] = meds
            cells.append(f"{mid:10.2f} ±{(max(meds) - min(meds)) / mid * 100:5.2f}%")
        first = statistics.median([r["cold"][0] / statistics.median(r["cold"][1:]) for r in rows]
                                  ) if "cold" in methods else float("nan")
        print(f"{prog:10s} " + " ".join(f"{c:>22s}" for c in cells) + f"   {first:.4f}")
    print("\nspeedup xla/program per method: median of per-round ratios [min, max]")
    for prog in result["programs"][1:]:
        cells = []
        for m in methods:
            ratios = [x / y for x, y in zip(base[("xla", m)], base[(prog, m)], strict=True)]
            cells.append(f"{statistics.median(ratios):.4f} [{min(ratios):.3f},{max(ratios):.3f}]")
        print(f"{prog:10s} " + " ".join(f"{c:>22s}" for c in cells))
    clocks = [r["nvml_before"].get("sm_mhz") for r in result["rows"] if r["nvml_before"]]
    if clocks:
        print(f"\nSM clock before blocks: min {min(clocks)} max {max(clocks)} MHz; reasons seen: "
              f"{sorted({r['nvml_before'].get('reasons') for r in result['rows']})}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problem", action="append", metavar="KERNEL:SHAPE:DTYPE")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--isolated", type=int, default=12)
    p.add_argument("--best", type=int, default=2)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--pad", action="store_true")
    p.add_argument("--methods", default="cold,cold_ro,iso_ro,iso_xor,"
                   "warm,pair,batch")
    p.add_argument("--config", action="append", metavar="JSON", help="another config to time")
    p.add_argument("--engine", choices=("gpu", "interpret"), help="the engine's workers, apart")
    p.add_argument("--child", choices=("xla", "ncu"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    problems = args.problem or ["hopper_matmul:m=4096,n=4096,k=4096:bfloat16"]
    if args.child:
        args.problem = problems[0]
        (child_xla if args.child == "xla" else child_ncu)(args)
        return 0
    out: dict[str, Any] = {"facts": device_facts(), "problems": []}
    print(json.dumps(out["facts"]), flush=True)
    for text in problems:
        args.problem = text
        if args.engine:
            result = engine_study(args)
        else:
            result = study(args)
            summarize(result)
            result["children"] = run_children(args) if args.processes else []
        out["problems"].append(result)
        if args.out:
            args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which hopper_matmul configs crash XLA's CPU compiler in GPU interpret mode (SIGFPE)?

Each config is built in interpret mode and compiled for the CPU (no run) in a fresh process,
so a crash kills only that process; one line per config: how it ended, the number of output
tiles (m_iters x n_iters of the cluster tile), tile_k, and the config. Shape: the quickstart's
256^3 bf16 (and --shape for others). CPU only, a few seconds a config:

    PYTHONPATH=. python3 benchmarks/interpret_crash_sweep.py [--shape 256,256,256]

Seen (jax 0.10.2, CPU): every config whose output is ONE tile crashed (SIGFPE in
``mlir::stablehlo::FoldRemOpPattern``, a remainder by a constant zero folded at compile time),
whatever its tile_k, steps or epilogue; every config with 2 or more tiles compiled.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import signal
import sys

BASE = {"cluster_dimension": None, "epi_tile_m": None, "epi_tile_n": None, "grid_minor_dim": "N",
        "grid_tile_width": 1, "max_concurrent_steps": 2, "tile_k": 64, "tile_m": 64,
        "tile_n": 64, "wg_dimension": "M"}


def _compile(shape: tuple[int, int, int], config: dict, run: bool = True) -> None:
    import jax

    from autotune.space.kernel import BuildOptions, get_kernel
    from autotune.space.problem import Config

    kernel = get_kernel("hopper_matmul")
    m, n, k = shape
    problem = kernel.problem({"m": m, "n": n, "k": k}, "bfloat16")
    fn = kernel.build(problem, Config(config), BuildOptions(interpret=True))
    specs = (jax.ShapeDtypeStruct((m, k), "bfloat16"), jax.ShapeDtypeStruct((k, n), "bfloat16"))
    with jax.default_device(jax.devices("cpu")[0]):
        compiled = jax.jit(fn).lower(*specs).compile()
        if run:  # the crash may come when the interpreter runs the kernel body
            a, b = kernel.make_inputs(problem, jax.random.key(0))
            jax.block_until_ready(compiled(a, b))


def _variants(shape: tuple[int, int, int]) -> list[dict]:
    from autotune.space.kernel import get_kernel

    kernel = get_kernel("hopper_matmul")
    m, n, k = shape
    space = kernel.valid_space(kernel.problem({"m": m, "n": n, "k": k}, "bfloat16"), interpret=True)
    out = []
    # k steps (k // tile_k) against max_concurrent_steps, on two output tiles and on one.
    for tile_m, tile_n, wg in ((128, 128, "M"), (128, 256, "M")):
        for tile_k in (32, 64):
            for steps in (2, 3, 4, 5, 6):
                c = {**BASE, "tile_m": tile_m, "tile_n": tile_n, "wg_dimension": wg,
                     "tile_k": tile_k, "max_concurrent_steps": steps}
                if space.is_valid(c):
                    out.append(c)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="256,256,256", help="m,n,k")
    p.add_argument("--timeout", type=float, default=240)
    args = p.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    from search_spaces.hopper_matmul import cluster_tile

    ctx = mp.get_context("spawn")
    tally: dict[tuple[int, str], int] = {}
    for c in _variants(shape):
        tiles = (shape[0] // cluster_tile(c, "m")) * (shape[1] // cluster_tile(c, "n"))
        proc = ctx.Process(target=_compile, args=(shape, c))
        proc.start()
        proc.join(args.timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            how = "timeout"
        elif proc.exitcode == 0:
            how = "ok"
        elif proc.exitcode < 0:
            how = signal.Signals(-proc.exitcode).name
        else:
            how = f"exit {proc.exitcode}"
        tally[(tiles, how)] = tally.get((tiles, how), 0) + 1
        k_iters = shape[2] // c["tile_k"]
        print(f"{how:8} tiles={tiles:<3} k_iters={k_iters:<3} steps={c['max_concurrent_steps']:<2} "
              f"{json.dumps(c, sort_keys=True)}", flush=True)
    print("summary (output tiles, outcome): configs")
    for key in sorted(tally):
        print(f"  {key}: {tally[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

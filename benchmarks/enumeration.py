"""Enumeration and proposal speed of the constraint engine (CPU only).

    python benchmarks/enumeration.py

Prints, for a synthetic 10^6-raw space, a 10^9-raw space and each bundled kernel's space:
raw and valid counts, time to count and to enumerate the valid set, lazy sampling rate, and
Optuna proposals per second through the ValidSampler (TPE and random).
"""

from __future__ import annotations

import argparse
import time

import optuna

from autotune.space.kernel import bundled_kernels, get_kernel
from autotune.space.problem import Problem
from autotune.space.search_space import Aligned, Choice, Constraint, PowerOfTwo, Space
from autotune.tuning.sampling import distributions, valid_sampler

BUNDLED_SHAPES = {
    "hopper_matmul": ({"m": 4096, "n": 4096, "k": 4096}, "bfloat16"),
    "hopper_attention": ({"batch": 4, "seq_q": 2048, "seq_kv": 2048, "heads_q": 16, "heads_kv": 16, "head_dim": 128}, "float16"),
    "softmax": ({"rows": 8192, "cols": 32768}, "bfloat16"),
}


def synthetic(raw_exp: int) -> tuple[Space, Problem]:
    """A matmul-like space with about 10^raw_exp raw combinations."""
    params = [
        Aligned("tile_m", unit=16, low=16, high=512),   # 32
        Aligned("tile_n", unit=16, low=16, high=512),   # 32
        Aligned("tile_k", unit=16, low=16, high=256),   # 16
        Aligned("steps", unit=1, low=1, high=8),        # 8
        Choice("order", ("M", "N")),                    # 2
        PowerOfTwo("width", low=1, high=16),            # 5 -> 1.3e6 raw
    ]
    if raw_exp >= 9:
        params += [Aligned("epi_m", unit=16, low=16, high=512), Aligned("epi_n", unit=16, low=16, high=512)]
    constraints = [
        Constraint("m_div", ("tile_m",), lambda c, e: e["m"] % c["tile_m"] == 0, "tile_m | m"),
        Constraint("n_div", ("tile_n",), lambda c, e: e["n"] % c["tile_n"] == 0, "tile_n | n"),
        Constraint("smem", ("tile_m", "tile_n", "tile_k", "steps"),
                   lambda c, e: (c["tile_m"] + c["tile_n"]) * c["tile_k"] * 2 * c["steps"] <= 232_448, "fits"),
    ]
    if raw_exp >= 9:
        constraints.append(Constraint("epi", ("tile_m", "tile_n", "epi_m", "epi_n"),
                                      lambda c, e: c["tile_m"] % c["epi_m"] == 0 and c["tile_n"] % c["epi_n"] == 0, "epi | tile"))
    return Space(tuple(params), tuple(constraints)), Problem("synthetic", {"m": 4096, "n": 4096}, "bf16")


def bench_space(label: str, bound, *, proposals: int) -> None:
    t = time.perf_counter()
    valid = bound.count()
    t_count = time.perf_counter() - t
    t = time.perf_counter()
    n = sum(1 for _ in bound._iter_tuples()) if valid <= 5_000_000 else None
    t_enum = time.perf_counter() - t
    t = time.perf_counter()
    sample = bound.sample(200, seed=0)
    t_sample = time.perf_counter() - t
    rates = {}
    for name in ("tpe", "random"):
        sampler = valid_sampler(name, bound, seed=0)
        study = optuna.create_study(sampler=sampler)
        dists = distributions(bound)
        t = time.perf_counter()
        for i in range(proposals):
            trial = study.ask(dists)
            study.tell(trial, float(i % 17))
        rates[name] = proposals / (time.perf_counter() - t)
    enum = f"{t_enum * 1e3:8.1f}" if n is not None else "   (lazy)"
    print(f"{label:<34} {bound.raw_count:>14,} {valid:>12,} {t_count * 1e3:8.1f} {enum} "
          f"{len(sample) / t_sample:>10,.0f} {rates['tpe']:>8,.0f} {rates['random']:>8,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--proposals", type=int, default=200)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{'space':<34} {'raw':>14} {'valid':>12} {'count ms':>8} {'enum ms':>8} {'sample/s':>10} {'tpe/s':>8} {'rand/s':>8}")
    for exp in (6, 9):
        space, problem = synthetic(exp)
        bench_space(f"synthetic ~10^{exp}", space.bind(problem), proposals=args.proposals)
    for name in bundled_kernels():
        if name not in BUNDLED_SHAPES:
            continue
        shape, dtype = BUNDLED_SHAPES[name]
        kernel = get_kernel(name)
        bench_space(f"{name} {dtype}", kernel.valid_space(kernel.problem(shape, dtype)), proposals=args.proposals)


if __name__ == "__main__":
    main()

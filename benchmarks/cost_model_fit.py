"""Fit hopper_matmul's cost-model constants to every measurement of a device (``--device``,
default the H200), judged shape by shape held out (CPU only, about 10 s for the default grid).

    python3 benchmarks/cost_model_fit.py [--grid NAME=V1/V2/...] ... [--per-family 0.01] [--loss top5]

Reads what ``benchmarks/cost_model_check.py`` reads (ground truth and live runs), evaluates
``hopper_matmul.cost_model(**constants)`` for every point of a grid over some of the ``Hopper``
constants, and scores each point on each shape by a loss: the measured gap to the fastest of the
median config of the model's first family, plus ``--per-family`` (1%) for each family it ranks
ahead of the fastest; ``--loss top5``: the gap of the fastest of its 5 first configs plus 0.2%
for each config it ranks ahead of the first within 1% (at most 50). It prints:

- leave one shape out: for each shape, the point that scores best on the *other* shapes, and its
  loss on this one, beside the committed model's; summed, whether fitting the grid generalises
  to a shape it did not see;
- the point that scores best on all shapes.

The default grid is benchmarks/RESULTS.md §7's; ``--grid`` replaces or adds dimensions.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost_model_check as check  # noqa: E402

from autotune.space.problem import Problem  # noqa: E402
from search_spaces import hopper_matmul  # noqa: E402

GRID: dict[str, list[Any]] = {
    "stage_transfer": ["none", "loaded", "full"],
    "l2_latency": [800.0, 1200.0, 1600.0, 2000.0],
    "l2_bytes": [48.0, 64.0, 96.0, 128.0],
}

Shape = tuple[str, Problem, list[dict[str, Any]], list[float]]


def shapes(truth: Sequence[str] | None, runs: Sequence[str] | None, device: str = check.DEVICE) -> list[Shape]:
    """(name, problem, configs, times) per measured hopper_matmul problem
    (:func:`cost_model_check.measured`)."""
    return [(f"{source} {problem.shape_text}", problem, configs, times)
            for source, problem, configs, times in check.measured("hopper_matmul", truth, runs, device=device)]


def losses(estimate: Callable[[Problem, Mapping[str, Any]], float], data: Sequence[Shape],
           per_family: float, loss: str = "family") -> list[float]:
    """The loss of ``estimate`` on each shape (see the module's docstring)."""
    out = []
    for _name, problem, configs, times in data:
        estimates = [float(estimate(problem, c)) for c in configs]
        if loss == "top5":
            order, best = sorted(range(len(times)), key=estimates.__getitem__), min(times)
            ahead = next(i for i, j in enumerate(order) if times[j] <= best * 1.01)
            out.append(min(times[j] for j in order[:5]) / best - 1 + 0.002 * min(ahead, 50))
            continue
        figures = check.family_figures(estimates, times)
        out.append(figures["first_family_median_gap"] + per_family * figures["families_ahead"])
    return out


def leave_one_out(table: Mapping[tuple[Any, ...], list[float]]) -> list[tuple[tuple[Any, ...], float]]:
    """For each shape: the grid point best on the others, and its loss on this shape."""
    n = len(next(iter(table.values())))
    out = []
    for held in range(n):
        point = min(table, key=lambda p: sum(v for i, v in enumerate(table[p]) if i != held))
        out.append((point, table[point][held]))
    return out


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    grid = dict(GRID)
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise SystemExit(f"--grid: expected NAME=V1/V2/..., got {item!r}")
        grid[name] = [check.parse_constants(f"x={v}")["x"] for v in values.split("/")]
    return grid


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="append", default=[], help="NAME=V1/V2/... (repeatable)")
    ap.add_argument("--per-family", type=float, default=0.01,
                    help="loss per family ranked ahead of the fastest (default 0.01)")
    ap.add_argument("--device", default=check.DEVICE, help=f"whose measurements (default {check.DEVICE})")
    ap.add_argument("--loss", choices=("family", "top5"), default="family")
    args = ap.parse_args(argv)
    grid = parse_grid(args.grid)
    with check.on_device(args.device):  # the configs' validity and the estimates: its facts
        fit(grid, shapes(None, None, args.device), args.per_family, args.loss)


def fit(grid: Mapping[str, list[Any]], data: Sequence[Shape], per_family: float, loss: str) -> None:
    names = list(grid)
    table: dict[tuple[Any, ...], list[float]] = {}
    for values in itertools.product(*grid.values()):
        try:
            model = hopper_matmul.cost_model(**dict(zip(names, values, strict=True)))
        except ValueError as e:
            raise SystemExit(f"--grid: {e}") from None
        table[values] = losses(model, data, per_family, loss)
    committed = losses(hopper_matmul.estimate_seconds, data, per_family, loss)
    print(f"{len(table)} grid points over {', '.join(names)}; {len(data)} shapes\n")
    print("| held-out shape | committed model: loss | fitted on the others: loss | its constants |")
    print("|---|---|---|---|")
    picks = leave_one_out(table)
    for (name, *_), base, (point, loss) in zip(data, committed, picks, strict=True):
        print(f"| {name} | {base:.3f} | {loss:.3f} | {dict(zip(names, point, strict=True))} |")
    print(f"| **sum** | **{sum(committed):.3f}** | **{sum(loss for _, loss in picks):.3f}** | |")
    best = min(table, key=lambda p: sum(table[p]))
    print(f"\nfitted on all {len(data)} shapes: {dict(zip(names, best, strict=True))}, loss {sum(table[best]):.3f} "
          f"(committed {sum(committed):.3f}); per shape: "
          + ", ".join(f"{v:.3f}" for v in table[best]))


if __name__ == "__main__":
    main()

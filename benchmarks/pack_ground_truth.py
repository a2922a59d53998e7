"""Packs per-shape ground-truth files into the package's data, or unpacks them.

    python3 benchmarks/pack_ground_truth.py FILES...            # merge into autotune/replay/data
    python3 benchmarks/pack_ground_truth.py --live RUNS... --device "NVIDIA H200" --kernel hopper_matmul
    python3 benchmarks/pack_ground_truth.py --unpack "NVIDIA H200" OUT_DIR

``benchmarks/ground_truth.py --out DIR`` writes one ``<kernel>__<shape>__<dtype>.json`` per
problem; packing merges each into ``autotune/replay/data/<device>/<kernel>.json.gz`` (a problem
of the same name is replaced; the format is in docs/replay.md), the versioned data that the
replay, the benchmarks and the tests read through
:func:`autotune.replay.ground_truth.load_ground_truth`. ``--live`` stores the configs that live
jobs measured (their JSON of runs, or ``--jsonl`` progress files; each config's median over the
runs) for ``benchmarks/cost_model_check.py``. ``--unpack`` writes a device's problems back as
per-shape files (what ``ground_truth.py --files`` extends and re-times). ``--root DIR`` packs into
another data folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from autotune.replay.ground_truth import (  # noqa: E402
    DATA_DIR,
    load_ground_truth,
    read_problem_file,
    save_ground_truth,
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="per-shape ground-truth files, or with --live the runs")
    ap.add_argument("--live", action="store_true", help="the files are live runs (JSON of runs, .jsonl)")
    ap.add_argument("--device", help="with --live: the device the runs measured on")
    ap.add_argument("--kernel", help="with --live: only this kernel's problems")
    ap.add_argument("--unpack", nargs=2, metavar=("DEVICE", "OUT_DIR"),
                    help="write DEVICE's problems as per-shape files in OUT_DIR")
    ap.add_argument("--root", type=Path, default=DATA_DIR, help="the data folder (default: the package's)")
    args = ap.parse_args(argv)
    if args.unpack:
        device, out = args.unpack
        problems = load_ground_truth(device, root=args.root)
        if not problems:
            raise SystemExit(f"no ground truth recorded for {device!r} in {args.root}")
        Path(out).mkdir(parents=True, exist_ok=True)
        for problem in problems:
            name = problem.pop("name")
            (Path(out) / f"{name}.json").write_text(json.dumps(problem, indent=1))
        print(f"wrote {len(problems)} files in {out}")
        return
    if not args.files:
        raise SystemExit("give the files to pack (or --unpack DEVICE OUT_DIR)")
    if args.live:
        from cost_model_check import live

        if not args.device:
            raise SystemExit("--live needs --device NAME: the device the runs measured on")
        entries = [{"kernel": r["kernel"], "device": args.device, "shape": r["shape"], "dtype": r["dtype"],
                    "times": [[json.loads(c), t] for c, t in sorted(r["times"].items())]}
                   for r in live(args.files) if args.kernel in (None, r["kernel"])]
        written = save_ground_truth([], root=args.root, live=entries)
    else:
        try:
            problems = [read_problem_file(f, ("kernel", "shape", "dtype", "device", "results"))
                        for f in args.files]
        except ValueError as e:
            raise SystemExit(str(e)) from None
        written = save_ground_truth(problems, root=args.root)
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

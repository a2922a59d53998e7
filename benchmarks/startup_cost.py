"""What a fresh worker process spends before its first config is timed (issue 16, first trial).

    python3 benchmarks/startup_cost.py --out $OUT/startup_cost.json     # H200
    python3 benchmarks/startup_cost.py --device interpret                # CPU smoke

Starts ``--runs`` fresh processes one after another; each reports, from its start, when each
step of a worker's first config finished: importing jax, the backend, Pallas' Mosaic GPU and
the kernel's module, inputs, compiling the reference and the default config, their first runs;
on a GPU then two empty CUPTI sessions, the L2 flush and two cold timings. Prints each step's
median over the runs (the first also pays a cold page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Both children: argv is (start time, kernel:shape:dtype, device); mark(step) notes the time.
PRELUDE = r"""
import os, sys, time, json
t0 = float(sys.argv[1]); marks = {}
def mark(name): marks[name] = time.time() - t0
import jax; mark("import jax")
interpret = sys.argv[3] == "interpret"
if interpret:
    jax.config.update("jax_platforms", "cpu")
"""

CHILD = PRELUDE + r"""
jax.devices(); mark("backend up")
if not interpret:
    import jax.experimental.pallas.mosaic_gpu  # noqa: F401
mark("import pallas")
from autotune.space.kernel import get_kernel
from autotune.space.problem import Problem, parse_shape
kernel_name, shape, dtype = sys.argv[2].split(":")
problem = Problem(kernel_name, parse_shape(shape), dtype)
kernel = get_kernel(kernel_name); mark("import kernel")
inputs = tuple(kernel.make_inputs(problem, jax.random.key(0)))
jax.block_until_ready(inputs); mark("inputs")
ref = jax.jit(kernel.reference(problem)).lower(*inputs).compile({"xla_gpu_autotune_level": 0} if not interpret else None)
mark("reference compiled")
from autotune.evaluation.pipeline import compile_config
from autotune.evaluation.contract import BuildOptions
config = kernel.default_config(problem)
compiled = compile_config(kernel, problem, config, BuildOptions(interpret=interpret))
mark("config compiled")
jax.block_until_ready(compiled.executable(*inputs)); mark("first run")
jax.block_until_ready(ref(*inputs)); mark("reference first run")
if not interpret:  # what the first cold-timed trial adds: CUPTI's start, the L2 flush
    from autotune import _jax_compat
    from autotune.evaluation.cold_timing import L2Flush, time_cold
    from autotune.evaluation.timing import select_kernel_time
    _jax_compat.cupti_session(lambda: None); mark("first CUPTI session")
    _jax_compat.cupti_session(lambda: None); mark("second CUPTI session")
    flush = L2Flush(); mark("flush made")
    flush.calibrate(_jax_compat.cupti_session); mark("flush calibrated")
    for name in ("first cold timing", "second cold timing"):
        time_cold(compiled.executable, inputs, 20, flush, aggregate=False, select=select_kernel_time)
        mark(name)
print(json.dumps(marks))
"""

# --path evaluator: a worker's own path, through its evaluator: warmed up as a worker starts
# (one after the other here), the problem prepared while the first config compiles, then that
# config's trial stage by stage, then a second config's.
EVALUATOR_CHILD = PRELUDE + r"""
from autotune.evaluation.contract import Compiled, make_evaluator
from autotune.space.kernel import get_kernel
from autotune.space.problem import Problem, parse_shape
kernel_name, shape, dtype = sys.argv[2].split(":")
problem = Problem(kernel_name, parse_shape(shape), dtype)
kernel = get_kernel(kernel_name)
evaluator = make_evaluator(sys.argv[3]); evaluator.device_info(); mark("evaluator up")
evaluator.warm_host(); evaluator.warm_device(); mark("warmed up")  # as a worker, at its start
first, second = kernel.valid_space(problem, interpret=interpret).sample(2, seed=0)
for name, config in (("first", first), ("second", second)):
    compiled = evaluator.compile(kernel, problem, config); mark(f"{name} compiled")
    assert isinstance(compiled, Compiled), compiled
    steps = {"run": "inputs and reference", "check": "run", "time": "check"}
    result = evaluator.run(compiled, on_stage=lambda s, n=name: (
        mark(f"{n} trial: {steps[str(s)]}") if str(s) in steps else None))
    assert result.ok, result
    mark(f"{name} trial: timed")
print(json.dumps(marks))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problem", default=None,
                   help="kernel:shape:dtype (default hopper_matmul 4096^3 bf16 on a GPU, "
                        "softmax 64x512 f32 in interpret mode)")
    p.add_argument("--device", choices=("gpu", "interpret"), default="gpu")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--path", choices=("steps", "evaluator"), default="steps",
                   help="steps: jax's own steps one by one; evaluator: a worker's path through "
                        "its evaluator, two trials")
    p.add_argument("--out", help="write every figure here (JSON)")
    args = p.parse_args(argv)
    problem = args.problem or ("hopper_matmul:m=4096,n=4096,k=4096:bfloat16" if args.device == "gpu"
                               else "softmax:rows=64,cols=512:float32")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    runs = []
    import time

    for _ in range(args.runs):
        child = CHILD if args.path == "steps" else EVALUATOR_CHILD
        out = subprocess.run([sys.executable, "-c", child, repr(time.time()), problem, args.device],
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print("  ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("median s from the process start: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"problem": problem, "path": args.path, "runs": runs,
                                              "median": medians},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

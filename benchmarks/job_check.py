"""How long checking a large job file takes (CPU only, no jax): ``autotune tune`` checks every
problem (kernel, shape keys, dtype, a non-empty space) before anything runs.

    python3 benchmarks/job_check.py                   # 10,000 problems, every bundled kernel
    python3 benchmarks/job_check.py --problems 2000

Writes a job file of ``--problems`` distinct problems (hopper_matmul, softmax and hopper_attention
shapes) to a temporary folder and times
:func:`autotune.tuning.jobs.load_job` on it, then prints the seconds and problems per second. Goal:
a 10,000-problem job is checked in seconds (it took minutes when every space was counted).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from autotune.tuning.jobs import load_job  # noqa: E402


def job_text(n: int) -> str:
    """A job of ``n`` distinct problems spread over three bundled kernels."""
    big = [1024 * i for i in range(1, 65)]  # 1024 .. 65536
    kernels = {
        "hopper_matmul": ("{{ m = {}, n = {}, k = {} }}", (big, big, big), ("bfloat16", "float16")),
        "softmax": ("{{ rows = {}, cols = {} }}", ([128 * i for i in range(1, 1025)],
                                                   [1024, 2048, 4096]), ("float32", "bfloat16")),
        "hopper_attention": (
            "{{ batch = 1, seq_q = {}, seq_kv = {}, heads_q = 8, heads_kv = 8, head_dim = 128 }}",
            (big, big), ("float16",),
        ),
    }
    blocks = []
    per_kernel = -(-n // len(kernels))
    made = 0
    for kernel, (fmt, axes, dtypes) in kernels.items():
        want = min(per_kernel, n - made)
        lines = [fmt.format(*combo) for combo in
                 itertools.islice(itertools.product(*axes), -(-want // len(dtypes)))]
        made += len(lines) * len(dtypes)
        dtype_list = ", ".join(f'"{d}"' for d in dtypes)
        blocks.append(
            f'[[problem]]\nkernel = "{kernel}"\ndtypes = [{dtype_list}]\nshapes = [\n  '
            + ",\n  ".join(lines) + "\n]\n"
        )
    return "[defaults]\ntrials = 8\n\n" + "\n".join(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "big.toml"
        path.write_text(job_text(args.problems))
        start = time.perf_counter()
        job = load_job(path)
        seconds = time.perf_counter() - start
    n = len(job.problems)
    print(f"checked a job of {n} problems in {seconds:.2f} s ({n / seconds:,.0f} problems/s)")


if __name__ == "__main__":
    main()

"""Kernels for the tests, importable by worker processes as ``tests.kernels_for_tests:NAME``.

* ``SCALE_ADD``: a tiny real Pallas Mosaic GPU kernel (``out = 2x + y`` over 1-D float32,
  one block per program, copied through shared memory) with one tunable, ``block``. It runs in
  GPU interpret mode on the CPU; blocks 128 and 256 lower for CUDA, while 64 (fewer elements
  than a warpgroup's 128 threads) and 512 (over a TMA copy's 256) do not, so interpret mode,
  which lowers each config for CUDA first, records those two ``invalid`` as the GPU would.
* ``SCALE_ADD_WRONG``: the same kernel off by one: always a wrong result.
* ``SCALE_ADD_NO_INTERPRET``: declares that it cannot run interpreted.
* ``FAKE``: a kernel that is never built: its config tells the fake evaluator what to do
  (``mode``, ``stage``, ``cost_us``, ``compile_ms``, ``run_ms``, ``sleep_ms``).

jax is imported inside the functions only, so fake-mode workers never load it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.space.kernel import BuildOptions, Kernel, register
from autotune.space.problem import Config, Problem
from autotune.space.search_space import Aligned, Choice, Constraint, PowerOfTwo, Space

PREFIX = "tests.kernels_for_tests:"


def _build_scale_add(
    problem: Problem, config: Config, options: BuildOptions, *, bias: float = 0.0
) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from autotune import _jax_compat

    n, block = int(problem["n"]), int(config["block"])
    if n % block:
        raise ValueError(f"block={block} must divide n={n}.")

    def body(
        x_gmem: Any, y_gmem: Any, o_gmem: Any, x_smem: Any, y_smem: Any, o_smem: Any, bar: Any
    ) -> None:
        i = jax.lax.axis_index("b")
        part = pl.ds(i * block, block)
        plgpu.copy_gmem_to_smem(x_gmem.at[part], x_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(y_gmem.at[part], y_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])
        with jax.named_scope("compute"):
            o_smem[...] = x_smem[...] * 2.0 + y_smem[...] + bias
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[part])
        plgpu.wait_smem_to_gmem(0)

    kwargs: dict[str, Any] = {}
    if options.interpret:
        kwargs["interpret"] = _jax_compat.interpret_params()
    if options.profile_space:
        kwargs["compiler_params"] = plgpu.CompilerParams(
            profile_space=options.profile_space, profile_dir=options.profile_dir or ""
        )
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((n,), jnp.float32),
        grid=(n // block,),
        grid_names=("b",),
        scratch_types=[plgpu.SMEM((block,), jnp.float32)] * 3 + [plgpu.Barrier(num_barriers=2)],
        kernel_name="scale_add",
        **kwargs,
    )


def _inputs(problem: Problem, key: Any) -> tuple[Any, ...]:
    import jax

    kx, ky = jax.random.split(key)
    n = int(problem["n"])
    return jax.random.normal(kx, (n,), "float32"), jax.random.normal(ky, (n,), "float32")


def _reference(problem: Problem) -> Any:
    return lambda x, y: x * 2.0 + y


def _baseline(problem: Problem) -> Any:
    return lambda x, y: x * 2.0 + y


SCALE_ADD = Kernel(
    name=PREFIX + "SCALE_ADD",
    space=Space(
        params=(Choice("block", (64, 128, 256, 512), ordered=True),),
        constraints=(
            Constraint(
                "block_divides_n",
                ("block",),
                lambda c, env: env["n"] % c["block"] == 0,
                "block must divide n",
            ),
        ),
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_build_scale_add,
    make_inputs=_inputs,
    reference=_reference,
    baseline=_baseline,
    flops=lambda p: 2 * int(p["n"]),
    bytes_moved=lambda p: 12 * int(p["n"]),
    description="out = 2x + y through shared memory (tests only)",
)

SCALE_ADD_WRONG = dataclasses.replace(
    SCALE_ADD,
    name=PREFIX + "SCALE_ADD_WRONG",
    build=lambda p, c, o: _build_scale_add(p, c, o, bias=1.0),
)

SCALE_ADD_NO_INTERPRET = dataclasses.replace(
    SCALE_ADD,
    name=PREFIX + "SCALE_ADD_NO_INTERPRET",
    interpret_ok=False,
    interpret_note="pretends to use a primitive the interpreter lacks",
)


def _never(*args: Any) -> Any:
    raise NotImplementedError("FAKE is only evaluated by the fake evaluator.")


FAKE = Kernel(
    name=PREFIX + "FAKE",
    space=Space(
        params=(
            Choice(
                "mode",
                ("ok", "sleep", "raise", "wrong", "segfault", "abort", "hang", "wedge", "poison"),
            ),
            Choice("stage", ("build", "lower", "compile", "run", "check", "time")),
        )
    ),
    shape_keys=("n",),
    dtypes=("float32",),
    build=_never,
    make_inputs=_never,
    reference=_never,
    description="behaviour chosen by its config (tests only)",
)


def unbuilt(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the fake engine never builds kernels")


def toy_matmul(name: str, **fields: Any) -> Kernel:
    """A registered toy matmul (``bm`` a multiple of 64 dividing ``m``, ``stages`` a power of
    two) that only a fake engine evaluates; ``fields`` add or replace Kernel fields."""
    kernel = Kernel(
        name=name,
        space=Space(params=(Aligned("bm", unit=64, low=64, high=512, divides="m"),
                            PowerOfTwo("stages", low=1, high=8))),
        shape_keys=("m",),
        dtypes=("float32",),
        build=unbuilt, make_inputs=unbuilt, reference=unbuilt,
        flops=lambda p: 2 * p["m"] ** 3, bytes_moved=lambda p: 3 * 4 * p["m"] ** 2,
        **fields,
    )
    register(kernel)
    return kernel

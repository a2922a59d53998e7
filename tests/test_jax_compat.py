"""autotune._jax_compat: the few places where JAX versions differ, and the interpreter's cost."""

from __future__ import annotations

import numpy as np


def test_the_interpreter_compiles_each_thread_program_once_per_argument_types():
    """GPU interpret mode runs a thread's program (one per warpgroup and grid block) compiled
    once per (program, argument types), not traced, lowered and compiled at every call, and
    each call still runs with its own arguments."""
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.mosaic.interpret import thread_map

    from autotune import _jax_compat

    assert _jax_compat.cache_interpret_thread_compiles()  # jax 0.10.2 has the function
    assert _jax_compat.cache_interpret_thread_compiles()  # idempotent
    seen: list[tuple[int, float]] = []

    def body(i, x):
        jax.experimental.io_callback(lambda i, x: seen.append((int(i), float(x))), None, i, x,
                                     ordered=False)

    jaxpr = jax.make_jaxpr(body)(jnp.int32(0), jnp.float32(0))
    compiles = []
    real_jit = jax.jit

    def counting_jit(*args, **kwargs):
        compiles.append(1)
        return real_jit(*args, **kwargs)

    _jax_compat._THREAD_PROGRAMS.clear()
    jax.jit = counting_jit
    try:
        for i in range(5):
            thread_map._run_jaxpr(jaxpr.jaxpr, jaxpr.consts, jnp.int32(i), np.float32(i / 2))
        jax.effects_barrier()
    finally:
        jax.jit = real_jit
    assert sorted(seen) == [(i, i / 2) for i in range(5)]
    assert len(compiles) == 1 and len(_jax_compat._THREAD_PROGRAMS) == 1

"""Writing a kernel: everything a kernel module needs of autotune, in one public module.

The bundled kernels (``search_spaces/``) import autotune through this module only (checked
by ``tests/test_architecture.py``), and a kernel of your own may do the same
(``docs/user_kernels.md``)::

    import autotune.kernels as ak

    SPACE = ak.Space((ak.Aligned("block", unit=64, low=64, high=1024),), ())
    KERNEL = ak.Kernel(name="my_kernel", space=SPACE, build=build, ...)

It holds the kernel and its space (:class:`Kernel`, :class:`BuildOptions`, :class:`Space`, the
tunables, :class:`Constraint` and the size helpers of :mod:`autotune.space.search_space`),
problems and configs, the device facts a kernel sizes itself by (:func:`current_device`,
:func:`launch_num_sms`), and the JAX adapter's kernel-building helpers (interpret mode,
in-kernel tracing, JAX's attention kernel, Mosaic GPU's MLIR context), so that no kernel
names a JAX private name or changes a JAX module.

Layer: space (it re-exports names of the space and the core). Importing it does not import
jax; the functions that need jax import it when called.
"""

from __future__ import annotations

from autotune._jax_compat import (
    attention_forward,
    force_interpret,
    interpret_params,
    mosaic_gpu_ir_context,
    patched_attention_mgpu,
    profile_params,
)
from autotune.devices import PROFILES, DeviceFacts, current_device, profile
from autotune.space.kernel import BuildOptions, Kernel
from autotune.space.problem import Config, Problem, dtype_bits, dtype_bytes
from autotune.space.search_space import (
    MBARRIER_BYTES,
    SMEM_ALIGNMENT_BYTES,
    SMEM_LIMIT_BYTES,
    TRANSFER_ALIGN_BYTES,
    WARP_SIZE,
    WARPGROUP_SIZE,
    Aligned,
    Bool,
    Choice,
    Constraint,
    Env,
    PowerOfTwo,
    Space,
    elems_per_bytes,
    is_aligned_transfer,
    per_128_bytes,
    profiler_smem_bytes,
    smem_aligned,
    threads,
    transfer_bytes,
)

__all__ = [
    # the kernel
    "Kernel",
    "BuildOptions",
    "Problem",
    "Config",
    "dtype_bytes",
    "dtype_bits",
    # its space
    "Space",
    "Env",
    "Aligned",
    "PowerOfTwo",
    "Choice",
    "Bool",
    "Constraint",
    "transfer_bytes",
    "is_aligned_transfer",
    "threads",
    "per_128_bytes",
    "elems_per_bytes",
    "profiler_smem_bytes",
    "smem_aligned",
    "WARP_SIZE",
    "WARPGROUP_SIZE",
    "SMEM_LIMIT_BYTES",
    "SMEM_ALIGNMENT_BYTES",
    "MBARRIER_BYTES",
    "TRANSFER_ALIGN_BYTES",
    # the device
    "DeviceFacts",
    "PROFILES",
    "profile",
    "current_device",
    "launch_num_sms",
    # building with JAX
    "interpret_params",
    "force_interpret",
    "profile_params",
    "attention_forward",
    "patched_attention_mgpu",
    "mosaic_gpu_ir_context",
]


def launch_num_sms(options: BuildOptions) -> int:
    """The SMs a persistent kernel launches for: ``options.num_sms`` when given (the lowering
    oracle passes the current device's), else those of the GPU jax runs on, else those of
    :func:`current_device` (the chosen profile: interpret mode, cross-lowering)."""
    if options.num_sms is not None:
        return options.num_sms
    import jax

    try:
        return int(jax.devices("gpu")[0].core_count)
    except (RuntimeError, AttributeError, IndexError):  # no GPU: the chosen device profile
        return current_device().num_sms

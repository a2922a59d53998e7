"""autotune.kernels: the public kernel-authoring API the bundled kernels import autotune by."""

from __future__ import annotations

import subprocess
import sys

import pytest

import autotune.kernels as ak
from autotune.devices import using_profile


def test_the_kernel_api_is_pinned():
    """The kernel-authoring names are exactly these: an accidental export or removal fails."""
    assert sorted(ak.__all__) == sorted([
        "Kernel", "BuildOptions", "Problem", "Config", "dtype_bytes", "dtype_bits",
        "Space", "Env", "Aligned", "PowerOfTwo", "Choice", "Bool", "Constraint",
        "transfer_bytes", "is_aligned_transfer", "threads", "per_128_bytes", "elems_per_bytes",
        "profiler_smem_bytes", "smem_aligned", "WARP_SIZE", "WARPGROUP_SIZE",
        "SMEM_LIMIT_BYTES", "SMEM_ALIGNMENT_BYTES", "MBARRIER_BYTES", "TRANSFER_ALIGN_BYTES",
        "DeviceFacts", "PROFILES", "profile", "current_device", "launch_num_sms",
        "interpret_params", "force_interpret", "profile_params", "attention_forward",
        "patched_attention_mgpu", "mosaic_gpu_ir_context",
    ])
    for name in ak.__all__:
        assert hasattr(ak, name), name


def test_importing_the_kernel_api_loads_no_jax():
    """``import autotune.kernels`` (and the root package's kernel names) imports no jax."""
    code = ("import sys, autotune.kernels, autotune\nautotune.Kernel\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib'))\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("profile_name", ["h100-pcie", "h200"])
def test_launch_num_sms_takes_the_options_then_the_gpu_then_the_profile(profile_name):
    """A persistent kernel launches for ``options.num_sms`` when given; without a GPU (this
    machine), for the chosen device profile's SMs."""
    import jax

    assert ak.launch_num_sms(ak.BuildOptions(num_sms=7)) == 7
    try:
        jax.devices("gpu")
        pytest.skip("a GPU is here: its SMs come before the profile's")
    except RuntimeError:
        pass
    with using_profile(profile_name):
        assert ak.launch_num_sms(ak.BuildOptions()) == ak.profile(profile_name).num_sms

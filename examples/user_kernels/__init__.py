"""Kernels of a user's own, declared for autotune with its public API (docs/user_kernels.md).

Named in job files and on the command line by import path, e.g.
``examples.user_kernels.bias_gelu:KERNEL``, from the repository root with ``--allow-import``.
"""

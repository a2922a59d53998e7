"""The space: what is tuned, which configs are allowed, and what measuring one produced.

Problems and configs (:mod:`.problem`), the declared search space with its tunables and
constraints (:mod:`.search_space`), kernels (:mod:`.kernel`), the validity check on stored
configs (:mod:`.validity`) and the result types every layer above shares (:mod:`.outcomes`:
Outcome, TrialResult, DeviceInfo, cache policies). Imports only the core layer
(:mod:`autotune.errors`, :mod:`autotune.devices`); no jax, no database, no Optuna.
"""

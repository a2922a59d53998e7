"""The space: what is tuned and which configs are allowed.

Problems and configs (:mod:`.problem`), the declared search space with its tunables and
constraints (:mod:`.search_space`), kernels (:mod:`.kernel`) and the validity check on stored
configs (:mod:`.validity`). Imports only :mod:`autotune.errors`; no jax, no database, no Optuna.
"""

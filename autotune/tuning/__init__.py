"""Tuning: proposals from Optuna, run over the engine, stored in the store.

The one module that touches Optuna's private names (:mod:`.optuna_adapter`), the valid-config
wrapper (:mod:`.sampling`, :mod:`.trial_index`), the sampler registry, one module per sampler
(:mod:`.samplers`), job files (:mod:`.jobs`), budgets (:mod:`.budgets`), a job run
(:mod:`.tuner`) around the one run loop (:mod:`.scheduler`) and what the loop builds on: the
shared studies (:mod:`.studies`), a problem's sampler and seeds (:mod:`.seeding`), the
confirmation round (:mod:`.confirmation`, pure; run by :mod:`.confirming`), the reports
(:mod:`.reports`) and a result's provenance (:mod:`.provenance`); and revalidation
(:mod:`.revalidate`). May import every package below it.
"""

# The sampler names (:mod:`.names`: the registry's, read without importing a sampler), here too so that the command line lists
# them without importing Optuna (:mod:`.sampling` holds the samplers and re-exports them).
from autotune.tuning.names import SAMPLERS as SAMPLERS  # noqa: E402, F401

"""Tuning: proposals from Optuna, run over the engine, stored in the store.

The one module that touches Optuna's private names (:mod:`.optuna_adapter`), the valid-config
wrapper (:mod:`.sampling`, :mod:`.trial_index`), the sampler registry, one module per sampler
(:mod:`.samplers`), job files (:mod:`.jobs`), the runner and scheduler (:mod:`.tuner`, :mod:`.scheduler`), the confirmation round
(:mod:`.confirmation`) and revalidation (:mod:`.revalidate`). May import every package below it.
"""

# The sampler names (:mod:`.names`: the registry's, read without importing a sampler), here too so that the command line lists
# them without importing Optuna (:mod:`.sampling` holds the samplers and re-exports them).
from autotune.tuning.names import SAMPLERS  # noqa: E402, F401

"""Tuning: proposals from Optuna, run over the engine, stored in the store.

The one module that touches Optuna's private names (:mod:`.optuna_adapter`), the samplers
(:mod:`.sampling`, :mod:`.ranked_sampler`, :mod:`.trial_index`), job files (:mod:`.jobs`), the
runner and scheduler (:mod:`.tuner`, :mod:`.scheduler`), the confirmation round
(:mod:`.confirmation`) and revalidation (:mod:`.revalidate`). May import every package below it.
"""

# The sampler names (:mod:`.names`, a static list), here too so that the command line lists
# them without importing Optuna (:mod:`.sampling` holds the samplers and re-exports them).
from autotune.tuning.names import SAMPLERS as SAMPLERS  # noqa: E402, F401

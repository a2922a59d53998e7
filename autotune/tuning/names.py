"""The sampler names a job file or ``--sampler`` may give: the registry's
(:mod:`autotune.tuning.samplers`), read without importing any sampler.

Kept apart from :mod:`.sampling` (which imports Optuna and numpy) so that the command line can
build its parser, and check a name, without importing them (issue 36: ``autotune --version``
took 0.95 s of CPU for the parser's choices). :data:`SAMPLERS` is a live view: a sampler
registered at run time (:func:`autotune.tuning.samplers.register`) is in it.
"""

from __future__ import annotations

from autotune.tuning.samplers import NAMES as SAMPLERS

__all__ = ["SAMPLERS"]

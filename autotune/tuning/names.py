"""The sampler names a job file or ``--sampler`` may give, as a static list.

Kept apart from :mod:`.sampling` (which imports Optuna and numpy) so that the command line can
build its parser, and check a name, without importing them (issue 36: ``autotune --version``
took 0.95 s of CPU for the parser's choices). ``tests/tuning/test_sampling.py::
test_the_static_sampler_names_are_the_registry`` checks it against :func:`.sampling.make_sampler`.
"""

from __future__ import annotations

__all__ = ["SAMPLERS"]

SAMPLERS = ("auto", "ranked", "tpe", "random", "cmaes", "gp", "qmc", "brute")

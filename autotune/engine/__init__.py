"""The engine: worker processes on every GPU, fed through pipes, surviving crashes and hangs.

Typed pipe messages (:mod:`.messages`) and the dispatcher with its workers (:mod:`.dispatcher`).
May import :mod:`autotune.space` and :mod:`autotune.evaluation`.
"""

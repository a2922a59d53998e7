"""The engine: worker processes on every GPU, fed through pipes, surviving crashes and hangs.

The :class:`~.dispatcher.Engine` (:mod:`.dispatcher`), the worker process with its GPU lock
(:mod:`.worker`), the typed pipe messages between them (:mod:`.messages`) and the default
number of workers and compile threads (:mod:`.layout`). May import :mod:`autotune.space` and
:mod:`autotune.evaluation`.
"""

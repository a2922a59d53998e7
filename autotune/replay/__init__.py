"""Replay: tuning over recorded measurements instead of a GPU.

:mod:`.ground_truth` reads and writes the recorded ground truth, versioned with the package
(``data/<device>/<kernel>.json.gz``, the format in docs/replay.md): :func:`load_ground_truth` is
the one loader. :mod:`.evaluator` is the replay runner behind the engine's evaluator interface
(:class:`~autotune.evaluation.contract.Evaluator`), answering a config with its recorded time;
:mod:`.runner` replays the real samplers over it (trials needed to get near the best);
:mod:`.sim_kernels` holds the simulated kernels of the CPU scheduling benchmarks. The layer sits
above tuning and storage (it drives the samplers and can fill a store), below the front.
"""

"""Evaluation: measuring one config of a kernel on one device.

Trial outcomes as values (:mod:`.trial`), the evaluator contract (:mod:`.contract`), the JAX
pipeline (:mod:`.pipeline`), timing (:mod:`.timing`, :mod:`.cold_timing`, :mod:`.clocks`), the
fake evaluator (:mod:`.fake`), lowering and space checking (:mod:`.lowering`, :mod:`.checking`)
and in-kernel traces (:mod:`.tracing`). May import :mod:`autotune.space`. Modules that need jax
import it inside functions, so importing this package (or :mod:`.trial`) never imports jax.
"""

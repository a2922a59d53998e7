"""Queries: reading the results database for callers, exports, reports and status.

Best configs (:mod:`.best`), the run-time lookup (:mod:`.lookup`), export and import
(:mod:`.exchange`), report pages (:mod:`.report`), job status (:mod:`.status`) and output files
(:mod:`.outputs`). Never imports jax (``tests/test_architecture.py``).
"""

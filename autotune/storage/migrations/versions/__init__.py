"""Revisions of the autotune schema, oldest first: ``0001_initial.py``, ..."""

"""Indexes for run-time lookup on large databases: one problem's ok trials, fastest first.

``Store.best`` filtered by device kind or by software version (the run-time lookup prefers the
running jax/jaxlib) could use only the ``problem_id`` prefix of ``ix_at_trials_best``, whose
second column is ``device_id``, and then sorted every trial of the problem. With
``(problem_id, status, median_us)`` it walks the ok trials fastest first and stops at the first
that matches. See ``benchmarks/lookup_latency.py`` and ``benchmarks/RESULTS.md`` §13.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_at_trials_rank", "at_trials", ["problem_id", "status", "median_us"])


def downgrade() -> None:
    op.drop_index("ix_at_trials_rank", table_name="at_trials")

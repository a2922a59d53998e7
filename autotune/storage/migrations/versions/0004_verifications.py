"""Verifications: independent re-times of stored winners and their baselines.

* ``at_verifications``: one row per problem that ``autotune verify`` re-timed with its own
  method (``autotune.tuning.verify``): the winner's, the baseline's and the other re-timed
  configs' per-round times, the re-timed speedup with its interval, the stored speedup it was
  held against and whether the stored winner still won. Rows of their own: nothing stored before
  is changed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "at_verifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        sa.Column("confirmation_id", sa.Integer(), nullable=True),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("baseline_name", sa.String(64), nullable=True),
        sa.Column("winner_rounds_us", sa.Text(), nullable=False),
        sa.Column("baseline_rounds_us", sa.Text(), nullable=False),
        sa.Column("others_json", sa.Text(), nullable=False),
        sa.Column("winner_median_us", sa.Double(), nullable=False),
        sa.Column("baseline_median_us", sa.Double(), nullable=True),
        sa.Column("speedup", sa.Double(), nullable=True),
        sa.Column("speedup_low", sa.Double(), nullable=True),
        sa.Column("speedup_high", sa.Double(), nullable=True),
        sa.Column("stored_speedup", sa.Double(), nullable=True),
        sa.Column("still_wins", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_verifications"),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["at_problems.id"], name="fk_at_verifications_problem_id"
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["at_devices.id"], name="fk_at_verifications_device_id"
        ),
        sa.ForeignKeyConstraint(
            ["software_id"], ["at_software.id"], name="fk_at_verifications_software_id"
        ),
        sa.ForeignKeyConstraint(
            ["confirmation_id"], ["at_confirmations.id"],
            name="fk_at_verifications_confirmation_id",
        ),
        sa.ForeignKeyConstraint(
            ["config_id"], ["at_configs.id"], name="fk_at_verifications_config_id"
        ),
    )
    op.create_index("ix_at_verifications_problem", "at_verifications", ["problem_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_at_verifications_problem", table_name="at_verifications")
    op.drop_table("at_verifications")

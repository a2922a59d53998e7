"""Measurements: the cache policy and spread of every timing, confirmation rounds, job runs.

* ``at_trials`` and ``at_baselines`` gain ``cache_policy`` (``cold`` | ``warm``; every row
  stored before is ``warm``: iterations back to back on the same inputs) and ``spread``
  (``(p90 - p10) / median`` of the samples; NULL on rows stored before, whose samples give it).
  The cache policy joins their unique keys: a config timed ``warm`` is not a ``cold``
  measurement, so a ``cold`` job measures it again, in a row of its own.
* ``at_runs``: one row per job run: job, device, host, cache policy, start and end, and the
  GPU's clocks, temperature and throttling before and after (JSON), with the warnings they gave.
* ``at_confirmations`` and ``at_confirmation_programs``: each confirmation round of a problem,
  with the per-round samples of every config it re-timed and of the baseline, the tie marks, the
  crowned config and the confirmed speedup with its spread. Rows of their own: no trial or
  baseline measured before is changed.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.Integer(), nullable=False)


def upgrade() -> None:
    with op.batch_alter_table("at_trials") as batch:
        batch.add_column(
            sa.Column("cache_policy", sa.String(16), nullable=False, server_default="warm")
        )
        batch.add_column(sa.Column("spread", sa.Double(), nullable=True))
        batch.drop_constraint("uq_at_trials_measurement", type_="unique")
        batch.create_unique_constraint(
            "uq_at_trials_measurement",
            ["problem_id", "config_id", "device_id", "software_id", "cache_policy"],
        )
    with op.batch_alter_table("at_baselines") as batch:
        batch.add_column(
            sa.Column("cache_policy", sa.String(16), nullable=False, server_default="warm")
        )
        batch.add_column(sa.Column("spread", sa.Double(), nullable=True))
        batch.drop_constraint("uq_at_baselines_measurement", type_="unique")
        batch.create_unique_constraint(
            "uq_at_baselines_measurement",
            ["problem_id", "device_id", "software_id", "name", "cache_policy"],
        )
    op.create_table(
        "at_runs",
        _id(),
        sa.Column("job", sa.String(200), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("cache_policy", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("clocks_before", sa.Text(), nullable=False),
        sa.Column("clocks_after", sa.Text(), nullable=True),
        sa.Column("warnings", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_runs"),
        sa.ForeignKeyConstraint(["device_id"], ["at_devices.id"], name="fk_at_runs_device_id"),
    )
    op.create_table(
        "at_confirmations",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        sa.Column("cache_policy", sa.String(16), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("crowned_trial_id", sa.Integer(), nullable=False),
        sa.Column("fastest_trial_id", sa.Integer(), nullable=False),
        sa.Column("baseline_name", sa.String(64), nullable=True),
        sa.Column("baseline_rounds_us", sa.Text(), nullable=False),
        sa.Column("baseline_median_us", sa.Double(), nullable=True),
        sa.Column("baseline_spread", sa.Double(), nullable=True),
        sa.Column("speedup", sa.Double(), nullable=True),
        sa.Column("speedup_spread", sa.Double(), nullable=True),
        sa.Column("speedup_low", sa.Double(), nullable=True),
        sa.Column("speedup_high", sa.Double(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_confirmations"),
        sa.ForeignKeyConstraint(["run_id"], ["at_runs.id"], name="fk_at_confirmations_run_id"),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["at_problems.id"], name="fk_at_confirmations_problem_id"
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["at_devices.id"], name="fk_at_confirmations_device_id"
        ),
        sa.ForeignKeyConstraint(
            ["software_id"], ["at_software.id"], name="fk_at_confirmations_software_id"
        ),
        sa.ForeignKeyConstraint(
            ["crowned_trial_id"], ["at_trials.id"], name="fk_at_confirmations_crowned_trial_id"
        ),
        sa.ForeignKeyConstraint(
            ["fastest_trial_id"], ["at_trials.id"], name="fk_at_confirmations_fastest_trial_id"
        ),
    )
    op.create_index(
        "ix_at_confirmations_problem", "at_confirmations", ["problem_id", "cache_policy", "id"]
    )
    op.create_table(
        "at_confirmation_programs",
        _id(),
        sa.Column("confirmation_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("rounds_us", sa.Text(), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("spread", sa.Double(), nullable=False),
        sa.Column("diff", sa.Double(), nullable=False),
        sa.Column("noise", sa.Double(), nullable=False),
        sa.Column("tie", sa.Boolean(), nullable=False),
        sa.Column("crowned", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_confirmation_programs"),
        sa.ForeignKeyConstraint(
            ["confirmation_id"], ["at_confirmations.id"],
            name="fk_at_confirmation_programs_confirmation_id",
        ),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["at_trials.id"], name="fk_at_confirmation_programs_trial_id"
        ),
        sa.UniqueConstraint(
            "confirmation_id", "position", name="uq_at_confirmation_programs_position"
        ),
    )


def downgrade() -> None:
    op.drop_table("at_confirmation_programs")
    op.drop_index("ix_at_confirmations_problem", table_name="at_confirmations")
    op.drop_table("at_confirmations")
    op.drop_table("at_runs")
    # Rows measured cold are dropped: the older schema cannot tell them from warm ones.
    op.execute("DELETE FROM at_trace_regions WHERE trial_id IN "
               "(SELECT id FROM at_trials WHERE cache_policy <> 'warm')")
    op.execute("DELETE FROM at_trials WHERE cache_policy <> 'warm'")
    op.execute("DELETE FROM at_baselines WHERE cache_policy <> 'warm'")
    with op.batch_alter_table("at_baselines") as batch:
        batch.drop_constraint("uq_at_baselines_measurement", type_="unique")
        batch.create_unique_constraint(
            "uq_at_baselines_measurement", ["problem_id", "device_id", "software_id", "name"]
        )
        batch.drop_column("spread")
        batch.drop_column("cache_policy")
    with op.batch_alter_table("at_trials") as batch:
        batch.drop_constraint("uq_at_trials_measurement", type_="unique")
        batch.create_unique_constraint(
            "uq_at_trials_measurement", ["problem_id", "config_id", "device_id", "software_id"]
        )
        batch.drop_column("spread")
        batch.drop_column("cache_policy")

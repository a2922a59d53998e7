"""The initial schema: kernels, problems, devices, software, configs, trials, baselines, trace regions.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.Integer(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "at_kernels",
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_kernels"),
        sa.UniqueConstraint("name", name="uq_at_kernels_name"),
    )
    op.create_table(
        "at_problems",
        _id(),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("shape_json", sa.Text(), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("digest", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_problems"),
        sa.ForeignKeyConstraint(["kernel_id"], ["at_kernels.id"], name="fk_at_problems_kernel_id"),
        sa.UniqueConstraint("digest", name="uq_at_problems_digest"),
    )
    op.create_index("ix_at_problems_kernel", "at_problems", ["kernel_id", "dtype"])
    op.create_table(
        "at_devices",
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("compute_capability", sa.String(32), nullable=False),
        sa.Column("driver", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_devices"),
        sa.UniqueConstraint(
            "name", "kind", "compute_capability", "driver", name="uq_at_devices_identity"
        ),
    )
    op.create_table(
        "at_software",
        _id(),
        sa.Column("jax", sa.String(64), nullable=False),
        sa.Column("jaxlib", sa.String(64), nullable=False),
        sa.Column("autotune", sa.String(64), nullable=False),
        sa.Column("extra", sa.String(1000), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_software"),
        sa.UniqueConstraint("jax", "jaxlib", "autotune", "extra", name="uq_at_software_versions"),
    )
    op.create_table(
        "at_configs",
        _id(),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_configs"),
        sa.ForeignKeyConstraint(["kernel_id"], ["at_kernels.id"], name="fk_at_configs_kernel_id"),
        sa.UniqueConstraint("kernel_id", "digest", name="uq_at_configs_kernel_digest"),
    )
    op.create_table(
        "at_trials",
        _id(),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=True),
        sa.Column("min_us", sa.Double(), nullable=True),
        sa.Column("max_us", sa.Double(), nullable=True),
        sa.Column("samples_us", sa.Text(), nullable=False),
        sa.Column("compile_s", sa.Double(), nullable=True),
        sa.Column("rel_error", sa.Double(), nullable=True),
        sa.Column("timing", sa.String(32), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("study_name", sa.String(200), nullable=True),
        sa.Column("optuna_trial_number", sa.Integer(), nullable=True),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_trials"),
        sa.ForeignKeyConstraint(["problem_id"], ["at_problems.id"], name="fk_at_trials_problem_id"),
        sa.ForeignKeyConstraint(["config_id"], ["at_configs.id"], name="fk_at_trials_config_id"),
        sa.ForeignKeyConstraint(["device_id"], ["at_devices.id"], name="fk_at_trials_device_id"),
        sa.ForeignKeyConstraint(
            ["software_id"], ["at_software.id"], name="fk_at_trials_software_id"
        ),
        sa.UniqueConstraint(
            "problem_id", "config_id", "device_id", "software_id", name="uq_at_trials_measurement"
        ),
    )
    op.create_index(
        "ix_at_trials_best", "at_trials", ["problem_id", "device_id", "status", "median_us"]
    )
    op.create_index("ix_at_trials_study", "at_trials", ["study_name", "optuna_trial_number"])
    op.create_table(
        "at_baselines",
        _id(),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("min_us", sa.Double(), nullable=False),
        sa.Column("max_us", sa.Double(), nullable=False),
        sa.Column("samples_us", sa.Text(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_baselines"),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["at_problems.id"], name="fk_at_baselines_problem_id"
        ),
        sa.ForeignKeyConstraint(["device_id"], ["at_devices.id"], name="fk_at_baselines_device_id"),
        sa.ForeignKeyConstraint(
            ["software_id"], ["at_software.id"], name="fk_at_baselines_software_id"
        ),
        sa.UniqueConstraint(
            "problem_id", "device_id", "software_id", "name", name="uq_at_baselines_measurement"
        ),
    )
    op.create_table(
        "at_trace_regions",
        _id(),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(500), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("trace_path", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_trace_regions"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["at_trials.id"], name="fk_at_trace_regions_trial_id"
        ),
        sa.UniqueConstraint("trial_id", "region", name="uq_at_trace_regions_trial_region"),
    )


def downgrade() -> None:
    for table in (
        "at_trace_regions",
        "at_baselines",
        "at_trials",
        "at_configs",
        "at_software",
        "at_devices",
        "at_problems",
        "at_kernels",
    ):
        op.drop_table(table)

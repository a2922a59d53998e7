"""Device facts: ``at_devices`` gains ``facts`` (JSON text, nullable).

What the tuner knew of the device a row measured on (:class:`autotune.devices.DeviceFacts`:
SM count, shared memory per block and per SM, L2 size, bandwidth, peak, clocks, and whether
read from the driver or taken from a profile). NULL on devices stored before, and for devices
without facts (the fake evaluator). Not part of the device's identity: a device row is still
its name, kind, compute capability and driver.

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("at_devices", sa.Column("facts", sa.Text(), nullable=True))


def downgrade() -> None:
    # A plain ALTER (SQLite 3.35+, PostgreSQL): a batch copy of at_devices would drop a table
    # the trials' foreign keys point at.
    op.execute("ALTER TABLE at_devices DROP COLUMN facts")

"""The database schema: every ``at_`` table as a SQLAlchemy declarative model.

Prefixed ``at_`` so that Optuna's RDB storage can share the database. Only the store
(:mod:`.store`) and the migrations (:mod:`.migrations`) use these models; callers get frozen
row values (:mod:`.rows`). No jax.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

_UTC = dt.UTC


class Base(DeclarativeBase):
    metadata = sa.MetaData(
        naming_convention={
            "pk": "pk_%(table_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s",
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        }
    )


class _UTCDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A timezone-aware UTC datetime, also on SQLite (which stores it naive, in UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> Any:
        if value is None:
            return None
        value = value.replace(tzinfo=_UTC) if value.tzinfo is None else value.astimezone(_UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        stamp: dt.datetime = value
        return stamp.replace(tzinfo=_UTC) if value.tzinfo is None else value.astimezone(_UTC)


class _Samples(sa.types.TypeDecorator[tuple[float, ...]]):
    """A list of floats as JSON text (exact round trip, NaN and infinity included)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Sequence[float] | None, dialect: sa.Dialect) -> Any:
        return json.dumps([float(v) for v in value or ()])

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> tuple[float, ...]:
        return tuple(float(v) for v in json.loads(value or "[]"))


class Kernels(Base):
    __tablename__ = "at_kernels"
    __table_args__ = (sa.UniqueConstraint("name", name="uq_at_kernels_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))


class Problems(Base):
    __tablename__ = "at_problems"
    __table_args__ = (
        sa.UniqueConstraint("digest", name="uq_at_problems_digest"),
        sa.Index("ix_at_problems_kernel", "kernel_id", "dtype"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(sa.ForeignKey("at_kernels.id"))
    shape_json: Mapped[str] = mapped_column(sa.Text)
    dtype: Mapped[str] = mapped_column(sa.String(32))
    digest: Mapped[str] = mapped_column(sa.String(16))


class Devices(Base):
    __tablename__ = "at_devices"
    __table_args__ = (
        sa.UniqueConstraint(
            "name", "kind", "compute_capability", "driver", name="uq_at_devices_identity"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    kind: Mapped[str] = mapped_column(sa.String(16))
    compute_capability: Mapped[str] = mapped_column(sa.String(32))
    driver: Mapped[str] = mapped_column(sa.String(64))
    # Revision 0005: autotune.devices.DeviceFacts as JSON; NULL when not known.
    facts: Mapped[str | None] = mapped_column(sa.Text, nullable=True)


class Software(Base):
    __tablename__ = "at_software"
    __table_args__ = (
        sa.UniqueConstraint("jax", "jaxlib", "autotune", "extra", name="uq_at_software_versions"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    jax: Mapped[str] = mapped_column(sa.String(64))
    jaxlib: Mapped[str] = mapped_column(sa.String(64))
    autotune: Mapped[str] = mapped_column(sa.String(64))
    # Any other version keys, as canonical JSON ("{}" when none).
    extra: Mapped[str] = mapped_column(sa.String(1000))


class Configs(Base):
    __tablename__ = "at_configs"
    __table_args__ = (sa.UniqueConstraint("kernel_id", "digest", name="uq_at_configs_kernel_digest"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(sa.ForeignKey("at_kernels.id"))
    config_json: Mapped[str] = mapped_column(sa.Text)
    digest: Mapped[str] = mapped_column(sa.String(16))


class Trials(Base):
    __tablename__ = "at_trials"
    __table_args__ = (
        # The database's own guarantee that no config is measured twice.
        sa.UniqueConstraint(
            "problem_id", "config_id", "device_id", "software_id", "cache_policy",
            name="uq_at_trials_measurement",
        ),
        # best(): ok trials of one problem on some devices, fastest first.
        sa.Index("ix_at_trials_best", "problem_id", "device_id", "status", "median_us"),
        # best() of a device kind or software version (revision 0002): walks one problem's ok
        # trials fastest first, stopping at the first that matches, with no sort.
        sa.Index("ix_at_trials_rank", "problem_id", "status", "median_us"),
        sa.Index("ix_at_trials_study", "study_name", "optuna_trial_number"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("at_problems.id"))
    config_id: Mapped[int] = mapped_column(sa.ForeignKey("at_configs.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("at_devices.id"))
    software_id: Mapped[int] = mapped_column(sa.ForeignKey("at_software.id"))
    status: Mapped[str] = mapped_column(sa.String(16))
    median_us: Mapped[float | None] = mapped_column(sa.Double)
    min_us: Mapped[float | None] = mapped_column(sa.Double)
    max_us: Mapped[float | None] = mapped_column(sa.Double)
    samples_us: Mapped[tuple[float, ...]] = mapped_column(_Samples)
    compile_s: Mapped[float | None] = mapped_column(sa.Double)
    rel_error: Mapped[float | None] = mapped_column(sa.Double)
    timing: Mapped[str] = mapped_column(sa.String(32))
    # Revision 0003: "cold" | "warm" (autotune.space.outcomes.CachePolicy); (p90 - p10) / median.
    cache_policy: Mapped[str] = mapped_column(sa.String(16), server_default="warm")
    spread: Mapped[float | None] = mapped_column(sa.Double)
    error: Mapped[str] = mapped_column(sa.Text)
    study_name: Mapped[str | None] = mapped_column(sa.String(200))
    optuna_trial_number: Mapped[int | None] = mapped_column(sa.Integer)
    worker: Mapped[str] = mapped_column(sa.String(200))
    host: Mapped[str] = mapped_column(sa.String(255))
    started_at: Mapped[dt.datetime | None] = mapped_column(_UTCDateTime)
    finished_at: Mapped[dt.datetime] = mapped_column(_UTCDateTime)


class Baselines(Base):
    __tablename__ = "at_baselines"
    __table_args__ = (
        sa.UniqueConstraint(
            "problem_id", "device_id", "software_id", "name", "cache_policy",
            name="uq_at_baselines_measurement",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("at_problems.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("at_devices.id"))
    software_id: Mapped[int] = mapped_column(sa.ForeignKey("at_software.id"))
    name: Mapped[str] = mapped_column(sa.String(64))
    median_us: Mapped[float] = mapped_column(sa.Double)
    min_us: Mapped[float] = mapped_column(sa.Double)
    max_us: Mapped[float] = mapped_column(sa.Double)
    samples_us: Mapped[tuple[float, ...]] = mapped_column(_Samples)
    measured_at: Mapped[dt.datetime] = mapped_column(_UTCDateTime)
    cache_policy: Mapped[str] = mapped_column(sa.String(16), server_default="warm")
    spread: Mapped[float | None] = mapped_column(sa.Double)


class TraceRegions(Base):
    __tablename__ = "at_trace_regions"
    __table_args__ = (
        sa.UniqueConstraint("trial_id", "region", name="uq_at_trace_regions_trial_region"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(sa.ForeignKey("at_trials.id"))
    region: Mapped[str] = mapped_column(sa.String(500))
    median_us: Mapped[float] = mapped_column(sa.Double)
    count: Mapped[int] = mapped_column(sa.Integer)
    trace_path: Mapped[str] = mapped_column(sa.Text)


class _Rounds(sa.types.TypeDecorator[tuple[tuple[float, ...], ...]]):
    """Per-round samples (a list of lists of floats) as JSON text."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return json.dumps([[float(v) for v in r] for r in value or ()])

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return tuple(tuple(float(v) for v in r) for r in json.loads(value or "[]"))


class Runs(Base):
    """One job run: where, with which cache policy, and the GPU's clocks around it (0003)."""

    __tablename__ = "at_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    job: Mapped[str] = mapped_column(sa.String(200))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("at_devices.id"))
    host: Mapped[str] = mapped_column(sa.String(255))
    cache_policy: Mapped[str] = mapped_column(sa.String(16))
    started_at: Mapped[dt.datetime] = mapped_column(_UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(_UTCDateTime)
    clocks_before: Mapped[str] = mapped_column(sa.Text)  # JSON of a ClockSnapshot
    clocks_after: Mapped[str | None] = mapped_column(sa.Text)
    warnings: Mapped[str] = mapped_column(sa.Text)  # JSON list of strings


class Confirmations(Base):
    """One confirmation round of a problem (0003); its programs in ConfirmationPrograms."""

    __tablename__ = "at_confirmations"
    __table_args__ = (
        sa.Index("ix_at_confirmations_problem", "problem_id", "cache_policy", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("at_runs.id"))
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("at_problems.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("at_devices.id"))
    software_id: Mapped[int] = mapped_column(sa.ForeignKey("at_software.id"))
    cache_policy: Mapped[str] = mapped_column(sa.String(16))
    rounds: Mapped[int] = mapped_column(sa.Integer)
    iterations: Mapped[int] = mapped_column(sa.Integer)
    crowned_trial_id: Mapped[int] = mapped_column(sa.ForeignKey("at_trials.id"))
    fastest_trial_id: Mapped[int] = mapped_column(sa.ForeignKey("at_trials.id"))
    baseline_name: Mapped[str | None] = mapped_column(sa.String(64))
    baseline_rounds_us: Mapped[tuple[tuple[float, ...], ...]] = mapped_column(_Rounds)
    baseline_median_us: Mapped[float | None] = mapped_column(sa.Double)
    baseline_spread: Mapped[float | None] = mapped_column(sa.Double)
    speedup: Mapped[float | None] = mapped_column(sa.Double)
    speedup_spread: Mapped[float | None] = mapped_column(sa.Double)
    speedup_low: Mapped[float | None] = mapped_column(sa.Double)
    speedup_high: Mapped[float | None] = mapped_column(sa.Double)
    created_at: Mapped[dt.datetime] = mapped_column(_UTCDateTime)


class ConfirmationPrograms(Base):
    __tablename__ = "at_confirmation_programs"
    __table_args__ = (
        sa.UniqueConstraint(
            "confirmation_id", "position", name="uq_at_confirmation_programs_position"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    confirmation_id: Mapped[int] = mapped_column(sa.ForeignKey("at_confirmations.id"))
    trial_id: Mapped[int] = mapped_column(sa.ForeignKey("at_trials.id"))
    position: Mapped[int] = mapped_column(sa.Integer)
    rounds_us: Mapped[tuple[tuple[float, ...], ...]] = mapped_column(_Rounds)
    median_us: Mapped[float] = mapped_column(sa.Double)
    spread: Mapped[float] = mapped_column(sa.Double)
    diff: Mapped[float] = mapped_column(sa.Double)
    noise: Mapped[float] = mapped_column(sa.Double)
    tie: Mapped[bool] = mapped_column(sa.Boolean)
    crowned: Mapped[bool] = mapped_column(sa.Boolean)


class Verifications(Base):
    """One independent re-time of a problem's stored winner and baseline (0004):
    ``autotune verify`` (autotune.tuning.verify), rows of their own; nothing else changes."""

    __tablename__ = "at_verifications"
    __table_args__ = (sa.Index("ix_at_verifications_problem", "problem_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("at_problems.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("at_devices.id"))
    software_id: Mapped[int] = mapped_column(sa.ForeignKey("at_software.id"))
    confirmation_id: Mapped[int | None] = mapped_column(sa.ForeignKey("at_confirmations.id"))
    config_id: Mapped[int] = mapped_column(sa.ForeignKey("at_configs.id"))
    method: Mapped[str] = mapped_column(sa.String(32))
    rounds: Mapped[int] = mapped_column(sa.Integer)
    calls: Mapped[int] = mapped_column(sa.Integer)
    baseline_name: Mapped[str | None] = mapped_column(sa.String(64))
    winner_rounds_us: Mapped[tuple[tuple[float, ...], ...]] = mapped_column(_Rounds)
    baseline_rounds_us: Mapped[tuple[tuple[float, ...], ...]] = mapped_column(_Rounds)
    others_json: Mapped[str] = mapped_column(sa.Text)  # the other configs re-timed, JSON
    winner_median_us: Mapped[float] = mapped_column(sa.Double)
    baseline_median_us: Mapped[float | None] = mapped_column(sa.Double)
    speedup: Mapped[float | None] = mapped_column(sa.Double)
    speedup_low: Mapped[float | None] = mapped_column(sa.Double)
    speedup_high: Mapped[float | None] = mapped_column(sa.Double)
    stored_speedup: Mapped[float | None] = mapped_column(sa.Double)
    still_wins: Mapped[bool | None] = mapped_column(sa.Boolean)
    created_at: Mapped[dt.datetime] = mapped_column(_UTCDateTime)

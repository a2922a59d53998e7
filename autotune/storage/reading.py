"""Reading the results database: trials, the best configs, baselines, trace regions, problems,
devices, job runs, confirmation rounds and per-problem summaries, as frozen rows.
:class:`StoreReader` is the reading part a :class:`~.store.Store` owns."""

from __future__ import annotations

import array
import datetime as dt
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from autotune.space.outcomes import PROGRAM_METHOD, DeviceInfo, DeviceKind, Outcome
from autotune.space.problem import Config, Problem
from autotune.storage.connection import Sessions
from autotune.storage.keys import (
    SOFTWARE_COLUMNS,
    checked_policy,
    device_filter,
    device_from_row,
    device_key,
    listing_filter,
    plausible,
    problem_from_rows,
    software_from_row,
    software_key,
    trial_query,
    trial_row,
)
from autotune.storage.rows import (
    NO_TIME,
    STRING_COLUMNS,
    TABLE_COLUMNS,
    BaselineRow,
    ConfirmationRow,
    ConfirmedProgram,
    Observed,
    ProblemSummary,
    RunRow,
    TraceRegionRow,
    TrialRow,
    TrialTable,
    VerificationRow,
)
from autotune.storage.schema import (
    Baselines,
    Configs,
    ConfirmationPrograms,
    Confirmations,
    Devices,
    Kernels,
    Problems,
    Runs,
    Software,
    TraceRegions,
    Trials,
    Verifications,
)

log = logging.getLogger("autotune.storage.store")

# Store.observations: what a new problem reads of its kernel's other shapes (issue 36). Sized
# so that a store like the recorded ground truth (autotune/replay/data: seven shapes of about 750
# configs each) is read whole, as the replay (benchmarks/search_efficiency.py) reads it, while
# a million stored trials cost no more than that.
HISTORY_SHAPES = 8
HISTORY_PER_SHAPE = 768
# Parsed configs and problems a reader keeps by id (each table's own; emptied when full): the
# history of HISTORY_SHAPES x HISTORY_PER_SHAPE trials several times over, a few MB.
PARSED_ROWS_KEPT = 20_000
_Row = TypeVar("_Row", Config, Problem)


# Store.trial_table: rows read per batch, and the most configs read by id (500 a statement)
# before every config of the kernels is read in one statement instead.
TABLE_BATCH = 50_000
_CONFIGS_BY_ID = 5_000
_NUMBERS = frozenset({"median_us", "min_us", "max_us", "compile_s", "rel_error", "spread",
                      "optuna_trial_number"})
_TIMES = frozenset({"started_at", "finished_at"})
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAIVE_EPOCH = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)


def _chunks(connection: sa.Connection, query: Any) -> Iterator[Sequence[Sequence[Any]]]:
    """The rows of ``query``, :data:`TABLE_BATCH` at a time: on SQLite from the driver's own
    cursor (values as SQLite holds them: datetimes as text), elsewhere streamed by SQLAlchemy
    (``yield_per``, a server-side cursor on PostgreSQL)."""
    if connection.dialect.name != "sqlite":
        result = connection.execute(query.execution_options(yield_per=TABLE_BATCH))
        yield from result.partitions()
        return
    compiled = query.compile(dialect=connection.dialect,
                             compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    positional = tuple(params[name] for name in compiled.positiontup or ())
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(compiled.string, positional)
        while rows := cursor.fetchmany(TABLE_BATCH):
            yield rows
    finally:
        cursor.close()


def _micros(value: Any) -> int:
    """A stored UTC datetime (a datetime, or SQLite's ISO text of one, naive in UTC) as
    microseconds since the epoch; :data:`NO_TIME` for None."""
    if value is None:
        return NO_TIME
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    since = value - (_NAIVE_EPOCH if value.tzinfo is None else _EPOCH)
    return int(since // _MICRO)


def _extend(columns: dict[str, Any], chunk: Sequence[Sequence[Any]],
            strings: dict[str, dict[Any, int]]) -> None:
    """Appends a batch of :meth:`StoreReader.trial_table` rows to its columns, one column at
    a time; a string column as indexes into ``strings[column]`` (value -> index, in the
    order values first appear)."""
    nan = float("nan")
    for name, values in zip(TABLE_COLUMNS, zip(*chunk, strict=True), strict=True):
        out = columns[name]
        index = strings.get(name)
        if index is not None:
            for value in dict.fromkeys(values):  # the distinct values of the batch, in order
                if value not in index:
                    index[value] = len(index)
            out.extend(map(index.__getitem__, values))
        elif name in _NUMBERS:
            out.extend([nan if v is None else v for v in values] if None in values else values)
        elif name in _TIMES:
            out.extend(map(_micros, values))
        elif name == "traced":
            out.extend(map(bool, values))
        else:  # the ids
            out.extend(values)


def _kept(kept: dict[int, _Row], row_id: int, parse: Callable[[], _Row]) -> _Row:
    """The parsed row ``row_id`` from ``kept``, else ``parse()`` kept there (``kept`` emptied
    first when it holds :data:`PARSED_ROWS_KEPT`)."""
    found = kept.get(row_id)
    if found is None:
        if len(kept) >= PARSED_ROWS_KEPT:
            kept.clear()
        found = kept[row_id] = parse()
    return found


class StoreReader:
    """Every read of one database, through the :class:`~.connection.Sessions` it is
    given (a :class:`~.store.Store` owns one and forwards its public methods to it)."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions
        # Parsed rows of the tables whose rows never change once written (a config, a
        # problem: content-keyed), by id, for the history reads of a job's problems one
        # after another (:meth:`observations`); bounded, emptied when full.
        self._parsed_configs: dict[int, Config] = {}
        self._parsed_problems: dict[int, Problem] = {}

    def _config(self, config_id: int, text: str) -> Config:
        return _kept(self._parsed_configs, config_id, lambda: Config.from_json(text))

    def _problem(self, problem_id: int, kernel: str, shape_json: str, dtype: str) -> Problem:
        return _kept(self._parsed_problems, problem_id,
                     lambda: Problem(kernel, json.loads(shape_json), dtype))

    def finished_digests(
        self,
        problem: Problem,
        *,
        device: DeviceInfo | None = None,
        software: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> set[str]:
        """Digests of the configs of ``problem`` with a stored trial (any outcome).

        ``device``, ``software`` and ``cache``, when given, restrict to trials on exactly that
        device and software, timed with that cache policy: the configs a worker there must not
        measure again.
        """
        query = (
            sa.select(Configs.digest)
            .join(Trials, Trials.config_id == Configs.id)
            .join(Problems, Problems.id == Trials.problem_id)
            .where(Problems.digest == problem.digest())
        )
        if device is not None:
            query = query.join(Devices, Devices.id == Trials.device_id).filter_by(
                **device_key(device)
            )
        if software is not None:
            query = query.join(Software, Software.id == Trials.software_id).filter_by(
                **software_key(software)
            )
        if cache is not None:
            query = query.where(Trials.cache_policy == checked_policy(cache))
        with self._sessions.read("read finished configs") as session:
            return set(session.scalars(query))

    def trials(
        self,
        problem: Problem | None = None,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        status: Outcome | str | None = None,
        device_kind: str | None = None,
        dtype: str | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]:
        """Stored trials, oldest first, filtered by problem, kernel, device name and kind,
        outcome, dtype and cache policy."""
        query = trial_query()
        if problem is not None:
            query = query.where(Problems.digest == problem.digest())
        query = listing_filter(query, kernel=kernel, dtype=dtype, device_name=device_name,
                               device_kind=device_kind)
        if status is not None:
            query = query.where(Trials.status == Outcome(status).value)
        if cache is not None:
            query = query.where(Trials.cache_policy == checked_policy(cache))
        with self._sessions.read("read trials") as session:
            return [trial_row(*row) for row in session.execute(query.order_by(Trials.id))]

    def observations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = None,
        shapes: int = HISTORY_SHAPES,
        per_shape: int = HISTORY_PER_SHAPE,
    ) -> list[Observed]:
        """What ``problem``'s kernel measured on these devices, as a bounded summary: every
        trial of ``problem`` itself, then of the ``shapes`` other problems of the kernel
        nearest to it (:func:`~autotune.space.problem.shape_distance`, same dtype first) with
        a trial there, at most ``per_shape`` trials each: all of a problem's when it has that
        few, else its ``per_shape // 4`` fastest ok trials (on the ``ix_at_trials_best``
        index) and an even sample of the others (every n-th by id). Oldest first (by trial id),
        as :meth:`trials` orders them, so a store within the bounds reads exactly what
        :meth:`trials` would.

        Only the chosen rows are read, as ``(problem, config, median_us or None)`` tuples (no
        ORM rows): the cost and the memory do not grow with the table
        (``benchmarks/history_scaling.py``).
        """
        if shapes < 0 or per_shape < 1:
            raise ValueError(f"shapes must be >= 0 and per_shape >= 1, got {shapes!r}, {per_shape!r}.")
        from autotune.space.problem import shape_distance

        kernel_query = (
            sa.select(Problems.id, Problems.shape_json, Problems.dtype)
            .join(Kernels, Kernels.id == Problems.kernel_id)
            .where(Kernels.name == problem.kernel)
            .order_by(Problems.id)
        )
        with self._sessions.read("read the kernel's history") as session:
            devices = [d for d in session.scalars(device_filter(sa.select(Devices.id), device_name, device_kind))]
            if not devices:
                return []
            on_device = Trials.device_id.in_(devices)
            here_digest = problem.digest()
            problems: dict[int, Problem] = {}
            ranked: list[tuple[bool, float, int]] = []
            here_id: int | None = None
            for pid, shape_json, dtype in session.execute(kernel_query):
                other = self._problem(pid, problem.kernel, shape_json, dtype)
                problems[pid] = other
                if other.digest() == here_digest:
                    here_id = pid
                    continue
                ranked.append((dtype != problem.dtype, shape_distance(problem.dims, other.dims), pid))
            ranked.sort()
            picked: list[int] = []
            for _other_dtype, _distance, pid in ranked:
                if len(picked) >= shapes:
                    break
                if session.scalar(sa.select(Trials.id).where(Trials.problem_id == pid, on_device).limit(1)) is not None:
                    picked.append(pid)

            # (trial id, problem id, config id, status, median): the rows chosen, by trial id.
            base = sa.select(Trials.id, Trials.problem_id, Trials.config_id, Trials.status,
                             Trials.median_us).where(on_device)
            chosen: dict[int, Any] = {}
            if here_id is not None:
                chosen.update((r[0], r) for r in session.execute(base.where(Trials.problem_id == here_id)))
            for pid in picked:
                mine = base.where(Trials.problem_id == pid)
                count = int(session.scalar(sa.select(sa.func.count()).select_from(Trials).where(
                    Trials.problem_id == pid, on_device)) or 0)
                if count <= per_shape:
                    chosen.update((r[0], r) for r in session.execute(mine))
                    continue
                fastest = per_shape // 4
                chosen.update((r[0], r) for r in session.execute(
                    mine.where(Trials.status == Outcome.OK.value, Trials.median_us.is_not(None))
                    .order_by(Trials.median_us, Trials.id).limit(fastest)))
                step = -(-count // (per_shape - fastest))
                chosen.update((r[0], r) for r in session.execute(
                    mine.where(Trials.id % step == 0).order_by(Trials.id).limit(per_shape - fastest)))
            wanted = {r[2] for r in chosen.values()}
            # .get: another thread of the job may empty the kept rows meanwhile
            kept = ((cid, self._parsed_configs.get(cid)) for cid in wanted)
            configs = {cid: config for cid, config in kept if config is not None}
            config_ids = sorted(wanted - configs.keys())
            for at in range(0, len(config_ids), 500):
                configs.update(
                    (cid, self._config(cid, text)) for cid, text in session.execute(
                        sa.select(Configs.id, Configs.config_json)
                        .where(Configs.id.in_(config_ids[at:at + 500]))))
        return [
            Observed(problems[pid], configs[cid], median if status == Outcome.OK.value else None)
            for _tid, pid, cid, status, median in (chosen[t] for t in sorted(chosen))
        ]

    def trial_table(
        self,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        status: Outcome | str | None = None,
        device_kind: str | None = None,
        dtype: str | None = None,
        limit: int | None = None,
    ) -> TrialTable:
        """Stored trials as columns, oldest first, filtered as :meth:`trials` filters them,
        the first ``limit`` only (filters and limit in SQL). The problems, configs, devices and
        software they name are read once each, not once per trial, in a bounded number of
        statements (``tests/queries/test_queries.py``).

        The trials are read in trial-id order (the table's own order: no sort), the kernel,
        dtype and device filters as ``IN`` subqueries that no index serves (``+ 0``), so that
        the database neither sorts nor spills a million rows; on SQLite through the driver's
        cursor in batches of :data:`TABLE_BATCH` rows (no SQLAlchemy row or type handling: a
        third of the CPU time at a million rows, ``benchmarks/history_scaling.py``)."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError(f"limit must be a whole number >= 0, but got {limit!r}.")
        traced = sa.exists().where(TraceRegions.trial_id == Trials.id)
        t = Trials.__table__.c
        query = sa.select(t.id, t.problem_id, t.config_id, t.device_id, t.software_id, t.status,
                          t.median_us, t.min_us, t.max_us, t.compile_s, t.rel_error, t.timing,
                          t.cache_policy, t.spread, t.study_name, t.optuna_trial_number, t.worker,
                          t.host, t.started_at, t.finished_at, traced, t.error)
        if kernel is not None or dtype is not None:
            problems_q = sa.select(Problems.id).join(Kernels, Kernels.id == Problems.kernel_id)
            problems_q = listing_filter(problems_q, kernel=kernel, dtype=dtype, device_name=None,
                                        device_kind=None)
            query = query.where((Trials.problem_id + 0).in_(problems_q))
        if device_name is not None or device_kind is not None:
            devices_q = device_filter(sa.select(Devices.id), device_name, device_kind)
            query = query.where((Trials.device_id + 0).in_(devices_q))
        if status is not None:
            query = query.where(Trials.status == Outcome(status).value)
        query = query.order_by(Trials.id)
        if limit is not None:
            query = query.limit(limit)
        columns: dict[str, Any] = {}
        for name in TABLE_COLUMNS:
            columns[name] = (array.array("d") if name in _NUMBERS else [] if name == "traced"
                             else array.array("q"))
        with self._sessions.read("read trials") as session:
            strings: dict[str, dict[Any, int]] = {name: {} for name in STRING_COLUMNS}
            for chunk in _chunks(session.connection(), query):
                _extend(columns, chunk, strings)
            problem_ids = set(columns["problem_id"])
            problems: dict[int, Problem] = {}
            kernel_ids: set[int] = set()
            for pid, kid, name, shape, dtype_ in session.execute(
                    sa.select(Problems.id, Kernels.id, Kernels.name, Problems.shape_json,
                              Problems.dtype).join(Kernels, Kernels.id == Problems.kernel_id)):
                if pid in problem_ids:
                    problems[pid] = Problem(name, json.loads(shape), dtype_)
                    kernel_ids.add(kid)
            config_ids = sorted(set(columns["config_id"]))
            configs: dict[int, str] = {}
            if len(config_ids) <= _CONFIGS_BY_ID:
                for at in range(0, len(config_ids), 500):
                    configs.update((cid, text) for cid, text in session.execute(
                        sa.select(Configs.id, Configs.config_json)
                        .where(Configs.id.in_(config_ids[at:at + 500]))))
            else:  # many: every config of the kernels, in one statement, those named kept
                wanted = set(config_ids)
                configs.update((cid, text) for cid, text in session.execute(
                    sa.select(Configs.id, Configs.config_json)
                    .where(Configs.kernel_id.in_(sorted(kernel_ids)))) if cid in wanted)
            devices = {d.id: device_from_row(d) for d in session.scalars(sa.select(Devices))}
            software = {s.id: software_from_row(s) for s in session.scalars(sa.select(Software))}
        return TrialTable(columns, problems, configs, devices, software,
                          {name: list(index) for name, index in strings.items()})

    def trial(self, trial_id: int) -> TrialRow | None:
        """The trial with id ``trial_id``, or None."""
        with self._sessions.read("read a trial") as session:
            row = session.execute(trial_query().where(Trials.id == trial_id)).first()
            return None if row is None else trial_row(*row)

    def best(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        n: int = 1,
        versions: Mapping[str, str] | None = None,
        cache: str | None = None,
    ) -> list[TrialRow]:
        """The ``n`` fastest ok trials of ``problem`` (lowest median first).

        Only devices of ``device_kind`` count (None: any kind), so GPU and interpret-mode
        times never mix; ``device_name`` further restricts to one device model. ``versions``
        (``{"jax": ..., "jaxlib": ...}``) restricts to trials measured with exactly those
        versions of the keys it gives. ``cache`` restricts to one cache policy; without it,
        the policy is the one :meth:`preferred_policy` picks, so that times of two policies
        are never ranked together.
        """
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, but got {n!r}.")
        query = (
            trial_query()
            .where(Problems.digest == problem.digest())
            .where(Trials.status == Outcome.OK.value, plausible(Trials.median_us))
        )
        query = device_filter(query, device_name, device_kind)
        if cache is None:
            cache = self.preferred_policy(problem, device_name=device_name, device_kind=device_kind)
        query = query.where(Trials.cache_policy == checked_policy(cache))
        for key, value in (versions or {}).items():
            if key not in SOFTWARE_COLUMNS:
                raise ValueError(
                    f"versions may name {', '.join(SOFTWARE_COLUMNS)}, but got {key!r}."
                )
            query = query.where(getattr(Software, key) == value)
        query = query.order_by(Trials.median_us, Trials.id).limit(n)
        with self._sessions.read("read the best trials") as session:
            return [trial_row(*row) for row in session.execute(query)]

    def preferred_policy(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
    ) -> str:
        """The cache policy whose results answer for ``problem`` on these devices: ``cold``
        when it has an ok trial timed cold there, else ``warm`` (one query)."""
        query = (
            sa.select(Trials.id)
            .join(Problems, Problems.id == Trials.problem_id)
            .join(Devices, Devices.id == Trials.device_id)
            .where(Problems.digest == problem.digest())
            .where(Trials.status == Outcome.OK.value, Trials.cache_policy == "cold")
            .where(plausible(Trials.median_us))
        )
        query = device_filter(query, device_name, device_kind).limit(1)
        with self._sessions.read("read the cache policies") as session:
            return "cold" if session.scalar(query) is not None else "warm"

    def baseline(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> BaselineRow | None:
        """The fastest stored baseline of ``problem`` (of ``name``, if given), or None."""
        rows = self.baselines(
            problem, device_name=device_name, device_kind=device_kind, name=name, cache=cache
        )
        return rows[0] if rows else None

    def baselines(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        name: str | None = None,
        cache: str | None = None,
    ) -> list[BaselineRow]:
        """Stored baselines of ``problem``, fastest first (of one cache policy, if given)."""
        query = (
            sa.select(Baselines, Problems, Kernels, Devices, Software)
            .join(Problems, Problems.id == Baselines.problem_id)
            .join(Kernels, Kernels.id == Problems.kernel_id)
            .join(Devices, Devices.id == Baselines.device_id)
            .join(Software, Software.id == Baselines.software_id)
            .where(Problems.digest == problem.digest())
        )
        if name is not None:
            query = query.where(Baselines.name == name)
        if cache is not None:
            query = query.where(Baselines.cache_policy == checked_policy(cache))
        query = device_filter(query, device_name, device_kind).where(plausible(Baselines.median_us))
        query = query.order_by(Baselines.median_us, Baselines.id)
        with self._sessions.read("read baselines") as session:
            return [
                BaselineRow(
                    id=b.id,
                    problem=problem_from_rows(k, p),
                    device=device_from_row(d),
                    software=software_from_row(s),
                    name=b.name,
                    median_us=b.median_us,
                    min_us=b.min_us,
                    max_us=b.max_us,
                    samples_us=b.samples_us,
                    measured_at=b.measured_at,
                    cache_policy=b.cache_policy,
                    spread=b.spread,
                )
                for b, p, k, d, s in session.execute(query)
            ]

    def trace_regions(self, trial_id: int) -> list[TraceRegionRow]:
        """The trace regions stored for a trial, by region name."""
        query = (
            sa.select(TraceRegions)
            .where(TraceRegions.trial_id == trial_id)
            .order_by(TraceRegions.region)
        )
        with self._sessions.read("read trace regions") as session:
            return [
                TraceRegionRow(r.trial_id, r.region, r.median_us, r.count, r.trace_path)
                for r in session.scalars(query)
            ]

    def problems(self, kernel: str | None = None) -> list[Problem]:
        """The problems with anything stored, by kernel name then insertion order."""
        query = (sa.select(Problems.id, Kernels.name, Problems.shape_json, Problems.dtype)
                 .join(Problems, Problems.kernel_id == Kernels.id))
        if kernel is not None:
            query = query.where(Kernels.name == kernel)
        query = query.order_by(Kernels.name, Problems.id)
        with self._sessions.read("read problems") as session:
            return [self._problem(*row) for row in session.execute(query)]

    def devices(self) -> list[DeviceInfo]:
        """Every device with anything stored."""
        query = sa.select(Devices).order_by(Devices.kind, Devices.name, Devices.id)
        with self._sessions.read("read devices") as session:
            return [device_from_row(d) for d in session.scalars(query)]

    def runs(self) -> list[RunRow]:
        """Every job run, oldest first."""
        query = sa.select(Runs, Devices).join(Devices, Devices.id == Runs.device_id)
        with self._sessions.read("read job runs") as session:
            return [
                RunRow(
                    id=r.id, job=r.job, device=device_from_row(d), host=r.host,
                    cache_policy=r.cache_policy, started_at=r.started_at,
                    finished_at=r.finished_at, clocks_before=json.loads(r.clocks_before),
                    clocks_after=None if r.clocks_after is None else json.loads(r.clocks_after),
                    warnings=tuple(json.loads(r.warnings or "[]")),
                )
                for r, d in session.execute(query.order_by(Runs.id))
            ]

    def confirmations(
        self,
        problem: Problem,
        *,
        device_name: str | None = None,
        device_kind: str | None = DeviceKind.GPU,
        cache: str | None = None,
        limit: int | None = None,
    ) -> list[ConfirmationRow]:
        """The stored confirmation rounds of ``problem``, newest first (the newest ``limit``)."""
        query = (
            sa.select(Confirmations.id)
            .join(Problems, Problems.id == Confirmations.problem_id)
            .join(Devices, Devices.id == Confirmations.device_id)
            .where(Problems.digest == problem.digest())
        )
        if cache is not None:
            query = query.where(Confirmations.cache_policy == checked_policy(cache))
        query = device_filter(query, device_name, device_kind)
        query = query.order_by(Confirmations.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._sessions.read("read confirmation rounds") as session:
            ids = [int(i) for i in session.scalars(query)]
        rows = [row for _problem_id, row in self._confirmation_rows(ids)]
        return sorted(rows, key=lambda r: -r.id)

    def _confirmation_rows(self, ids: Sequence[int]) -> list[tuple[int, ConfirmationRow]]:
        """(problem id, row) of the confirmations ``ids``, with their programs."""
        if not ids:
            return []
        query = (
            sa.select(Confirmations, Problems, Kernels, Devices, Software)
            .join(Problems, Problems.id == Confirmations.problem_id)
            .join(Kernels, Kernels.id == Problems.kernel_id)
            .join(Devices, Devices.id == Confirmations.device_id)
            .join(Software, Software.id == Confirmations.software_id)
            .where(Confirmations.id.in_(list(ids)))
        )
        programs_q = (
            sa.select(ConfirmationPrograms, Configs)
            .join(Trials, Trials.id == ConfirmationPrograms.trial_id)
            .join(Configs, Configs.id == Trials.config_id)
            .where(ConfirmationPrograms.confirmation_id.in_(list(ids)))
            .order_by(ConfirmationPrograms.confirmation_id, ConfirmationPrograms.position)
        )
        with self._sessions.read("read confirmation rounds") as session:
            programs: dict[int, list[ConfirmedProgram]] = {}
            for p, c in session.execute(programs_q):
                programs.setdefault(p.confirmation_id, []).append(ConfirmedProgram(
                    trial_id=p.trial_id, config=Config.from_json(c.config_json),
                    position=p.position, rounds_us=p.rounds_us, median_us=p.median_us,
                    spread=p.spread, diff=p.diff, noise=p.noise, tie=bool(p.tie),
                    crowned=bool(p.crowned),
                ))
            out = []
            for conf, prob, k, d, s in session.execute(query):
                out.append((prob.id, ConfirmationRow(
                    id=conf.id, problem=problem_from_rows(k, prob), device=device_from_row(d),
                    software=software_from_row(s), cache_policy=conf.cache_policy, rounds=conf.rounds,
                    iterations=conf.iterations, crowned_trial_id=conf.crowned_trial_id,
                    fastest_trial_id=conf.fastest_trial_id, baseline_name=conf.baseline_name,
                    baseline_median_us=conf.baseline_median_us, baseline_spread=conf.baseline_spread,
                    baseline_rounds_us=conf.baseline_rounds_us, speedup=conf.speedup,
                    speedup_spread=conf.speedup_spread, speedup_low=conf.speedup_low,
                    speedup_high=conf.speedup_high, created_at=conf.created_at, run_id=conf.run_id,
                    programs=tuple(programs.get(conf.id, ())),
                )))
        return out

    def verifications(
        self,
        problem: Problem | None = None,
        *,
        device_name: str | None = None,
        device_kind: str | None = None,
        limit: int | None = None,
    ) -> list[VerificationRow]:
        """The stored ``autotune verify`` rows (of ``problem``, or of every problem), newest
        first (the newest ``limit``)."""
        query = self._verification_query()
        if problem is not None:
            query = query.where(Problems.digest == problem.digest())
        query = device_filter(query, device_name, device_kind)
        query = query.order_by(Verifications.id.desc())
        if limit is not None:
            query = query.limit(limit)
        return self._verification_rows(query)

    def program_checks(self, confirmation_ids: Sequence[int]) -> dict[int, VerificationRow]:
        """The newest program check (a verification row of method
        :data:`~autotune.space.outcomes.PROGRAM_METHOD`) of each of the confirmation rounds
        ``confirmation_ids`` that has one, by confirmation id: one statement for them all."""
        ids = sorted({int(i) for i in confirmation_ids})
        if not ids:
            return {}
        newest = (
            sa.select(sa.func.max(Verifications.id))
            .where(Verifications.method == PROGRAM_METHOD,
                   Verifications.confirmation_id.in_(ids))
            .group_by(Verifications.confirmation_id)
        )
        query = self._verification_query().where(Verifications.id.in_(newest))
        return {row.confirmation_id: row for row in self._verification_rows(query)
                if row.confirmation_id is not None}

    @staticmethod
    def _verification_query() -> Any:
        return (
            sa.select(Verifications, Problems, Kernels, Devices, Software, Configs)
            .join(Problems, Problems.id == Verifications.problem_id)
            .join(Kernels, Kernels.id == Problems.kernel_id)
            .join(Devices, Devices.id == Verifications.device_id)
            .join(Software, Software.id == Verifications.software_id)
            .join(Configs, Configs.id == Verifications.config_id)
        )

    def _verification_rows(self, query: Any) -> list[VerificationRow]:
        with self._sessions.read("read verifications") as session:
            return [
                VerificationRow(
                    id=v.id, problem=problem_from_rows(k, p), device=device_from_row(d),
                    software=software_from_row(s), confirmation_id=v.confirmation_id,
                    config=Config.from_json(c.config_json), method=v.method, rounds=v.rounds,
                    calls=v.calls, baseline_name=v.baseline_name,
                    winner_rounds_us=v.winner_rounds_us, baseline_rounds_us=v.baseline_rounds_us,
                    others=tuple(json.loads(v.others_json)),
                    winner_median_us=v.winner_median_us,
                    baseline_median_us=v.baseline_median_us, speedup=v.speedup,
                    speedup_low=v.speedup_low, speedup_high=v.speedup_high,
                    stored_speedup=v.stored_speedup, still_wins=v.still_wins,
                    created_at=v.created_at,
                )
                for v, p, k, d, s, c in session.execute(query)
            ]

    def summaries(
        self,
        *,
        kernel: str | None = None,
        dtype: str | None = None,
        device_name: str | None = None,
        device_kind: str | None = None,
    ) -> list[ProblemSummary]:
        """One summary per (problem, device name, device kind, cache policy) with stored trials;
        each carries its policy's newest confirmation round, if any, and that round's newest
        program check (:meth:`program_checks`)."""
        group = (Trials.problem_id, Devices.name, Devices.kind, Trials.cache_policy)

        def filtered(query: Any) -> Any:
            query = (
                query.join(Devices, Devices.id == Trials.device_id)
                .join(Problems, Problems.id == Trials.problem_id)
                .join(Kernels, Kernels.id == Problems.kernel_id)
            )
            return listing_filter(query, kernel=kernel, dtype=dtype, device_name=device_name,
                                  device_kind=device_kind)

        counts_q = filtered(sa.select(*group, Trials.status, sa.func.count()).select_from(Trials))
        counts_q = counts_q.group_by(*group, Trials.status)
        rank = sa.func.row_number().over(partition_by=group, order_by=(Trials.median_us, Trials.id))
        ranked = filtered(
            sa.select(*group, Trials.id, Trials.median_us, Configs.config_json, rank.label("rank"))
            .select_from(Trials)
            .join(Configs, Configs.id == Trials.config_id)
            .where(Trials.status == Outcome.OK.value, plausible(Trials.median_us))
        ).subquery()
        best_q = sa.select(ranked).where(ranked.c.rank == 1)
        base_rank = sa.func.row_number().over(
            partition_by=(Baselines.problem_id, Devices.name, Devices.kind,
                          Baselines.cache_policy),
            order_by=(Baselines.median_us, Baselines.id),
        )
        base_sub = (
            sa.select(
                Baselines.problem_id, Devices.name, Devices.kind, Baselines.cache_policy,
                Baselines.name.label("baseline"), Baselines.median_us, base_rank.label("rank"),
            )
            .join(Devices, Devices.id == Baselines.device_id)
            .where(plausible(Baselines.median_us))
            .subquery()
        )
        base_q = sa.select(base_sub).where(base_sub.c.rank == 1)

        with self._sessions.read("summarise results") as session:
            trials: dict[tuple[int, str, str, str], dict[str, int]] = {}
            for problem_id, name, kind, policy, status, count in session.execute(counts_q):
                trials.setdefault((problem_id, name, kind, policy), {})[status] = int(count)
            best = {
                (r.problem_id, r.name, r.kind, r.cache_policy):
                    (r.id, r.median_us, json.loads(r.config_json))
                for r in session.execute(best_q)
            }
            baselines = {
                (r.problem_id, r.name, r.kind, r.cache_policy): (r.baseline, r.median_us)
                for r in session.execute(base_q)
            }
            newest = (
                sa.select(sa.func.max(Confirmations.id))
                .join(Devices, Devices.id == Confirmations.device_id)
                .where(Confirmations.problem_id.in_(sorted({k[0] for k in trials})))
                .group_by(Confirmations.problem_id, Devices.name, Devices.kind,
                          Confirmations.cache_policy)
            )
            confirmation_ids = [int(i) for i in session.scalars(newest)]
            problem_ids = sorted({key[0] for key in trials})
            problems = {
                p.id: problem_from_rows(k, p)
                for k, p in session.execute(
                    sa.select(Kernels, Problems)
                    .join(Problems, Problems.kernel_id == Kernels.id)
                    .where(Problems.id.in_(problem_ids))
                )
            }
        confirmations = {
            (problem_id, c.device.name, c.device.kind.value, c.cache_policy): c
            for problem_id, c in self._confirmation_rows(confirmation_ids)
        }
        checks = self.program_checks(confirmation_ids)
        out = []
        for key in sorted(trials, key=lambda k: (problems[k[0]].kernel, k[0], k[2], k[1], k[3])):
            best_id, best_us, best_config = best.get(key, (None, None, None))
            baseline_name, baseline_us = baselines.get(key, (None, None))
            confirmation = confirmations.get(key)
            out.append(
                ProblemSummary(
                    problem=problems[key[0]],
                    device=key[1],
                    device_kind=key[2],
                    by_status=trials[key],
                    best_us=best_us,
                    best_config=best_config,
                    best_trial_id=best_id,
                    baseline_name=baseline_name,
                    baseline_us=baseline_us,
                    cache_policy=key[3],
                    confirmation=confirmation,
                    program_check=None if confirmation is None else checks.get(confirmation.id),
                )
            )
        return out

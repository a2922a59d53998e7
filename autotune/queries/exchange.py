"""Export the best config per problem (JSON, CSV, or a plain Python module) and import it back.

* ``json``: ``{"format": "autotune-export", "version": 1, "records": [...]}``, one record per
  (problem, device, cache policy) with kernel, shape, dtype, device, device_kind,
  compute_capability, driver, median_us, jax_version, software, config, cache_policy, spread,
  and, when a confirmation round crowned the config, confirmed (true), confirmed_speedup,
  speedup_spread and ties (the configs within the noise of the fastest); and which
  implementation wins: baseline_name, speedup_low and speedup_high (the confirmed speedup's
  interval), program_speedup, program_speedup_low and program_speedup_high (the confirmation's
  program check: the two timed as a program calls them; None without one), faster ("kernel",
  "baseline" or "tie": what was measured), runs ("kernel" or "baseline": which one a program
  given the baseline runs, ``autotune.queries.best.runs_of``: a tie by its estimate) and
  choice (in words: "XLA is 2.1% faster (...): it runs; the kernel's best config is ...") from
  the program check where there is one, else from the confirmation
  (``autotune.queries.best.verdict_figures``), and verdict_source ("program-check",
  "confirmation" or null), which of the two decided. Verification rows themselves are not
  exported: an import never brings back a confirmation or its program check, only the
  configs (as trials).
  :func:`import_json` reads it back (a record without cache_policy is ``warm``).
* ``csv``: the same records, one row each (shape as ``m=..,n=..``, config as JSON).
* ``python``: a module needing nothing but Python, keyed by device as JAX's tuned block-size
  tables are: ``TUNED = {device: {(kernel, ((key, value), ...), dtype): {config}}}`` where
  ``device`` is the device name (what ``jax.devices()[0].device_kind`` says, e.g.
  ``"NVIDIA H200"``), plus a ``"default"`` table (per problem, the fastest of the devices);
  ``COMPUTE_CAPABILITY`` maps device names to their compute capability, and
  ``lookup(kernel, shape, dtype, device=None)`` takes a device name or a compute capability
  (``"9.0"``) and falls back to ``"default"``; ``CHOICE`` (keyed as ``TUNED``) says which
  implementation wins each problem and which runs (``runs``), and ``choose(...)`` answers
  ``("baseline", name)`` or ``("kernel", config)`` as ``autotune.tuned(baseline=...)`` routes
  (also given the module as its ``table=``). ``CHOICE`` entries carry the deciding figures and
  their ``source``.

Interpret-mode results (functional runs on a CPU, not GPU timings) are left out unless asked
for by device (``device="interpret"`` or the interpret device's name).

Every record carries the cache policy it was timed with (``cold`` / ``warm``) and, when a
confirmation round ran, its crowned config, confirmed speedup with spread, and the ties; the
python table prefers, per problem and device, GPU results, then cold-cache ones (times of two
cache policies are never compared).

Importing never replaces stored results: each record becomes an ok trial on its device
through :meth:`Store.record_trial`, which keeps the first trial of a (problem, config,
device, software). No jax here.

Why one piece (over 400 lines): export and import are one format (JSON, CSV, Python) read and
written in both directions; the record checks are shared by both.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import JobError
from autotune.queries import best as best_queries
from autotune.queries.best import open_store, resolve_device, served_summaries
from autotune.space.outcomes import (
    CACHE_POLICIES,
    DEVICE_KINDS,
    DeviceInfo,
    DeviceKind,
    TrialResult,
    plausible_us,
    time_problem,
)
from autotune.space.problem import Config, Problem
from autotune.space.validity import servable
from autotune.storage.rows import PROGRAM_CHECK, ProblemSummary, current_check
from autotune.storage.store import Store
from autotune.storage.urls import display_url, in_memory, resolve_url

__all__ = [
    "FORMATS", "export_records", "render", "import_json", "import_records", "check_records",
    "is_export", "BadRecord", "MAX_IMPORT_BYTES", "MAX_IMPORT_DEPTH", "MAX_IMPORT_RECORDS",
    "skipped_interpret", "interpret_export_counts",
]

FORMATS = ("json", "python", "csv")
_MAGIC = "autotune-export"
_VERSION = 1
# How `export --out` recognises a file it may replace: one of its own exports.
PYTHON_MARKER = f"# {_MAGIC} version {_VERSION} (python): written by `autotune export`"
CSV_FIELDS = ("kernel", "shape", "dtype", "device", "device_kind", "median_us", "jax_version",
              "config", "cache_policy", "spread", "confirmed", "confirmed_speedup",
              "speedup_spread", "ties", "baseline_name", "speedup_low", "speedup_high", "faster",
              "choice", "program_speedup", "program_speedup_low", "program_speedup_high",
              "verdict_source", "runs")
CSV_HEADER = ",".join(CSV_FIELDS)
# Every CSV export so far starts with these columns (later versions add columns after them).
_CSV_HEADER_V1 = ",".join(CSV_FIELDS[:8])

log = logging.getLogger(__name__)
_RECORD_KEYS = "kernel, shape, dtype, device, median_us and config"


def export_records(
    db: str | None = None, *, kernel: str | None = None, device: str | None = None
) -> list[dict[str, Any]]:
    """The best stored config of every (problem, device), as JSON-ready dicts."""
    records: list[dict[str, Any]] = []
    with open_store(db) as store:
        if store is None:
            return records
        name, kind = (None, None) if device is None else resolve_device(store, device)
        summaries = store.summaries(kernel=kernel, device_name=name, device_kind=kind)
        left_out = _interpret_left_out(summaries) if device is None else set()
        for summary in served_summaries(store, summaries):  # configs valid under today's rules
            if summary.best_config is None or summary.best_trial_id is None:
                continue
            if not plausible_us(summary.best_us):
                log.warning("%s on %s: skipping the stored time %r: %s; it is never exported.",
                            summary.problem, summary.device, summary.best_us,
                            time_problem(summary.best_us))
                continue
            if (summary.problem, summary.device) in left_out:
                continue  # functional runs, not GPU timings: only when asked for (or no GPU)
            confirmation = summary.confirmation
            trial = store.trial(summary.best_trial_id)
            if trial is None:  # deleted between the two reads
                continue
            if confirmation is not None and confirmation.created_at < trial.finished_at:
                confirmation = None  # a faster config was found since: not confirmed
            median_us, config, spread = summary.best_us, dict(summary.best_config), trial.spread
            if confirmation is not None and not servable(summary.problem, confirmation.crowned.config):
                confirmation = None  # its crowned config breaks today's rules: never served
            if confirmation is not None and not plausible_us(confirmation.crowned.median_us):
                confirmation = None  # its confirmed time is not a time: never exported
            if confirmation is not None:
                crowned = confirmation.crowned
                median_us, config, spread = crowned.median_us, dict(crowned.config), crowned.spread
                trial = store.trial(crowned.trial_id) or trial
            info = trial.device
            records.append({
                "kernel": summary.problem.kernel,
                "shape": summary.problem.dims,
                "dtype": summary.problem.dtype,
                "device": summary.device,
                "device_kind": summary.device_kind,
                "compute_capability": info.compute_capability,
                "driver": info.driver,
                "median_us": median_us,
                "trial_id": trial.id,
                "jax_version": trial.software.get("jax", ""),
                "software": dict(trial.software),
                "config": config,
                "cache_policy": summary.cache_policy,
                "spread": _finite(spread),
                "confirmed": confirmation is not None,
                "confirmed_speedup": None if confirmation is None else _finite(confirmation.speedup),
                "speedup_spread": None if confirmation is None else _finite(confirmation.speedup_spread),
                **_choice(dataclasses.replace(summary, confirmation=confirmation), config),
                "ties": [] if confirmation is None else [
                    {"config": dict(p.config), "median_us": p.median_us, "diff": _finite(p.diff)}
                    for p in confirmation.tied_with_winner() if plausible_us(p.median_us)
                ],
            })
    return records


def _choice(summary: ProblemSummary, config: Mapping[str, Any]) -> dict[str, Any]:
    """Which implementation wins the problem (issue 35): the baseline named, the confirmed
    speedup's interval, the program check's speedup and interval (None without one),
    ``faster`` ("kernel", "baseline" or "tie"), ``runs`` ("kernel" or "baseline": the route,
    :func:`~autotune.queries.best.runs_of`) and the choice in words from the figures
    :func:`~autotune.queries.best.verdict_figures` picks (the program check where there is one,
    else the confirmation), and ``verdict_source``, which of the two that was."""
    confirmation = summary.confirmation
    low = high = name = None
    if confirmation is not None and confirmation.speedup is not None:
        name = confirmation.baseline_name
        low, high = _finite(confirmation.speedup_low), _finite(confirmation.speedup_high)
    check = current_check(confirmation, summary.program_check)
    verdict = best_queries.verdict_figures(summary)
    speedup, v_low, v_high = (_finite(v) for v in verdict[:3])
    return {
        "baseline_name": name, "speedup_low": low, "speedup_high": high,
        "program_speedup": None if check is None else _finite(check.speedup),
        "program_speedup_low": None if check is None else _finite(check.speedup_low),
        "program_speedup_high": None if check is None else _finite(check.speedup_high),
        "verdict_source": verdict.source,
        "faster": best_queries.faster_of(speedup, v_low, v_high),
        "runs": best_queries.runs_of(speedup, v_low, v_high, verdict.other),
        "choice": best_queries.choice_words(config, speedup, v_low, v_high, name, verdict.other),
    }


def _interpret_left_out(summaries: Sequence[ProblemSummary]) -> set[tuple[Problem, str]]:
    """The (problem, device) interpret-mode results an export asking for no device leaves out:
    all of them on a machine with a GPU; on one without, those of problems with a GPU result
    (as :func:`~autotune.queries.best.best_result` answers there)."""
    with_gpu = {s.problem for s in summaries if s.device_kind == DeviceKind.GPU}
    gpu_here = best_queries.host_has_gpu()  # looked up at call time: tests replace it
    return {(s.problem, s.device) for s in summaries if s.device_kind == DeviceKind.INTERPRET
            and (gpu_here or s.problem in with_gpu)}


def interpret_export_counts(db: str | None = None, *,
                            kernel: str | None = None) -> tuple[int, int]:
    """``(left out, included)``: how many (problem, interpret device) results with a best
    config :func:`export_records` leaves out, and includes, when no device is asked for."""
    with open_store(db) as store:
        if store is None:
            return 0, 0
        summaries = [s for s in store.summaries(kernel=kernel) if s.best_config is not None]
        left = _interpret_left_out(summaries)
        interpret = [s for s in summaries if s.device_kind == DeviceKind.INTERPRET]
        out = sum(1 for s in interpret if (s.problem, s.device) in left)
        return out, len(interpret) - out


def skipped_interpret(db: str | None = None, *, kernel: str | None = None) -> int:
    """How many (problem, interpret device) results :func:`export_records` leaves out when
    no device is asked for."""
    return interpret_export_counts(db, kernel=kernel)[0]


def render(records: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """``records`` (from :func:`export_records`) as text in ``fmt`` (json, python or csv)."""
    if fmt == "json":
        doc = {"format": _MAGIC, "version": _VERSION, "records": list(records)}
        return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        fields = CSV_FIELDS
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in records:
            writer.writerow({k: _csv_cell(v) for k, v in {
                **{k: r.get(k) for k in fields if k not in ("shape", "config", "ties")},
                "ties": len(r.get("ties") or ()),
                "shape": Problem(r["kernel"], r["shape"], r["dtype"]).shape_text,
                "config": json.dumps(r["config"], sort_keys=True),
            }.items()})
        return out.getvalue()
    if fmt == "python":
        return _python_module(records)
    raise JobError(f"Unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}.")


# A spreadsheet reads a cell starting with one of these as a formula (=HYPERLINK(...), +cmd,
# -2+3, @SUM, and tab or carriage return ahead of one): OWASP's CSV injection.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs: text starting like a formula (a kernel or device
    name from the database) gets a leading ``'``; numbers are written as they are."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_STARTS):
        value = "'" + value
    # csv leaves a lone carriage return unquoted, and a reader would end the row there.
    return value.replace("\r", "\\r")


def is_export(head: str) -> bool:
    """Whether text starting with ``head`` (the first few KiB of a file) is one of our exports
    (json, python or csv), which ``export --out`` may replace."""
    first = head.lstrip("\ufeff").split("\n", 2)
    if first[0] == PYTHON_MARKER or first[0].startswith(_CSV_HEADER_V1):
        return True
    # json: sort_keys puts "format" first.
    return head.startswith("{") and len(first) > 1 and first[1].strip() == f'"format": "{_MAGIC}",'


def _python_module(records: Sequence[Mapping[str, Any]]) -> str:
    tables: dict[str, dict[tuple[Any, ...], Mapping[str, Any]]] = {}
    default: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    capability: dict[str, str] = {}
    for r in records:
        key = (r["kernel"], tuple(sorted(r["shape"].items())), r["dtype"])
        def rank(x: Mapping[str, Any]) -> tuple[bool, bool, float]:
            return (x["device_kind"] != DeviceKind.GPU, x.get("cache_policy", "warm") != "cold",
                    x["median_us"])

        table = tables.setdefault(r["device"], {})
        if key not in table or rank(r) < rank(table[key]):
            table[key] = r
        old = default.get(key)
        if old is None or rank(r) < rank(old):
            default[key] = r
        if r.get("compute_capability"):
            capability[r["device"]] = str(r["compute_capability"])
    lines = [
        PYTHON_MARKER,
        '"""Tuned configs exported by autotune. Plain Python: needs nothing else installed.',
        "",
        "TUNED maps a device name (jax.devices()[0].device_kind, e.g. 'NVIDIA H100 80GB HBM3') and",
        '"default" to tables of (kernel, ((shape key, value), ...) sorted, dtype) -> the best',
        "config; DETAILS maps the same keys to where and how fast it was measured.",
        '"""',
        "",
        "TUNED = {",
    ]
    named = sorted(tables) + ["default"]

    def details(r: Mapping[str, Any]) -> dict[str, Any]:
        return {"device": r["device"], "device_kind": r["device_kind"],
                "median_us": r["median_us"], "jax_version": r["jax_version"],
                "cache_policy": r.get("cache_policy", "warm"),
                "confirmed_speedup": r.get("confirmed_speedup"),
                "speedup_spread": r.get("speedup_spread")}

    def choice(r: Mapping[str, Any]) -> dict[str, Any]:
        # The figures that decided (the program check's where it did, else the confirmation's).
        source = r.get("verdict_source")
        of = "program_speedup" if source == PROGRAM_CHECK else "confirmed_speedup"
        low, high = ("program_speedup_low", "program_speedup_high") if source == PROGRAM_CHECK \
            else ("speedup_low", "speedup_high")
        faster = r.get("faster", "tie")
        runs = best_queries.written_runs(r.get("runs"), faster, r.get(of), r.get(low),
                                         r.get(high))
        return {"faster": faster, "runs": runs, "baseline": r.get("baseline_name"),
                "speedup": r.get(of), "speedup_low": r.get(low), "speedup_high": r.get(high),
                "source": source, "words": r.get("choice", "")}

    def config(r: Mapping[str, Any]) -> dict[str, Any]:
        return dict(sorted(r["config"].items()))

    # TUNED, DETAILS and CHOICE: one {device: {key: entry}} table each, keyed alike.
    blocks = (("TUNED", config), ("DETAILS", details), ("CHOICE", choice))
    for i, (name, entry) in enumerate(blocks):
        if i:
            lines += ["}", "", f"{name} = {{"]
        for device in named:
            table = default if device == "default" else tables[device]
            lines.append(f"    {device!r}: {{")
            for key in sorted(table, key=repr):
                lines.append(f"        {key!r}: {entry(table[key])!r},")
            lines.append("    },")
    lines += [
        "}",
        "",
        f"COMPUTE_CAPABILITY = {dict(sorted(capability.items()))!r}",
        "",
        '_ALIASES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64"}',
        "",
        "",
        "def _found(kernel, shape, dtype, device):",
        '    """(table name, key, config) of the first table holding (kernel, shape, dtype): the',
        '    device\'s (by name, or by compute capability such as "9.0"), then "default"."""',
        "    dtype = _ALIASES.get(dtype, dtype)",
        "    key = (kernel, tuple(sorted(dict(shape).items())), dtype)",
        "    names = [device] if device in TUNED else sorted(",
        "        name for name, cc in COMPUTE_CAPABILITY.items() if device is not None and cc == device)",
        '    for name in [*names, "default"]:',
        "        config = TUNED.get(name, {}).get(key)",
        "        if config is not None:",
        "            return name, key, config",
        "    return None",
        "",
        "",
        "def lookup(kernel, shape, dtype, device=None):",
        '    """The tuned config of (kernel, shape mapping, dtype) as a new dict, or None.',
        "",
        "    device: a device name (jax.devices()[0].device_kind) or a compute capability such",
        '    as "9.0"; its table is tried first, then "default".',
        '    """',
        "    found = _found(kernel, shape, dtype, device)",
        "    return None if found is None else dict(found[2])",
        "",
        "",
        "def choose(kernel, shape, dtype, device=None):",
        '    """Which implementation to run: ("baseline", its name) where the verdict\'s speedup',
        "    puts the baseline ahead (a tie too, by its estimate);",
        '    ("kernel", config) where it puts the kernel ahead or nothing was confirmed; None if',
        '    untuned. CHOICE\'s "runs" says which. The verdict is the program check\'s where one',
        "    was stored (the two timed as a program calls them), else the confirmation round's:",
        '    "source" says which.',
        "",
        "    The table is picked as lookup() picks it (the device's, then \"default\").",
        '    """',
        "    found = _found(kernel, shape, dtype, device)",
        "    if found is None:",
        "        return None",
        "    name, key, config = found",
        "    choice = CHOICE.get(name, {}).get(key, {})",
        "    # An entry without \"runs\" (written by hand): by \"faster\" alone.",
        '    older = "baseline" if choice.get("faster") == "baseline" else "kernel"',
        '    if choice.get("runs", older) == "baseline":',
        '        return "baseline", choice.get("baseline")',
        '    return "kernel", dict(config)',
        "",
    ]
    return "\n".join(lines)


# Bounds on what `autotune import` reads: an export of every problem of a large campaign is a
# few MB and 4 levels deep; anything far past that is refused before it is parsed.
MAX_IMPORT_BYTES = 64 * 1024 * 1024
MAX_IMPORT_DEPTH = 32
MAX_IMPORT_RECORDS = 100_000
MAX_TEXT_CHARS = 256  # device names, drivers, versions, string config values
MAX_KERNEL_NAME_CHARS = 255
_ERRORS_SHOWN = 20  # bad records named in the message; the count says how many in all

_KNOWN_KEYS = frozenset({
    "kernel", "shape", "dtype", "device", "device_kind", "compute_capability", "driver",
    "median_us", "jax_version", "software", "config",
    "trial_id",  # the exporting database's id: informational, never imported as an id
    # The measurement (issue 19): the cache policy is imported; the rest is informational.
    "cache_policy", "spread", "confirmed", "confirmed_speedup", "speedup_spread", "ties",
    # Which implementation wins (issue 35), and the program check behind it: informational,
    # never imported.
    "baseline_name", "speedup_low", "speedup_high", "faster", "choice", "program_speedup",
    "program_speedup_low", "program_speedup_high", "verdict_source", "runs",
})
_DEVICE_KINDS = DEVICE_KINDS


def _finite(value: Any) -> Any:
    """``value``, or None where it is a float that is not finite (exports are strict JSON)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _refuse_in_memory(db: str | None) -> None:
    """Raises JobError when ``db`` is an in-memory database: an import there vanishes at once."""
    url = resolve_url(db)
    if in_memory(url):
        raise JobError(
            f"The database {display_url(url)} is in memory: the imported records would be lost "
            "at once. Give a file (e.g. --db sqlite:///results/autotune.db) or a server URL."
        )


def import_json(
    path: str | pathlib.Path, db: str | None = None, *, allow_import: bool = False
) -> tuple[int, int]:
    """Loads a JSON export into ``db``; returns (trials added, already stored).

    Every record is checked (:func:`check_records`) before anything is written, and all are
    written in one transaction: a file with any bad record is refused as a whole.

    Raises:
      JobError: the file is missing, too large, not JSON, nested too deeply, not an autotune
        export, or holds bad records (each named with its index, the rule and the value);
        ``db`` is an in-memory database (the import would be lost at once).
    """
    _refuse_in_memory(db)  # before the file is read
    path = pathlib.Path(path)
    hint = "`autotune import` reads a JSON export made by `autotune export --format json`."
    try:
        with path.open("rb") as f:
            data = f.read(MAX_IMPORT_BYTES + 1)
    except OSError as e:
        raise JobError(f"cannot read {path}: {e.strerror or e}; {hint}") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise JobError(
            f"{path} is larger than {MAX_IMPORT_BYTES // 2**20} MiB (the import limit); {hint} "
            "Split a larger export by kernel (`autotune export --kernel K`)."
        )
    try:
        doc = json.loads(data.decode("utf-8"))  # NaN/Infinity parse; the record checks name them
    except UnicodeDecodeError as e:
        raise JobError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); {hint}") from None
    except RecursionError:
        raise JobError(
            f"{path} is nested too deeply to be an export (at most {MAX_IMPORT_DEPTH} levels); {hint}"
        ) from None
    except (json.JSONDecodeError, ValueError) as e:
        raise JobError(f"{path} is not JSON ({e}); {hint}") from None
    depth = _depth(doc, MAX_IMPORT_DEPTH)
    if depth > MAX_IMPORT_DEPTH:
        raise JobError(
            f"{path} is nested more than {MAX_IMPORT_DEPTH} levels deep; an export is 4. {hint}"
        )
    if not isinstance(doc, dict) or doc.get("format") != _MAGIC or not isinstance(doc.get("records"), list):
        raise JobError(f"{path} is not an autotune JSON export (made by `autotune export --format json`).")
    if doc.get("version") != _VERSION:
        raise JobError(f"{path}: export version {doc.get('version')!r} is not supported (expected {_VERSION}).")
    return import_records(doc["records"], db, where=str(path), allow_import=allow_import)


def _depth(doc: Any, limit: int) -> int:
    """How deeply ``doc`` nests lists and objects (iteratively; stops counting past ``limit``)."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, level)
            if level > limit:
                return level
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, level + 1) for child in children)
    return deepest


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """One rule a record of an import breaks: its index, the rule, and the value."""

    index: int
    rule: str
    value: str  # repr of the offending value, shortened

    def __str__(self) -> str:
        return f"record {self.index}: [{self.rule}] {self.value}"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text_problem(field: str, value: Any, *, limit: int = MAX_TEXT_CHARS, empty_ok: bool = True) -> str | None:
    """Why ``value`` is not a sane string for ``field``, or None."""
    if not isinstance(value, str):
        return f"{field} must be a string, got {type(value).__name__} {_short(value)}"
    if not value and not empty_ok:
        return f"{field} must not be empty"
    if len(value) > limit:
        return f"{field} is {len(value)} characters long; at most {limit} are allowed"
    if not value.isprintable():
        return f"{field} = {_short(value)} holds control or non-printable characters"
    return None


def check_records(
    records: Sequence[Any], *, allow_import: bool = False
) -> tuple[list[tuple[Problem, Config, float, DeviceInfo, dict[str, str], str]], list[BadRecord]]:
    """Checks every record of an export: (the records parsed, the rules they break).

    Rules: ``record`` (an object with the known keys), ``kernel_known``, ``shape`` (the
    kernel's keys, positive sizes), ``dtype`` (one the kernel supports), ``config`` (valid for
    the kernel's space bound to the problem: :func:`autotune.space.validity.violations`),
    ``median_us`` (a finite, positive number), ``device`` (a name, not null or blank),
    ``text`` (device, driver and version strings of at most 256 printable characters),
    ``device_kind`` (gpu, interpret or fake), ``spread`` (null or a finite number >= 0),
    ``cache_policy``.
    """
    from autotune.space.kernel import get_kernel
    from autotune.space.validity import violations

    parsed = []
    bad: list[BadRecord] = []
    if len(records) > MAX_IMPORT_RECORDS:
        return [], [BadRecord(-1, "records", f"{len(records)} records; at most "
                              f"{MAX_IMPORT_RECORDS} per import")]
    kernels: dict[str, Any] = {}
    for i, r in enumerate(records):
        errors: list[tuple[str, str]] = []
        if not isinstance(r, dict):
            bad.append(BadRecord(i, "record", f"a record must be an object, got {_short(r)}"))
            continue
        missing = [k for k in ("kernel", "shape", "dtype", "device", "median_us", "config") if k not in r]
        unknown = sorted(str(k) for k in set(r) - _KNOWN_KEYS)
        if missing:
            errors.append(("record", f"no {', '.join(map(repr, missing))}; each record needs {_RECORD_KEYS}"))
        if unknown:
            errors.append(("record", f"unknown key(s) {_short(unknown)}; known: {', '.join(sorted(_KNOWN_KEYS))}"))
        if missing:
            bad.extend(BadRecord(i, rule, text) for rule, text in errors)
            continue
        name = r["kernel"]
        kernel = None
        why = _text_problem("kernel", name, limit=MAX_KERNEL_NAME_CHARS, empty_ok=False)
        if why:
            errors.append(("kernel_known", why))
        else:
            if name not in kernels:
                try:
                    kernels[name] = get_kernel(name, allow_import=allow_import)
                except (JobError, LookupError) as e:
                    kernels[name] = e
            kernel = kernels[name]
            if isinstance(kernel, Exception):
                errors.append(("kernel_known", f"kernel {_short(name)}: {kernel}"))
                kernel = None
        median = r["median_us"]
        why = time_problem(median)  # the one gate on times, as for what is served and exported
        if why:
            errors.append(("median_us", why if not isinstance(median, str | list | dict)
                           else f"median_us must be a number of microseconds, got {_short(median)}"))
        device_name = r["device"]
        if not isinstance(device_name, str) or not device_name.strip():
            errors.append(("device", f"device = {_short(device_name)}; each record must name the "
                                     "device it was measured on (e.g. 'NVIDIA H100 80GB HBM3')"))
        elif why := _text_problem("device", device_name):
            errors.append(("text", why))
        for field in ("device_kind", "compute_capability", "driver", "jax_version"):
            if field in r and r[field] is not None:
                why = _text_problem(field, r[field])
                if why:
                    errors.append(("text", why))
        kind = r.get("device_kind") or DeviceKind.GPU
        if isinstance(kind, str) and kind not in _DEVICE_KINDS:
            errors.append(("device_kind", f"device_kind = {_short(kind)}; expected one of {', '.join(_DEVICE_KINDS)}"))
        software = r.get("software") or {}
        if not isinstance(software, dict):
            errors.append(("text", f"software must be an object of versions, got {_short(software)}"))
            software = {}
        for key, value in software.items():
            for why in (_text_problem("software key", key, limit=64, empty_ok=False),
                        _text_problem(f"software[{key!r}]", value)):
                if why:
                    errors.append(("text", why))
        config_value = r["config"]
        config = None
        if not isinstance(config_value, dict):
            errors.append(("config", f"config must be an object, got {_short(config_value)}"))
        else:
            for key, value in config_value.items():
                if isinstance(value, str):
                    why = _text_problem(f"config[{key!r}]", value)
                    if why:
                        errors.append(("config", why))
                elif isinstance(value, float) and not math.isfinite(value):
                    errors.append(("config", f"config[{key!r}] = {value!r} is not finite"))
            try:
                config = Config(config_value)
            except (TypeError, ValueError) as e:
                errors.append(("config", str(e)))
        problem = None
        if kernel is not None:
            shape, dtype = r["shape"], r["dtype"]
            if not isinstance(shape, dict):
                errors.append(("shape", f"shape must be an object of {', '.join(kernel.shape_keys)}, got {_short(shape)}"))
            elif not isinstance(dtype, str):
                errors.append(("dtype", f"dtype must be a string, got {_short(dtype)}"))
            else:
                try:
                    problem = kernel.problem(shape, dtype)
                except (JobError, ValueError, TypeError) as e:
                    errors.append(("dtype" if "dtype" in str(e) else "shape", str(e)))
                if problem is not None and problem.dtype not in kernel.dtypes:
                    errors.append(("dtype", f"{kernel.name} supports dtype {', '.join(kernel.dtypes)}, "
                                            f"not {problem.dtype}"))
                    problem = None
        if problem is not None and config is not None:
            broken = violations(problem, config, kernel=kernel)
            if broken:
                errors.append(("config_valid", f"config {_short(dict(config), 200)} breaks "
                                               f"{'; '.join(broken)}"))
        spread = r.get("spread")
        if spread is not None and (isinstance(spread, bool) or not isinstance(spread, int | float)
                                   or not (math.isfinite(spread) and spread >= 0)):
            errors.append(("spread", f"spread must be null or a finite number >= 0, got "
                                     f"{_short(spread)}"))
        cache = r.get("cache_policy") or "warm"
        if cache not in CACHE_POLICIES:
            errors.append(("cache_policy", f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, "
                                           f"got {_short(cache)}"))
        if errors or problem is None or config is None:
            bad.extend(BadRecord(i, rule, text) for rule, text in errors)
            continue
        device = DeviceInfo(r["device"], kind, r.get("compute_capability") or "", r.get("driver") or "")
        versions = {str(k): str(v) for k, v in software.items()}
        versions.setdefault("jax", str(r.get("jax_version") or ""))
        parsed.append((problem, config, float(median), device, versions, cache))
    return parsed, bad


def import_records(
    records: Sequence[Mapping[str, Any]],
    db: str | None = None,
    *,
    where: str = "records",
    allow_import: bool = False,
) -> tuple[int, int]:
    """Stores exported records as ok trials; returns (added, already stored).

    Checks every record first (:func:`check_records`), then writes all of them in one
    transaction: on any bad record or database error, nothing is written.

    Raises:
      JobError: a record breaks a rule (the message names each: index, rule, value), or
        ``db`` is an in-memory database.
      StorageError: the database could not be written; nothing was.
    """
    _refuse_in_memory(db)
    parsed, bad = check_records(records, allow_import=allow_import)
    if bad:
        shown = "\n".join(f"  {b}" for b in bad[:_ERRORS_SHOWN])
        more = f"\n  ... and {len(bad) - _ERRORS_SHOWN} more" if len(bad) > _ERRORS_SHOWN else ""
        count = len({b.index for b in bad})
        raise JobError(
            f"{where}: {count} of {len(records)} record(s) break the import rules, so nothing was "
            f"imported:\n{shown}{more}\nFix or remove those records (an export made by this version "
            "of `autotune export --format json` passes)."
        )
    trials = [
        (problem, config,
         dataclasses.replace(TrialResult.timed([median], compile_s=None, rel_error=None,
                                               timing="imported"), cache=cache),
         device, software)
        for problem, config, median, device, software, cache in parsed
    ]
    # The spread measured where the samples were taken (an export carries the median only).
    spreads = [None if r.get("spread") is None else float(r["spread"]) for r in records]
    with Store(db) as store:
        recorded = store.record_trials(trials, worker="import", spreads=spreads)
    duplicates = sum(r.duplicate for r in recorded)
    return len(recorded) - duplicates, duplicates

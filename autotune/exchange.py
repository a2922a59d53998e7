"""Export the best config per problem (JSON, CSV, or a plain Python module) and import it back.

* ``json``: ``{"format": "autotune-export", "version": 1, "records": [...]}``, one record per
  (problem, device) with kernel, shape, dtype, device, device_kind, compute_capability,
  driver, median_us, jax_version, software and config. :func:`import_json` reads it back.
* ``csv``: the same records, one row each (shape as ``m=..,n=..``, config as JSON).
* ``python``: a module needing nothing but Python, keyed by device as JAX's tuned block-size
  tables are: ``TUNED = {device: {(kernel, ((key, value), ...), dtype): {config}}}`` where
  ``device`` is the device name (what ``jax.devices()[0].device_kind`` says, e.g.
  ``"NVIDIA H200"``), plus a ``"default"`` table (per problem, the fastest of the devices);
  ``COMPUTE_CAPABILITY`` maps device names to their compute capability, and
  ``lookup(kernel, shape, dtype, device=None)`` takes a device name or a compute capability
  (``"9.0"``) and falls back to ``"default"``.

Interpret-mode results (functional runs on a CPU, not GPU timings) are left out unless asked
for by device (``device="interpret"`` or the interpret device's name).

Importing never replaces stored results: each record becomes an ok trial on its device
through :meth:`Store.record_trial`, which keeps the first trial of a (problem, config,
device, software). No jax here.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import JobError
from autotune.problem import Config, Problem, canonical_dtype
from autotune.queries import _device_filter, _open
from autotune.storage import Store
from autotune.trial import DeviceInfo, TrialResult

__all__ = ["FORMATS", "export_records", "render", "import_json", "import_records", "skipped_interpret"]

FORMATS = ("json", "python", "csv")
_MAGIC = "autotune-export"
_VERSION = 1
_RECORD_KEYS = "kernel, shape, dtype, device, median_us and config"


def export_records(
    db: str | None = None, *, kernel: str | None = None, device: str | None = None
) -> list[dict[str, Any]]:
    """The best stored config of every (problem, device), as JSON-ready dicts."""
    records: list[dict[str, Any]] = []
    with _open(db) as store:
        if store is None:
            return records
        name, kind = (None, None) if device is None else _device_filter(store, device)
        for summary in store.summaries(kernel=kernel, device_name=name, device_kind=kind):
            if summary.best_config is None or summary.best_trial_id is None:
                continue
            if device is None and summary.device_kind == "interpret":
                continue  # functional runs, not GPU timings: only when asked for
            trial = store.trial(summary.best_trial_id)
            if trial is None:  # deleted between the two reads
                continue
            info = trial.device
            records.append({
                "kernel": summary.problem.kernel,
                "shape": summary.problem.dims,
                "dtype": summary.problem.dtype,
                "device": summary.device,
                "device_kind": summary.device_kind,
                "compute_capability": info.compute_capability,
                "driver": info.driver,
                "median_us": summary.best_us,
                "trial_id": summary.best_trial_id,
                "jax_version": trial.software.get("jax", ""),
                "software": dict(trial.software),
                "config": dict(summary.best_config),
            })
    return records


def skipped_interpret(db: str | None = None, *, kernel: str | None = None) -> int:
    """How many (problem, interpret device) results :func:`export_records` leaves out when
    no device is asked for."""
    with _open(db) as store:
        if store is None:
            return 0
        return sum(1 for s in store.summaries(kernel=kernel, device_kind="interpret")
                   if s.best_config is not None)


def render(records: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """``records`` (from :func:`export_records`) as text in ``fmt`` (json, python or csv)."""
    if fmt == "json":
        doc = {"format": _MAGIC, "version": _VERSION, "records": list(records)}
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        fields = ["kernel", "shape", "dtype", "device", "device_kind", "median_us",
                  "jax_version", "config"]
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in records:
            writer.writerow({
                **{k: r[k] for k in fields if k not in ("shape", "config")},
                "shape": Problem(r["kernel"], r["shape"], r["dtype"]).shape_text,
                "config": json.dumps(r["config"], sort_keys=True),
            })
        return out.getvalue()
    if fmt == "python":
        return _python_module(records)
    raise JobError(f"Unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}.")


def _python_module(records: Sequence[Mapping[str, Any]]) -> str:
    tables: dict[str, dict[tuple[Any, ...], Mapping[str, Any]]] = {}
    default: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    capability: dict[str, str] = {}
    for r in records:
        key = (r["kernel"], tuple(sorted(r["shape"].items())), r["dtype"])
        table = tables.setdefault(r["device"], {})
        if key not in table or r["median_us"] < table[key]["median_us"]:
            table[key] = r
        rank = (r["device_kind"] != "gpu", r["median_us"])
        old = default.get(key)
        if old is None or rank < (old["device_kind"] != "gpu", old["median_us"]):
            default[key] = r
        if r.get("compute_capability"):
            capability[r["device"]] = str(r["compute_capability"])
    lines = [
        '"""Tuned configs exported by autotune. Plain Python: needs nothing else installed.',
        "",
        "TUNED maps a device name (jax.devices()[0].device_kind, e.g. 'NVIDIA H200') and",
        '"default" to tables of (kernel, ((shape key, value), ...) sorted, dtype) -> the best',
        "config; DETAILS maps the same keys to where and how fast it was measured.",
        '"""',
        "",
        "TUNED = {",
    ]
    named = sorted(tables) + ["default"]
    for device in named:
        table = default if device == "default" else tables[device]
        lines.append(f"    {device!r}: {{")
        for key in sorted(table, key=repr):
            lines.append(f"        {key!r}: {dict(sorted(table[key]['config'].items()))!r},")
        lines.append("    },")
    lines += ["}", "", "DETAILS = {"]
    for device in named:
        table = default if device == "default" else tables[device]
        lines.append(f"    {device!r}: {{")
        for key in sorted(table, key=repr):
            r = table[key]
            details = {"device": r["device"], "device_kind": r["device_kind"],
                       "median_us": r["median_us"], "jax_version": r["jax_version"]}
            lines.append(f"        {key!r}: {details!r},")
        lines.append("    },")
    lines += [
        "}",
        "",
        f"COMPUTE_CAPABILITY = {dict(sorted(capability.items()))!r}",
        "",
        '_ALIASES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64"}',
        "",
        "",
        "def lookup(kernel, shape, dtype, device=None):",
        '    """The tuned config of (kernel, shape mapping, dtype) as a new dict, or None.',
        "",
        "    device: a device name (jax.devices()[0].device_kind) or a compute capability such",
        '    as "9.0"; its table is tried first, then "default".',
        '    """',
        "    dtype = _ALIASES.get(dtype, dtype)",
        "    key = (kernel, tuple(sorted(dict(shape).items())), dtype)",
        "    names = [device] if device in TUNED else sorted(",
        "        name for name, cc in COMPUTE_CAPABILITY.items() if device is not None and cc == device)",
        '    for name in [*names, "default"]:',
        "        config = TUNED.get(name, {}).get(key)",
        "        if config is not None:",
        "            return dict(config)",
        "    return None",
        "",
    ]
    return "\n".join(lines)


def import_json(path: str | pathlib.Path, db: str | None = None) -> tuple[int, int]:
    """Loads a JSON export into ``db``; returns (trials added, already stored).

    Raises:
      JobError: the file is missing, not JSON, or not an autotune export.
    """
    path = pathlib.Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise JobError(
            f"cannot read {path}: {e.strerror or e}; `autotune import` reads a JSON export made "
            "by `autotune export --format json`."
        ) from None
    except json.JSONDecodeError as e:
        raise JobError(f"{path} is not JSON ({e}); `autotune import` reads a --format json export.") from None
    if not isinstance(doc, dict) or doc.get("format") != _MAGIC or not isinstance(doc.get("records"), list):
        raise JobError(f"{path} is not an autotune JSON export (made by `autotune export --format json`).")
    if doc.get("version") != _VERSION:
        raise JobError(f"{path}: export version {doc.get('version')!r} is not supported (expected {_VERSION}).")
    return import_records(doc["records"], db, where=str(path))


def import_records(
    records: Sequence[Mapping[str, Any]], db: str | None = None, *, where: str = "records"
) -> tuple[int, int]:
    """Stores exported records as ok trials; returns (added, already stored). Checks every
    record before writing any."""
    parsed = []
    for i, r in enumerate(records):
        try:
            problem = Problem(r["kernel"], r["shape"], canonical_dtype(r["dtype"]))
            config = Config(r["config"])
            median = float(r["median_us"])
            if not median > 0:
                raise ValueError(f"median_us must be positive, got {median}")
            device = DeviceInfo(str(r["device"]), str(r.get("device_kind") or "gpu"),
                                str(r.get("compute_capability") or ""), str(r.get("driver") or ""))
            software = {str(k): str(v) for k, v in dict(r.get("software") or {}).items()}
            software.setdefault("jax", str(r.get("jax_version") or ""))
        except KeyError as e:
            raise JobError(
                f"{where}: record {i} has no {e.args[0]!r}; each record needs {_RECORD_KEYS} "
                "(as `autotune export --format json` writes them). Nothing was imported."
            ) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise JobError(
                f"{where}: record {i} is malformed: {e}; each record needs {_RECORD_KEYS} "
                "(as `autotune export --format json` writes them). Nothing was imported."
            ) from None
        parsed.append((problem, config, median, device, software))
    added = duplicates = 0
    with Store(db) as store:
        for problem, config, median, device, software in parsed:
            result = TrialResult.timed([median], compile_s=None, rel_error=None, timing="imported")
            recorded = store.record_trial(problem, config, result, device=device,
                                          software=software, worker="import")
            duplicates += recorded.duplicate
            added += not recorded.duplicate
    return added, duplicates

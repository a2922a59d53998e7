"""Export the best config per problem (JSON, CSV, or a plain Python module) and import it back.

* ``json``: ``{"format": "autotune-export", "version": 1, "records": [...]}``, one record per
  (problem, device, cache policy) with kernel, shape, dtype, device, device_kind,
  compute_capability, driver, median_us, jax_version, software, config, cache_policy, spread,
  and, when a confirmation round crowned the config, confirmed (true), confirmed_speedup,
  speedup_spread and ties (the configs within the noise of the fastest).
  :func:`import_json` reads it back (a record without cache_policy is ``warm``).
* ``csv``: the same records, one row each (shape as ``m=..,n=..``, config as JSON).
* ``python``: a module needing nothing but Python: ``TUNED = {(kernel, ((key, value), ...),
  dtype): {config}}`` (one config per problem: GPU results preferred, then cold-cache ones, then
  the fastest; times of two cache policies are never compared) and
  ``lookup(kernel, shape, dtype)``.

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
from autotune.trial import CACHE_POLICIES, DeviceInfo, TrialResult

__all__ = ["FORMATS", "export_records", "render", "import_json", "import_records"]

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
            confirmation = summary.confirmation
            trial = store.trial(summary.best_trial_id)
            if trial is None:  # deleted between the two reads
                continue
            if confirmation is not None and confirmation.created_at < trial.finished_at:
                confirmation = None  # a faster config was found since: not confirmed
            median_us, config, spread = summary.best_us, dict(summary.best_config), trial.spread
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
                "jax_version": trial.software.get("jax", ""),
                "software": dict(trial.software),
                "config": config,
                "cache_policy": summary.cache_policy,
                "spread": spread,
                "confirmed": confirmation is not None,
                "confirmed_speedup": None if confirmation is None else confirmation.speedup,
                "speedup_spread": None if confirmation is None else confirmation.speedup_spread,
                "ties": [] if confirmation is None else [
                    {"config": dict(p.config), "median_us": p.median_us, "diff": p.diff}
                    for p in confirmation.tied_with_winner()
                ],
            })
    return records


def render(records: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """``records`` (from :func:`export_records`) as text in ``fmt`` (json, python or csv)."""
    if fmt == "json":
        doc = {"format": _MAGIC, "version": _VERSION, "records": list(records)}
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        fields = ["kernel", "shape", "dtype", "device", "device_kind", "median_us",
                  "jax_version", "config", "cache_policy", "spread", "confirmed",
                  "confirmed_speedup", "speedup_spread", "ties"]
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in records:
            writer.writerow({
                **{k: r.get(k) for k in fields if k not in ("shape", "config", "ties")},
                "ties": len(r.get("ties") or ()),
                "shape": Problem(r["kernel"], r["shape"], r["dtype"]).shape_text,
                "config": json.dumps(r["config"], sort_keys=True),
            })
        return out.getvalue()
    if fmt == "python":
        return _python_module(records)
    raise JobError(f"Unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}.")


def _python_module(records: Sequence[Mapping[str, Any]]) -> str:
    chosen: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in records:
        key = (r["kernel"], tuple(sorted(r["shape"].items())), r["dtype"])
        old = chosen.get(key)
        def rank(x: Mapping[str, Any]) -> tuple[bool, bool, float]:
            return (x["device_kind"] != "gpu", x.get("cache_policy", "warm") != "cold",
                    x["median_us"])

        if old is None or rank(r) < rank(old):
            chosen[key] = r
    lines = [
        '"""Tuned configs exported by autotune. Plain Python: needs nothing else installed.',
        "",
        "TUNED maps (kernel, ((shape key, value), ...) sorted, dtype) to the best config;",
        "DETAILS maps the same keys to where and how fast it was measured.",
        '"""',
        "",
        "TUNED = {",
    ]
    for key in sorted(chosen, key=repr):
        lines.append(f"    {key!r}: {dict(sorted(chosen[key]['config'].items()))!r},")
    lines += ["}", "", "DETAILS = {"]
    for key in sorted(chosen, key=repr):
        r = chosen[key]
        details = {"device": r["device"], "device_kind": r["device_kind"],
                   "median_us": r["median_us"], "jax_version": r["jax_version"],
                   "cache_policy": r.get("cache_policy", "warm"),
                   "confirmed_speedup": r.get("confirmed_speedup"),
                   "speedup_spread": r.get("speedup_spread")}
        lines.append(f"    {key!r}: {details!r},")
    lines += [
        "}",
        "",
        '_ALIASES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64"}',
        "",
        "",
        "def lookup(kernel, shape, dtype):",
        '    """The tuned config of (kernel, shape mapping, dtype) as a new dict, or None."""',
        "    dtype = _ALIASES.get(dtype, dtype)",
        "    config = TUNED.get((kernel, tuple(sorted(dict(shape).items())), dtype))",
        "    return None if config is None else dict(config)",
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
            cache = str(r.get("cache_policy") or "warm")
            if cache not in CACHE_POLICIES:
                raise ValueError(f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, got {cache!r}")
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
        parsed.append((problem, config, median, device, software, cache))
    added = duplicates = 0
    with Store(db) as store:
        for problem, config, median, device, software, cache in parsed:
            result = TrialResult.timed([median], compile_s=None, rel_error=None, timing="imported")
            recorded = store.record_trial(problem, config, result, device=device,
                                          software=software, worker="import", cache=cache)
            duplicates += recorded.duplicate
            added += not recorded.duplicate
    return added, duplicates

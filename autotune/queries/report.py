"""``autotune report``: plots of what tuning found, per problem, and an index page linking them.

For every (problem, device) with stored trials, :func:`write_report` writes into its own folder
of ``out_dir`` (default ``results/report/``):

* ``convergence.png``: each measured config's time in the order measured, the best so far as a
  step line, the baseline as a horizontal line, failed trials as marks along the bottom;
* ``importance.png``: Optuna's parameter importances on the problem's study, which is stored
  in the same database (fANOVA when scikit-learn is installed, else PED-ANOVA, which needs
  nothing more; left out, with a note, when the study is missing or has too few complete
  trials);
* ``distribution.png``: a histogram of the times of every config that ran ok;
* ``roofline.png``: achieved TFLOP/s against arithmetic intensity (the kernel's FLOP and byte
  counts) under the device's compute and memory ceilings (:data:`DEVICE_PEAKS`); a device
  without known peaks (interpret mode, an unknown GPU) gets no ceilings, and the title says so;
* ``regions.png``: per-region times from in-kernel traces, when some trial was traced;

and ``index.html``: one summary row per problem and device, and the images. Needs matplotlib
(``pip install 'autotune[report]'``); it draws with the Agg backend, off screen. No jax.

Why one piece (over 400 lines): one report: the per-problem pages, their plots and the index
share the device peaks, the Optuna study lookup and the output folder checks.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune._paths import output_dir, safe_path, write_output
from autotune.devices import PROFILES, profile_for_name
from autotune.errors import JobError, NothingTunedError
from autotune.space.outcomes import MAX_TIME_US, MIN_TIME_US, DeviceKind, plausible_us
from autotune.storage.rows import ProblemSummary, TrialRow
from autotune.storage.store import Store

__all__ = ["DEVICE_PEAKS", "DevicePeaks", "ProblemPage", "Report", "device_peaks", "write_report"]

log = logging.getLogger(__name__)

DEFAULT_OUT = "results/report"
_DPI = 110
_SIZE = (8.0, 4.6)  # inches: 880 x 506 pixels


@dataclasses.dataclass(frozen=True)
class DevicePeaks:
    """A device's dense peak compute (TFLOP/s, by input dtype) and memory bandwidth (TB/s)."""

    name: str
    tflops: Mapping[str, float] = dataclasses.field(hash=False)
    hbm_tbps: float
    source: str = ""


def _peaks(key: str) -> DevicePeaks | None:
    """A profile's peaks (:data:`autotune.devices.PROFILES`): fp8 at twice the bf16 rate, as on
    every Hopper part; float32 and float64 at the CUDA-core float32 peak."""
    facts = PROFILES[key]
    if facts.peak_bf16_tflops is None or facts.mem_bandwidth_gbs is None:
        return None
    bf16 = facts.peak_bf16_tflops
    tflops = {"bfloat16": bf16, "float16": bf16, "float8_e4m3fn": 2 * bf16, "float8_e5m2": 2 * bf16}
    if facts.peak_fp32_tflops is not None:
        tflops["float32"] = tflops["float64"] = facts.peak_fp32_tflops
    return DevicePeaks(facts.name, tflops, facts.mem_bandwidth_gbs / 1000, f"{key} datasheet profile")


# Per profile with known peaks (autotune.devices: dense tensor-core peaks from the datasheets).
DEVICE_PEAKS: tuple[tuple[str, DevicePeaks], ...] = tuple(
    (key, peaks) for key in PROFILES if (peaks := _peaks(key)) is not None
)


def device_peaks(device_name: str, device_kind: str) -> DevicePeaks | None:
    """The peaks of a stored device (the profile its name matches,
    :func:`autotune.devices.profile_for_name`), or None (interpret or fake runs, unknown
    devices)."""
    if device_kind != DeviceKind.GPU:
        return None
    key = profile_for_name(device_name)
    return dict(DEVICE_PEAKS).get(key) if key is not None else None


@dataclasses.dataclass(frozen=True)
class ProblemPage:
    """What the report holds for one problem on one device."""

    summary: ProblemSummary
    folder: str  # relative to the report's folder
    images: dict[str, str] = dataclasses.field(hash=False)  # kind -> path relative to the report
    notes: tuple[str, ...] = ()
    tflops: float | None = None
    gbps: float | None = None
    versions: str = ""


@dataclasses.dataclass(frozen=True)
class Report:
    """The index page and one :class:`ProblemPage` per problem and device."""

    index: Path
    pages: tuple[ProblemPage, ...]


def _require_matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "autotune report needs matplotlib, which is not installed: "
            "pip install 'autotune[report]' (or pip install matplotlib)."
        ) from e
    return matplotlib


def write_report(
    db: str | None = None,
    *,
    out_dir: str | Path = DEFAULT_OUT,
    kernel: str | None = None,
    allow_import: bool = False,
) -> Report:
    """Writes the plots of every stored problem (of ``kernel``) and ``index.html`` into
    ``out_dir``; returns what was written.

    ``allow_import`` lets FLOP and byte counts come from kernels stored under an import path
    (``package.module:NAME``), which means importing that module.

    Raises:
      NothingTunedError: the database holds no trials (of ``kernel``).
      ImportError: matplotlib is not installed.
    """
    _require_matplotlib()
    from autotune.queries.best import open_store, served_summaries
    from autotune.queries.outputs import check_output_dir
    from autotune.storage.urls import display_url, resolve_url

    out = check_output_dir(out_dir, flag="the report folder (--out)")
    with open_store(db) as store:
        summaries = [] if store is None else served_summaries(store, store.summaries(kernel=kernel))
        if store is None or not summaries:
            raise NothingTunedError(
                "nothing stored" + (f" for kernel {kernel}" if kernel else "")
                + f" in {display_url(resolve_url(db))}; run `autotune tune` first."
            )
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JobError(f"the report folder (--out) {str(out)!r} cannot be created: "
                           f"{e.strerror or e}.") from None
        studies = _StudyReader(store)
        pages = [_problem_page(store, s, out, studies, allow_import) for s in summaries]
    index = write_output(out / "index.html", _index_html(pages, db))  # never through a link
    return Report(index=index, pages=tuple(pages))


# --------------------------------------------------------------------------------- one problem


def _slug(text: str, limit: int = 60) -> str:
    """``text`` as a file-name part: letters, digits, ``_`` and ``-`` only, never empty."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_-")[:limit]
    return slug or "x"


def _folder_name(summary: ProblemSummary) -> str:
    import hashlib

    problem = summary.problem
    key = f"{problem.key()}|{summary.device}|{summary.device_kind}"
    if summary.cache_policy != "warm":  # warm pages keep the folders they had before
        key += f"|{summary.cache_policy}"
    tag = hashlib.sha256(key.encode())
    shape = "_".join(f"{k}{v}" for k, v in problem.dims.items())
    parts = [_slug(problem.kernel), _slug(shape), _slug(problem.dtype), _slug(summary.device, 30)]
    if summary.cache_policy != "warm":
        parts.append(_slug(summary.cache_policy))
    return "__".join(parts) + "-" + tag.hexdigest()[:8]


def _problem_page(
    store: Store, summary: ProblemSummary, out: Path, studies: _StudyReader, allow_import: bool
) -> ProblemPage:
    problem = summary.problem
    # Names come from the database: slugged, then checked, so nothing lands outside ``out``.
    folder = _folder_name(summary)
    output_dir(out, folder)  # a folder that already is a link is refused
    policy = summary.cache_policy
    rows = store.trials(problem, device_name=summary.device, device_kind=summary.device_kind,
                        cache=policy)
    interpret = summary.device_kind == DeviceKind.INTERPRET
    # The one gate on times: a stored time that is not one is never plotted.
    bad = sum(1 for r in rows if r.ok and r.median_us is not None and not plausible_us(r.median_us))
    rows = [dataclasses.replace(r, median_us=None) if r.ok and not plausible_us(r.median_us)
            else r for r in rows]
    # An interpreted kernel's wall-clock time beside a CPU XLA time would read as a speedup:
    # an interpret-mode baseline (stored by older versions) is not drawn.
    baseline = None if interpret else store.baseline(
        problem, device_name=summary.device, device_kind=summary.device_kind, cache=policy)
    title = (f"{problem.kernel} [{problem.shape_text}; {problem.dtype}] on {summary.device}, "
             f"{policy} cache")
    images: dict[str, str] = {}
    notes: list[str] = []
    if bad:
        notes.append(f"{bad} stored time(s) that are not plausible times (not positive, finite, "
                     f"from {MIN_TIME_US:g} to {MAX_TIME_US:g} us) are left out of the plots.")

    def save(kind: str, fig: Any) -> None:
        path = safe_path(out, folder, f"{kind}.png")
        buffer = io.BytesIO()
        fig.savefig(buffer, dpi=_DPI, format="png")
        write_output(path, buffer.getvalue())  # never through a link
        images[kind] = f"{folder}/{kind}.png"

    if interpret:
        notes.append(
            "Interpret mode: these are functional runs of the kernel in GPU interpret mode on a "
            "CPU. Their wall-clock times say whether a config runs and is correct, not how fast "
            "it is on a GPU: no throughput, roofline or speedup is drawn from them."
        )
    save("convergence", _convergence(rows, baseline, title))
    names = [r.study_name for r in rows if r.study_name]
    importance = studies.importances(problem, summary.device, names[-1] if names else None)
    if isinstance(importance, str):
        notes.append(f"Parameter importances: {importance}")
    else:
        save("importance", _importance(*importance, title))
    ok = [r for r in rows if r.ok and r.median_us is not None]
    if ok:
        save("distribution", _distribution(rows, baseline, title))
    counts = None if interpret else _counts(problem, allow_import)
    tflops = gbps = None
    if interpret:
        pass
    elif counts is None:
        notes.append("Roofline: the kernel's FLOP and byte counts are not known here.")
    elif ok:
        peaks = device_peaks(summary.device, summary.device_kind)
        fig, tflops, gbps = _roofline(ok, baseline, counts, peaks, problem.dtype, title)
        save("roofline", fig)
        if peaks is None:
            notes.append(f"Roofline: no ceilings, the peaks of {summary.device} are not known.")
    traced = [r for r in ok if r.traced]
    if traced:
        regions = {r.id: store.trace_regions(r.id) for r in sorted(traced, key=_time)[:3]}
        save("regions", _regions(regions, {r.id: r for r in traced}, title))
    versions = sorted({f"jax {r.software.get('jax', '?')}, jaxlib {r.software.get('jaxlib', '?')}"
                       for r in rows})
    c = summary.confirmation
    if c is not None:
        ties = list(c.tied_with_winner())
        raced = sum(1 for p in c.programs if len(p.rounds_us) < c.rounds)
        notes.append(
            f"Confirmation round ({c.rounds} interleaved rounds of {c.iterations} runs, "
            f"{len(c.programs)} configs" + (f" ({raced} raced out)" if raced else "")
            + f" and the baseline, {c.cache_policy} cache): crowned "
            f"{json.dumps(dict(c.crowned.config), sort_keys=True)} at {_fmt_us(c.crowned.median_us)}"
            + ("" if c.speedup is None else
               f", speedup {c.speedup:.3f}x ±{100 * (c.speedup_spread or 0):.1f}%")
            + (f"; tied with it within the noise: {len(ties)} config(s) "
               + "; ".join(f"{json.dumps(dict(p.config), sort_keys=True)} ({100 * p.diff:+.2f}%)"
                           for p in ties) if ties else "; no ties")
        )
    return ProblemPage(summary, folder, images, tuple(notes), tflops, gbps, "; ".join(versions))


def _time(row: TrialRow) -> float:
    return row.median_us if row.median_us is not None else math.inf


def _counts(problem: Any, allow_import: bool) -> tuple[int, int] | None:
    """(FLOPs, bytes) of one call, from the kernel; None when unknown."""
    from autotune.space.kernel import get_kernel

    try:
        kernel = get_kernel(problem.kernel, allow_import=allow_import)
        if kernel.flops is None or kernel.bytes_moved is None:
            return None
        return int(kernel.flops(problem)), int(kernel.bytes_moved(problem))
    except Exception as e:  # noqa: BLE001 - a kernel that cannot be loaded only loses a plot
        log.info("No FLOP/byte counts for %s: %s", problem, e)
        return None


class _StudyReader:
    """Parameter importances from the Optuna studies stored in the same database."""

    # Importances from fewer complete trials are noise, not a finding.
    MIN_TRIALS = 10

    def __init__(self, store: Store) -> None:
        from autotune.tuning.optuna_adapter import has_studies_table

        self._present = has_studies_table(store.engine)
        self._url = store.url
        self._storage: Any = None

    def importances(
        self, problem: Any, device: str, name: str | None = None
    ) -> tuple[dict[str, float], str, int] | str:
        """Importances by parameter, the method's name and the trials used, or why there are
        none. ``name``: the study the trials were stored under (else today's naming)."""
        if not self._present:
            return "the database holds no Optuna studies (results imported, or stored otherwise)."
        import optuna
        import sqlalchemy.exc

        from autotune.space.outcomes import DeviceInfo, DeviceKind
        from autotune.storage.store import failure_reason
        from autotune.tuning.studies import study_name

        # The study's name reads the device's name only; the kind must still be a real one.
        name = name or study_name(problem, DeviceInfo(device, DeviceKind.GPU))
        try:
            if self._storage is None:
                self._storage = optuna.storages.RDBStorage(self._url, skip_table_creation=True)
            study = optuna.load_study(study_name=name, storage=self._storage)
            complete = study.get_trials(deepcopy=False,
                                        states=(optuna.trial.TrialState.COMPLETE,))
        except KeyError:
            return f"no Optuna study named {name!r}."
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
            return f"its Optuna study could not be read ({failure_reason(e)})."
        if len(complete) < self.MIN_TRIALS:
            return (f"only {len(complete)} complete trial(s) in the study; importances need at "
                    f"least {self.MIN_TRIALS}.")
        import importlib.util
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if importlib.util.find_spec("sklearn") is not None:
                    evaluator: Any = optuna.importance.FanovaImportanceEvaluator(seed=0)
                    method = "fANOVA"
                else:
                    evaluator, method = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
                values = optuna.importance.get_param_importances(study, evaluator=evaluator)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            return f"Optuna could not compute them ({e})."
        if not values or not all(math.isfinite(v) for v in values.values()) or not any(
            values.values()
        ):
            return "every complete trial has the same parameter values (nothing to compare)."
        return dict(values), method, len(complete)


# --------------------------------------------------------------------------------- figures


def _figure(title: str, subtitle: str) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    fig.suptitle(title, fontsize=10, color="0.25")
    ax.set_title(subtitle, fontsize=12)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:,.2f} s"
    if us >= 10_000:
        return f"{us / 1000:,.1f} ms"
    return f"{us:,.1f} µs" if us >= 10 else f"{us:.2f} µs"


def _rate(value: float, unit: str) -> str:
    """``value`` (in T``unit``, e.g. TFLOP/s) with the prefix that keeps it at 1 or more."""
    for factor, prefix in ((1.0, "T"), (1e3, "G"), (1e6, "M"), (1e9, "k")):
        if value * factor >= 1:
            return f"{value * factor:,.3g} {prefix}{unit}"
    return f"{value * 1e12:.3g} {unit}"


def _legend_below(fig: Any, ax: Any) -> None:
    """The legend under the axes, where it hides no data."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize=8,
               frameon=False)


def _use_log(values: Sequence[float]) -> bool:
    return bool(values) and max(values) > 3 * min(values)


def _plain(value: float, _pos: Any = None) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _time_ticks(ax: Any, which: str, log_scale: bool) -> None:
    from matplotlib.ticker import FuncFormatter

    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_formatter(FuncFormatter(_plain))
    if log_scale:
        _log_ticks(axis, *(ax.get_ylim() if which == "y" else ax.get_xlim()))


def _log_ticks(axis: Any, lo: float, hi: float) -> None:
    """Plain-number labels on a log axis; also at 2x and 5x when it spans under 3 decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
    few = lo > 0 and hi / lo < 1000
    axis.set_minor_formatter(FuncFormatter(_plain) if few else NullFormatter())


_STATUS_COLORS = {
    "invalid": "tab:purple", "compile_error": "tab:orange", "wrong_result": "tab:red",
    "timeout": "tab:brown", "crashed": "black",
}


def _convergence(rows: Sequence[TrialRow], baseline: Any, title: str) -> Any:
    times = [r.median_us for r in rows if r.ok and r.median_us is not None]
    fig, ax = _figure(title, "Best time so far, by trial")
    xs, ys, best_x, best_y = [], [], [], []
    best = math.inf
    # x: Optuna's trial number where the trial has one (the number optuna-dashboard shows),
    # else the position in the order measured.
    numbers = [r.optuna_trial_number for r in rows if r.optuna_trial_number is not None]
    numbered = len(numbers) == len(rows)
    where = numbers if numbered else list(range(1, len(rows) + 1))
    for i, r in zip(where, rows, strict=True):
        if r.ok and r.median_us is not None:
            xs.append(i)
            ys.append(r.median_us)
            best = min(best, r.median_us)
        if best < math.inf:
            best_x.append(i)
            best_y.append(best)
    ax.scatter(xs, ys, s=18, color="tab:blue", alpha=0.45, label="a config (ok)", zorder=2)
    if best_x:
        ax.step(best_x, best_y, where="post", color="tab:blue", lw=2,
                label=f"best so far: {_fmt_us(best_y[-1])}", zorder=3)
    if baseline is not None:
        ax.axhline(baseline.median_us, color="tab:red", ls="--", lw=1.5,
                   label=f"baseline {baseline.name}: {_fmt_us(baseline.median_us)}")
    failed: dict[str, list[int]] = {}
    for i, r in zip(where, rows, strict=True):
        if not r.ok:
            failed.setdefault(r.status.value, []).append(i)
    for status, where in sorted(failed.items()):
        ax.plot(where, [0.015] * len(where), "|", ms=14, mew=2, transform=ax.get_xaxis_transform(),
                color=_STATUS_COLORS.get(status, "0.4"), label=f"{status} ({len(where)})")
    log_scale = _use_log(times + ([baseline.median_us] if baseline is not None else []))
    if log_scale:
        ax.set_yscale("log")
    ax.margins(y=0.08)
    _time_ticks(ax, "y", log_scale)
    ax.set_xlabel("Optuna trial number" if numbered else "trial, in the order measured")
    ax.set_ylabel("kernel time (µs)" + (", log scale" if log_scale else ""))
    ax.set_xlim(min(where, default=1) - 0.5, max(where, default=1) + 0.5)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not times:
        ax.text(0.5, 0.5, "no config ran ok", transform=ax.transAxes, ha="center", fontsize=12)
    ax.margins(y=0.08)
    _legend_below(fig, ax)
    return fig


def _importance(values: Mapping[str, float], method: str, trials: int, title: str) -> Any:
    fig, ax = _figure(title, f"Parameter importance for the time (Optuna {method}, {trials} trials)")
    names = list(values)[::-1]  # most important on top
    shares = [values[n] for n in names]
    bars = ax.barh(names, shares, color="tab:green", alpha=0.8)
    for bar, share in zip(bars, shares, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {share:.0%}",
                va="center", fontsize=9)
    ax.set_xlim(0, max(max(shares, default=0.0) * 1.15, 0.05))
    ax.set_xlabel("importance (normalised: all parameters sum to 100%)")
    from matplotlib.ticker import PercentFormatter

    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    return fig


def _distribution(rows: Sequence[TrialRow], baseline: Any, title: str) -> Any:
    import numpy as np

    times = [r.median_us for r in rows if r.ok and r.median_us is not None]
    failed = len(rows) - len(times)
    fig, ax = _figure(title, f"Times of the {len(times)} configs that ran ok"
                      + (f" ({failed} other trial{'s' if failed > 1 else ''} failed)" if failed else ""))
    log_scale = _use_log(times + ([baseline.median_us] if baseline is not None else []))
    lo, hi = min(times), max(times)
    bins_n = int(min(40, max(5, math.sqrt(len(times)) * 2)))
    if lo == hi:
        bins = np.linspace(lo * 0.95, hi * 1.05, 6)
    elif log_scale:
        bins = np.geomspace(lo * 0.98, hi * 1.02, bins_n + 1)
    else:
        bins = np.linspace(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo), bins_n + 1)
    ax.hist(times, bins=bins, color="tab:blue", alpha=0.75, edgecolor="white")
    ax.axvline(lo, color="tab:green", lw=2, label=f"best: {_fmt_us(lo)}")
    ax.axvline(float(np.median(times)), color="0.3", ls=":", lw=1.5,
               label=f"median: {_fmt_us(float(np.median(times)))}")
    if baseline is not None:
        ax.axvline(baseline.median_us, color="tab:red", ls="--", lw=1.5,
                   label=f"baseline {baseline.name}: {_fmt_us(baseline.median_us)}")
    if log_scale:
        ax.set_xscale("log")
    _time_ticks(ax, "x", log_scale)
    ax.set_xlabel("kernel time (µs)" + (", log scale" if log_scale else ""))
    ax.set_ylabel("configs")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _legend_below(fig, ax)
    return fig


def _roofline(
    ok: Sequence[TrialRow],
    baseline: Any,
    counts: tuple[int, int],
    peaks: DevicePeaks | None,
    dtype: str,
    title: str,
) -> tuple[Any, float, float]:
    import numpy as np

    flops, nbytes = counts
    intensity = flops / nbytes  # FLOP per byte
    achieved = sorted(flops / r.median_us / 1e6 for r in ok if r.median_us)  # TFLOP/s
    best_tflops = achieved[-1]
    best_us = flops / best_tflops / 1e6
    best_gbps = nbytes / best_us / 1e3
    peak_tflops = None if peaks is None else peaks.tflops.get(dtype)
    base_tflops = None if baseline is None else flops / baseline.median_us / 1e6
    # Interpret-mode runs reach MFLOP/s: the axis takes the unit that fits.
    low = min(achieved[0], base_tflops or achieved[0])
    scale, unit = next(((f, u) for f, u in ((1.0, "TFLOP/s"), (1e3, "GFLOP/s"), (1e6, "MFLOP/s"))
                        if low * f >= 0.5), (1e9, "kFLOP/s"))
    subtitle = f"Roofline: achieved {unit} at the kernel's arithmetic intensity"
    if peaks is None:
        subtitle += "\n(no ceilings: this device's peak compute and bandwidth are not known)"
    elif peak_tflops is None:
        subtitle += f"\n(no compute ceiling for {dtype} on {peaks.name})"
    fig, ax = _figure(title, subtitle)
    ax.set_xscale("log")
    ax.set_yscale("log")
    x_lo, x_hi = intensity / 30, intensity * 30
    if peaks is not None:
        ridge = (peak_tflops or 0) / peaks.hbm_tbps
        if ridge:
            x_lo, x_hi = min(x_lo, ridge / 10), max(x_hi, ridge * 10)
        xs = np.geomspace(x_lo, x_hi, 200)
        memory = xs * peaks.hbm_tbps  # FLOP/byte x TB/s = TFLOP/s
        roof = np.minimum(memory, peak_tflops) if peak_tflops else memory
        ax.plot(xs, roof * scale, color="0.2", lw=2,
                label=f"{peaks.name}: {peaks.hbm_tbps:g} TB/s HBM"
                + (f", {peak_tflops:g} TFLOP/s dense {dtype}" if peak_tflops else ""))
    ax.vlines(intensity, achieved[0] * scale, achieved[-1] * scale, color="tab:blue", lw=6,
              alpha=0.35, label=f"all {len(achieved)} ok configs")
    text = f"best: {_rate(best_tflops, 'FLOP/s')}, {_rate(best_gbps / 1e3, 'B/s')}"
    if peaks is not None:
        parts = [f"{best_gbps / 1e3 / peaks.hbm_tbps:.0%} of HBM bandwidth"]
        if peak_tflops:
            parts.insert(0, f"{best_tflops / peak_tflops:.0%} of peak compute")
        text += "\n(" + ", ".join(parts) + ")"
    ax.plot([intensity], [best_tflops * scale], "*", ms=16, color="tab:green", label=text, zorder=4)
    if base_tflops is not None:
        ax.plot([intensity], [base_tflops * scale], "D", ms=8, color="tab:red", zorder=4,
                label=f"baseline {baseline.name}: {_rate(base_tflops, 'FLOP/s')}")
    ax.set_xlim(x_lo, x_hi)
    ys = [achieved[0], achieved[-1]] + [v for v in (peak_tflops, base_tflops) if v]
    ax.set_ylim(min(ys) * scale / 5, max(ys) * scale * 3)
    _log_ticks(ax.xaxis, x_lo, x_hi)
    _log_ticks(ax.yaxis, *ax.get_ylim())
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved), log scale")
    ax.set_ylabel(f"achieved {unit}, log scale")
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    return fig, best_tflops, best_gbps


def _regions(regions: Mapping[int, Sequence[Any]], rows: Mapping[int, TrialRow], title: str) -> Any:
    import numpy as np

    names = sorted({r.region for stats in regions.values() for r in stats},
                   key=lambda n: -max((r.median_us for s in regions.values() for r in s
                                       if r.region == n), default=0.0))
    fig, ax = _figure(title, "In-kernel trace: time per region (median over warpgroups)")
    height = 0.8 / max(len(regions), 1)
    y = np.arange(len(names))
    for i, (trial_id, stats) in enumerate(regions.items()):
        by_name = {r.region: r for r in stats}
        values = [by_name[n].median_us if n in by_name else 0.0 for n in names]
        row = rows[trial_id]
        label = f"trial {trial_id} ({_fmt_us(row.median_us or 0.0)} total)"
        bars = ax.barh(y + i * height - 0.4 + height / 2, values, height=height * 0.95, label=label)
        for bar, n in zip(bars, names, strict=True):
            if n in by_name:
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                        f" {_fmt_us(by_name[n].median_us)} ×{by_name[n].count}",
                        va="center", fontsize=8)
    ax.set_yticks(y, [n if len(n) <= 30 else n[:28] + "…" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("region time (µs); ×N: occurrences traced")
    ax.set_xlim(0, max((r.median_us for s in regions.values() for r in s), default=1.0) * 1.3)
    ax.grid(False, axis="y")
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    return fig


# --------------------------------------------------------------------------------- index.html


def _cell(value: Any) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _index_html(pages: Sequence[ProblemPage], db: str | None) -> str:
    # here: the module's imports are shared
    from autotune.queries.best import choice_words, verdict_figures
    from autotune.storage.rows import PROGRAM_CHECK

    head = ["kernel", "shape", "dtype", "device", "cache", "trials", "best", "baseline", "speedup",
            "runs", "ties", "compute", "bandwidth", "measured with", "best config", "plots"]
    rows = []
    for page in pages:
        s = page.summary
        trials = ", ".join(f"{k} {v}" for k, v in sorted(s.by_status.items()))
        interpret = s.device_kind == DeviceKind.INTERPRET
        baseline = ("-" if s.baseline_us is None or interpret
                    else f"{s.baseline_name} {_fmt_us(s.baseline_us)}")
        links = " ".join(
            f'<a href="{html.escape(path)}">{html.escape(kind)}</a>'
            for kind, path in page.images.items()
        )
        config = "-" if s.best_config is None else json.dumps(s.best_config, sort_keys=True)
        c = s.confirmation
        best_us, speedup, ties = s.best_us, "-" if s.speedup is None else f"{s.speedup:.3g}x", "-"
        runs = "-" if interpret else choice_words(s.best_config, None, None, None, None)
        if c is not None:
            best_us = c.crowned.median_us
            config = json.dumps(dict(c.crowned.config), sort_keys=True)
            ties = str(len(c.tied_with_winner()))
            if c.baseline_median_us is not None and not interpret:
                baseline = f"{c.baseline_name} {_fmt_us(c.baseline_median_us)}"
            if c.speedup is not None:
                speedup = f"{c.speedup:.3g}x ±{100 * (c.speedup_spread or 0):.1f}% (confirmed)"
            if not interpret:  # which implementation the program runs (issue 35): the
                # program check's verdict where there is one, else the confirmation's
                verdict = verdict_figures(s)
                runs = choice_words(c.crowned.config, verdict.speedup, verdict.low, verdict.high,
                                    c.baseline_name, verdict.other)
                if verdict.source == PROGRAM_CHECK:
                    runs += " (as a program calls them)"
        rows.append(
            f'<tr><td><a href="#{html.escape(page.folder)}">{html.escape(s.problem.kernel)}</a></td>'
            + _cell(s.problem.shape_text) + _cell(s.problem.dtype)
            + _cell(s.device) + _cell(s.cache_policy) + _cell(trials)
            + _cell("-" if best_us is None else _fmt_us(best_us)) + _cell(baseline)
            + _cell("-" if interpret else speedup) + _cell(runs) + _cell(ties)
            + _cell("-" if page.tflops is None else _rate(page.tflops, "FLOP/s"))
            + _cell("-" if page.gbps is None else _rate(page.gbps / 1e3, "B/s"))
            + _cell(page.versions)
            + f'<td class="config">{html.escape(config)}</td>'
            + f"<td>{links}</td></tr>"
        )
    sections = []
    for page in pages:
        s = page.summary
        anchor = html.escape(page.folder)
        images = "".join(
            f'<a href="{html.escape(path)}"><img src="{html.escape(path)}" alt="{html.escape(kind)}"></a>'
            for kind, path in page.images.items()
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in page.notes)
        sections.append(
            f'<section id="{anchor}"><h2>{html.escape(str(s.problem))} on {html.escape(s.device)}</h2>'
            + (f"<ul>{notes}</ul>" if notes else "") + f'<div class="plots">{images}</div></section>'
        )
    from autotune.storage.urls import display_url, resolve_url

    source = html.escape(display_url(resolve_url(db)))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autotune report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; }}
td.config {{ font-family: monospace; font-size: 0.8em; max-width: 28em; word-break: break-all; }}
.plots img {{ width: 49%; min-width: 420px; margin: 0.2em 0; }}
</style></head><body>
<h1>autotune report</h1>
<p>{len(pages)} problem(s) and device(s) from {source}. Times are the median of each
config's timed runs; speedup is the baseline's time over the best time. Cache: cold (the L2
flushed before every timed run) or warm (runs back to back); the two are never compared. Where
a confirmation round ran, the best config, its time, the baseline and the speedup are the
round's (interleaved re-timing; the speedup is the median per-round ratio, ± half its range),
and ties counts the configs tied with the best one (within the measured noise). Runs: which
implementation <code>autotune.tuned(baseline=...)</code> runs for the problem, the baseline where
the confirmed speedup's whole interval lies below 1.0, else the kernel with its best config.</p>
<table><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
{chr(10).join(sections)}
</body></html>
"""

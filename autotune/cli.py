"""The ``autotune`` command line. Library code does not print; this module does.

    autotune spaces [KERNEL --shape k=v,... --dtype D [--sample N] [--json]]
    autotune tune JOB.toml [--db URL] [--trials N] [--time-budget S] [--patience N] [--sampler NAME]
                           [--device auto|gpu|interpret]
    autotune best KERNEL --shape k=v,... --dtype D [--device NAME] [--db URL] [--json]
    autotune results [--kernel K] [--dtype D] [--device NAME] [--db URL] [--json]
    autotune check KERNEL --shape k=v,... --dtype D [--sample N] [--allow-import]
    autotune export [--format json|python|csv] [--kernel K] [--device D] [--db URL] [--out FILE]
    autotune import FILE [--db URL]
    autotune revalidate [--kernel K] [--db URL] [--device auto|gpu|interpret] [--top N]
    autotune report [--kernel K] [--db URL] [--out DIR]

Exit codes: 0 success; 1 nothing tuned (``best``) or configs failed (``check``); 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, NothingTunedError

__all__ = ["main"]

EXIT_OK, EXIT_NOTHING, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep its message short
        self.print_usage(sys.stderr)
        print(f"autotune: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description="Autotuner for JAX Pallas Mosaic GPU kernels.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("spaces", help="list bundled kernels, or count and sample a space")
    s.add_argument("kernel", nargs="?")
    s.add_argument("--shape", help="k=v,k=v (e.g. m=4096,n=4096,k=4096)")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--sample", type=int, default=5, metavar="N", help="valid configs to show")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.add_argument("--allow-import", action="store_true", help="allow KERNEL as package.module:NAME")

    t = sub.add_parser("tune", help="run a job file (resumable)")
    t.add_argument("job")
    t.add_argument("--db", help="SQLAlchemy URL (default $AUTOTUNE_DB or sqlite:///results/autotune.db)")
    t.add_argument("--trials", type=int, help="override every problem's trial budget")
    t.add_argument("--time-budget", type=float, metavar="SECONDS", help="override the time budget per problem")
    t.add_argument("--patience", type=int, metavar="N",
                   help="stop a problem early after N measured configs in a row without a better one "
                        "(0: never; default: the job's, else 24)")
    t.add_argument("--sampler", help="override the sampler (auto, ranked, tpe, random, cmaes, gp, qmc, brute)")
    t.add_argument("--device", default="auto", choices=("auto", "gpu", "interpret"))
    t.add_argument("--gpus", help="'all' or a list like 0,1 (one measuring worker per GPU)")
    t.add_argument("--results-dir", default="results", help="where traces and reports go")
    t.add_argument("--allow-import", action="store_true", help="allow kernels named package.module:NAME")

    b = sub.add_parser("best", help="the best stored config of a problem")
    b.add_argument("kernel")
    b.add_argument("--shape", required=True)
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--device", help="a device name, or gpu / interpret")
    b.add_argument("--db")
    b.add_argument("--json", action="store_true")

    r = sub.add_parser("results", help="what the database holds, per problem")
    r.add_argument("--kernel")
    r.add_argument("--dtype")
    r.add_argument("--device")
    r.add_argument("--db")
    r.add_argument("--json", action="store_true")

    c = sub.add_parser("check", help="cross-lower a sample of a space for CUDA, on this CPU")
    c.add_argument("kernel")
    c.add_argument("--shape", required=True)
    c.add_argument("--dtype", default="bfloat16")
    c.add_argument("--sample", type=int, default=32, metavar="N")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--allow-import", action="store_true")

    e = sub.add_parser("export", help="write the best config per problem (json, python or csv)")
    e.add_argument("--format", default="json", choices=("json", "python", "csv"))
    e.add_argument("--kernel")
    e.add_argument("--device", help="a device name, or gpu / interpret")
    e.add_argument("--db")
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout")

    i = sub.add_parser("import", help="load a json export into a database (keeps existing results)")
    i.add_argument("file")
    i.add_argument("--db")

    v = sub.add_parser("revalidate", help="re-measure stored winners of other jax/jaxlib versions")
    v.add_argument("--kernel")
    v.add_argument("--db")
    v.add_argument("--device", default="auto", choices=("auto", "gpu", "interpret"))
    v.add_argument("--top", type=int, default=3, metavar="N", help="stale configs per problem")
    v.add_argument("--allow-import", action="store_true")

    o = sub.add_parser("report", help="plots per problem and an index.html (needs matplotlib)")
    o.add_argument("--kernel")
    o.add_argument("--db")
    o.add_argument("--out", default="results/report", metavar="DIR")
    o.add_argument("--allow-import", action="store_true", help="FLOP counts of import-path kernels")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
    handler = {"spaces": _spaces, "tune": _tune, "best": _best, "results": _results, "check": _check,
               "export": _export, "import": _import, "revalidate": _revalidate, "report": _report}
    try:
        return handler[args.command](args)
    except NothingTunedError as e:
        print(f"autotune: {e}", file=sys.stderr)
        return EXIT_NOTHING
    except (AutotuneError, ValueError) as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("autotune: interrupted; finished trials are stored, re-run to resume.", file=sys.stderr)
        return 130


# ---------------------------------------------------------------------------------------------


def _problem(args: argparse.Namespace) -> tuple[Any, Any]:
    from autotune.errors import JobError
    from autotune.kernel import get_kernel
    from autotune.problem import parse_shape

    kernel = get_kernel(args.kernel, allow_import=getattr(args, "allow_import", False))
    if not args.shape:
        raise JobError(f"--shape is required with a kernel; {kernel.name} takes keys {', '.join(kernel.shape_keys)}.")
    return kernel, kernel.problem(parse_shape(args.shape), args.dtype)


def _spaces(args: argparse.Namespace) -> int:
    from autotune.kernel import bundled_kernels, get_kernel

    if args.kernel is None:
        for name in bundled_kernels():
            kernel = get_kernel(name)
            print(f"{name}\t{', '.join(kernel.shape_keys)}\t{', '.join(kernel.dtypes)}\t{kernel.description}")
        return EXIT_OK
    if args.sample < 0:
        raise ValueError(f"--sample must be 0 or more, got {args.sample}.")
    kernel, problem = _problem(args)
    space = kernel.valid_space(problem)
    configs = space.sample(args.sample, seed=args.seed)
    if args.json:
        print(json.dumps({
            "kernel": kernel.name,
            "shape": problem.dims,
            "dtype": problem.dtype,
            "valid": space.count(),
            "raw": space.raw_count,
            "configs": [dict(c) for c in configs],
        }))
        return EXIT_OK
    print(f"{problem}: {space.count()} valid of {space.raw_count} raw configs")
    print("\n".join(space.describe()))
    for c in configs:
        print("  " + json.dumps(dict(c)))
    return EXIT_OK


def _tune(args: argparse.Namespace) -> int:
    from autotune.api import open_engine
    from autotune.errors import JobError
    from autotune.jobs import MAX_TRIALS, Budget, load_job
    from autotune.storage import Store
    from autotune.tuner import require_persistent, run_job

    job = load_job(args.job, allow_import=args.allow_import)
    if args.trials is not None and not 0 < args.trials <= MAX_TRIALS:
        raise JobError(f"--trials must be a positive whole number up to {MAX_TRIALS}, got {args.trials}.")
    if args.time_budget is not None and not 0 < args.time_budget < float("inf"):
        raise JobError(f"--time-budget must be a positive, finite number of seconds, got {args.time_budget}.")
    if args.patience is not None and args.patience < 0:
        raise JobError(f"--patience must be a whole number of trials, 0 or more (0: never stop early), "
                       f"got {args.patience}.")
    if args.sampler is not None:
        from autotune.sampling import SAMPLERS

        if args.sampler not in SAMPLERS:
            raise JobError(f"--sampler {args.sampler!r} is unknown; expected one of {', '.join(SAMPLERS)}.")
    specs = []
    for spec in job.problems:
        budget = spec.budget
        if args.trials is not None or args.time_budget is not None:
            budget = Budget(
                trials=args.trials if args.trials is not None else (budget.trials if args.time_budget is None else None),
                seconds=args.time_budget if args.time_budget is not None else budget.seconds,
                patience=budget.patience,
            )
        if args.patience is not None:
            budget = dataclasses.replace(budget, patience=args.patience or None)
        specs.append(dataclasses.replace(spec, budget=budget, sampler=args.sampler or spec.sampler))
    job = dataclasses.replace(job, problems=tuple(specs))
    gpus = _parse_gpus(args.gpus)
    store = Store(args.db)
    progress = _Progress()
    try:
        require_persistent(store)  # before the engine writes its logs under --results-dir
        log_dir = str(Path(args.results_dir) / "logs" / time.strftime("%Y%m%d-%H%M%S"))
        with open_engine(args.device, gpus=gpus, allow_import=args.allow_import, log_dir=log_dir) as engine:
            reports = run_job(job, store=store, engine=engine, results_dir=args.results_dir,
                              on_event=progress, allow_import=args.allow_import)
    finally:
        progress.close()
        store.close()
    _print_reports(reports)
    for r in reports:
        if r.invalid:
            shape = ",".join(f"{k}={v}" for k, v in r.problem.dims.items())
            flag = " --allow-import" if ":" in r.problem.kernel else ""
            print(f"{r.problem}: {r.invalid} config(s) did not lower (stored as invalid, never "
                  f"proposed again): its space is missing a rule. Each stored error names it; "
                  f"`autotune check {r.problem.kernel} --shape {shape} --dtype {r.problem.dtype}"
                  f"{flag}` finds it before spending GPU time.")
    return EXIT_OK


def _parse_gpus(text: str | None) -> list[int] | None:
    from autotune.errors import JobError

    if text is None:
        return None
    if text == "all":
        import os

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            return [int(x) for x in visible.split(",") if x.strip().isdigit()]
        from autotune.api import count_gpus

        return list(range(count_gpus()))
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise JobError(f"--gpus must be 'all' or ids like 0,1; got {text!r}.") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise JobError(f"--gpus must list distinct non-negative ids like 0,1; got {text!r}.")
    return ids


class _Progress:
    """One line per problem, redrawn in place on a terminal."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._open = False

    def __call__(self, event: Any) -> None:
        total = event.total if event.total is not None else "?"
        best = f"{event.best_us:.1f} us" if event.best_us is not None else "-"
        bar = ""
        if isinstance(event.total, int) and event.total > 0:
            filled = min(20, int(20 * event.done / event.total))
            bar = "[" + "#" * filled + "." * (20 - filled) + "] "
        line = f"{event.problem}: {bar}{event.done}/{total} best {best}"
        if event.kind in ("skip", "done"):
            line += f" ({event.message})" if event.message else ""
            self._write(line, end=True)
        elif self._tty:
            self._write(line, end=False)

    def _write(self, line: str, *, end: bool) -> None:
        if self._tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if end else ""))
        elif end:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self._open = not end

    def close(self) -> None:
        if self._open:
            sys.stderr.write("\n")
            self._open = False


def _print_reports(reports: Sequence[Any]) -> None:
    header = ["problem", "device", "best us", "TFLOP/s", "GB/s", "baseline us", "speedup", "trials", "invalid", "stop"]
    rows = []
    for r in reports:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.by_status.items()))
        rows.append([
            str(r.problem),
            r.device,
            _num(r.best_us, ".1f"),
            _num(r.tflops, ".0f"),
            _num(r.gbps, ".0f"),
            _num(r.baseline_us, ".1f") + (f" ({r.baseline_name})" if r.baseline_name else ""),
            _num(r.speedup, ".3f"),
            statuses or "-",
            str(r.invalid),
            r.stop_reason or "-",
        ])
    _table(header, rows)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def _best(args: argparse.Namespace) -> int:
    from autotune.problem import Problem, parse_shape
    from autotune.queries import best_result

    shape = parse_shape(args.shape)
    problem = Problem(args.kernel, shape, args.dtype)  # validates the dtype; never imports jax
    result = best_result(args.kernel, shape, problem.dtype, device=args.device, db=args.db)
    if result is None:
        raise NothingTunedError(
            f"nothing tuned for {problem}"
            + (f" on {args.device}" if args.device else "")
            + f"; run `autotune tune` with a job listing it (db: {args.db or 'default'})."
        )
    if args.json:
        print(json.dumps(result.to_dict(), default=str))
    else:
        print(f"{problem} on {result.device}: {result.median_us:.1f} us")
        if result.stale:
            print(f"  measured with jax {result.jax_version}, jaxlib {result.jaxlib_version}, not the "
                  "running versions: `autotune revalidate` re-measures it")
        if result.baseline_us:
            print(f"  baseline {result.baseline_name}: {result.baseline_us:.1f} us (speedup {result.baseline_us / result.median_us:.3f})")
        print("  config: " + json.dumps(result.config))
    return EXIT_OK


def _results(args: argparse.Namespace) -> int:
    from autotune.queries import list_results

    rows = list_results(args.db, kernel=args.kernel, dtype=args.dtype, device=args.device)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], default=str))
        return EXIT_OK
    if not rows:
        print("no results stored" + (f" for kernel {args.kernel}" if args.kernel else ""))
        return EXIT_OK
    header = ["problem", "device", "trials", "best us"]
    table = [[r.problem_text, r.device, ", ".join(f"{k} {v}" for k, v in sorted(r.by_status.items())),
              _num(r.best_us, ".1f")] for r in rows]
    _table(header, table)
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from autotune.errors import JobError
    from autotune.exchange import export_records, render

    text = render(export_records(args.db, kernel=args.kernel, device=args.device), args.format)
    if args.out is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(args.out).write_text(text)
    except OSError as e:
        raise JobError(
            f"--out {args.out!r} cannot be written ({e.strerror or e}); give a file in an existing, "
            "writable folder."
        ) from None
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    from autotune.exchange import import_json

    added, kept = import_json(args.file, args.db)
    print(f"imported {added} trial(s); {kept} already stored (kept unchanged)")
    return EXIT_OK


def _revalidate(args: argparse.Namespace) -> int:
    from autotune.api import open_engine
    from autotune.revalidate import revalidate
    from autotune.storage import Store

    if args.top < 1:
        raise ValueError(f"--top must be 1 or more, got {args.top}.")
    with Store(args.db) as store, open_engine(args.device, allow_import=args.allow_import) as engine:
        reports = revalidate(store, engine, kernel=args.kernel, top=args.top)
    if not reports:
        print("nothing to revalidate: every stored winner on this device was measured with the "
              "running jax/jaxlib")
        return EXIT_OK
    header = ["problem", "device", "old us", "old jax", "new us", "ratio", "winner", "changed"]
    rows = []
    for r in reports:
        old = r.old_winner
        holds = "holds" if r.holds else (
            "-" if r.winner is None else f"now {json.dumps(dict(r.winner))} {_num(r.winner_us, '.1f')} us")
        rows.append([str(r.problem), r.device, f"{old.old_us:.1f}", old.old_software.get("jax", "?"),
                     _num(old.new_us, ".1f") if old.result.ok else old.result.outcome.value,
                     _num(old.ratio, ".3f"), holds, "yes" if r.changed else "no"])
    _table(header, rows)
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from autotune.report import write_report

    try:
        report = write_report(args.db, out_dir=args.out, kernel=args.kernel,
                              allow_import=args.allow_import)
    except ImportError as e:  # matplotlib missing: the message names the extra to install
        print(f"autotune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    images = sum(len(p.images) for p in report.pages)
    print(f"wrote {images} plot(s) of {len(report.pages)} problem(s); open {report.index}")
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    from autotune.checking import check_space

    kernel, problem = _problem(args)
    report = check_space(kernel, problem, sample=args.sample, seed=args.seed)
    print(f"{problem}: cross-lowered {report.checked} of {report.valid} valid configs for CUDA: "
          f"{report.ok} ok, {len(report.failures)} failed")
    for f in report.failures:
        last = f.error.splitlines()[-1] if f.error else ""
        print(f"  FAIL {json.dumps(dict(f.config))}\n    {last if last.startswith(f.error_type) else f'{f.error_type}: {last}'}")
        if f.suggestion:
            print(f"    missing rule? {f.suggestion}")
        if f.rule:
            print(f"    excluded by: {f.rule}")
    rules = list(dict.fromkeys(f.rule for f in report.failures if f.rule))
    if rules:
        print(f"The space is missing {len(rules)} rule(s); each excludes its failures and no config "
              "that lowered. Add to the space's constraints (autotune exports the names):")
        for rule in rules:
            print(f"  {rule}")
    return EXIT_OK if not report.failures else EXIT_NOTHING


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

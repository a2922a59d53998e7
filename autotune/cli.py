# PYTHON_ARGCOMPLETE_OK
"""The ``autotune`` command line. Library code does not print; this module does.

    autotune [-v] [-q] [--db URL] COMMAND ...     (-v, -q and --db are accepted after COMMAND too)
    autotune spaces [KERNEL --shape k=v,... --dtype D [--sample N]] [--json]
    autotune tune JOB.toml [--trials N] [--time-budget S] [--patience N] [--effort quick|full]
                           [--sampler NAME] [--device auto|gpu|interpret] [--dry-run] [--jsonl]
                           [--workers-per-gpu N] [--compile-threads N]
    autotune status JOB.toml [--json]
    autotune best KERNEL --shape k=v,... --dtype D [--device NAME] [--json]
    autotune results [--kernel K] [--dtype D] [--device NAME] [--json]
    autotune check KERNEL --shape k=v,... --dtype D [--sample N] [--allow-import] [--json]
    autotune export [--format json|python|csv] [--kernel K] [--device D] [--out FILE]
    autotune import FILE
    autotune revalidate [--kernel K] [--device auto|gpu|interpret] [--top N] [--json]
    autotune report [--kernel K] [--out DIR]
    autotune verify [--kernel K] [--device auto|gpu|interpret] [--rounds N] [--calls N]
                    [--others N] [--json]

Exit codes: 0 success; 1 nothing tuned (``best``, ``report``; ``revalidate`` and ``verify`` on a
missing database) or configs failed (``check``);
2 bad input, a database that cannot be used, or output that cannot be written (``> /dev/full``);
3 a ``tune`` job ran to its end but some trials crashed (stored as crashed; the
last line says how many and where the worker logs are); 130 Ctrl-C (SIGINT); 143 SIGTERM
(see :mod:`autotune.interrupts`); 141 the reader of the
output went away (``autotune spaces | head -1``): like a Unix tool killed by SIGPIPE, quietly.
70 an internal error (a bug): one line naming the file that holds its traceback.

Output never shows a database password (:func:`autotune.storage.urls.display_url`) nor raw control
characters from the database; docs/guarantees.md lists what is checked where.

Why one piece (over 400 lines): the argument parser and one small handler per command; the
handlers share the output conventions (the database named once, masked URLs, exit codes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from autotune._paths import default_results_dir
from autotune.errors import AutotuneError, JobError, NothingTunedError, did_you_mean
from autotune.space.outcomes import DeviceKind
from autotune.tuning.budgets import EFFORTS  # the --effort presets, re-exported

if TYPE_CHECKING:
    from autotune.engine.protocol import EngineLike
    from autotune.interrupts import Handler
    from autotune.storage.store import Store

__all__ = ["main", "EXIT_OK", "EXIT_NOTHING", "EXIT_USAGE", "EXIT_CRASHED", "EXIT_PIPE", "EXIT_BUG", "EFFORTS"]

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_CRASHED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_PIPE = 130, 141  # 128 + SIGINT, 128 + SIGPIPE, as a shell reports them
EXIT_BUG = 70  # EX_SOFTWARE (sysexits.h): an internal error, a bug in autotune

INTERPRET_NOTE = (
    "interpret: functional runs in GPU interpret mode on a CPU (one checked run per config); "
    "their wall-clock times are not GPU timings (no TFLOP/s, GB/s or speedup). best/export/the "
    "lookup answer with them on a machine without a GPU, and elsewhere only when asked for "
    "with --device interpret."
)
EXIT_SIGINT = EXIT_INTERRUPTED  # SIGTERM exits 143 (autotune.interrupts)
MAX_SAMPLE = 10_000  # `spaces --sample`: configs printed
MAX_CHECK_SAMPLE = 1_000  # `check --sample`: configs cross-lowered (about a second each)


def _printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``), so stored strings cannot drive the
    terminal; newlines and tabs are escaped too inside one table cell or line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _say(text: str, *, file: Any = None) -> None:
    """Prints a message: URL passwords masked, control characters escaped (line by line)."""
    from autotune.storage.urls import mask_text

    lines = mask_text(text).split("\n")
    print("\n".join(_printable(line) for line in lines), file=file or sys.stdout)


_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _MaskingFormatter(logging.Formatter):
    """Log lines never show a database password."""

    def format(self, record: logging.LogRecord) -> str:
        from autotune.storage.urls import mask_text

        return mask_text(super().format(record))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep its message short
        import re

        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)", message)
        if choice:  # an unknown command or choice: name the closest one too
            allowed = re.findall(r"'?([^,' ]+)'?", choice.group(2))
            message += did_you_mean(choice.group(1), allowed)
        self.print_usage(sys.stderr)
        print(f"autotune: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _version() -> str:
    from importlib import metadata

    from autotune import __version__
    from autotune._jax_compat import installed_versions

    parts = [f"{k} {v}" for k, v in installed_versions().items()]
    try:
        parts.append(f"optuna {metadata.version('optuna')}")
    except metadata.PackageNotFoundError:  # pragma: no cover - a dependency
        pass
    parts.append(f"python {sys.version.split()[0]}")
    return f"autotune {__version__} ({', '.join(parts)})"


DB_HELP = ("SQLAlchemy URL or SQLite file (default: $AUTOTUNE_DB, else sqlite:///results/autotune.db "
           "relative to the working directory)")


def _globals(parser: argparse.ArgumentParser, *, db: bool, top: bool = False) -> None:
    """The options accepted before and after the command. After it they default to SUPPRESS,
    so an option given before the command is not reset by the command's parser."""
    default: Callable[[Any], Any] = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    g = parser.add_argument_group("global options")
    g.add_argument("-v", "--verbose", action="store_true", default=default(False), help="log what happens")
    g.add_argument("-q", "--quiet", action="store_true", default=default(False),
                   help="print results only: no progress, no database line")
    if db:
        g.add_argument("--db", metavar="URL", default=default(None), help=DB_HELP)


# The commands that open Optuna studies (tune, and status, report and revalidate, which read them).
_OPTUNA_COMMANDS = frozenset({"tune", "status", "report", "revalidate"})


class _VersionAction(argparse.Action):
    """``--version``: the versions are read (package metadata) only when it is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(_version())
        parser.exit()


def _device_profile(parser: argparse.ArgumentParser) -> None:
    from autotune.devices import DEFAULT_PROFILE, PROFILE_ENV_VAR, PROFILES

    parser.add_argument(
        "--device-profile", metavar="NAME",
        help=f"the device to work for where no GPU can be asked (cross-lowering, interpret mode): "
             f"{', '.join(PROFILES)} (default: ${PROFILE_ENV_VAR}, else {DEFAULT_PROFILE}); a GPU "
             "the driver reports is always used as it is")


def _parser() -> argparse.ArgumentParser:
    # Names only (a static list): the parser is built without importing Optuna or numpy.
    from autotune.tuning.names import SAMPLERS

    p = _Parser(prog="autotune", description="Autotuner for JAX Pallas Mosaic GPU kernels.",
                epilog="The database: --db, else $AUTOTUNE_DB, else results/autotune.db under the "
                       "working directory. Exit codes: 0 ok, 1 nothing tuned / check failed, "
                       "2 bad input, 3 trials crashed, 130 interrupted, 141 broken pipe.")
    p.add_argument("--version", action=_VersionAction)
    _globals(p, db=True, top=True)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("spaces", help="list bundled kernels, or count and sample a space")
    s.add_argument("kernel", nargs="?")
    s.add_argument("--shape", help="k=v,k=v (e.g. m=4096,n=4096,k=4096)")
    s.add_argument("--dtype", default="bfloat16", help="input dtype (default: bfloat16)")
    s.add_argument("--sample", type=int, default=5, metavar="N",
                   help=f"valid configs to show (default: 5, at most {MAX_SAMPLE})")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--allow-import", action="store_true", help="allow KERNEL as package.module:NAME")
    _device_profile(s)
    _globals(s, db=False)

    t = sub.add_parser("tune", help="run a job file (resumable)")
    t.add_argument("job")
    t.add_argument("--trials", type=int, help="override every problem's trial budget")
    t.add_argument("--time-budget", type=float, metavar="SECONDS", help="override the time budget per problem")
    t.add_argument("--patience", type=int, metavar="N",
                   help="stop a problem early after N measured configs in a row without a better one "
                        "(0: never; default: the job's, else 24)")
    t.add_argument("--effort", choices=tuple(EFFORTS),
                   help="a preset of --trials and --patience: " + "; ".join(
                       f"{k}: {v[0]} trials, patience {v[1]}" for k, v in EFFORTS.items())
                   + " (--trials/--patience override it)")
    t.add_argument("--sampler", metavar="NAME",
                   help=f"override the sampler: {', '.join(SAMPLERS)} (default: the job's, else auto)")
    t.add_argument("--device", default="auto", choices=("auto", "gpu", "interpret"),
                   help="auto (default): the GPU if there is one, else GPU interpret mode on the CPU")
    t.add_argument("--cache", choices=("auto", "cold", "warm"),
                   help="L2 between timed runs: cold (flushed; default on a GPU) or warm; "
                        "overrides the job's `cache`")
    t.add_argument("--gpus", help="'all' or a list like 0,1 (one measuring worker per GPU)")
    t.add_argument("--workers-per-gpu", type=int, metavar="N",
                   help="compiling worker processes per GPU (default: from the cores and GPU memory)")
    t.add_argument("--compile-threads", type=int, metavar="N",
                   help="compile threads per worker (default: from the cores)")
    t.add_argument("--results-dir", default=default_results_dir(),
                   help="where traces and worker logs go (default: $AUTOTUNE_RESULTS_DIR, else results)")
    t.add_argument("--compilation-cache", default="auto", metavar="DIR",
                   help="JAX's persistent compilation cache: auto (default: <results-dir>/jax_cache "
                        "on a GPU, off in interpret mode), off, or a folder")
    t.add_argument("--allow-import", action="store_true", help="allow kernels named package.module:NAME")
    _device_profile(t)
    t.add_argument("--dry-run", action="store_true",
                   help="print per problem the valid configs, budget, device, database and an "
                        "estimated time; measure nothing")
    t.add_argument("--jsonl", action="store_true", help="progress as JSON lines on stdout, for machines")
    _globals(t, db=True)

    st = sub.add_parser("status", help="where a job stands: per problem done / in flight / budget, live hosts")
    st.add_argument("job")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--allow-import", action="store_true", help="allow kernels named package.module:NAME")
    _globals(st, db=True)

    b = sub.add_parser("best", help="the best stored config of a problem")
    b.add_argument("kernel")
    b.add_argument("--shape", required=True, help="k=v,k=v")
    b.add_argument("--dtype", default="bfloat16", help="input dtype (default: bfloat16)")
    b.add_argument("--device", help="a device name, or gpu / interpret (default: GPU results only)")
    b.add_argument("--cache", choices=("cold", "warm"),
                   help="answer from this cache policy's results (default: cold if any, else warm)")
    b.add_argument("--json", action="store_true", help="print JSON")
    _globals(b, db=True)

    r = sub.add_parser("results", help="what the database holds, per problem")
    r.add_argument("--kernel")
    r.add_argument("--dtype")
    r.add_argument("--device", help="a device name, or gpu / interpret (default: all)")
    r.add_argument("--json", action="store_true", help="print JSON")
    r.add_argument("--invalid", action="store_true",
                   help="list stored ok results whose config breaks today's rules (never served)")
    _globals(r, db=True)

    c = sub.add_parser("check", help="cross-lower a sample of a space for CUDA, on this CPU")
    c.add_argument("kernel")
    c.add_argument("--shape", required=True, help="k=v,k=v")
    c.add_argument("--dtype", default="bfloat16", help="input dtype (default: bfloat16)")
    c.add_argument("--sample", type=int, default=32, metavar="N",
                   help=f"configs to lower (default: 32, at most {MAX_CHECK_SAMPLE})")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--allow-import", action="store_true", help="allow KERNEL as package.module:NAME")
    _device_profile(c)
    c.add_argument("--json", action="store_true", help="print JSON")
    _globals(c, db=False)

    e = sub.add_parser("export", help="write the best config per problem (json, python or csv)")
    e.add_argument("--format", default="json", choices=("json", "python", "csv"))
    e.add_argument("--kernel")
    e.add_argument("--device", help="a device name, or gpu / interpret (default: GPU results only)")
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    e.add_argument("--force", action="store_true",
                   help="replace --out even if it is not an autotune export (never the database)")
    _globals(e, db=True)

    i = sub.add_parser("import", help="load a json export into a database (keeps existing results)")
    i.add_argument("file")
    i.add_argument("--allow-import", action="store_true",
                   help="accept records of kernels named package.module:NAME (imports them to check)")
    _globals(i, db=True)

    v = sub.add_parser("revalidate", help="re-measure stored winners of other jax/jaxlib versions")
    v.add_argument("--kernel")
    v.add_argument("--cache", choices=("auto", "cold", "warm"),
                   help="the cache policy whose winners to re-measure (default: cold on a GPU)")
    v.add_argument("--device", default="auto", choices=("auto", "gpu", "interpret"))
    v.add_argument("--top", type=int, default=3, metavar="N", help="stale configs per problem (default: 3)")
    v.add_argument("--compilation-cache", default="auto", metavar="DIR",
                   help="JAX's persistent compilation cache: auto (default: results/jax_cache on a "
                        "GPU, off in interpret mode), off, or a folder")
    v.add_argument("--allow-import", action="store_true", help="allow kernels named package.module:NAME")
    v.add_argument("--json", action="store_true", help="print JSON")
    _globals(v, db=True)

    w = sub.add_parser("verify", help="re-time stored winners and baselines by a second method")
    w.add_argument("--kernel")
    w.add_argument("--device", default="auto", choices=("auto", "gpu", "interpret"))
    w.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="interleaved rounds (default: 15)")
    w.add_argument("--calls", type=int, default=20, metavar="N",
                   help="calls per program, block and round (default: 20)")
    w.add_argument("--method", default="auto", choices=("auto", "cupti-isolated", "cupti-flushed",
                                                        "wallclock-difference"),
                   help="the second timing method: auto (default): cupti-isolated on a GPU, "
                        "wallclock-difference in interpret mode")
    w.add_argument("--others", type=int, default=2, metavar="N",
                   help="other stored configs re-timed beside the winner (default: 2)")
    w.add_argument("--compilation-cache", default="auto", metavar="DIR",
                   help="where the job kept XLA's autotune picks: auto (default: "
                        "results/jax_cache on a GPU), off, or a folder")
    w.add_argument("--allow-import", action="store_true", help="allow kernels named package.module:NAME")
    w.add_argument("--json", action="store_true", help="print JSON")
    _globals(w, db=True)

    o = sub.add_parser("report", help="plots per problem and an index.html")
    o.add_argument("--kernel")
    o.add_argument("--out", default=str(Path(default_results_dir()) / "report"), metavar="DIR",
                   help="(default: results/report, or report under $AUTOTUNE_RESULTS_DIR)")
    o.add_argument("--allow-import", action="store_true", help="FLOP counts of import-path kernels")
    _globals(o, db=True)

    d = sub.add_parser("db", help="repair the database: `db repair` rewrites a missing or doubled "
                                  "schema version record")
    d.add_argument("action", choices=["repair"],
                   help="repair: record the schema version the tables match (exactly one row)")
    _globals(d, db=True)
    _add_completers(p)
    return p


def _complete_kernels(prefix: str = "", **_: Any) -> list[str]:
    """Shell completion (argcomplete) of a kernel: the bundled kernels' names."""
    from autotune.space.kernel import bundled_kernels

    return [k for k in bundled_kernels() if k.startswith(prefix)]


def _complete_dtypes(prefix: str = "", **_: Any) -> list[str]:
    """Shell completion of ``--dtype``: the canonical dtype names."""
    from autotune.space.problem import DTYPES

    return [d for d in DTYPES if d.startswith(prefix)]


def _add_completers(parser: argparse.ArgumentParser) -> None:
    """Gives argcomplete the kernel names (the ``kernel`` argument and ``--kernel``), the dtypes
    and the samplers; inert without argcomplete."""
    from autotune.tuning import SAMPLERS

    def complete_samplers(prefix: str = "", **_: Any) -> list[str]:
        return [name for name in SAMPLERS if name.startswith(prefix)]

    completers = {"kernel": _complete_kernels, "dtype": _complete_dtypes,
                  "sampler": complete_samplers}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_completers(sub)
        elif action.dest in completers:
            action.completer = completers[action.dest]  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (see the module's docstring)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a full disk shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        # The reader went away (`autotune spaces | head -1`): end quietly, as Unix tools do,
        # and exit 141 (128 + SIGPIPE, what a shell shows for a tool killed so).
        _stdout_to_devnull()
        return EXIT_PIPE
    except OSError as e:
        if e.filename is not None:  # a file's error, not the output's: a bug to show
            raise
        # Writing the output failed (`autotune results > /dev/full`: no space left).
        _stdout_to_devnull()
        print(f"autotune: error: cannot write the output (stdout): {e.strerror or e}; "
              "free space or send it elsewhere.", file=sys.stderr)
        return EXIT_USAGE


def _stdout_to_devnull() -> None:
    """Points stdout at devnull, so that the interpreter's final flush of what could not be
    written does not raise again (Python's recipe for broken pipes)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


# The commands that open Optuna studies: tuning, or reading them.
_OPTUNA_COMMANDS = frozenset({"tune", "status", "report", "revalidate"})


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        import argcomplete  # optional: pip install 'autotune[completion]'
    except ImportError:
        pass
    else:
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    root = logging.getLogger()
    ours = not root.handlers  # else logging is the embedding program's (or pytest's) to format
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=_LOG_FORMAT)
    if ours:
        for h in root.handlers:
            h.setFormatter(_MaskingFormatter(_LOG_FORMAT))
    # alembic's INFO lines are its own plumbing (a dozen "setup plugin ..." per database
    # opened); a migration autotune applies is logged by autotune.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from autotune.errors import MissingDatabaseWarning

    if args.command in _OPTUNA_COMMANDS:  # the others never import Optuna (0.5 s of CPU)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
    # The CLI names the database itself (_say_db); the API's warning would say it twice.
    warnings.simplefilter("ignore", MissingDatabaseWarning)
    handler = {"spaces": _spaces, "tune": _tune, "status": _status, "best": _best, "results": _results, "check": _check,
               "export": _export, "import": _import, "revalidate": _revalidate, "report": _report,
               "verify": _verify, "db": _db}
    from autotune.devices import using_profile
    from autotune.interrupts import GRACE_S, Interrupted, handling

    # tune's bound is a second signal (its workers are killed, its open trials closed).
    with handling(grace_s=None if args.command == "tune" else GRACE_S) as signals:
        args.signals = signals
        try:
            with using_profile(getattr(args, "device_profile", None)):
                return handler[args.command](args)
        except NothingTunedError as e:
            _say(f"autotune: {e}", file=sys.stderr)
            return EXIT_NOTHING
        except (AutotuneError, ValueError) as e:
            _say(f"autotune: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as e:
            print("autotune: interrupted; finished trials are stored, re-run to resume.", file=sys.stderr)
            return e.exit_code if isinstance(e, Interrupted) else EXIT_SIGINT


# ---------------------------------------------------------------------------------------------


def _db_text(db: str | None) -> str:
    """The database ``db`` resolves to, password masked, and whether a SQLite file exists."""
    from autotune.storage.urls import (
        display_url,
        plain_sqlite_file,
        plain_sqlite_text,
        resolve_url,
        sqlite_path,
    )

    path = plain_sqlite_file(db)  # read without SQLAlchemy (autotune best: RESULTS.md §17)
    if path is not None:
        text = plain_sqlite_text(path)
    else:
        url = resolve_url(db)
        text = display_url(url)
        path = sqlite_path(url)
    if path is not None and not path.exists():
        text += " (no such file yet"
        text += "; from $AUTOTUNE_DB)" if db is None and os.environ.get("AUTOTUNE_DB") else (
            "; set --db or $AUTOTUNE_DB to use another)" if db is None else ")")
    return text


def _say_db(args: argparse.Namespace) -> None:
    """Prints the resolved database to stderr (unless --quiet), so results can be found."""
    if not args.quiet:
        print(f"autotune: database {_db_text(args.db)}", file=sys.stderr)


def _kernel_filter(name: str | None, db: str | None) -> None:
    """Checks a --kernel filter: a bundled kernel, an import path, or a kernel stored in the
    database; else exit 2 naming the known ones, with a "did you mean"."""
    if name is None or ":" in name:
        return
    from autotune.queries.best import stored_kernels
    from autotune.space.kernel import BUNDLED

    known = [*BUNDLED, *(k for k in stored_kernels(db) if k not in BUNDLED)]
    if name not in known:
        raise JobError(f"--kernel {name!r} is unknown: the kernels are {', '.join(known)}."
                       + did_you_mean(name, known))


def _problem(args: argparse.Namespace) -> tuple[Any, Any]:
    from autotune.space.kernel import get_kernel
    from autotune.space.problem import parse_shape

    kernel = get_kernel(args.kernel, allow_import=getattr(args, "allow_import", False))
    if not args.shape:
        raise JobError(f"--shape is required with a kernel; {kernel.name} takes keys "
                       f"{kernel.shape_keys_text()}.")
    return kernel, kernel.problem(parse_shape(args.shape), args.dtype)


def _spaces(args: argparse.Namespace) -> int:
    from autotune.space.kernel import bundled_kernels, get_kernel

    if args.kernel is None:
        kernels = [get_kernel(name) for name in bundled_kernels()]
        if args.json:
            print(json.dumps([{
                "kernel": k.name, "shape_keys": list(k.shape_keys),
                "optional_shape_keys": {key: v for key, v in k.shape_defaults.items()
                                        if key not in k.shape_keys},
                "dtypes": list(k.dtypes), "interpret_ok": k.interpret_ok,
                "description": k.description,
            } for k in kernels]))
            return EXIT_OK
        for kernel in kernels:
            print(f"{kernel.name}\t{kernel.shape_keys_text()}\t{', '.join(kernel.dtypes)}\t"
                  f"{kernel.description}")
        return EXIT_OK
    if not 0 <= args.sample <= MAX_SAMPLE:
        raise ValueError(f"--sample must be 0 to {MAX_SAMPLE} (configs to show), got {args.sample}.")
    kernel, problem = _problem(args)
    device = kernel.check_device()
    space = kernel.valid_space(problem, device=device)
    configs = space.sample(args.sample, seed=args.seed)
    if args.json:
        print(json.dumps({
            "kernel": kernel.name,
            "shape": problem.dims,
            "dtype": problem.dtype,
            "device": device.to_dict(),
            "valid": space.count(),
            "raw": space.raw_count,
            "configs": [dict(c) for c in configs],
        }))
        return EXIT_OK
    print(f"{problem}: {space.count()} valid of {space.raw_count} raw configs on {device.describe()}")
    example = configs[0] if configs else None
    print("\n".join(space.describe(example)))
    if example is not None:
        print("  (rules shown with the values of the first config below)")
    for c in configs:
        print("  " + json.dumps(dict(c)))
    return EXIT_OK


def _job_overrides(args: argparse.Namespace, job: Any) -> Any:
    """The job with the command line's budget (:mod:`autotune.tuning.budgets`) and sampler
    overrides applied."""
    from autotune.tuning.budgets import override_budgets

    job = override_budgets(job, trials=args.trials, seconds=args.time_budget,
                           patience=args.patience, effort=args.effort)
    if args.sampler is not None:
        from autotune.tuning.names import SAMPLERS

        if args.sampler not in SAMPLERS:
            raise JobError(f"--sampler {args.sampler!r} is unknown; expected one of {', '.join(SAMPLERS)}."
                           + did_you_mean(args.sampler, SAMPLERS))
        from autotune.tuning.samplers import require_packages

        try:
            require_packages(args.sampler)
        except JobError as e:
            raise JobError(f"--sampler {args.sampler}: {e}") from None
        job = dataclasses.replace(job, problems=tuple(
            dataclasses.replace(spec, sampler=args.sampler) for spec in job.problems))
    cache = job.cache if args.cache is None else (None if args.cache == "auto" else args.cache)
    for flag, value in (("--workers-per-gpu", args.workers_per_gpu),
                        ("--compile-threads", args.compile_threads)):
        if value is not None and not 1 <= value <= 256:
            raise JobError(f"{flag} must be a whole number from 1 to 256, got {value}; leave it "
                           "out to size it from the machine.")
    return dataclasses.replace(job, cache=cache)


def _tune(args: argparse.Namespace) -> int:
    from autotune.api import run_tuning
    from autotune.progress import make_progress
    from autotune.tuning.jobs import load_job

    job = _job_overrides(args, load_job(args.job, allow_import=args.allow_import))
    gpus, device = _check_gpus(args.gpus, args.device)
    from autotune.queries.outputs import check_output_dir

    check_output_dir(args.results_dir, flag="--results-dir")
    if args.compilation_cache not in ("auto", "off"):
        check_output_dir(args.compilation_cache, flag="--compilation-cache")
    if args.dry_run:
        return _dry_run(args, job, gpus, device)
    progress = make_progress("quiet" if args.quiet else "jsonl" if args.jsonl else "auto")
    # One folder per process: runners started in the same second on one host (a job shared
    # by several processes) must not write each other's worker logs.
    log_dir = str(Path(args.results_dir) / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    layout = {k: v for k, v in (("workers_per_gpu", args.workers_per_gpu),
                                ("compile_threads", args.compile_threads)) if v is not None}

    def say_db(store: Store) -> None:
        if not args.quiet and not args.jsonl:
            print(f"autotune: database {_db_text(args.db)}", file=sys.stderr)

    try:
        reports = run_tuning(job, db=args.db, device=device, allow_import=args.allow_import,
                             observer=progress, on_event=progress, results_dir=args.results_dir,
                             gpus=gpus, log_dir=log_dir, layout=layout, on_store=say_db,
                             on_engine=lambda engine: _on_interrupt(args.signals, engine, log_dir),
                             compilation_cache=args.compilation_cache)
    finally:
        args.signals.status = args.signals.abort = None
    if args.jsonl:
        for r in reports:
            print(json.dumps({"event": "summary", **_report_dict(r)}, default=str))
    else:
        _print_reports(reports)
        for r in reports:
            if r.invalid:
                shape = ",".join(f"{k}={v}" for k, v in r.problem.dims.items())
                flag = " --allow-import" if ":" in r.problem.kernel else ""
                print(f"{r.problem}: {r.invalid} config(s) did not lower (stored as invalid, never "
                      f"proposed again): its space is missing a rule. Each stored error names it; "
                      f"`autotune check {r.problem.kernel} --shape {shape} --dtype {r.problem.dtype}"
                      f"{flag}` finds it before spending GPU time.")
    measured = sum(progress.counts.values())
    crashed = progress.counts.get("crashed", 0)
    if crashed:
        logs = sorted(set(progress.crash_logs))
        print(f"autotune: {crashed} of {measured} trial(s) crashed in this run (stored as crashed, "
              f"never proposed again)" + (f"; worker logs: {', '.join(logs)}" if logs else "")
              + f"; exit code {EXIT_CRASHED}.", file=sys.stderr)
        return EXIT_CRASHED
    if not args.quiet:
        print(f"autotune: done: {len(reports)} problem(s), {measured} trial(s) measured in this run, "
              "none crashed.", file=sys.stderr)
    return EXIT_OK


def _on_interrupt(signals: Handler, engine: EngineLike, log_dir: str) -> None:
    """What the first Ctrl-C or SIGTERM says it waits for; the second kills the workers."""

    def status() -> str:
        count = getattr(engine, "in_flight", None)
        what = "the configs in flight" if count is None else f"{count} config(s) in flight"
        return (f"closing {what} for a later run, finished trials are stored "
                f"(worker logs: {getattr(engine, 'log_dir', log_dir)})")

    signals.status = status
    signals.abort = getattr(engine, "kill_workers", None)


def _report_dict(r: Any) -> dict[str, Any]:
    """A tuning report in the result schema (``RESULT_FIELDS``), plus this run's counts."""
    interpret = r.device_kind == DeviceKind.INTERPRET
    return {
        "kernel": r.problem.kernel, "shape": r.problem.dims, "dtype": r.problem.dtype,
        "device": r.device, "device_kind": r.device_kind,
        "config": None if r.best_config is None else dict(r.best_config),
        "median_us": r.best_us, "by_status": dict(r.by_status),
        "baseline_name": r.baseline_name, "baseline_us": r.baseline_us,
        "speedup": None if interpret else r.speedup,
        "tflops": None if interpret else r.tflops, "gbps": None if interpret else r.gbps,
        "measured_now": r.measured_now, "stop_reason": r.stop_reason,
        "confirm_s": r.confirm_s,  # the confirmation round's wall time in this run
    }


def _dry_run(args: argparse.Namespace, job: Any, gpus: list[int] | None, device: str) -> int:
    """Per problem: the valid space, budget, device, database and an estimated time, as a
    table or (``--jsonl``) one JSON object per problem; measures and writes nothing (a missing
    database is not created). Every problem is checked before anything is printed."""
    from autotune.api import detect_device
    from autotune.queries.best import host_has_gpu, stored_trial_seconds
    from autotune.space.kernel import get_kernel

    device = detect_device() if device == "auto" else device
    if device == DeviceKind.GPU and not host_has_gpu():  # told without probing jax
        raise JobError(
            "--device gpu: this machine has no GPU (the NVIDIA driver lists none, or "
            "CUDA_VISIBLE_DEVICES hides them), so the job would stop at its start; leave "
            "--device out (or give --device interpret) to tune in GPU interpret mode on the CPU, "
            "or dry-run it on the GPU machine.")
    records: list[dict[str, Any]] = []
    for spec in job.problems:
        problem, budget = spec.problem, spec.budget
        record: dict[str, Any] = {
            "problem": str(problem), "kernel": problem.kernel, "shape": problem.dims,
            "dtype": problem.dtype, "device": device, "gpus": gpus,
            "budget": {"trials": budget.trials, "seconds": budget.seconds,
                       "patience": budget.patience},
            "valid": None, "raw": None, "stored": None, "to_go": None,
            # the median seconds per trial of the kernel on this device kind, and of how many
            "per_trial_s": None, "median_of": None, "estimate_s": None, "skipped": None,
        }
        records.append(record)
        kernel = get_kernel(problem.kernel, allow_import=args.allow_import)
        if device == DeviceKind.INTERPRET and not kernel.interpret_ok:
            record["skipped"] = "does not run in GPU interpret mode"
            continue
        space = kernel.valid_space(problem, interpret=device == DeviceKind.INTERPRET)
        per_trial, known, stored = stored_trial_seconds(problem, device_kind=device, db=args.db)
        trials = min(x for x in (budget.trials, space.count()) if x is not None)
        trials = max(0, trials - stored)
        seconds = None
        if per_trial is not None:
            seconds = trials * per_trial
            if budget.seconds is not None:
                seconds = min(seconds, budget.seconds)
        record.update(valid=space.count(), raw=space.raw_count, stored=stored, to_go=trials,
                      per_trial_s=per_trial, median_of=known, estimate_s=seconds)
    if args.jsonl:
        _say_db(args)
        for record in records:
            print(json.dumps(record, default=str))
        return EXIT_OK
    where = f"gpus {','.join(map(str, gpus))}" if gpus else ("the GPU" if device == DeviceKind.GPU else "the CPU")
    print(f"dry run: device {device} ({where}); database {_db_text(args.db)}")
    rows = []
    for r in records:
        if r["skipped"]:
            rows.append([r["problem"], "-", "-", "-", f"skipped: {r['skipped']}"])
            continue
        budget = r["budget"]
        parts = []
        if budget["trials"] is not None:
            parts.append(f"{budget['trials']} trials")
        if budget["seconds"] is not None:
            parts.append(f"{budget['seconds']:g} s")
        if budget["patience"]:
            parts.append(f"patience {budget['patience']}")
        if r["per_trial_s"] is None:
            estimate = "unknown (no stored trials of this kernel on this device kind)"
        else:
            estimate = (f"~{_duration(r['estimate_s'])} ({r['to_go']} to go x {r['per_trial_s']:.1f} s, "
                        f"median of {r['median_of']} stored)")
        rows.append([r["problem"], f"{r['valid']} of {r['raw']}", ", ".join(parts) or "-",
                     str(r["stored"]), estimate])
    _table(["problem", "valid configs", "budget", "stored", "estimate"], rows)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from autotune.errors import EmptyDatabaseError, JobError
    from autotune.queries.status import job_status
    from autotune.storage.store import Store
    from autotune.storage.urls import resolve_url, sqlite_path
    from autotune.tuning.jobs import load_job

    job = load_job(args.job, allow_import=args.allow_import)
    path = sqlite_path(resolve_url(args.db))
    if path is not None and not path.exists():
        raise JobError(f"No database at {path}: nothing of job {job.name!r} has run there yet; "
                       "give the --db the job runs with.")
    _say_db(args)
    try:
        store = Store(args.db, read_only=True)
    except EmptyDatabaseError as e:
        raise JobError(f"{e} Nothing of job {job.name!r} has run there.") from None
    with store:
        status = job_status(job, store)
    if args.json:
        print(json.dumps(status.to_dict(), default=str))
        return EXIT_OK
    live = ", ".join(f"{h} ({n} in flight)" for h, n in sorted(status.hosts.items())) or "none"
    print(f"job {status.job}: {len(job.problems)} problem(s); hosts with a live heartbeat: {live}")
    header = ["problem", "device", "done/budget", "in flight", "best us", "state"]
    rows = [[p.problem, p.device or "-", f"{p.done}/{p.budget if p.budget is not None else '-'}",
             str(p.in_flight) + (f" (+{p.stale} stale)" if p.stale else ""),
             _num(p.best_us, ".1f"), p.state] for p in status.problems]
    _table(header, rows)
    return EXIT_OK


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _check_gpus(text: str | None, device: str) -> tuple[list[int] | None, str]:
    """``--gpus`` against ``--device``: (the GPU ids, the device to tune on). With ``--device
    gpu`` the user's word is taken (nothing is probed); with ``interpret``, or ``auto`` on a
    machine where jax sees no GPU, ``--gpus`` is refused, since interpret mode runs on the CPU."""
    if text is None:
        return None, device
    if device == DeviceKind.INTERPRET:
        raise JobError(f"--gpus {text} names GPUs, but --device interpret runs on the CPU (GPU "
                       "interpret mode); leave --gpus out, or give --device gpu to tune on those GPUs.")
    gpus = _parse_gpus(text)
    if device == "auto":
        from autotune.api import count_gpus

        if count_gpus() == 0:
            raise JobError(f"--gpus {text}: jax sees no GPU on this machine, so --device auto would "
                           "run in GPU interpret mode on the CPU, which takes no --gpus; leave --gpus "
                           "out to tune in interpret mode, or give --device gpu to use them anyway.")
        device = DeviceKind.GPU
    return gpus, device


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

        ids = list(range(count_gpus()))
        if not ids:
            raise JobError("--gpus all: jax sees no GPU on this machine (and CUDA_VISIBLE_DEVICES "
                           "is not set); leave --gpus out, or name the ids, such as --gpus 0,1.")
        return ids
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise JobError(f"--gpus must be 'all' or ids like 0,1; got {text!r}.") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise JobError(f"--gpus must list distinct non-negative ids like 0,1; got {text!r}.")
    return ids


def _speedup_text(speedup: float | None, spread: float | None, confirmed: bool,
                  confirmation: Any = None) -> str:
    """``1.013 ±0.2% (confirmed, faster)``, ``0.990``, or ``-``: a confirmed speedup says in a
    word whether its interval lies above 1.0 (faster), holds it (no faster) or lies below
    (slower)."""
    if speedup is None:
        return "-"
    text = f"{speedup:.3f}"
    if spread is not None:
        text += f" ±{100 * spread:.1f}%"
    if not confirmed:
        return text
    low = getattr(confirmation, "speedup_low", None)
    high = getattr(confirmation, "speedup_high", None)
    if low is None or high is None:
        return text + " (confirmed)"
    return text + f" (confirmed, {_interval_word(low, high)})"


def _interval_word(low: float, high: float) -> str:
    """A speedup's interval in a word: above 1.0 "faster", below "slower", else "no faster"."""
    return "faster" if low > 1.0 else "slower" if high < 1.0 else "no faster"


def _called_text(check: Any) -> str:
    """The program check's speedup in the job's table: ``0.980 (faster|no faster|slower)``."""
    if check.speedup is None or check.speedup_low is None or check.speedup_high is None:
        return "-"
    return f"{check.speedup:.3f} ({_interval_word(check.speedup_low, check.speedup_high)})"


def _print_reports(reports: Sequence[Any]) -> None:
    gpu = any(r.device_kind != DeviceKind.INTERPRET for r in reports)
    if gpu:
        header = ["problem", "device", "cache", "best us", "TFLOP/s", "GB/s", "baseline us",
                  "speedup", "as called", "ties", "trials", "invalid", "stop"]
    else:  # interpret mode: functional runs, no throughput or speedup to show
        header = ["problem", "device", "wall us (interpret)", "trials", "invalid", "stop"]
    rows = []
    for r in reports:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.by_status.items()))
        interpret = r.device_kind == DeviceKind.INTERPRET
        confirmed = r.confirmation is not None
        row = [str(r.problem), r.device]
        if gpu:
            row.append(r.cache_policy)
        row.append(_num(r.best_us, ".1f"))
        if gpu:
            check = r.program_check
            row += ["-", "-", "-", "-", "-", "-"] if interpret else [
                _num(r.tflops, ".0f"), _num(r.gbps, ".0f"),
                _num(r.baseline_us, ".1f") + (f" ({r.baseline_name})" if r.baseline_name else ""),
                _speedup_text(r.speedup, r.speedup_spread, confirmed, r.confirmation),
                "-" if check is None else _called_text(check),
                str(r.ties) if confirmed else "-",
            ]
        rows.append([*row, statuses or "-", str(r.invalid), r.stop_reason or "-"])
    _table(header, rows)
    if any(r.device_kind == DeviceKind.INTERPRET for r in reports):
        print(INTERPRET_NOTE)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    rows = [[_printable(c) for c in r] for r in rows]  # stored text never drives the terminal
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _best(args: argparse.Namespace) -> int:
    from autotune.errors import KernelNotFoundError
    from autotune.queries.best import best_result, list_results, stored_kernels
    from autotune.storage.rows import PROGRAM_CHECK
    from autotune.space.kernel import BUNDLED, get_kernel
    from autotune.space.problem import Problem, parse_shape

    shape = parse_shape(args.shape)
    if ":" in args.kernel:  # a user's kernel: not imported here; its stored problems tell
        problem = Problem(args.kernel, shape, args.dtype)
    else:  # unknown kernel, shape key or dtype: exit 2 naming what is allowed (no jax import)
        try:
            problem = get_kernel(args.kernel).problem(shape, args.dtype)
        except KernelNotFoundError:
            stored = stored_kernels(args.db)
            if args.kernel not in stored:  # neither bundled nor in the database
                known = [*BUNDLED, *(k for k in stored if k not in BUNDLED)]
                raise KernelNotFoundError(
                    f"Unknown kernel {args.kernel!r}: the kernels are {', '.join(known)} "
                    "(bundled, or stored in the database)." + did_you_mean(args.kernel, known)
                ) from None
            problem = Problem(args.kernel, shape, args.dtype)
    _say_db(args)
    result = best_result(problem.kernel, problem.dims, problem.dtype, device=args.device, db=args.db,
                         cache=args.cache)
    if result is None:
        if args.json:  # stdout stays valid JSON for a reader: nothing is null (and exit 1)
            print("null")
        others = [] if args.device else [
            s for s in list_results(args.db, kernel=problem.kernel, dtype=problem.dtype)
            if s.problem == problem and s.best_us is not None]
        hint = ""
        if others:
            kinds = sorted({s.device_kind for s in others})
            hint = (f"; it has results on {', '.join(kinds)} only (functional runs, not GPU "
                    f"timings, for interpret): add --device {kinds[0]} to see them")
        raise NothingTunedError(
            f"nothing tuned for {problem}"
            + (f" on {args.device}" if args.device else " on a GPU")
            + (hint or f"; run `autotune tune` with a job listing it (database {_db_text(args.db)}).")
        )
    interpret = result.device_kind == DeviceKind.INTERPRET
    if args.json:
        payload = result.to_dict()
        if interpret:
            payload.update(baseline_us=None, ratio=None, speedup=None)
        print(json.dumps(payload, default=str))
        return EXIT_OK
    kind = " (interpret mode: a functional run on the CPU, not a GPU timing)" if interpret else ""
    if interpret and args.device is None and not args.quiet:
        print("autotune: no GPU on this machine and no GPU result stored for this problem: "
              "answering with its interpret-mode result; --device gpu asks for GPU results "
              "only.", file=sys.stderr)
    # An interpret-mode result is one checked run: it has no spread to show.
    spread = ("" if result.spread is None or interpret
              else f" (spread {100 * result.spread:.1f}%)")
    _say(f"{problem} on {result.device}: {result.median_us:.1f} us{spread}{kind}, cache "
         f"{result.cache_policy}" + (", confirmed" if result.confirmed else ""))
    if result.stale:
        _say(f"  measured with jax {result.jax_version}, jaxlib {result.jaxlib_version}, not the "
             "running versions: `autotune revalidate` re-measures it")
    if result.baseline_us and not interpret:
        speedup = _speedup_text(result.speedup, result.speedup_spread, result.confirmed)
        _say(f"  baseline {result.baseline_name}: {result.baseline_us:.1f} us (speedup {speedup})")
        # Which one runs (best.runs_of): the one the verdict's speedup puts ahead.
        runs = (result.baseline_name or "the baseline") if result.runs == "baseline" \
            else "the kernel"
        if result.program_words:  # both figures, and which decided the route
            _say(f"  GPU time (CUPTI, kernels only): the tuned kernel is "
                 f"{result.confirmation_verdict}")
            _say(f"  as a program calls them: {result.program_words}")
            source = result.verdict_figures.source
            _say(f"  the {'program check' if source == PROGRAM_CHECK else 'confirmation round'}"
                 f" decides the route: {runs} runs")
        elif result.verdict:
            _say(f"  the tuned kernel is {result.verdict}; {runs} runs")
    print("  config: " + json.dumps(result.config))
    for tie in result.ties:
        print(f"  tied within the noise ({100 * tie['diff']:+.2f}%): " + json.dumps(tie["config"]))
    return EXIT_OK


def _results(args: argparse.Namespace) -> int:
    from autotune.queries.best import check_device, list_results, unservable_results

    _kernel_filter(args.kernel, args.db)
    check_device(args.device, args.db)
    _say_db(args)
    if args.invalid:
        bad = unservable_results(args.db, kernel=args.kernel, dtype=args.dtype, device=args.device)
        if args.json:
            print(json.dumps([b.to_dict() for b in bad], default=str))
            return EXIT_OK
        if not bad:
            print("every stored ok result is valid under today's rules")
            return EXIT_OK
        _table(["trial", "problem", "device", "us", "config", "broken rules"],
               [[str(b.trial.id), str(b.trial.problem), b.trial.device.name, _num(b.trial.median_us, ".1f"),
                 json.dumps(dict(b.trial.config)), "; ".join(b.broken)] for b in bad])
        print(f"{len(bad)} stored result(s) break today's rules: they are kept but never served "
              "(best, lookup, export).")
        return EXIT_OK
    rows = list_results(args.db, kernel=args.kernel, dtype=args.dtype, device=args.device)
    if args.json:
        out = []
        for r in rows:
            record = r.to_dict()
            if r.device_kind == DeviceKind.INTERPRET:
                record["speedup"] = None
            out.append(record)
        print(json.dumps(out, default=str))
        return EXIT_OK
    if not rows:
        print("no results stored" + (f" for kernel {args.kernel}" if args.kernel else "")
              + f" in {_db_text(args.db)}")
        return EXIT_OK
    header = ["problem", "device", "cache", "trials", "best us", "speedup", "ties"]
    table = [[r.problem_text, r.device + (" [interpret]" if r.device_kind == DeviceKind.INTERPRET else ""),
              r.cache_policy,
              ", ".join(f"{k} {v}" for k, v in sorted(r.by_status.items())),
              _num(r.best_us if r.confirmation is None else r.confirmation.crowned.median_us, ".1f"),
              "-" if r.device_kind == DeviceKind.INTERPRET else
              _speedup_text(r.confirmed_speedup if r.confirmation is not None else r.speedup,
                            None if r.confirmation is None else r.confirmation.speedup_spread,
                            r.confirmation is not None, r.confirmation),
              "-" if r.confirmation is None else str(len(r.confirmation.tied_with_winner()))]
             for r in rows]
    _table(header, table)
    bad = unservable_results(args.db, kernel=args.kernel, dtype=args.dtype, device=args.device)
    if bad:
        print(f"{len(bad)} stored ok result(s) break today's rules and are never served: "
              "`autotune results --invalid` lists them.")
    if any(r.device_kind == DeviceKind.INTERPRET for r in rows):
        print(INTERPRET_NOTE)
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from autotune.queries.best import check_device
    from autotune.queries.exchange import export_records, interpret_export_counts, render
    from autotune.queries.outputs import write_export_file

    _kernel_filter(args.kernel, args.db)
    check_device(args.device, args.db)
    _say_db(args)  # on stderr: `autotune export > FILE` stays clean
    text = render(export_records(args.db, kernel=args.kernel, device=args.device), args.format)
    if args.device is None and not args.quiet:
        left, included = interpret_export_counts(args.db, kernel=args.kernel)
        if left:
            print(f"autotune: left out {left} interpret-mode result(s) (functional runs, not GPU "
                  "timings); --device interpret exports them.", file=sys.stderr)
        if included:
            print(f"autotune: exported {included} interpret-mode result(s) (device_kind "
                  "\"interpret\": functional runs on a CPU, not GPU timings): this machine has no "
                  "GPU and the database holds no GPU result for those problems; --device gpu "
                  "exports GPU results only.", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK
    write_export_file(args.out, text, db=args.db, force=args.force)
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    from autotune.queries.exchange import import_json

    added, kept = import_json(args.file, args.db, allow_import=args.allow_import)
    print(f"imported {added} trial(s); {kept} already stored (kept unchanged)")
    return EXIT_OK


def _remeasuring(args: argparse.Namespace, verb: str) -> tuple[str, str | None]:
    """What ``revalidate`` and ``verify`` check before measuring again: the compilation-cache
    folder and the ``--kernel`` filter; the database named; a missing SQLite file is nothing
    to re-measure (not created). Returns the device and the compilation-cache folder."""
    from autotune.api import compilation_cache_folder, detect_device
    from autotune.queries.outputs import check_output_dir
    from autotune.storage.urls import resolve_url, sqlite_path

    if args.compilation_cache not in ("auto", "off"):
        check_output_dir(args.compilation_cache, flag="--compilation-cache")
    _kernel_filter(args.kernel, args.db)
    _say_db(args)
    path = sqlite_path(resolve_url(args.db))
    if path is not None and not path.exists():  # not created: there is nothing to re-measure
        raise NothingTunedError(f"nothing stored in {_db_text(args.db)}: nothing to {verb}.")
    device = detect_device() if args.device == "auto" else args.device
    return device, compilation_cache_folder(args.compilation_cache,
                                            results_dir=default_results_dir(), device=device)


def _revalidate(args: argparse.Namespace) -> int:
    from autotune.api import open_engine
    from autotune.storage.store import Store
    from autotune.tuning.revalidate import revalidate

    if args.top < 1:
        raise ValueError(f"--top must be 1 or more, got {args.top}.")
    device, folder = _remeasuring(args, "revalidate")
    cache = None if args.cache in (None, "auto") else args.cache
    with Store(args.db) as store, open_engine(device, allow_import=args.allow_import,
                                              cache=cache, compilation_cache=folder) as engine:
        reports = revalidate(store, engine, kernel=args.kernel, top=args.top)
    if args.json:
        print(json.dumps([{
            "kernel": r.problem.kernel, "shape": r.problem.dims, "dtype": r.problem.dtype,
            "device": r.device, "old_us": r.old_winner.old_us,
            "old_software": dict(r.old_winner.old_software),
            "new_us": r.old_winner.new_us if r.old_winner.result.ok else None,
            "status": r.old_winner.result.outcome.value, "ratio": r.old_winner.ratio,
            "holds": r.holds, "changed": r.changed,
            "config": None if r.winner is None else dict(r.winner), "median_us": r.winner_us,
        } for r in reports], default=str))
        return EXIT_OK
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


def _verify(args: argparse.Namespace) -> int:
    import tempfile

    from autotune.evaluation.independent import CUPTI_METHOD, FLUSHED_METHOD, METHOD
    from autotune.evaluation.xla_autotune import autotune_cache_folder, pin_in
    from autotune.storage.store import Store
    from autotune.tuning.provenance import software_versions
    from autotune.tuning.verify import ROUNDS, timing_on_this_machine, verify

    if args.rounds is None:
        args.rounds = ROUNDS
    for flag, value, low in (("--rounds", args.rounds, 1), ("--calls", args.calls, 1),
                             ("--others", args.others, 0)):
        if value < low:
            raise ValueError(f"{flag} must be {low} or more, got {value}.")
    device, folder = _remeasuring(args, "verify")
    if device == "gpu":
        # The baseline compiled here must be the program the job timed: XLA's autotune pick
        # from the job's folder (evaluation.xla_autotune), before jax starts its backend.
        pin_in(os.environ, autotune_cache_folder(folder, tempfile.mkdtemp(prefix="autotune-")))
        from autotune.evaluation.pipeline import gpu_device_info

        info = gpu_device_info()
    else:
        from autotune.evaluation.pipeline import interpret_device_info

        info = interpret_device_info()

    def progress(result: Any, target: Any, why: str | None) -> None:
        if why is not None:
            print(f"autotune: {target.problem}: not verified: {why}", file=sys.stderr)

    method = args.method
    if method == "auto":
        method = CUPTI_METHOD if device == "gpu" else METHOD
    if method in (CUPTI_METHOD, FLUSHED_METHOD) and device != "gpu":
        raise ValueError(f"--method {method} needs a GPU (CUPTI); in interpret mode use "
                         f"--method {METHOD}.")
    with Store(args.db) as store:
        results = verify(
            store, info, software_versions(),
            time_target=timing_on_this_machine(interpret=device == "interpret", method=method,
                                               allow_import=args.allow_import),
            method=method, kernel=args.kernel, rounds=args.rounds, calls=args.calls,
            others=args.others, on_result=progress,
        )
    if args.json:
        print(json.dumps([r.to_dict() for r in results], default=str))
        return EXIT_OK
    if not results:
        print(f"nothing verified: no problem stored for {info.name}")
        return EXIT_OK
    header = ["problem", "winner us", "baseline us", "stored", "re-timed [interval]", "diff",
              "re-timed/stored: winner, baseline", "still wins", "verdict"]
    rows = []
    for r in results:
        interval = ("-" if r.speedup is None else
                    f"{r.speedup:.4f} [{r.speedup_low:.4f}, {r.speedup_high:.4f}]")
        moved = ", ".join("-" if m is None else f"{100 * m:+.2f}%"
                          for m in (r.winner_moved, r.baseline_moved))
        rows.append([str(r.problem), f"{r.winner_median_us:.2f}",
                     _num(r.baseline_median_us, ".2f"), _num(r.stored_speedup, ".4f"), interval,
                     "-" if r.difference is None else f"{100 * r.difference:+.2f}%", moved,
                     {None: "-", True: "yes", False: "no"}[r.still_wins], r.words() or "-"])
    _table(header, rows)
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from autotune.queries.outputs import check_output_dir
    from autotune.queries.report import write_report

    check_output_dir(args.out, flag="--out")
    _kernel_filter(args.kernel, args.db)
    _say_db(args)
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
    from autotune.evaluation.checking import check_space

    if not 0 <= args.sample <= MAX_CHECK_SAMPLE:
        raise ValueError(f"--sample must be 0 to {MAX_CHECK_SAMPLE} (configs to cross-lower, about a "
                         f"second each), got {args.sample}.")
    kernel, problem = _problem(args)
    device = kernel.check_device()
    report = check_space(kernel, problem, sample=args.sample, seed=args.seed, device=device)
    if args.json:
        print(json.dumps({
            "kernel": kernel.name, "shape": problem.dims, "dtype": problem.dtype,
            "device": device.to_dict(),
            "valid": report.valid, "checked": report.checked, "ok": report.ok,
            "failures": [{"config": dict(f.config), "error_type": f.error_type, "error": f.error,
                          "suggestion": f.suggestion or None, "rule": f.rule or None}
                         for f in report.failures],
        }, default=str))
        return EXIT_OK if not report.failures else EXIT_NOTHING
    print(f"{problem}: cross-lowered {report.checked} of {report.valid} valid configs for CUDA "
          f"on {device.describe()}: "
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


def _db(args: argparse.Namespace) -> int:
    """``autotune db repair``: one schema version record, the version the tables match."""
    from autotune.storage.connection import repair_version_record
    from autotune.storage.urls import check_database_path, display_url, resolve_url, sqlite_path

    url = resolve_url(args.db)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise JobError(f"There is no database at {path}: nothing to repair. Name it with --db.")
    check_database_path(url)
    found, recorded = repair_version_record(url, str(path) if path else display_url(url))
    if found == [recorded]:
        _say(f"autotune: the schema version record of {_db_text(args.db)} is sound ({recorded}): "
             "nothing to repair.")
        return EXIT_OK
    before = "no version table" if found is None else (
        "no row" if not found else f"{len(found)} rows ({', '.join(found)})")
    _say(f"autotune: repaired the schema version record of {_db_text(args.db)}: found {before}, "
         f"now {recorded} (the version its tables match). The next command opens it as usual"
         " (upgrading an older schema).")
    return EXIT_OK


def run() -> None:
    """The ``autotune`` console script and ``python -m autotune``: :func:`main`, then the exit
    (:func:`autotune.interrupts.end_process`). An exception that no handler expects (a bug)
    ends it as :func:`_internal_error` says, never with a traceback on the terminal."""
    from autotune.interrupts import end_process

    try:
        code = main()
    except Exception as e:  # noqa: BLE001 - the last resort: what main() did not expect
        code = _internal_error(e, sys.argv[1:])
    end_process(code)


def _internal_error(error: Exception, argv: Sequence[str]) -> int:
    """Reports a bug: one line on stderr naming the exception and a file holding its traceback
    (with the command line and version; secrets masked), the traceback on stderr too with
    ``-v``; returns :data:`EXIT_BUG`."""
    import tempfile
    import traceback

    from autotune.storage.urls import mask_argv, mask_text

    text = mask_text(f"autotune {_version()}; command line: {mask_argv(argv)!r}\n"
                     + "".join(traceback.format_exception(error)))
    try:
        fd, where = tempfile.mkstemp(prefix="autotune-bug-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        where = f"(not written: {e.strerror or e})"
    if {"-v", "--verbose"} & set(argv):
        print(text, file=sys.stderr, end="")
    _say(f"autotune: internal error: {type(error).__name__}: {error}. This is a bug in autotune, "
         f"not in what you gave it; its traceback is in {where}: please report it with that "
         "file.", file=sys.stderr)
    return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    run()

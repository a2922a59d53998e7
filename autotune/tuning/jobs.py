"""Job files: TOML data naming the problems to tune and their budgets.

A job file is data, never code::

    [defaults]              # optional; each problem may override any of these
    trials = 32             # measured configs per problem (and/or `seconds`)
    patience = 24           # stop after this many configs in a row without a better one
    sampler = "auto"        # auto | ranked | tpe | random | cmaes | gp | qmc | brute
    seed = 0
    known_good = true       # try the kernel's known-good default config first

    cache = "cold"          # optional, for the whole job: cold (default on a GPU) | warm

    [[problem]]
    kernel = "hopper_matmul"
    dtype = "bfloat16"                      # or dtypes = ["bfloat16", "float16"]
    shape = { m = 4096, n = 4096, k = 4096 } # or shapes = [{...}, {...}]

Each ``[[problem]]`` expands to every shape × dtype it lists. A kernel named by import path
(``package.module:NAME``) is loaded only when the caller allows imports.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune._paths import check_file_name
from autotune.errors import JobError, KernelNotFoundError, NoValidConfigError
from autotune.space.kernel import bundled_kernels, get_kernel
from autotune.space.outcomes import CACHE_POLICIES
from autotune.space.problem import Problem
from autotune.tuning.confirmation import CONFIRM_INTERLEAVES
from autotune.tuning.names import SAMPLERS

__all__ = ["Budget", "ProblemSpec", "Job", "load_job", "parse_job"]

MAX_TRIALS = 1_000_000
MAX_PROBLEMS = 100_000  # problems one job may expand to (checked in about a minute)
MAX_JOB_BYTES = 16 * 1024 * 1024  # a 100,000-problem job file is about 8 MB
# Stop after this many measured configs in a row without a new best; chosen by the replay over
# recorded ground truth (benchmarks/search_efficiency.py --patience, benchmarks/RESULTS.md §4).
DEFAULT_PATIENCE = 24
MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers refuse larger seeds, and negative ones
_SETTINGS = {
    "trials": "a positive whole number of configs to measure per problem",
    "seconds": "a positive number of seconds to spend per problem",
    "patience": "a whole number of measured configs without a better one after which tuning stops "
                "(0: never stop early)",
    "sampler": f"one of {', '.join(SAMPLERS)}",
    "seed": "a whole number from 0 to 2**32 - 1 (4294967295), the seeds numpy's and Optuna's "
            "samplers accept (default 0)",
    "iterations": "a whole number of timed runs per config, 1 to 10000",
    "trace_top_k": "how many of the best configs get an in-kernel trace (0 to 100)",
    "confirm_top": "how many of the best configs the confirmation round re-times (0: none, "
                   "up to 32)",
    "confirm_rounds": "a whole number of interleaved confirmation rounds, 1 to 100",
    "confirm_iterations": "a whole number of timed runs per program and round, 1 to 10000",
    "confirm_interleave": "\"blocks\" (a confirmation round times each program for its runs, "
                          "one after another) or \"calls\" (the round's programs call by "
                          "call in one timed session)",
    "known_good": "true (try the kernel's known-good default config first) or false (search "
                  "without it)",
}
_PROBLEM_KEYS = {"kernel", "dtype", "dtypes", "shape", "shapes", *_SETTINGS}


@dataclasses.dataclass(frozen=True)
class Budget:
    """When to stop tuning one problem: after ``trials`` measured configs or ``seconds``, or
    early, once ``patience`` configs in a row have not beaten the best (``None``: never)."""

    trials: int | None = 32
    seconds: float | None = None
    patience: int | None = None  # job files and tune() default to DEFAULT_PATIENCE


@dataclasses.dataclass(frozen=True)
class ProblemSpec:
    """One problem of a job, with its budget and search settings."""

    problem: Problem
    budget: Budget
    sampler: str = "auto"
    seed: int | None = 0
    iterations: int = 20
    trace_top_k: int = 1
    # The confirmation round (autotune.tuning.confirmation): the best `confirm_top` configs and the
    # baseline, `confirm_rounds` interleaved rounds of `confirm_iterations` timed runs each.
    # None: DEFAULT_CONFIRM_TOP on a GPU (and the fake evaluator), 0 in GPU interpret mode,
    # where every run of an interpreted kernel takes seconds and its wall-clock time says
    # nothing about a GPU.
    confirm_top: int | None = None
    # None: adaptive (5 rounds, up to DEFAULT_CONFIRM_ROUNDS while the result is not clear).
    confirm_rounds: int | None = None
    # None: sized by each program's time (autotune.tuning.confirmation.sized_iterations).
    confirm_iterations: int | None = None
    # How a round interleaves its programs: "blocks" or "calls" (Engine.confirm's
    # interleaved); None: DEFAULT_CONFIRM_INTERLEAVE (autotune.tuning.confirmation).
    confirm_interleave: str | None = None
    known_good: bool = True  # propose the kernel's known-good default config first


@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    problems: tuple[ProblemSpec, ...]
    # The cache policy of every timing ("cold" | "warm"); None: cold on a GPU, warm otherwise.
    cache: str | None = None


def load_job(path: str | Path, *, allow_import: bool = False) -> Job:
    """Reads and checks a job file.

    Raises:
      JobError: the file is missing, not TOML, or a field is wrong; the message names the
        file, the field, the value and what is allowed. Nothing is tuned or written.
    """
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_JOB_BYTES:
            raise JobError(
                f"Job file {str(path)!r} is {path.stat().st_size:,} bytes, more than the "
                f"{MAX_JOB_BYTES:,} bytes a job file may be; split it into several jobs."
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobError(
            f"Job file {str(path)!r} does not exist; give the path of a TOML job file such as "
            "examples/quickstart.toml."
        ) from None
    except IsADirectoryError:
        raise JobError(
            f"Job file {str(path)!r} is a directory; give the path of a TOML job file such as "
            "examples/quickstart.toml."
        ) from None
    except UnicodeDecodeError as e:
        raise JobError(
            f"Job file {str(path)!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
            f"{e.start}); a job file is TOML, which is UTF-8 text."
        ) from None
    except OSError as e:
        raise JobError(f"Job file {str(path)!r} cannot be read: {e.strerror or e}.") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"Job file {str(path)!r} is not valid TOML: {e}.") from None
    return parse_job(data, name=path.stem, allow_import=allow_import, where=str(path))


def parse_job(
    data: Mapping[str, Any], *, name: str = "job", allow_import: bool = False, where: str = "job"
) -> Job:
    """Checks a parsed job (a dict, as from TOML) and expands it into problems."""
    unknown = sorted(set(data) - {"defaults", "problem", "name", "cache"})
    if unknown:
        raise JobError(
            f"{where}: unknown top-level key(s) {unknown}; allowed: [defaults], [[problem]], "
            "name, cache."
        )
    cache = data.get("cache")
    if cache is not None and cache not in (*CACHE_POLICIES, "auto"):
        raise JobError(
            f"{where}: cache = {cache!r} is not allowed; it must be one of "
            f"{', '.join(CACHE_POLICIES)} or auto (the L2 flushed between timed runs, or not; "
            "auto: cold on a GPU, warm in interpret mode)."
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise JobError(
            f"{where}: [defaults] must be a table of settings, got {type(defaults).__name__} "
            f"{defaults!r}; allowed settings: {', '.join(_SETTINGS)}."
        )
    bad = sorted(set(defaults) - set(_SETTINGS))
    if bad:
        raise JobError(
            f"{where}: unknown key(s) {bad} in [defaults]; allowed: {', '.join(_SETTINGS)}."
        )
    problems = data.get("problem")
    if problems is None:
        raise JobError(f"{where}: no [[problem]] entries; a job needs at least one.")
    if not isinstance(problems, list) or not all(isinstance(p, Mapping) for p in problems):
        raise JobError(
            f"{where}: 'problem' must be an array of tables ([[problem]] sections), got "
            f"{problems!r}."
        )
    if not problems:
        raise JobError(f"{where}: no [[problem]] entries; a job needs at least one.")
    specs: list[ProblemSpec] = []
    seen: dict[Problem, int] = {}
    for i, entry in enumerate(problems):
        room = MAX_PROBLEMS - len(specs)
        for spec in _expand(entry, defaults, f"{where}: problem #{i + 1}", allow_import, room):
            if spec.problem in seen:
                raise JobError(
                    f"{where}: problem #{i + 1}: {spec.problem} is listed twice (also by problem "
                    f"#{seen[spec.problem]}); list each kernel, shape and dtype once."
                )
            seen[spec.problem] = i + 1
            specs.append(spec)
    job_name = data.get("name", name)
    if not isinstance(job_name, str) or not job_name:
        raise JobError(f"{where}: 'name' must be a non-empty string, got {job_name!r}.")
    if "name" in data:  # it may name result files: one file name, never a path
        check_file_name(f"{where}: name", job_name)
    return Job(name=job_name, problems=tuple(specs), cache=None if cache == "auto" else cache)


def _expand(
    entry: Mapping[str, Any], defaults: Mapping[str, Any], where: str, allow_import: bool,
    room: int = MAX_PROBLEMS,
) -> list[ProblemSpec]:
    unknown = sorted(set(entry) - _PROBLEM_KEYS)
    if unknown:
        raise JobError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(_PROBLEM_KEYS))}.")
    kernel_name = entry.get("kernel")
    if not isinstance(kernel_name, str) or not kernel_name:
        raise JobError(
            f"{where}: 'kernel' must name a kernel: one of {', '.join(bundled_kernels())}, or "
            f"'package.module:NAME' (with --allow-import); got {kernel_name!r}."
        )
    try:
        kernel = get_kernel(kernel_name, allow_import=allow_import)
    except KernelNotFoundError as e:
        raise JobError(f"{where}: {e}") from None
    shapes = _one_or_many(entry, "shape", "shapes", where, Mapping)
    dtypes = _one_or_many(entry, "dtype", "dtypes", where, str)
    if len(shapes) * len(dtypes) > room:
        raise JobError(
            f"{where}: {len(shapes)} shape(s) x {len(dtypes)} dtype(s) would take the job past "
            f"{MAX_PROBLEMS:,} problems, the most one job may hold; split it into several jobs."
        )
    settings = {**defaults, **{k: v for k, v in entry.items() if k in _SETTINGS}}
    _check_settings(settings, where)
    trials = settings.get("trials")
    seconds = settings.get("seconds")
    if trials is None and seconds is None:
        trials = 32
    patience = settings.get("patience", DEFAULT_PATIENCE)
    budget = Budget(trials=trials, seconds=float(seconds) if seconds is not None else None,
                    patience=patience or None)
    top_k = settings.get("trace_top_k", 1)
    if trials is not None and top_k > trials:
        raise JobError(
            f"{where}: trace_top_k = {top_k} is more than trials = {trials}: only measured "
            f"configs can be traced, so it must be 0 to {trials}."
        )
    out = []
    for shape in shapes:
        for dtype in dtypes:
            try:
                problem = kernel.problem(shape, dtype)
                kernel.valid_space(problem, device=kernel.check_device())
            except (JobError, NoValidConfigError) as e:
                raise JobError(f"{where}: {e}") from None
            out.append(
                ProblemSpec(
                    problem=problem,
                    budget=budget,
                    sampler=settings.get("sampler", "auto"),
                    seed=settings.get("seed", 0),
                    iterations=settings.get("iterations", 20),
                    trace_top_k=settings.get("trace_top_k", 1),
                    confirm_top=settings.get("confirm_top"),
                    confirm_rounds=settings.get("confirm_rounds"),
                    confirm_iterations=settings.get("confirm_iterations"),
                    confirm_interleave=settings.get("confirm_interleave"),
                    known_good=settings.get("known_good", True),
                )
            )
    return out


def _one_or_many(
    entry: Mapping[str, Any], one: str, many: str, where: str, kind: type
) -> list[Any]:
    if one in entry and many in entry:
        raise JobError(f"{where}: give either '{one}' or '{many}', not both.")
    if one in entry:
        values = [entry[one]]
    elif many in entry:
        values = entry[many]
        if not isinstance(values, list) or not values:
            raise JobError(f"{where}: '{many}' must be a non-empty array, got {values!r}.")
    else:
        raise JobError(f"{where}: '{one}' is missing (or give '{many}' as an array).")
    for v in values:
        if not isinstance(v, kind):
            want = "a table like { m = 4096, n = 4096 }" if kind is Mapping else "a string like \"bfloat16\""
            raise JobError(f"{where}: '{one}' must be {want}, got {v!r}.")
    return values


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_settings(s: Mapping[str, Any], where: str) -> None:
    def fail(key: str) -> None:
        raise JobError(f"{where}: {key} = {s[key]!r} is not allowed; it must be {_SETTINGS[key]}.")

    if "trials" in s and not (_is_int(s["trials"]) and 0 < s["trials"] <= MAX_TRIALS):
        fail("trials")
    if "patience" in s and not (_is_int(s["patience"]) and 0 <= s["patience"] <= MAX_TRIALS):
        fail("patience")
    if "seconds" in s and not (
        isinstance(s["seconds"], int | float) and not isinstance(s["seconds"], bool)
        and 0 < s["seconds"] < float("inf")
    ):
        fail("seconds")
    if "sampler" in s and s["sampler"] not in SAMPLERS:
        fail("sampler")
    if "sampler" in s:
        try:
            from autotune.tuning.sampling import require_sampler_packages  # imports Optuna

            require_sampler_packages(s["sampler"])
        except JobError as e:
            raise JobError(f"{where}: {e}") from None
    if "seed" in s and not (_is_int(s["seed"]) and 0 <= s["seed"] <= MAX_SEED):
        fail("seed")
    if "iterations" in s and not (_is_int(s["iterations"]) and 1 <= s["iterations"] <= 10_000):
        fail("iterations")
    if "trace_top_k" in s and not (_is_int(s["trace_top_k"]) and 0 <= s["trace_top_k"] <= 100):
        fail("trace_top_k")
    if "confirm_top" in s and not (_is_int(s["confirm_top"]) and 0 <= s["confirm_top"] <= 32):
        fail("confirm_top")
    if "confirm_rounds" in s and not (_is_int(s["confirm_rounds"]) and 1 <= s["confirm_rounds"] <= 100):
        fail("confirm_rounds")
    if "confirm_iterations" in s and not (
        _is_int(s["confirm_iterations"]) and 1 <= s["confirm_iterations"] <= 10_000
    ):
        fail("confirm_iterations")
    if "confirm_interleave" in s and s["confirm_interleave"] not in CONFIRM_INTERLEAVES:
        fail("confirm_interleave")
    if "known_good" in s and not isinstance(s["known_good"], bool):
        fail("known_good")

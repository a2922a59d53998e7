"""Pieces several benchmark scripts share (not a script): a problem written KERNEL:SHAPE:DTYPE,
a table cell, NVML's handle of GPU 0, and the scheduler's ask path timed against a study of
stored trials (``ask_latency.py``, ``history_scaling.py``)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def parse_problem(text: str) -> tuple[Any, Any]:
    """``hopper_matmul:m=4096,n=4096,k=4096:bfloat16`` -> (the kernel, its problem)."""
    from autotune.space.kernel import get_kernel
    from autotune.space.problem import parse_shape

    try:
        name, shape, dtype = text.split(":")
    except ValueError:
        raise SystemExit(f"--problem {text!r}: expected KERNEL:SHAPE:DTYPE such as "
                         "hopper_matmul:m=4096,n=4096,k=4096:bfloat16") from None
    kernel = get_kernel(name)
    return kernel, kernel.problem(parse_shape(shape), dtype)


def fmt(value: Any, spec: str) -> str:
    """A table cell: ``value`` formatted by ``spec``, ``-`` for None."""
    return "-" if value is None else format(value, spec)


def nvml_gpu0() -> tuple[Any, Any] | None:
    """(the ``pynvml`` module, its handle of GPU 0), or None without nvidia-ml-py or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - optional
        return None


def add_finished(study: Any, dists: Mapping[str, Any], configs: Sequence[Mapping[str, Any]],
                 cost: Callable[[Any], float]) -> None:
    """``configs`` added to ``study`` as finished trials (value ``cost(config)``, outcome ok)."""
    from optuna.trial import FrozenTrial, TrialState

    from autotune.tuning.sampling import OUTCOME_ATTR

    t0 = dt.datetime.now()
    study.add_trials([
        FrozenTrial(number=i, state=TrialState.COMPLETE, value=cost(c), datetime_start=t0,
                    datetime_complete=t0, params=c, distributions=dict(dists), user_attrs={},
                    system_attrs={OUTCOME_ATTR: "ok"}, intermediate_values={}, trial_id=i)
        for i, c in enumerate(configs)])


def ask_run(kernel: Any, problem: Any, space: Any, sampler: Any, study: Any,
            dists: Mapping[str, Any], sampler_name: str, stored: int, asks: int) -> Any:
    """The scheduler's state of one problem (``tuning.scheduler``) over ``study``, which holds
    ``stored`` finished trials, with budget for ``asks`` more; read up to date."""
    from autotune.tuning import scheduler
    from autotune.tuning.jobs import Budget, ProblemSpec

    spec = ProblemSpec(problem, Budget(trials=stored + 10 * asks), sampler=sampler_name)
    run = scheduler._Run(index=0, spec=spec, kernel=kernel, space=space, sampler=sampler,
                         study=study, dists=dists, outside=0, best_us=None, done_before=stored)
    run.refresh()
    return run


def time_asks(run: Any, asks: int, tell: Callable[[Any, Any], None],
              gap_s: float = 0.0) -> list[tuple[float, float]]:
    """``asks`` asks of ``run`` (:func:`ask_run`), each answered by ``tell(trial, config)``,
    then ``gap_s`` (the time until the next result comes and frees a slot): per ask, its wall
    and its thread's CPU time in milliseconds."""
    times = []
    for _ in range(asks):
        t, c = time.perf_counter(), time.thread_time()
        asked = run.ask()
        times.append(((time.perf_counter() - t) * 1000, (time.thread_time() - c) * 1000))
        assert asked is not None, "the ask was refused"
        tell(*asked)
        time.sleep(gap_s)
    return times

"""Tunable kernels: what the tuner needs to know about a kernel, and where to find one.

A :class:`Kernel` bundles, for one Pallas Mosaic GPU kernel: its search space (tunables and
constraints), how to build it for a problem and config, how to make fresh random inputs, a
reference to check it against, a baseline to beat, and FLOP/byte counts. Bundled kernels live
in ``search_spaces/`` (one module each, exporting ``KERNEL``); a user's kernel is named by an
import path ``package.module:NAME`` and loaded only when the caller allows imports
(``docs/user_kernels.md``).

Importing this module does not import jax; building and running a kernel does.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from autotune.devices import HOPPER_ARCHS, DeviceFacts, check_arch, current_device
from autotune.errors import JobError, KernelNotFoundError, NoValidConfigError, did_you_mean
from autotune.space.problem import MAX_SIZE, Config, Problem, canonical_dtype
from autotune.space.search_space import BoundSpace, Space

__all__ = [
    "Kernel",
    "BuildOptions",
    "BUNDLED",
    "get_kernel",
    "bundled_kernels",
    "register",
    "import_path",
    "resolve_kernel",
]


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How to build a kernel: on the GPU or interpreted on the CPU, and with tracing or not.

    ``profile_space`` > 0 asks for in-kernel traces (``plgpu.CompilerParams(profile_space=...,
    profile_dir=...)`` for Pallas kernels, ``ProfilerSpec`` for raw Mosaic GPU ones) written to
    ``profile_dir``. The tracing pass binds the space with the same ``profile_space``, so the
    profiler's shared memory counts against the limit.
    """

    interpret: bool = False
    profile_space: int = 0
    profile_dir: str | None = None
    trace_scope: str = "warpgroup"
    # SMs to launch for (persistent kernels); None asks the device (on a machine without a
    # GPU: autotune.devices.current_device(), the chosen profile). Cross-lowering passes the
    # current device's count.
    num_sms: int | None = None


# tolerances (rtol, atol) on ||out - ref|| / ||ref|| by input dtype: METHOD.md's bands.
DEFAULT_TOLERANCE: dict[str, float] = {
    "float64": 1e-9,
    "float32": 2e-3,  # the matrix units' float32 (tf32) mode lands near 3e-4
    "bfloat16": 2e-2,
    "float16": 5e-3,
    "float8_e4m3fn": 1.5e-1,
    "float8_e5m2": 2.5e-1,
}


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A tunable kernel and everything the tuner needs to tune it.

    Attributes:
      name: the kernel's name in job files, the CLI and the database. A kernel of your own
        is stored under its import path (``"package.module:NAME"``, see
        :func:`resolve_kernel`); this name is then only a label.
      space: tunables and constraints (a :class:`Space`, or a function of the problem's
        :class:`~autotune.space.search_space.Env` returning one, for spaces whose shape depends on it).
      shape_keys: the problem keys a shape must give (e.g. ``("m", "n", "k")``).
      dtypes: input dtypes the kernel supports; others get an error naming them.
      build: ``build(problem, config, options) -> fn``; ``fn(*inputs)`` runs the kernel and
        is jit-able. The config uses the kernel's own parameter names.
      make_inputs: ``make_inputs(problem, key) -> tuple`` of fresh random arrays (never zeros)
        from a ``jax.random`` key.
      reference: ``reference(problem) -> fn``; ``fn(*inputs)`` computes the right answer in
        higher precision.
      flops, bytes_moved: counts for one call (``None`` when meaningless), for TFLOP/s and GB/s.
      baseline: ``baseline(problem) -> fn`` the thing to beat (XLA, cuDNN), timed in the same run.
      baseline_name: what ``baseline`` is, for reports ("xla", "cudnn").
      default_config: a known-good config (JAX's own defaults), a first trial and a fallback.
      shape_defaults: values for optional shape keys (``{"causal": False}``).
      interpret_ok: whether GPU interpret mode can run it (some kernels use primitives the
        interpreter lacks); ``interpret_note`` says why not.
      tolerance: relative error bound on ``||out - ref|| / ||ref||`` per input dtype.
      description: one line for ``autotune spaces``.
      shape_of: ``shape_of(*inputs) -> shape`` mapping the call's input arrays to the
        problem's shape keys (``{"m": a.shape[0], ...}``), for run-time lookup
        (:func:`autotune.tuned`); None when the kernel does not declare one.
      cost_model: ``cost_model(problem, config) -> seconds``, an analytic estimate of one
        call's run time (Triton's ``perf_model``): its order matters most, its scale helps
        where it is in seconds. The ranked sampler ranks with it before anything is measured
        and corrects it with what is (docs/ranked_sampler.md); None when the kernel has none.
      archs: the compile targets the kernel supports (``("sm_90a",)``, Hopper, for every
        bundled kernel); on a device of another architecture every command refuses it in one
        line (:meth:`check_device`). Empty: any device.
    """

    name: str
    space: Space | Callable[[Any], Space]
    shape_keys: tuple[str, ...]
    dtypes: tuple[str, ...]
    build: Callable[[Problem, Config, BuildOptions], Callable[..., Any]]
    make_inputs: Callable[[Problem, Any], tuple[Any, ...]]
    reference: Callable[[Problem], Callable[..., Any]]
    flops: Callable[[Problem], int] | None = None
    bytes_moved: Callable[[Problem], int] | None = None
    baseline: Callable[[Problem], Callable[..., Any]] | None = None
    baseline_name: str = "xla"
    default_config: Callable[[Problem], Mapping[str, Any]] | None = None
    shape_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    interpret_ok: bool = True
    interpret_note: str = ""
    tolerance: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TOLERANCE))
    description: str = ""
    shape_of: Callable[..., Mapping[str, Any]] | None = None
    cost_model: Callable[[Problem, Mapping[str, Any]], float] | None = None
    archs: tuple[str, ...] = HOPPER_ARCHS

    def check_device(self, device: DeviceFacts | None = None) -> DeviceFacts:
        """The device (default: :func:`~autotune.devices.current_device`), when the kernel
        supports its architecture.

        Raises:
          UnsupportedDeviceError: (a :class:`JobError`) it does not; one line naming both.
        """
        device = device if device is not None else current_device()
        check_arch(self.name, self.archs, device)
        return device

    # -- problems ---------------------------------------------------------------------------

    def problem(self, shape: Mapping[str, Any], dtype: str) -> Problem:
        """A checked :class:`Problem` for this kernel: keys complete, dtype supported.

        Raises:
          JobError: a shape key is missing or unknown, or the dtype is not supported; the
            message names the key or dtype and what is allowed.
        """
        try:
            dtype = canonical_dtype(dtype)
        except ValueError as e:
            raise JobError(str(e)) from None
        merged = dict(self.shape_defaults)
        merged.update(shape)
        allowed = set(self.shape_keys) | set(self.shape_defaults)
        unknown = [k for k in merged if k not in allowed]
        if unknown:
            hints = "".join(did_you_mean(k, allowed) for k in unknown)
            raise JobError(
                f"Kernel {self.name!r} has no shape key(s) {unknown}; its keys are "
                f"{self.shape_keys_text()}.{hints}"
            )
        missing = [k for k in self.shape_keys if k not in merged]
        if missing:
            raise JobError(
                f"Kernel {self.name!r} needs shape key(s) {missing}; got {sorted(shape)}. "
                f"Its keys are {self.shape_keys_text()}. "
                f"Example: --shape {','.join(f'{k}=1024' for k in self.shape_keys)}"
            )
        for key in self.shape_keys:
            value = merged[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
                raise JobError(
                    f"Kernel {self.name!r}: shape key {key}={value!r} must be a positive integer "
                    f"of at most {MAX_SIZE} (2**31 - 1)."
                )
        for key, default in self.shape_defaults.items():
            if type(merged[key]) is not type(default):
                raise JobError(
                    f"Kernel {self.name!r}: shape key {key}={merged[key]!r} must be a "
                    f"{type(default).__name__} like its default {default!r}."
                )
        problem = Problem(self.name, merged, dtype)
        return problem

    def shape_keys_text(self) -> str:
        """The shape keys in words: required ones, then optional ones with their defaults
        (``batch, seq_q, ..., and optionally causal (default false)``)."""
        text = ", ".join(self.shape_keys)
        optional = [
            f"{k} (default {str(v).lower() if isinstance(v, bool) else v})"
            for k, v in self.shape_defaults.items() if k not in self.shape_keys
        ]
        return text + (", and optionally " + ", ".join(optional) if optional else "")

    def bind(self, problem: Problem, **env: Any) -> BoundSpace:
        """The kernel's space bound to ``problem`` (``env``: ``profile_space``, ``device``
        etc.; the device defaults to :func:`~autotune.devices.current_device`)."""
        if "device" not in env:
            env["device"] = current_device()
        space = self.space
        if not isinstance(space, Space):
            from autotune.space.search_space import Env

            space = space(Env(problem, **env))
        return space.bind(problem, **env)

    def valid_space(self, problem: Problem, **env: Any) -> BoundSpace:
        """Like :meth:`bind`, but raises :class:`NoValidConfigError` when nothing is valid.

        An unsupported dtype is reported here too, with the dtypes the kernel does support.
        """
        if problem.dtype not in self.dtypes:
            # The space's own problem rules (reads=()) may say why the dtype is unsupported.
            try:
                bound = self.bind(problem, **env)
                why = "".join(
                    f" [{rule.name}] {rule.explain({}, bound.env)}."
                    for rule in bound.problem_rules
                    if not rule.check({}, bound.env)
                )
            except Exception:  # noqa: BLE001 - a space that cannot bind this dtype adds nothing
                why = ""
            raise NoValidConfigError(
                f"No valid config for {problem}: [supported_dtype] {self.name} supports "
                f"dtype {', '.join(self.dtypes)}, not {problem.dtype}.{why}"
            )
        # Checking a job binds every problem's space and counts it (up to seconds for a large
        # space), and tuning binds it again: the second time comes from here.
        if "device" not in env:
            env["device"] = current_device()
        key = (self.name, problem, tuple(sorted(env.items())))
        hit = _VALID_SPACES.get(key)
        if hit is not None and hit[0] is self:
            return hit[1]
        bound = self.bind(problem, **env)
        bound.require_nonempty()
        with _VALID_SPACES_LOCK:
            _VALID_SPACES[key] = (self, bound)
            while len(_VALID_SPACES) > 256:
                _VALID_SPACES.pop(next(iter(_VALID_SPACES)))
        return bound


# (kernel name, problem, env) -> (kernel, its valid space): the last 256 bound.
_VALID_SPACES: dict[tuple[Any, ...], tuple[Kernel, BoundSpace]] = {}
_VALID_SPACES_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Finding kernels.

# Bundled kernels: name -> module under search_spaces/ (imported lazily; each exports KERNEL).
BUNDLED: dict[str, str] = {
    "hopper_matmul": "search_spaces.hopper_matmul",
    "hopper_attention": "search_spaces.hopper_attention",
    "softmax": "search_spaces.softmax",
    "mosaic_scale": "search_spaces.mosaic_scale",
}


# Kernels declared in the running program (autotune.tune(kernel_object, ...)); workers started
# by the engine re-resolve kernels by name, so a registered kernel must also be importable
# by path for GPU runs in worker processes.
_REGISTERED: dict[str, Kernel] = {}


def register(kernel: Kernel) -> None:
    """Makes ``kernel`` resolvable by its name in this process."""
    if kernel.name in BUNDLED:
        raise KernelNotFoundError(
            f"Kernel name {kernel.name!r} is taken by a bundled kernel; choose another name."
        )
    _REGISTERED[kernel.name] = kernel


def bundled_kernels() -> list[str]:
    """Names of the bundled kernels."""
    return list(BUNDLED)


def get_kernel(name: str, *, allow_import: bool = False) -> Kernel:
    """The kernel called ``name``: a bundled one, or ``package.module:NAME`` if allowed.

    Raises:
      KernelNotFoundError: unknown name, an import path without ``allow_import``, or an import
        path that does not lead to a :class:`Kernel`.
    """
    if name in BUNDLED:
        module = importlib.import_module(BUNDLED[name])
        kernel: Kernel = module.KERNEL
        return kernel
    if name in _REGISTERED:
        return _REGISTERED[name]
    if ":" not in name:
        known = [*BUNDLED, *_REGISTERED]
        raise KernelNotFoundError(
            f"Unknown kernel {name!r}: bundled kernels are {', '.join(BUNDLED)}; a kernel of "
            "your own is named 'package.module:NAME' (and needs --allow-import)."
            + did_you_mean(name, known)
        )
    if not allow_import:
        raise KernelNotFoundError(
            f"Kernel {name!r} is an import path; importing code from a job file needs an explicit "
            "--allow-import (CLI) or allow_import=True (API)."
        )
    module_name, _, attr = name.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or not attr.isidentifier():
        raise KernelNotFoundError(
            f"Kernel {name!r} is not an import path: it must be 'package.module:NAME', a dotted "
            "module path and a name made of Python identifiers (no '/', '..' or spaces)."
        )
    _cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise KernelNotFoundError(
            f"Kernel {name!r}: cannot import module {module_name!r}: {e}. The module must be "
            f"importable from the current directory ({os.getcwd()}) or PYTHONPATH."
        ) from e
    obj = getattr(module, attr, None)
    if not isinstance(obj, Kernel):
        raise KernelNotFoundError(
            f"Kernel {name!r}: {module_name}.{attr} is {type(obj).__name__}, not an "
            "autotune.Kernel."
        )
    if obj.name != name:
        obj = dataclasses.replace(obj, name=name)
    return obj


def _cwd_importable() -> None:
    """Lets ``package.module`` paths resolve from the current directory, as ``python -m`` does.

    The ``autotune`` console script starts with its own directory on ``sys.path``, not the
    current one; a job run from a project's root names the project's modules from there.
    Appended, so it never shadows an installed package. Worker processes start with this
    process's ``sys.path``.
    """
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.append(cwd)


def import_path(kernel: Kernel) -> str | None:
    """``"package.module:NAME"`` under which ``kernel`` can be imported, or None.

    A kernel loaded by :func:`get_kernel` from a path carries it as its name. Otherwise the
    modules of its ``build``, ``make_inputs`` and ``reference`` are searched for a global
    holding this very object. A kernel defined in a script run as ``python script.py`` (its
    ``__main__``) has no import path; one run with ``python -m package.module`` does.
    """
    if ":" in kernel.name:
        return kernel.name
    seen: set[str] = set()
    for fn in (kernel.build, kernel.make_inputs, kernel.reference):
        module_name = getattr(fn, "__module__", None)
        if not module_name or module_name in seen:
            continue
        seen.add(module_name)
        module = sys.modules.get(module_name)
        if module is None:
            continue
        if module_name == "__main__":
            spec = getattr(module, "__spec__", None)
            if spec is None or not spec.name or spec.name == "__main__":
                continue
            module_name = spec.name
        for attr, value in list(vars(module).items()):
            if value is kernel:
                return f"{module_name}:{attr}"
    return None


def resolve_kernel(kernel: str | Kernel, *, allow_import: bool = False) -> Kernel:
    """The kernel ``kernel`` names, or a :class:`Kernel` object under its stored name.

    Results are stored under a kernel's name: a bundled kernel's own, a user's kernel's
    import path (``"package.module:NAME"``, the name a job file and ``autotune best`` use).
    A kernel object found in its module gets that path as its name, so tuning, ``best``
    and the run-time lookup all meet on one name; one without an import path keeps its own.
    """
    if not isinstance(kernel, Kernel):
        return get_kernel(kernel, allow_import=allow_import)
    if kernel.name in BUNDLED:
        return kernel
    path = import_path(kernel)
    if path is None or path == kernel.name:
        return kernel
    return dataclasses.replace(kernel, name=path)

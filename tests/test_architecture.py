"""The import layers of docs/architecture.md, enforced over every module's imports (ast).

A module may import from its own layer and the layers below it, never from one above; the
query side never imports jax. Every import counts, at module level or inside a function: a
lazy import is still a dependency. Imports under ``if TYPE_CHECKING:`` are not run, and the
root package (the lazy public API) may name anything there.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "autotune"

# Lowest first. A module's layer is its subpackage's, or its own name's for top-level modules.
LAYERS: list[tuple[str, set[str]]] = [
    ("core", {"autotune", "autotune.errors", "autotune._paths", "autotune._jax_compat",
              "autotune.devices"}),
    ("space", {"autotune.space"}),
    ("evaluation", {"autotune.evaluation"}),
    ("engine", {"autotune.engine"}),
    ("storage", {"autotune.storage"}),
    ("tuning", {"autotune.tuning"}),
    ("queries", {"autotune.queries"}),
    ("front", {"autotune.api", "autotune.cli", "autotune.progress", "autotune.interrupts",
               "autotune.__main__"}),
]
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}
# Modules of the query side (the run-time API included): none may import jax, even lazily
# through the modules they import at module level.
QUERY_SIDE = ["autotune.queries"]
JAX = ("jax", "jaxlib")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of an autotune module (or of a name imported from one)."""
    best = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if prefix == "autotune":
                if module == "autotune" or module.startswith("autotune.__version__"):
                    return name
                continue
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (name, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py")
    return best[0]


def imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` for every import that runs."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            inner = top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for a in child.names:
                    # ``from autotune.x import y``: y may be a module (autotune.x.y) or a name.
                    full = f"{child.module}.{a.name}"
                    found.append((full if full in MODULES else child.module, child.lineno, top))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    own = LEVEL[layer_of(module)]
    bad = [
        f"{module_name(MODULES[module])}:{line} imports {target} ({layer_of(target)})"
        for target, line, _top in imports(MODULES[module])
        if target.startswith("autotune") and LEVEL[layer_of(target)] > own
    ]
    assert not bad, "\n".join(bad)


def _module_level_closure(start: str) -> set[str]:
    """Every module imported at module level from ``start``, transitively (autotune modules
    followed; other packages recorded by their top-level name)."""
    seen, todo, external = set(), [start], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        todo.extend(p for p in parents if p in MODULES)
        for target, _line, top in imports(MODULES[module]):
            if not top:
                continue
            if target.startswith("autotune"):
                while target not in MODULES and "." in target:
                    target = target.rsplit(".", 1)[0]
                todo.append(target)
            else:
                external.add(target.split(".")[0])
    return external


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if any(m.startswith(q) for q in QUERY_SIDE))
)
def test_the_query_side_never_imports_jax(module):
    external = _module_level_closure(module)
    assert not external & set(JAX), f"{module} imports jax at module level (through its imports)"
    # ... nor inside a function of its own
    lazy = [t for t, _line, _top in imports(MODULES[module]) if t.split(".")[0] in JAX]
    assert not lazy, f"{module} imports {lazy}"


def test_importing_the_query_side_and_best_config_loads_no_jax():
    modules = sorted(m for m in MODULES if any(m.startswith(q) for q in QUERY_SIDE))
    code = (
        "import sys, autotune\n"
        + "".join(f"import {m}\n" for m in modules)
        + "autotune.best_config; autotune.best_result; autotune.tuned; autotune.lookup_config\n"
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib'))\n"
        + "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_optuna_private_names_stay_in_tuning():
    """Only the tuning layer and above import Optuna at all; its private names are the
    adapter's alone (tests/tuning/test_optuna_adapter.py checks the names)."""
    for module, path in MODULES.items():
        uses = [t for t, _line, _top in imports(path) if t.split(".")[0] == "optuna"]
        if uses:
            assert LEVEL[layer_of(module)] >= LEVEL["tuning"], (module, uses)


def test_no_module_reaches_into_another_modules_private_names():
    """``module._name`` is that module's own: no autotune module reads an underscore name of
    another autotune module it imports as a module (the scheduler uses the study module's
    non-underscore interface)."""
    bad = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> autotune module imported as a module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in MODULES:
                        aliases[a.asname or a.name] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{module}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(bad)


# -- one run loop (docs/architecture.md, "One run loop") ----------------------------------------

# The steps of a run loop, by the names of the calls that make them: ask a study for a trial,
# submit its config to the engine, store the result, tell the study. A module that calls one
# name of every step runs a loop of its own.
RUN_LOOP_STEPS = {
    "ask": {"new_trial", "ask"},
    "submit": {"submit"},
    "record": {"record_trial", "record_trials"},
    "tell": {"tell_result", "tell"},
}
RUN_LOOP = "autotune.tuning.scheduler"
# The modules of the run: the loop, the job's frame around it, and what the loop builds on.
RUN_MODULES = ["autotune.tuning.tuner", "autotune.tuning.scheduler", "autotune.tuning.studies",
               "autotune.tuning.reports", "autotune.tuning.confirming", "autotune.tuning.seeding",
               "autotune.tuning.provenance"]


def called_names(path: pathlib.Path) -> set[str]:
    """The names a module calls: ``f(...)`` gives ``f``, ``x.f(...)`` gives ``f``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


def run_loops(paths: dict[str, pathlib.Path]) -> list[str]:
    """The modules that call a name of every step of a run loop."""
    return sorted(m for m, path in paths.items()
                  if all(called_names(path) & names for names in RUN_LOOP_STEPS.values()))


def _imported_modules(module: str) -> set[str]:
    """The autotune modules ``module`` imports, lazily or not (TYPE_CHECKING left out)."""
    out = set()
    for target, _line, _top in imports(MODULES[module]):
        if target.startswith("autotune"):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            out.add(target)
    return out - {module}


def _reachable(start: str) -> set[str]:
    """Every autotune module ``start`` imports, transitively, lazy imports included."""
    seen: set[str] = set()
    todo = list(_imported_modules(start))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imported_modules(module))
    return seen


def test_there_is_one_run_loop():
    """Ask -> submit -> record -> tell happens in the scheduler alone: no other module calls
    every step (the sequential runner that tuner.py held was a second loop, and this check
    finds it there), and the study's ask and tell (``studies.new_trial``,
    ``studies.tell_result``) are called from the scheduler only."""
    assert run_loops(MODULES) == [RUN_LOOP]
    callers = {step: sorted(m for m, path in MODULES.items()
                            if m != "autotune.tuning.studies" and step in called_names(path))
               for step in ("new_trial", "tell_result")}
    assert callers == {"new_trial": [RUN_LOOP], "tell_result": [RUN_LOOP]}


def test_the_run_loop_check_finds_a_second_loop(tmp_path):
    """The check above is not vacuous: a module that asks, submits, records and tells (the
    shape of the sequential loop tuner.py once held) is found as a run loop."""
    second = tmp_path / "second.py"
    second.write_text(
        "def tune(study, engine, store, dists):\n"
        "    trial = new_trial(study, dists)\n"
        "    result = engine.submit('k', None, trial.params).result()\n"
        "    recorded = store.record_trial(None, trial.params, result)\n"
        "    tell_result(study, trial, result, duplicate=recorded.duplicate)\n")
    paths = {RUN_LOOP: MODULES[RUN_LOOP], "second": second}
    assert run_loops(paths) == [RUN_LOOP, "second"]


def test_the_queries_never_import_the_runner():
    """The query side reads studies through ``tuning.studies`` and never reaches the job
    runner or the scheduler, directly, lazily or through another module."""
    runner = {"autotune.tuning.tuner", "autotune.tuning.scheduler"}
    bad = {m: sorted(_reachable(m) & runner) for m in MODULES
           if any(m.startswith(q) for q in QUERY_SIDE)}
    assert not {m: r for m, r in bad.items() if r}, bad


def test_the_study_module_needs_neither_jax_the_engine_nor_the_evaluation():
    """``tuning.studies`` (what queries may import for study names and heartbeats) reaches no
    module of the engine or the evaluation, and no jax, even through lazy imports."""
    reached = _reachable("autotune.tuning.studies")
    heavy = sorted(m for m in reached
                   if m.startswith(("autotune.engine", "autotune.evaluation")))
    assert not heavy, heavy
    external = {t.split(".")[0] for m in reached | {"autotune.tuning.studies"}
                for t, _line, _top in imports(MODULES[m]) if not t.startswith("autotune")}
    assert not external & set(JAX), external


def test_the_run_modules_import_one_way():
    """No module of the run (the job frame, the loop, the pieces below it) lies on an import
    cycle: the tuner imports the scheduler, never the other way."""
    assert "autotune.tuning.tuner" not in _reachable(RUN_LOOP)
    cyclic = [m for m in RUN_MODULES if m in _reachable(m)]
    assert not cyclic, cyclic

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


# Underscore names of other modules that the modules below still import, while other branches
# restructure them (issue 33): (importing file, "module._name"). This list must only shrink:
# never add to it; remove an entry once its file no longer needs it (a stale entry fails
# test_the_private_import_allowlist_holds_no_stale_entry).
PRIVATE_IMPORT_ALLOWLIST: frozenset[tuple[str, str]] = frozenset()


def _private_uses(source: str, module: str, filename: str = "<src>") -> list[tuple[str, int]]:
    """``("target_module._name", line)`` for every underscore name of another autotune module
    that ``source`` (the module ``module``) imports by name (``from m import _x``, relative
    imports included) or reads through a module it imported (``m._x``, ``import a.b as m``
    then ``m._x``, ``a.b._x``). A private *module* (``from autotune import _paths``) is a
    module, not a name: importing it is not counted."""
    tree = ast.parse(source, filename)
    package = module if MODULES.get(module, pathlib.Path()).name == "__init__.py" else (
        module.rsplit(".", 1)[0])
    found: list[tuple[str, int]] = []
    aliases: dict[str, str] = {}  # local name -> autotune module (or package prefix)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source_module = ".".join(base + ([node.module] if node.module else []))
            else:
                source_module = node.module or ""
            if not source_module.startswith("autotune"):
                continue
            for a in node.names:
                full = f"{source_module}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif (a.name.startswith("_") and not a.name.startswith("__")
                        and source_module != module):
                    found.append((full, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("autotune"):
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        parts, value = [], node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        target = ".".join([aliases[value.id], *reversed(parts)])
        if target in MODULES and target != module and f"{target}.{node.attr}" not in MODULES:
            found.append((f"{target}.{node.attr}", node.lineno))
    return found


def _private_imports() -> dict[tuple[str, str], list[int]]:
    """(file, "module._name") -> lines, over every autotune module."""
    out: dict[tuple[str, str], list[int]] = {}
    for module, path in MODULES.items():
        rel = path.relative_to(REPO).as_posix()
        for target, line in _private_uses(path.read_text(), module, str(path)):
            out.setdefault((rel, target), []).append(line)
    return out


def test_no_module_imports_or_reads_another_modules_private_names():
    """No autotune module imports an underscore name of another (``from m import _x``) or
    reads one through a module it imported (``m._x``): shared helpers are public within
    their package. Only PRIVATE_IMPORT_ALLOWLIST's pairs are left (the scheduler uses the
    tuner's non-underscore interface)."""
    bad = [f"{file}:{lines[0]} uses {target}"
           for (file, target), lines in sorted(_private_imports().items())
           if (file, target) not in PRIVATE_IMPORT_ALLOWLIST]
    assert not bad, "\n".join(bad)


def test_the_private_import_allowlist_holds_no_stale_entry():
    """Every allowlisted (file, name) pair still occurs: one that is gone must be removed,
    so the list only shrinks."""
    stale = sorted(PRIVATE_IMPORT_ALLOWLIST - set(_private_imports()))
    assert not stale, f"remove from PRIVATE_IMPORT_ALLOWLIST: {stale}"


@pytest.mark.parametrize(("source", "expected"), [
    ("from autotune.storage.keys import _policy, software_key", ["autotune.storage.keys._policy"]),
    ("from .keys import _policy", ["autotune.storage.keys._policy"]),
    ("from autotune.storage import keys\nkeys._policy('warm')", ["autotune.storage.keys._policy"]),
    ("import autotune.storage.keys as k\nk._policy", ["autotune.storage.keys._policy"]),
    ("import autotune.storage.keys\nautotune.storage.keys._policy", ["autotune.storage.keys._policy"]),
    ("from autotune import _paths\nfrom autotune._paths import safe_path", []),
    ("from autotune.storage.keys import software_key\nx._private", []),
    ("from autotune.storage.store import _SOUND_FILES", []),  # its own name
])
def test_the_private_name_check_sees_every_form(source, expected):
    """The check above catches ``from m import _x`` (absolute and relative) and ``m._x``
    through every import form, and not a module's own names or a private module."""
    found = [target for target, _line in _private_uses(source, "autotune.storage.store")]
    assert found == expected

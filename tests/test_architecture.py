"""The import layers of docs/architecture.md, enforced over every module's imports (ast).

A module may import from its own layer and the layers below it, never from one above; the
query side never imports jax. Every import counts, at module level or inside a function: a
lazy import is still a dependency. Imports under ``if TYPE_CHECKING:`` are not run, and the
root package (the lazy public API) may name anything there.
"""

from __future__ import annotations

import ast
import functools
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
    # The bundled kernels (search_spaces/, loaded by name by autotune.space.kernel) and the
    # public kernel API they import (autotune.kernels) sit in the space layer.
    ("space", {"autotune.space", "autotune.kernels", "search_spaces"}),
    ("evaluation", {"autotune.evaluation"}),
    ("engine", {"autotune.engine"}),
    ("storage", {"autotune.storage"}),
    ("tuning", {"autotune.tuning"}),
    ("queries", {"autotune.queries"}),
    ("replay", {"autotune.replay"}),
    ("front", {"autotune.api", "autotune.cli", "autotune.progress", "autotune.interrupts",
               "autotune.__main__"}),
]
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}


def parse(path: pathlib.Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per version of the file (the checks below read every
    module many times over; none changes a tree)."""
    stat = path.stat()
    return _parse(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(pathlib.Path(path).read_text(), path)
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

    visit(parse(path), True)
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


# -- Kernels: search_spaces/ and the modules loaded by name -------------------------------------
# The bundled kernels sit in the space layer: autotune.space.kernel loads them by name. They
# import autotune through its public kernel API only (autotune.kernels, or the root package's
# public names), and no JAX private name.

KERNEL_PACKAGE = REPO / "search_spaces"
KERNEL_MODULES = {module_name(p): p for p in sorted(KERNEL_PACKAGE.rglob("*.py"))}
PUBLIC_KERNEL_API = ("autotune", "autotune.kernels")
# Modules that import others by a name computed at run time, each with the registry its
# names come from (a dict literal at module level: key -> module name). A module loaded this
# way is a dependency like an import, and the layer rules apply to it. The root package's
# lazy public API (_EXPORTS) is exempt, as its imports under TYPE_CHECKING are; a user's
# kernel (``package.module:NAME``, with --allow-import) is the user's code, not autotune's.
DYNAMIC_IMPORTS: dict[str, str | None] = {"autotune": None, "autotune.space.kernel": "BUNDLED",
                                           "autotune.tuning.samplers": "ENTRIES"}
_DYNAMIC_CALLS = {"import_module", "__import__", "spec_from_file_location", "run_module",
                  "run_path"}


def _resolve(target: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module of ``modules`` an imported name belongs to (a name of it, or a module)."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target if target in modules else None


def dynamic_import_lines(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` that import a module by a name computed at run time."""
    lines = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in _DYNAMIC_CALLS:
                lines.append(node.lineno)
    return lines


def registry(path: pathlib.Path, name: str) -> dict[str, str]:
    """The dict literal assigned to ``name`` at the top level of ``path``."""
    for node in parse(path).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[arg-type]
            assert isinstance(value, dict), f"{path}: {name} is not a dict literal"
            return value
    raise AssertionError(f"{path} assigns no {name}")


def dependencies(module: str, modules: dict[str, pathlib.Path],
                 dynamic: dict[str, list[str]]) -> list[tuple[str, int]]:
    """``(module, line)`` for every module ``module`` imports, lazily or not, and every module
    it loads by name from its registry (line 0)."""
    found = [(t, line) for t, line, _top in imports(modules[module])]
    found += [(t, 0) for t in dynamic.get(module, [])]
    return [(r, line) for t, line in found if (r := _resolve(t, modules)) is not None]


def registered_modules() -> dict[str, list[str]]:
    """Module -> the modules it loads by name: from its registry, read with ``ast`` where it is
    a dict literal (BUNDLED), else from the running registry (the samplers' ENTRIES, whose
    module paths are built from the package's name)."""
    import importlib

    found = {}
    for m, reg in DYNAMIC_IMPORTS.items():
        if reg == "ENTRIES":
            found[m] = sorted({e.module for e in importlib.import_module(m).ENTRIES})
        elif reg is not None:
            found[m] = sorted(set(registry(MODULES[m], reg).values()))
    return found


def layer_violations(modules: dict[str, pathlib.Path], dynamic: dict[str, list[str]],
                     start: str) -> list[str]:
    """Every module reached from ``start`` (imports, lazy ones included, and modules loaded
    by name) that sits in a layer above ``start``'s, with the path that reaches it."""
    own = LEVEL[layer_of(start)]
    seen, todo, bad = {start: start}, [start], []
    while todo:
        module = todo.pop()
        for target, line in dependencies(module, modules, dynamic):
            if target in seen:
                continue
            seen[target] = f"{seen[module]} -> {target}" + (f" (line {line})" if line else
                                                            " (loaded by name)")
            if LEVEL[layer_of(target)] > own:
                bad.append(f"{seen[target]} ({layer_of(target)})")
            else:
                todo.append(target)
    return bad


def public_api_violations(path: pathlib.Path) -> list[str]:
    """Where a kernel module reaches autotune other than through its public kernel API, or
    names a JAX private name."""
    import autotune
    import autotune.kernels

    exported = {"autotune": set(autotune.__all__), "autotune.kernels": set(autotune.kernels.__all__)}
    tree = parse(path)
    bad, aliases, jax_aliases = [], {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root == "autotune":
                    if a.name not in PUBLIC_KERNEL_API:
                        bad.append(f"line {node.lineno}: import {a.name}")
                    aliases[a.asname or a.name] = a.name
                if root in JAX:
                    jax_aliases.add(a.asname or root)
                    if any(p.startswith("_") for p in a.name.split(".")):
                        bad.append(f"line {node.lineno}: import {a.name} (a JAX private module)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if root == "autotune":
                    if full in PUBLIC_KERNEL_API:
                        aliases[a.asname or a.name] = full
                    elif node.module not in exported or a.name not in exported[node.module]:
                        bad.append(f"line {node.lineno}: from {node.module} import {a.name}")
                if root in JAX:
                    jax_aliases.add(a.asname or a.name)
                    if any(p.startswith("_") for p in full.split(".")):
                        bad.append(f"line {node.lineno}: from {node.module} import {a.name} "
                                   "(a JAX private name)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = node.value.id
            if owner in aliases and node.attr not in exported[aliases[owner]]:
                bad.append(f"line {node.lineno}: {aliases[owner]}.{node.attr} is not public")
            if (owner in jax_aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"line {node.lineno}: {owner}.{node.attr} (a JAX private name)")
    return bad


def test_every_kernel_module_is_in_the_space_layer():
    """search_spaces/ is covered by the layer rules: each of its modules is in the space layer."""
    assert KERNEL_MODULES, "no modules found under search_spaces/"
    for module in KERNEL_MODULES:
        assert layer_of(module) == "space", module


@pytest.mark.parametrize("module", sorted(KERNEL_MODULES))
def test_kernel_modules_import_nothing_above_the_space(module):
    """A bundled kernel imports (lazily or not) nothing of a layer above the space: it is
    loaded by the space layer itself."""
    own = LEVEL[layer_of(module)]
    modules = {**MODULES, **KERNEL_MODULES}
    bad = [f"{module}:{line} imports {target} ({layer_of(target)})"
           for target, line in dependencies(module, modules, {})
           if LEVEL[layer_of(target)] > own]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", sorted(KERNEL_MODULES))
def test_kernel_modules_use_only_the_public_kernel_api(module):
    """A bundled kernel reaches autotune through ``autotune.kernels`` (or the root package's
    public names) only, and names no JAX private name (those live in ``autotune._jax_compat``)."""
    bad = public_api_violations(KERNEL_MODULES[module])
    assert not bad, f"{module}:\n" + "\n".join(bad)


def test_every_module_loaded_by_name_comes_from_a_registry_the_layer_test_reads():
    """Only the modules of DYNAMIC_IMPORTS import by a computed name; a new one must name its
    registry here, so the layer rules follow what it loads."""
    found = {m for m, p in {**MODULES, **KERNEL_MODULES}.items() if dynamic_import_lines(p)}
    assert found == set(DYNAMIC_IMPORTS), (
        f"modules importing by name: {sorted(found)}; registered: {sorted(DYNAMIC_IMPORTS)}")


def test_the_bundled_kernel_registry_names_kernel_modules_the_layers_allow():
    """BUNDLED (read with ast, and as the running code has it) names modules of search_spaces/,
    each in a layer the loading module may import from."""
    import autotune.space.kernel

    loaded = registered_modules()["autotune.space.kernel"]
    assert loaded == sorted(set(autotune.space.kernel.BUNDLED.values()))
    for target in loaded:
        assert target in KERNEL_MODULES, f"BUNDLED names {target}, not a module of search_spaces/"
        assert LEVEL[layer_of(target)] <= LEVEL[layer_of("autotune.space.kernel")], target


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "space"))
def test_the_space_layer_reaches_no_layer_above_it_through_its_kernels(module):
    """From each space module, every module reached (imports, lazy ones included, and the
    kernels loaded by name, transitively) sits in the space layer or below."""
    bad = layer_violations({**MODULES, **KERNEL_MODULES}, registered_modules(), module)
    assert not bad, "\n".join(bad)


def test_a_kernel_reaching_evaluation_fails_the_layer_rules(tmp_path):
    """The checks above catch a registered kernel that imports the evaluation layer (lazily,
    inside its build) or a private autotune module: they can fail."""
    bad_kernel = tmp_path / "bad_kernel.py"
    bad_kernel.write_text(
        "import autotune.kernels as ak\n"
        "from autotune._jax_compat import profile_params\n"
        "def build(problem, config, options):\n"
        "    from autotune.evaluation.lowering import lower_for_cuda\n"
        "    return ak.Kernel, ak._private, lower_for_cuda, profile_params\n"
    )
    modules = {**MODULES, **KERNEL_MODULES, "search_spaces.bad_kernel": bad_kernel}
    dynamic = registered_modules()
    dynamic["autotune.space.kernel"] = [*dynamic["autotune.space.kernel"],
                                        "search_spaces.bad_kernel"]
    reached = layer_violations(modules, dynamic, "autotune.space.kernel")
    assert reached == ["autotune.space.kernel -> search_spaces.bad_kernel (loaded by name) -> "
                       "autotune.evaluation.lowering (line 4) (evaluation)"]
    api = public_api_violations(bad_kernel)
    assert any("from autotune._jax_compat import profile_params" in b for b in api), api
    assert any("autotune.kernels._private is not public" in b for b in api), api
    assert any("from autotune.evaluation.lowering import" in b for b in api), api


def test_no_module_patches_jax_at_import():
    """Importing every module of autotune/ and search_spaces/ leaves every JAX module it
    finds loaded as it was: no attribute replaced, added or removed (submodules apart)."""
    jax_modules = [
        "jax", "jax.numpy", "jax.experimental.pallas", "jax.experimental.pallas.mosaic_gpu",
        "jax.experimental.pallas.ops.gpu.attention_mgpu",
        "jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu", "jax.experimental.mosaic.gpu",
        "jax._src.pallas.mosaic.interpret.thread_map", "jax._src.lib",
    ]
    # (not __main__, which runs the CLI, nor the migration scripts alembic runs)
    ours = sorted(m for m in {**MODULES, **KERNEL_MODULES}
                  if not m.endswith("__main__") and ".migrations" not in m)
    code = (
        "import importlib, sys, types\n"
        f"for name in {jax_modules!r}:\n"
        "    importlib.import_module(name)\n"
        "def state():\n"
        "    return {m: {k: id(v) for k, v in vars(mod).items()\n"
        "                if not isinstance(v, types.ModuleType)}\n"
        "            for m, mod in list(sys.modules.items())\n"
        "            if m.split('.')[0] in ('jax', 'jaxlib') and mod is not None}\n"
        "before = state()\n"
        f"for name in {ours!r}:\n"
        "    importlib.import_module(name)\n"
        "after = state()\n"
        "changed = sorted(f'{m}.{k}' for m in before for k in before[m].keys() | after[m].keys()\n"
        "                 if before[m].get(k) != after[m].get(k))\n"
        "assert not changed, f'changed by importing autotune: {changed}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


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
    for node in ast.walk(parse(path)):
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

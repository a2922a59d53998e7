"""The docs name tests by path (``tests/<folder>/test_x.py::test_name``); every one exists."""

from __future__ import annotations

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "benchmarks" / "RESULTS.md", *sorted((REPO / "docs").glob("*.md"))]
NAMED = re.compile(r"tests/[\w/]*?test_\w+\.py(?:::\w+\*?)?")  # name* : any name so begun


def test_every_test_named_in_the_docs_exists():
    """Each ``tests/...test_x.py`` (and ``::test_name``) in the README and docs/ is a real test
    file (and a test function in it), so moving tests cannot leave a doc pointing nowhere."""
    missing = []
    for doc in DOCS:
        if not doc.exists():
            continue
        for ref in sorted(set(NAMED.findall(doc.read_text()))):
            path, _, name = ref.partition("::")
            file = REPO / path
            if not file.is_file():
                missing.append(f"{doc.relative_to(REPO)}: {ref} (no such file)")
                continue
            if name:
                defined = {n.name for n in ast.walk(ast.parse(file.read_text()))
                           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                found = (any(d.startswith(name[:-1]) for d in defined) if name.endswith("*")
                         else name in defined)
                if not found:
                    missing.append(f"{doc.relative_to(REPO)}: {ref} (no such test)")
    assert not missing, "\n".join(missing)

"""The public modules pass ``mypy --strict`` (pyproject.toml ``[tool.mypy]`` names them).

This is how mypy runs in CI: the test extra installs it, and this test runs it with the
project's configuration, failing with mypy's own report.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_public_modules_pass_mypy_strict(tmp_path):
    """`python3 -m mypy` (the files and strict settings of pyproject.toml) reports no error."""
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    env = {**os.environ, "MYPY_FORCE_COLOR": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy_cache"), "--no-error-summary"],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert proc.returncode == 0, f"mypy --strict failed:\n{proc.stdout}{proc.stderr}"

"""``autotune ARGS`` run in the test's own process, for the commands of a test whose first
command ran in its own process (the CLI's start, its imports and its exit code are then shown
once; the later commands' output is what they must show)."""

from __future__ import annotations

import subprocess


def cli_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``autotune ARGS`` through :func:`autotune.cli.main` in this process (output captured by
    pytest's ``capsys``; the stores that queries keep open closed after, as at a process's
    end)."""
    from autotune.cli import main
    from autotune.queries.best import close_stores

    capsys.readouterr()
    try:
        code = main(list(args))
    finally:
        close_stores()
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["autotune", *args], code, out, err)

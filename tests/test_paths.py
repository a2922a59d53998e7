"""autotune._paths: names from job files, kernels, configs and the database never lead out of the
results directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune._paths import UnsafePathError, check_file_name, safe_path
from autotune.errors import JobError

ESCAPES = [
    ("../../etc/x", "'..'"),
    ("..", "'..'"),
    ("traces/../../x", "'..'"),
    ("/etc/passwd", "absolute path"),
    ("//server/share", "absolute path"),
    ("a\x00b", "NUL byte"),
    ("", "''"),
    (".", "'.'"),
    ("a//b", "''"),
    ("a/", "''"),
    ("..\\..\\windows", "backslash"),
    ("x" * 256, "longer than 255 bytes"),
    ("é" * 128, "longer than 255 bytes"),
]


@pytest.mark.parametrize("name, rule", ESCAPES, ids=[repr(n)[:24] for n, _ in ESCAPES])
def test_names_that_would_leave_the_root_are_refused(name, rule, tmp_path):
    """Each escaping name raises UnsafePathError (a JobError) naming the value and the rule."""
    with pytest.raises(UnsafePathError) as info:
        safe_path(tmp_path, "traces", name, "abc")
    message = str(info.value)
    assert repr(name)[:40].rstrip("'") in message and rule in message
    assert "results directory" in message
    assert isinstance(info.value, JobError)
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_good_names_join_under_the_root(tmp_path):
    """Import-path kernel names, digests and nested relative parts stay under the root."""
    path = safe_path(tmp_path, "traces", "pkg.mod:KERNEL", "3f2a", "a/b c")
    assert path == tmp_path / "traces" / "pkg.mod:KERNEL" / "3f2a" / "a" / "b c"
    assert path.resolve().is_relative_to(tmp_path.resolve())
    assert safe_path("results") == Path("results")


def test_non_string_parts_are_refused(tmp_path):
    """A part that is not a string (None, bytes, a Path) is refused, naming its type."""
    for part in (None, b"x", Path("/etc")):
        with pytest.raises(UnsafePathError, match=type(part).__name__):
            safe_path(tmp_path, part)  # type: ignore[arg-type]


def test_file_names_are_one_component():
    """check_file_name allows one file name and names the field and rule otherwise."""
    assert check_file_name("name", "my-job_v2.1") == "my-job_v2.1"
    for bad, rule in (("a/b", "'/'"), ("..", "'..'"), ("", "non-empty"), (3, "non-empty"),
                      ("a\x00", "NUL")):
        with pytest.raises(UnsafePathError, match=rule) as info:
            check_file_name("job name", bad)
        assert "job name" in str(info.value)


@given(st.lists(st.text(max_size=12), min_size=1, max_size=4))
def test_fuzz_accepted_paths_never_leave_the_root(parts):
    """Whatever the parts, an accepted path resolves inside the root (lexically)."""
    root = Path("/srv/results")
    try:
        path = safe_path(root, *parts)
    except UnsafePathError:
        return
    assert Path(*Path(str(path)).parts).is_relative_to(root)
    assert ".." not in path.parts and "\x00" not in str(path)

"""autotune._paths: names from job files, kernels, configs and the database never lead out of the
results directory."""

from __future__ import annotations

import os
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


# --------------------------------------------------------------------------- output files


def test_write_output_refuses_a_link_and_never_writes_through_one(tmp_path):
    """write_output refuses a target that is a symbolic link (naming it), and a link raced in
    after the check is replaced by the rename, never written through."""
    import autotune._paths as paths

    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.txt"
    link.symlink_to(victim)
    with pytest.raises(paths.LinkRefusedError, match="symbolic link"):
        paths.write_output(link, "new")
    assert victim.read_text() == "precious"
    original = paths._refuse_link
    try:  # the link appears between the check and the write: the rename replaces the link
        paths._refuse_link = lambda path, what: None
        paths.write_output(link, "new")
    finally:
        paths._refuse_link = original
    assert victim.read_text() == "precious" and not link.is_symlink() and link.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_output_dir_refuses_a_linked_folder_below_the_root(tmp_path):
    """output_dir creates the folders below its root and refuses one that is a symbolic link;
    the root itself may be a link (the user named it)."""
    from autotune._paths import LinkRefusedError, output_dir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.symlink_to(elsewhere)
    assert output_dir(root, "traces", "k/abc").is_dir()
    (elsewhere / "traces" / "evil").symlink_to(tmp_path)
    with pytest.raises(LinkRefusedError, match="evil"):
        output_dir(root, "traces", "evil", "x")
    assert not (tmp_path / "x").exists()


def test_a_worker_log_is_never_appended_through_a_link(tmp_path):
    """open_log appends with O_NOFOLLOW: a log path that is a link is refused, naming it."""
    from autotune._paths import LinkRefusedError, open_log

    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "worker-0.log").symlink_to(victim)
    with pytest.raises(LinkRefusedError):
        open_log(tmp_path / "worker-0.log")
    fd = open_log(tmp_path / "worker-1.log")
    os.write(fd, b"ok")
    os.close(fd)
    assert victim.read_text() == "precious" and (tmp_path / "worker-1.log").read_text() == "ok"

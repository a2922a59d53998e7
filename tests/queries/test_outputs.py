"""Output paths: `export --out` never replaces the database in use or a file that is not one of
our exports (without --force), writes atomically, and output folders that are files or cannot
be written give exit 2 naming the path and why, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import socket
import stat

import pytest

from autotune import cli
from autotune.queries import best as queries
from autotune.queries import outputs
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
SOFTWARE = {"jax": "0.11.2", "jaxlib": "0.11.2", "autotune": "0.1.0"}
SOFTMAX = Problem("softmax", {"rows": 64, "cols": 1024}, "float16")
# A folder nobody can create files in, root included (tests run as root in CI).
UNWRITABLE = "/proc/self/autotune-out"


@pytest.fixture
def db(tmp_path) -> pathlib.Path:
    """An SQLite database with one tuned problem."""
    path = tmp_path / "tuned.db"
    config = get_kernel("softmax").valid_space(SOFTMAX).sample(1, seed=0)[0]
    with Store(f"sqlite:///{path}") as store:
        store.record_trial(SOFTMAX, Config(config), TrialResult.timed([9.0], compile_s=1.0,
                           rel_error=0.0, timing="fake"), device=GPU, software=SOFTWARE)
    queries.close_stores()
    return path


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def _db_intact(path: pathlib.Path) -> None:
    with path.open("rb") as f:
        assert f.read(16) == b"SQLite format 3\x00"
    with Store(f"sqlite:///{path}") as store:
        assert len(store.trials()) == 1


@pytest.mark.parametrize("fmt", ["json", "python", "csv"])
def test_export_never_replaces_the_database_in_use(db, tmp_path, capsys, fmt, campaign, monkeypatch):
    """`export --out` naming the database in use (directly, through a symbolic link, a
    relative path, or its -wal file) exits 2 and leaves it intact, even with --force."""
    link = tmp_path / "link.db"
    link.symlink_to(db)
    monkeypatch.chdir(tmp_path)
    targets = [str(db), str(link), "tuned.db", f"./sub/../{db.name}", str(db) + "-wal"]
    (tmp_path / "sub").mkdir()
    campaign.add(bad_inputs=2 * len(targets))
    for target in targets:
        for force in ([], ["--force"]):
            code, err = _run(["export", "--format", fmt, "--db", str(db), "--out", target, *force],
                             capsys)
            assert code == 2 and "database in use" in err, (target, force, err)
            _db_intact(db)


def test_export_refuses_a_file_that_is_not_an_export_unless_forced(db, tmp_path, capsys, campaign):
    """An existing file that is not one of our exports is left as it is (exit 2) unless
    --force; one of our own exports (any format) is replaced without --force."""
    campaign.add(bad_inputs=2)
    notes = tmp_path / "notes.txt"
    notes.write_text("my precious notes\n")
    code, err = _run(["export", "--db", str(db), "--out", str(notes)], capsys)
    assert code == 2 and "not an autotune export" in err and "--force" in err
    assert notes.read_text() == "my precious notes\n"
    folder = tmp_path / "folder"
    folder.mkdir()
    code, err = _run(["export", "--db", str(db), "--out", str(folder)], capsys)
    assert code == 2 and "is a folder" in err
    assert _run(["export", "--db", str(db), "--out", str(notes), "--force"], capsys)[0] == 0
    assert json.loads(notes.read_text())["format"] == "autotune-export"
    for fmt in ("json", "python", "csv"):
        out = tmp_path / f"tuned.{fmt}"
        assert _run(["export", "--format", fmt, "--db", str(db), "--out", str(out)], capsys)[0] == 0
        for again in ("json", "python", "csv"):  # our exports replace each other
            assert _run(["export", "--format", again, "--db", str(db), "--out", str(out)],
                        capsys)[0] == 0


def test_export_writes_atomically(db, tmp_path, monkeypatch, capsys, campaign):
    """A write that fails half-way (disk full) leaves the previous export as it was and no
    temporary file behind; exit 2 naming the path."""
    out = tmp_path / "tuned.json"
    assert _run(["export", "--db", str(db), "--out", str(out)], capsys)[0] == 0
    before = out.read_text()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    campaign.add(faults=1)
    code, err = _run(["export", "--format", "csv", "--db", str(db), "--out", str(out)], capsys)
    assert code == 2 and "No space left" in err and str(out) in err
    assert out.read_text() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("where", ["file", "under_file", "unwritable"])
def test_output_folders_that_cannot_be_used_exit_2(db, tmp_path, capsys, where, campaign):
    """`report --out`, `tune --results-dir`, `--compilation-cache` (tune, revalidate) and
    `export --out`'s folder naming a file, a path under a file, or a folder that cannot be
    written: exit 2 naming the path and why."""
    campaign.add(bad_inputs=3)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    folder = {"file": str(a_file), "under_file": str(a_file / "sub"), "unwritable": UNWRITABLE}[where]
    why = {"file": "a file, not a folder", "under_file": "a file, not a folder",
           "unwritable": "not writable"}[where]
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float16"\nshape = { rows = 64, cols = 1024 }\n')
    for argv in (
        ["report", "--db", str(db), "--out", folder],
        ["tune", str(job), "--db", f"sqlite:///{tmp_path}/new.db", "--results-dir", folder],
        ["tune", str(job), "--db", f"sqlite:///{tmp_path}/new.db", "--compilation-cache", folder],
        ["revalidate", "--db", str(db), "--device", "interpret", "--compilation-cache", folder],
        ["export", "--db", str(db), "--out", os.path.join(folder, "tuned.json")],
    ):
        code, err = _run(argv, capsys)
        assert code == 2, (argv, err)
        assert folder in err and why in err, (argv, err)
    assert not (tmp_path / "new.db").exists()


def test_export_never_replaces_a_device_fifo_or_socket(db, tmp_path, capsys, campaign, monkeypatch):
    """`export --out` naming a character device (a copy of /dev/null's node, and /dev/null
    itself without --force), a FIFO or a socket exits 2 naming what it is, even with --force:
    renaming the export over it would replace the node itself. Nothing is written, the node is
    unchanged, and `tune --results-dir` naming one says what it is too."""
    work = tmp_path / "out"
    work.mkdir()
    monkeypatch.chdir(work)  # a socket's path must be short
    nodes = {"fifo": stat.S_ISFIFO, "sock": stat.S_ISSOCK}
    os.mkfifo("fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("sock")
    try:
        os.mknod("null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        nodes["null"] = stat.S_ISCHR
    except PermissionError:  # not root: the FIFO and the socket still tell
        pass
    before = sorted(os.listdir())
    campaign.add(bad_inputs=2 * len(nodes) + 1)
    for name, is_kind in nodes.items():
        for force in (["--force"], []):  # --force first: without the check, a FIFO's read blocks
            code, err = _run(["export", "--db", str(db), "--out", name, *force], capsys)
            assert code == 2 and "not a regular file" in err and "stdout" in err, (name, force, err)
            assert is_kind(os.stat(name).st_mode), name
    code, err = _run(["export", "--db", str(db), "--out", os.devnull], capsys)
    assert code == 2 and "character device" in err
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    job = tmp_path / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float16"\nshape = { rows = 64, cols = 1024 }\n')
    code, err = _run(["tune", str(job), "--db", f"sqlite:///{work}/new.db", "--results-dir",
                      "fifo", "--dry-run"], capsys)
    assert code == 2 and "is a FIFO (named pipe), not a folder" in err
    listener.close()
    assert sorted(os.listdir()) == before  # no temporary file, no database
    with pytest.raises(outputs.JobError, match="not a regular file"):
        outputs.atomic_write_text(work / "fifo", "text")


@pytest.mark.parametrize("blank", ["", "  "])
def test_blank_output_paths_exit_2(db, tmp_path, capsys, campaign, monkeypatch, blank):
    """A blank `export --out`, `report --out`, `tune --results-dir` or `--compilation-cache`
    exits 2 naming the flag, instead of writing into the working directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    job = work / "job.toml"
    job.write_text('[[problem]]\nkernel = "softmax"\ndtype = "float16"\nshape = { rows = 64, cols = 1024 }\n')
    before = sorted(os.listdir())
    argvs = [
        ["export", "--db", str(db), "--out", blank],
        ["report", "--db", str(db), "--out", blank],
        ["tune", str(job), "--db", str(db), "--results-dir", blank, "--dry-run"],
        ["tune", str(job), "--db", str(db), "--compilation-cache", blank, "--dry-run"],
    ]
    campaign.add(bad_inputs=len(argvs))
    for argv in argvs:
        code, err = _run(argv, capsys)
        flag = argv[argv.index(blank) - 1]
        assert code == 2 and f"{flag} {blank!r} is blank" in err, (argv, err)
    assert sorted(os.listdir()) == before


def test_check_output_dir_accepts_a_new_folder_and_creates_nothing(tmp_path):
    """A folder that does not exist yet under a writable one is accepted and not created."""
    target = tmp_path / "a" / "b"
    assert outputs.check_output_dir(target, flag="--out") == target
    assert not (tmp_path / "a").exists()


def test_export_never_writes_through_a_link(tmp_path, capsys, campaign):
    """export --out naming a symbolic link (to an export or any file) is refused with exit 2,
    even with --force; the file it points at is left as it was (it used to be replaced)."""
    from autotune import cli

    url = f"sqlite:///{tmp_path}/db.sqlite"
    assert cli.main(["export", "--db", url, "--format", "json", "--out", str(tmp_path / "real.json")]) == 0
    before = (tmp_path / "real.json").read_text()
    link = tmp_path / "shared.json"
    link.symlink_to(tmp_path / "real.json")
    for force in ([], ["--force"]):
        campaign.add(bad_inputs=1)
        assert cli.main(["export", "--db", url, "--format", "json", "--out", str(link), *force]) == 2
        err = capsys.readouterr().err
        assert "symbolic link" in err and "Traceback" not in err, err
    assert (tmp_path / "real.json").read_text() == before and link.is_symlink()

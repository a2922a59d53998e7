"""Secrets: a database password appears in no output, log line, report, exception or stored
row. One function renders URLs for people (autotune.storage.urls.display_url)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from autotune.errors import StorageError
from autotune.space.kernel import get_kernel
from autotune.space.problem import Problem
from autotune.storage.store import Store
from autotune.storage.urls import display_url, mask_text, resolve_url

PASSWORD = "S3cretPlant"
REPO = Path(__file__).resolve().parents[2]
SOFTMAX = Problem("softmax", {"rows": 64, "cols": 1024}, "float16")


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/test",
    f"postgresql://postgres:{PASSWORD}@db.example:5432/test?options=-csearch_path%3Dx",
    f"postgresql://postgres@127.0.0.1/test?password={PASSWORD}",
    f"postgresql://postgres:{PASSWORD}@127.0.0.1:notaport/test",  # not parseable
    f"mysql://u:{PASSWORD}@h/db",
])
def test_display_url_masks_the_password(url):
    """The password (in the user part or a password= parameter) becomes ***, whatever the URL."""
    shown = display_url(url)
    assert PASSWORD not in shown and "***" in shown
    assert PASSWORD not in mask_text(f"could not open {url}: refused")


def test_store_errors_and_repr_never_show_the_password():
    """A URL that is not a URL, and Store's repr, mask the password (also in chained causes)."""
    with pytest.raises(StorageError) as e:
        resolve_url(f"postgresql://postgres:{PASSWORD}@127.0.0.1:notaport/test")
    text = str(e.value) + str(e.value.__cause__ or "") + str(e.value.__context__ or "")
    assert PASSWORD not in text


def _planted(db_url: str) -> str:
    """``db_url`` (a fresh PostgreSQL schema) with a password planted in it: the real server
    trusts local connections, so it still connects."""
    return sa.make_url(db_url).set(password=PASSWORD).render_as_string(hide_password=False)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOTUNE_DB": ""}
    return subprocess.run([sys.executable, "-m", "autotune", "-v", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _cli_in_process(args: list[str], capfd: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """``autotune -v ARGS`` through :func:`autotune.cli.main` in this process, seeing what the
    command's own process would show: stdout and stderr at the file-descriptor level (capfd:
    also what C libraries such as libpq write), the log lines of the handler the CLI installs
    itself (pytest's handlers are taken off the root logger meanwhile, so the CLI formats its
    log as in its own process, through its masking formatter), Optuna's log (its handler
    pointed at the captured stderr) and every warning raised (shown as Python would show it,
    even one shown before in this process). The stores that queries keep open are closed
    after, so each command connects afresh, as in its own process."""
    import logging
    import warnings

    import optuna

    from autotune.cli import main
    from autotune.queries.best import close_stores

    monkeypatch.setenv("AUTOTUNE_DB", "")
    capfd.readouterr()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    optuna_verbosity = optuna.logging.get_verbosity()
    streams = [(h, h.setStream(sys.stderr)) for h in logging.getLogger("optuna").handlers
               if isinstance(h, logging.StreamHandler)]
    root.handlers.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                code = main(["-v", *args])
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
    finally:
        close_stores()
        for h in root.handlers:
            h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        optuna.logging.set_verbosity(optuna_verbosity)
        for h, stream in streams:
            h.setStream(stream)
    out, err = capfd.readouterr()
    err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
                   for w in caught)
    return code, out, err


@pytest.mark.postgres
def test_no_cli_command_shows_a_planted_password(db_url, tmp_path, campaign, capfd, monkeypatch):
    """Every CLI command (successes and error paths, with -v logging) run against a PostgreSQL
    URL holding a password never prints it, and no report file or stored row holds it.

    The commands that start a job (tune), the first and the last run in their own process, as
    a user runs them; the others run in this process (:func:`_cli_in_process`, which sees
    their stdout, stderr, log and warnings as their own process would show them), sparing the
    start of a fresh interpreter each."""
    if not db_url.startswith("postgresql"):
        pytest.skip("the planted password needs the PostgreSQL server")
    url = _planted(db_url)
    assert Store(url).url == url  # it connects, password and all
    wrong = sa.make_url(url).set(database="no_such_database").render_as_string(hide_password=False)
    config = dict(get_kernel("softmax").valid_space(SOFTMAX).sample(1, seed=0)[0])
    (tmp_path / "job.toml").write_text(
        '[[problem]]\nkernel = "softmax"\ndtype = "float16"\nshape = { rows = 64, cols = 1024 }\n')
    export = tmp_path / "in.json"
    export.write_text(json.dumps({"format": "autotune-export", "version": 1, "records": [
        {"kernel": "softmax", "shape": SOFTMAX.dims, "dtype": "float16", "device": "NVIDIA H200",
         "median_us": 9.0, "config": config}]}))
    bad_export = tmp_path / "bad.json"
    bad_export.write_text(json.dumps({"format": "autotune-export", "version": 1, "records": [
        {"kernel": "softmax", "shape": SOFTMAX.dims, "dtype": "float16", "device": "x",
         "median_us": -1, "config": {}}]}))
    best = ["best", "softmax", "--shape", "rows=64,cols=1024", "--dtype", "float16"]
    commands = [
        [*best, "--db", url],  # nothing tuned yet
        ["results", "--db", url],
        ["report", "--db", url, "--out", str(tmp_path / "empty_report")],  # nothing stored
        ["import", str(export), "--db", url],
        ["import", str(bad_export), "--db", url],
        [*best, "--db", url],
        [*best, "--json", "--db", url],
        ["results", "--db", url],
        ["results", "--json", "--db", url],
        ["results", "--invalid", "--db", url],
        ["export", "--db", url],
        ["export", "--format", "python", "--db", url, "--out", str(tmp_path / "t.py")],
        ["export", "--format", "csv", "--db", url, "--device", "nope"],
        ["report", "--db", url, "--out", str(tmp_path / "report")],
        ["tune", str(tmp_path / "job.toml"), "--db", url, "--trials", "0"],
        ["tune", str(tmp_path / "job.toml"), "--db", wrong, "--results-dir", str(tmp_path / "r")],
        ["revalidate", "--db", wrong],
        [*best, "--db", wrong],
        ["results", "--db", wrong],
        ["export", "--db", wrong],
        ["import", str(export), "--db", wrong],
        ["report", "--db", wrong, "--out", str(tmp_path / "report2")],
        ["best", "softmax", "--shape", "rows=64,cols=1024", "--db",
         url.replace("@127.0.0.1:5432", "@127.0.0.1:notaport")],  # not a URL
    ]
    campaign.add(bad_inputs=len(commands))
    codes, masked_in_process = [], 0
    monkeypatch.chdir(tmp_path)
    for i, argv in enumerate(commands):
        if argv[0] == "tune" or i in (0, len(commands) - 1):
            done = _cli(argv, tmp_path)
            code, out, err = done.returncode, done.stdout, done.stderr
        else:
            code, out, err = _cli_in_process(argv, capfd, monkeypatch)
            masked_in_process += ":***@" in out + err
        assert PASSWORD not in out + err, (argv, out, err)
        assert "Traceback" not in err, (argv, err)
        codes.append(code)
    assert codes[0] == 1 and codes[3] == 0 and codes[5] == 0, codes  # the commands really ran
    assert all(code in (0, 1, 2) for code in codes), codes
    assert masked_in_process >= 10, "the in-process capture missed the database lines"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "index.html" for p in written)
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), path
    with Store(url) as store, store.engine.connect() as conn:
        for table in sa.inspect(conn).get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')):
                assert PASSWORD not in repr(tuple(row)), table


@pytest.mark.parametrize("key", ["password", "passwd", "pwd", "sslpassword", "secret", "token",
                                 "api_key", "apikey", "access_token", "Password"])
def test_the_cli_database_line_masks_a_secret_in_the_query_string(key, tmp_path, capsys):
    """The line naming the database (and `results`' "no results stored in ...") masks a
    secret given as a query parameter (?password=..., ?token=...), as display_url does."""
    from autotune.cli import main

    assert main(["results", "--db", f"sqlite:///{tmp_path}/x.db?{key}={PASSWORD}"]) == 0
    captured = capsys.readouterr()
    assert f"autotune: database sqlite:///{tmp_path}/x.db?{key}=***" in captured.err
    assert PASSWORD not in captured.out + captured.err


# Passwords with the characters a pattern does not expect; none of their pieces may show.
ODD_PASSWORDS = ["Zq9Kw7", "Zq9@Kw7", "Zq9:Kw7", "Zq9/Kw7", "Zq9%40Kw7", "Zq9\u00fc\u2603Kw7",
                 "Zq9?Kw7", "Zq9#Kw7", "Zq9@:/?#Kw7", "Zq9&Kw7", "Zq9=Kw7", "Zq9'Kw7", "Zq9 Kw7"]
# Every URL form SQLAlchemy accepts, with {pw} where a password goes (as written by hand,
# unencoded) and {q} where it goes percent-encoded (a query string).
URL_FORMS = [
    "postgresql://me:{pw}@db.example:5432/tune",
    "postgresql+psycopg://me:{pw}@db.example/tune",
    "postgresql://me:{pw}@/tune?host=/var/run/postgresql",
    "postgresql://me:{pw}@[::1]:5432/tune",
    "postgresql://:{pw}@db.example/tune",
    "postgres://me:{pw}@db.example/tune?sslmode=require",
    "mysql+pymysql://me:{pw}@db.example/tune?charset=utf8mb4",
    "oracle+oracledb://me:{pw}@db.example:1521/?service_name=x",
    "mssql+pyodbc://me:{pw}@my_dsn",
    "postgresql://me@db.example/tune?password={q}",
    "postgresql://me@db.example/tune?sslmode=require&sslpassword={q}&application_name=a",
    "postgresql://me@db.example/tune?options=-c%20password%3D{q}",
    "sqlite:///results/autotune.db?token={q}",
    "postgresql://me:{pw}@db.example/tune?password={q}&api_key={q}",
]


def _forms() -> list[tuple[str, str]]:
    import urllib.parse

    return [(form, form.format(pw=pw, q=urllib.parse.quote(pw, safe="")))
            for form in URL_FORMS for pw in ODD_PASSWORDS]


def _leaks(text: str) -> bool:
    return "Zq9" in text or "Kw7" in text


@pytest.mark.parametrize(("form", "url"), _forms())
def test_every_url_form_with_odd_characters_is_masked_everywhere(form, url, campaign):
    """display_url, and mask_text on the URL alone, quoted (a repr), in a list's repr (the
    internal-error file's command line), in a log line and after a password= word: no piece
    of a password with @ : / % ? # & = ' space or unicode in it shows, under any URL form."""
    campaign.add(bad_inputs=1)
    assert not _leaks(display_url(url)), display_url(url)
    for text in (url, repr(url), repr(["--db", url, "results"]), f"could not open {url}: refused",
                 f"(background on this error at: {url})\nnext line", f'db="{url}"'):
        assert not _leaks(mask_text(text)), (text, mask_text(text))
    assert "***" in display_url(url)


@pytest.mark.parametrize("password", ODD_PASSWORDS)
def test_a_url_object_with_any_password_is_masked(password):
    """A URL object (what resolve_url returns) renders its password percent-encoded; the one
    masking function hides it too, and keeps the host and database readable."""
    url = sa.URL.create("postgresql+psycopg", username="me", password=password,
                        host="db.example", database="tune", query={"password": password})
    shown = display_url(url)
    assert not _leaks(shown) and "db.example" in shown and "/tune" in shown, shown


def test_masking_parses_rather_than_over_matching():
    """What is not a secret stays readable: a user without a password, an '@' in a path or a
    query value, a port, the host of a socket folder."""
    for text in ["postgresql://me@db:5432/tune", "sqlite:////home/me@corp/a:b.db",
                 "postgresql://me@db/tune?application_name=a@b:c",
                 "postgresql://me@/tune?host=/var/run/postgresql"]:
        assert display_url(text) == text, display_url(text)


@pytest.mark.parametrize("password", ["Zq9Kw7", "Zq9@:/?#Kw7", "Zq9%40Kw7"])
def test_the_lookups_warning_and_strict_error_never_show_the_password(password, caplog):
    """The run-time lookup's WARNING (and its strict=True StorageError) name the database with
    every secret masked: in its user part and in its query string (they used
    render_as_string, which kept ?password=...)."""
    import logging
    import urllib.parse

    from autotune.queries import lookup

    url = (f"postgresql://me:{password}@127.0.0.1:1/tune"
           f"?password={urllib.parse.quote(password, safe='')}&connect_timeout=1")
    lookup.clear_cache()
    try:
        with caplog.at_level(logging.INFO, logger="autotune"):
            answer = lookup.lookup_config("softmax", SOFTMAX.dims, "float16", db=url,
                                          default={"block_rows": 1}, timeout_s=1)
        assert answer[1] == "default"
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warned and not any(_leaks(m) for m in warned), warned
        lookup.clear_cache()
        with pytest.raises(StorageError) as e:
            lookup.lookup_config("softmax", SOFTMAX.dims, "float16", db=url, strict=True,
                                 timeout_s=1)
        assert not _leaks(str(e.value)) and "***" in str(e.value), str(e.value)
    finally:
        lookup.clear_cache()


def test_the_internal_error_file_masks_urls_and_password_like_arguments(tmp_path, monkeypatch,
                                                                         capsys):
    """The internal-error file keeps the command line with every URL's secrets masked and the
    values of password-like options (--password X, --token=X, pwd=X) replaced by ***."""
    import tempfile

    import autotune.cli as cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    argv = ["results", "--db", "postgresql://me:Zq9@:/Kw7@db/tune?sslpassword=Zq9Kw7",
            "--password", "Zq9Kw7", "--token=Zq9Kw7", "pwd=Zq9Kw7"]
    assert cli._internal_error(RuntimeError("boom at postgresql://me:Zq9 Kw7@db/tune"), argv) == 70
    err = capsys.readouterr().err
    (report,) = tmp_path.glob("autotune-bug-*.txt")
    text = report.read_text()
    assert not _leaks(text) and not _leaks(err), text
    assert "'--password', '***'" in text and "--token=***" in text and "pwd=***" in text

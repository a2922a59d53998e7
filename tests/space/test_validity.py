"""The validity invariant: every config served (best, best_config, lookup, export) is valid for
its kernel's space bound to its problem under today's rules; stored rows that are not are
skipped with a warning, never served, and listed by `autotune results --invalid`."""

from __future__ import annotations

import json
import logging

import pytest

from autotune import cli
from autotune.queries import best as queries
from autotune.queries import lookup
from autotune.queries.exchange import export_records, render
from autotune.space import validity
from autotune.space.kernel import get_kernel
from autotune.space.outcomes import DeviceInfo, TrialResult
from autotune.space.problem import Config, Problem
from autotune.storage.store import Store

GPU = DeviceInfo("NVIDIA H200", "gpu", "9.0", "570.86")
SOFTWARE = queries.running_versions() | {"autotune": "0.1.0"}
MATMUL = Problem("hopper_matmul", {"m": 4096, "n": 4096, "k": 4096}, "bfloat16")
NEAR = Problem("hopper_matmul", {"m": 4096, "n": 4096, "k": 2048}, "bfloat16")


def timed(us: float) -> TrialResult:
    return TrialResult.timed([us], compile_s=1.0, rel_error=1e-3, timing="fake")


def _valid(problem: Problem) -> dict:
    return dict(get_kernel(problem.kernel).valid_space(problem).sample(1, seed=3)[0])


def _broken_variants(problem: Problem) -> list[tuple[str, dict]]:
    """Configs that break today's rules in different ways: a tile that does not divide the
    problem, an unknown tunable, a missing tunable, a value outside a domain."""
    good = _valid(problem)
    return [
        ("tile_not_dividing", {**good, "tile_m": 192}),
        ("unknown_key", {**good, "bogus": 1}),
        ("missing_key", {k: v for k, v in good.items() if k != "tile_k"}),
        ("out_of_domain", {**good, "max_concurrent_steps": 99}),
    ]


@pytest.fixture(autouse=True)
def _fresh_caches():
    lookup.clear_cache()
    validity.clear_cache()
    yield
    queries.close_stores()
    lookup.clear_cache()


@pytest.fixture
def mixed(db_url: str) -> tuple[str, dict, list[dict]]:
    """A database where MATMUL's fastest stored configs break today's rules and a slower valid
    one is stored too; NEAR (a neighbour) has only a broken config."""
    good = _valid(MATMUL)
    broken = [c for _, c in _broken_variants(MATMUL)]
    with Store(db_url) as store:
        store.record_trial(MATMUL, Config(good), timed(500.0), device=GPU, software=SOFTWARE)
        for i, config in enumerate(broken):
            store.record_trial(MATMUL, Config(config), timed(10.0 + i), device=GPU, software=SOFTWARE)
        store.record_trial(NEAR, Config(broken[1]), timed(1.0), device=GPU, software=SOFTWARE)
    return db_url, good, broken


def test_each_broken_variant_breaks_a_rule():
    """The fixtures' broken configs really break today's rules (and the good one does not)."""
    assert validity.violations(MATMUL, _valid(MATMUL)) == []
    for name, config in _broken_variants(MATMUL):
        assert validity.violations(MATMUL, config), name


def test_best_skips_stored_configs_that_break_todays_rules(mixed, caplog, campaign):
    """best_result/best_config answer the fastest VALID config, warn about the skipped rows."""
    url, good, broken = mixed
    campaign.add(bad_inputs=len(broken))
    with caplog.at_level(logging.WARNING, logger="autotune.space.validity"):
        result = queries.best_result("hopper_matmul", MATMUL.dims, "bfloat16", db=url)
    assert result is not None and result.config == good and result.median_us == 500.0
    assert queries.best_config("hopper_matmul", MATMUL.dims, "bf16", db=url) == good
    assert "never served" in caplog.text and "tile_m" in caplog.text


def test_nothing_valid_stored_means_nothing_tuned(mixed, capsys):
    """A problem whose only stored config is broken answers None, and `best` exits 1."""
    url, _, _ = mixed
    assert queries.best_result("hopper_matmul", NEAR.dims, "bfloat16", db=url) is None
    assert cli.main(["best", "hopper_matmul", "--shape", "m=4096,n=4096,k=2048", "--db", url]) == 1
    assert "nothing tuned" in capsys.readouterr().err


def test_lookup_exact_and_nearest_answers_are_valid(mixed):
    """The run-time lookup's exact answer skips broken rows; a neighbour with only a broken
    config is never used as the nearest answer."""
    url, good, _ = mixed
    config, source = lookup.lookup_config("hopper_matmul", MATMUL.dims, "bfloat16", db=url)
    assert (dict(config), source) == (good, "exact")
    other = {"m": 4096, "n": 4096, "k": 1024}  # nearest stored: NEAR (broken), then MATMUL
    config, source = lookup.lookup_config("hopper_matmul", other, "bfloat16", db=url)
    bound = get_kernel("hopper_matmul").bind(get_kernel("hopper_matmul").problem(other, "bfloat16"))
    assert source in ("nearest", "default") and bound.is_valid(config)
    if source == "nearest":
        assert dict(config) == good


def test_exports_carry_only_valid_configs(mixed):
    """Every export format serves the fastest valid config; broken rows are left out."""
    url, good, broken = mixed
    records = export_records(url)
    assert [(r["shape"], r["config"]) for r in records] == [(MATMUL.dims, good)]
    for fmt in ("json", "csv", "python"):
        text = render(records, fmt)
        for config in broken:
            assert json.dumps(config, sort_keys=True) not in text


def test_results_lists_unservable_rows(mixed, capsys):
    """`results` counts the rows never served, `results --invalid` lists each with its rule."""
    url, _, broken = mixed
    assert cli.main(["results", "--db", url]) == 0
    out = capsys.readouterr().out
    assert f"{len(broken) + 1} stored ok result(s) break today's rules" in out
    assert cli.main(["results", "--invalid", "--json", "--db", url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(json.dumps(r["config"], sort_keys=True) for r in listed) == sorted(
        json.dumps(c, sort_keys=True) for c in [*broken, broken[1]])
    assert all(r["broken"] and r["broken"][0].startswith("[") for r in listed)
    assert cli.main(["results", "--invalid", "--db", url]) == 0
    assert "m_divisible" in capsys.readouterr().out


def test_results_escapes_control_characters_from_the_database(db_url, capsys, campaign):
    """Control characters stored in the database (a device name, a kernel name) reach the
    terminal escaped, never raw."""
    campaign.add(bad_inputs=2)
    evil = DeviceInfo("GPU\x1b[2J\x1b]0;owned\x07", "gpu", "9.0", "1")
    problem = Problem("evil\x1b[31m", {"m": 1}, "float32")
    with Store(db_url) as store:
        store.record_trial(MATMUL, Config(_valid(MATMUL)), timed(5.0), device=evil, software=SOFTWARE)
        store.record_trial(problem, Config({"a": "x\x1by"}), timed(5.0), device=GPU, software=SOFTWARE)
    for argv in (["results"], ["results", "--invalid"],
                 ["best", "hopper_matmul", "--shape", "m=4096,n=4096,k=4096"]):
        assert cli.main([*argv, "--db", db_url]) == 0
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and "\x07" not in out + err, argv
    assert cli.main(["results", "--db", db_url]) == 0
    assert "\\x1b[2J" in capsys.readouterr().out

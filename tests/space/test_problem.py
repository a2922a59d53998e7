"""Problems and configs: canonical forms, hashing, dtype and --shape parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.space.problem import Config, Problem, canonical_dtype, parse_shape


def test_config_is_canonical_and_hashable():
    """Configs with the same items are equal, hash equally and share JSON and digest."""
    a = Config({"tile_m": 128, "tile_n": 64, "wg": "M", "epi": None})
    b = Config(epi=None, wg="M", tile_n=64, tile_m=128)
    assert a == b and hash(a) == hash(b)
    assert a.to_json() == '{"epi":null,"tile_m":128,"tile_n":64,"wg":"M"}'
    assert a.digest() == b.digest() and len(a.digest()) == 16
    assert Config.from_json(a.to_json()) == a
    assert a.replace(tile_m=256)["tile_m"] == 256 and a["tile_m"] == 128


def test_config_rejects_non_scalar_values():
    """A config value must be a scalar: the error names the key."""
    with pytest.raises(ValueError, match=r"config\['x'\]"):
        Config({"x": [1, 2]})


def test_problem_canonicalises_dtype_and_shape():
    """Problem('bf16') == Problem('bfloat16'); shape order does not matter."""
    p = Problem("k", {"n": 2, "m": 1}, "bf16")
    q = Problem("k", {"m": 1, "n": 2}, "bfloat16")
    assert p == q and hash(p) == hash(q) and p.key() == q.key()
    assert p.shape_text == "m=1,n=2" and p["n"] == 2 and p.dtype_bytes == 2


def test_problem_rejects_bad_values():
    """Non-positive sizes and unknown dtypes are rejected with the key and value named."""
    with pytest.raises(ValueError, match=r"shape\['m'\] must be a positive integer, but got 0"):
        Problem("k", {"m": 0}, "f32")
    with pytest.raises(ValueError, match="Unknown dtype 'float12'"):
        Problem("k", {"m": 1}, "float12")
    assert canonical_dtype("FP8") == "float8_e4m3fn"


def test_parse_shape_forms():
    """--shape accepts 4096, 4_096, 4k, 2**12 and true/false."""
    assert parse_shape("m=4096,n=4_096,k=4k, b=2**12,causal=true") == {
        "m": 4096, "n": 4096, "k": 4096, "b": 4096, "causal": True,
    }


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("m", "not key=value"),
        ("m=", "not key=value"),
        ("m=4096,m=1", "twice"),
        ("m=-1", "not key=value|positive"),
        ("m=0", "positive"),
        ("m=abc", "not a whole number"),
        ("m=1.5", "not a whole number"),
        ("1m=3", "not key=value"),
        ("m=2**99", "at most 2147483647"),
    ],
)
def test_parse_shape_errors(text, match):
    """Malformed --shape text names the item and the expected form."""
    with pytest.raises(ValueError, match=match):
        parse_shape(text)


@given(st.text(max_size=40))
def test_parse_shape_fuzz(text):
    """parse_shape never crashes: it returns a dict of positive ints/bools or raises ValueError."""
    try:
        out = parse_shape(text)
    except ValueError:
        return
    assert out and all((isinstance(v, bool) or v > 0) for v in out.values())


def test_a_config_unpickled_in_another_process_hashes_as_one_made_there(tmp_path):
    """A config keeps its hash (a dict key on every call of a tuned function), so one pickled in
    a process with other string hashes (an engine worker) is rebuilt there, not carried over:
    it finds the same dict entries as a config made in that process."""
    import os
    import pickle
    import subprocess
    import sys

    path = tmp_path / "config.pkl"
    path.write_bytes(pickle.dumps(Config(tile_m=128, grid_minor_dim="N")))
    code = ("import pickle, sys; from autotune.space.problem import Config; "
            f"c = pickle.loads(open({str(path)!r}, 'rb').read()); "
            "made = Config(tile_m=128, grid_minor_dim='N'); "
            "sys.exit(0 if hash(c) == hash(made) and {made: 1}.get(c) == 1 and c == made else 1)")
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0

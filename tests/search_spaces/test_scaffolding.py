"""search_spaces/scaffolding.py: the pieces the bundled kernels share."""

from __future__ import annotations

import dataclasses

import pytest

import autotune.kernels as ak
from search_spaces import scaffolding as sc
from search_spaces import softmax


def test_a_reason_is_its_template_and_fills_in_what_a_partial_config_gives():
    """A Reason reads as its template; a violation's message fills in the derived values and
    shows ``?`` for one a partial config cannot give."""
    says = sc.reasons(lambda c, env: {**c, "double": 2 * c["a"]} if "a" in c else dict(c))
    reason = says("a={a} doubled is {double}, b={b}")
    assert reason == "a={a} doubled is {double}, b={b}"
    assert reason({"a": 3, "b": 1}, None) == "a=3 doubled is 6, b=1"
    assert reason({"b": 1}, None) == "a=? doubled is ?, b=1"


def test_the_build_refuses_naming_the_rule():
    """A plan's refusal is a ValueError naming its rule; the refill check refuses a refill
    that would wait on a tile it has not fetched."""
    with pytest.raises(ValueError, match=r"^\[rows_tile\] block_rows=3"):
        sc.refuse("rows_tile", "block_rows=3 must divide rows=8")
    sc.check_refill(1, 2, "slots")
    for lag, slots in ((1, 1), (-1, 2)):
        with pytest.raises(ValueError, match=r"\[refill_needs_free_slot\].*slots="):
            sc.check_refill(lag, slots, "slots")


def test_a_plan_takes_the_config_fields_of_its_names_and_the_given_ones_win():
    """``plan`` fills a dataclass from the config by field name; the given fields win."""

    @dataclasses.dataclass(frozen=True)
    class Plan:
        tile: int
        steps: int
        n: int

    config = {"tile": 64, "steps": 2, "unrelated": True}
    assert sc.plan(Plan, config, n=1024, steps=3) == Plan(tile=64, steps=3, n=1024)


def test_a_bundled_kernel_is_assembled_from_its_modules_conventional_names():
    """``kernel`` takes the space and the functions of the conventional names from the
    module, and the fields given win."""
    k = softmax.KERNEL
    assert k.space is softmax.SPACE and k.build is softmax.build
    assert k.reference is softmax.reference and k.default_config is softmax.default_config
    assert k.shape_of is softmax.shape_of and k.baseline is softmax.baseline
    other = sc.kernel("other", vars(softmax), shape_keys=("rows", "cols"), dtypes=("float32",),
                      build=softmax.reference)
    assert isinstance(other, ak.Kernel) and other.name == "other"
    assert other.build is softmax.reference and other.make_inputs is softmax.make_inputs


def test_a_reason_survives_a_copy():
    """A copied Reason (a space is deep-copied by the replay harness) keeps its template and
    its derivation."""
    import copy

    says = sc.reasons(lambda c, env: {"x": c["a"] + 1})
    copied = copy.deepcopy(says("x={x}"))
    assert copied == "x={x}" and copied({"a": 1}, None) == "x=2"

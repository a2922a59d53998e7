"""Problems and configs: the frozen, canonical, hashable values everything else passes around.

A *problem* is what a kernel is tuned for: the kernel's name, its shape (named sizes, plus the
few non-size keys a kernel declares, such as ``causal``) and the input dtype. A *config* is one
point of a kernel's search space. Both have one canonical JSON form, and a hash of it, so that a
config proposed twice, or stored by two hosts, is recognised as the same one.

This module must not import jax: queries use it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.errors import did_you_mean

__all__ = [
    "Config", "Problem", "DTYPES", "MAX_SIZE", "dtype_bits", "dtype_bytes", "parse_shape",
    "canonical_dtype", "shape_distance",
]

ShapeValue = int | bool | str
# The largest size a shape may give: kernels index with 32-bit integers, and CUDA grids stop
# at 2**31 - 1 blocks. A larger size is a typo, and would only fail after a long compile.
MAX_SIZE = 2**31 - 1

# Bits per element of the dtypes this project knows. Names are numpy/JAX canonical names.
DTYPES: dict[str, int] = {
    "float64": 64,
    "float32": 32,
    "bfloat16": 16,
    "float16": 16,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "int32": 32,
    "int16": 16,
    "int8": 8,
}
_DTYPE_ALIASES = {
    "f64": "float64", "f32": "float32", "bf16": "bfloat16", "f16": "float16", "half": "float16",
    "fp8": "float8_e4m3fn", "f8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "i32": "int32", "i16": "int16", "i8": "int8",
}


def canonical_dtype(name: str) -> str:
    """Returns the canonical name of a dtype (``"bf16"`` -> ``"bfloat16"``).

    Raises:
      ValueError: the name is not a dtype this project knows.
    """
    if not isinstance(name, str):
        raise ValueError(f"dtype must be a string such as 'bfloat16', but got {name!r}.")
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        known = ", ".join(DTYPES)
        raise ValueError(
            f"Unknown dtype {name!r}: expected one of {known} (or bf16, f16, f32, fp8)."
            + did_you_mean(key, [*DTYPES, *_DTYPE_ALIASES])
        )
    return key


def dtype_bits(dtype: str) -> int:
    """Bits per element of ``dtype`` (a canonical name or an alias)."""
    return DTYPES[canonical_dtype(dtype)]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a canonical name or an alias)."""
    return dtype_bits(dtype) // 8


# The value types kept as they are; a type lookup first (a local search freezes 100,000s of
# configs), the general checks for anything else.
_PLAIN = frozenset({int, bool, str, type(None)})


def _freeze(mapping: Mapping[str, Any], what: str) -> tuple[tuple[str, Any], ...]:
    items = []
    for key, value in mapping.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{what} keys must be identifiers, but got {key!r}.")
        if type(value) not in _PLAIN:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int | bool | str | None):
                raise ValueError(
                    f"{what}[{key!r}] must be an int, bool, string or None, but got "
                    f"{type(value).__name__} {value!r}."
                )
        items.append((key, value))
    return tuple(sorted(items))


def _rebuilt(cls: type[_FrozenMap], items: tuple[tuple[str, Any], ...]) -> _FrozenMap:
    """A frozen map of ``cls`` from items frozen before (unpickling: nothing to check again)."""
    made = cls.__new__(cls)
    _FrozenMap.__init__(made, items)
    return made


class _FrozenMap(Mapping[str, Any]):
    """A read-only mapping stored as a sorted tuple, so equal mappings hash equally."""

    __slots__ = ("_items", "_index", "_hash")

    def __init__(self, items: tuple[tuple[str, Any], ...]) -> None:
        self._items = items
        self._index = dict(items)
        # Kept: a config is a dict key on every call of a tuned function (its kernel's cache).
        self._hash = hash(items)

    def __getitem__(self, key: str) -> Any:
        return self._index[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its items where it is unpickled: the kept hash is of this process's
        # string hashes, which another process (an engine worker) does not share.
        return (_rebuilt, (type(self), self._items))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _FrozenMap):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._index == dict(other)
        return NotImplemented

    def to_json(self) -> str:
        """The canonical JSON form: sorted keys, no spaces."""
        return json.dumps(self._index, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """A 16-hex-digit hash of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


class Config(_FrozenMap):
    """One point of a search space: parameter name -> value, frozen and canonical.

    ``Config({"tile_m": 128, "tile_n": 64}) == Config({"tile_n": 64, "tile_m": 128})``, and both
    have the same :meth:`to_json` and :meth:`digest`.
    """

    __slots__ = ()

    def __init__(self, values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        merged = dict(values or {}, **kwargs)
        super().__init__(_freeze(merged, "config"))

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls(json.loads(text))

    def replace(self, **changes: Any) -> Config:
        return Config(dict(self, **changes))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items)
        return f"Config({inner})"


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a kernel is tuned for: kernel name, shape (named sizes and flags), input dtype.

    ``shape`` is given as a mapping and stored as a sorted tuple of pairs, so problems hash and
    compare by value. ``dtype`` is canonicalised (``"bf16"`` -> ``"bfloat16"``).
    """

    kernel: str
    shape: tuple[tuple[str, ShapeValue], ...]
    dtype: str

    def __init__(self, kernel: str, shape: Mapping[str, ShapeValue], dtype: str) -> None:
        if not isinstance(kernel, str) or not kernel:
            raise ValueError(f"kernel must be a non-empty string, but got {kernel!r}.")
        frozen = _freeze(dict(shape), "shape")
        for key, value in frozen:
            if isinstance(value, int) and not isinstance(value, bool) and not 0 < value <= MAX_SIZE:
                raise ValueError(
                    f"shape[{key!r}] must be a positive integer, but got {value}; sizes go up to "
                    f"{MAX_SIZE} (2**31 - 1)."
                )
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "shape", frozen)
        object.__setattr__(self, "dtype", canonical_dtype(dtype))

    @property
    def dims(self) -> dict[str, ShapeValue]:
        """The shape as a plain dict."""
        return dict(self.shape)

    def __getitem__(self, key: str) -> ShapeValue:
        for k, v in self.shape:
            if k == key:
                return v
        raise KeyError(f"problem {self.kernel} has no shape key {key!r}; it has {self.shape_text}")

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def shape_json(self) -> str:
        return json.dumps(dict(self.shape), sort_keys=True, separators=(",", ":"))

    @property
    def shape_text(self) -> str:
        """``m=4096,n=4096,k=4096``: the form ``--shape`` takes."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.shape)

    def key(self) -> str:
        """A stable key naming this problem: ``kernel|shape_json|dtype``."""
        return f"{self.kernel}|{self.shape_json}|{self.dtype}"

    def digest(self) -> str:
        return hashlib.sha256(self.key().encode()).hexdigest()[:16]

    def __str__(self) -> str:
        return f"{self.kernel}[{self.shape_text}; {self.dtype}]"


def _fmt(value: ShapeValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_SHAPE_ITEM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^=,\s]+)\s*$")


def parse_shape(text: str) -> dict[str, ShapeValue]:
    """Parses ``--shape`` text: ``m=4096,n=4096,k=4096`` (also ``causal=true``).

    Sizes accept ``4096``, ``4_096``, ``4k`` (= 4096) and ``2**12``.

    Raises:
      ValueError: naming the offending item and the expected form.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("--shape must be key=value pairs separated by commas, e.g. m=4096,n=4096,k=4096; got an empty value.")
    out: dict[str, ShapeValue] = {}
    for item in text.split(","):
        match = _SHAPE_ITEM.match(item)
        if not match:
            raise ValueError(
                f"--shape item {item.strip()!r} is not key=value; expected e.g. m=4096,n=4096,k=4096."
            )
        key, raw = match.groups()
        if key in out:
            raise ValueError(f"--shape names {key!r} twice ({text.strip()!r}); give each key once.")
        out[key] = _parse_value(key, raw)
    return out


def _parse_value(key: str, raw: str) -> ShapeValue:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    value: int  # int ** int is typed Any (a negative exponent makes a float); ours are not
    try:
        if "**" in raw:
            base, _, exp = raw.partition("**")
            if not (base.isdigit() and exp.isdigit()):
                raise ValueError
            if int(exp) > 64 and int(base) > 1:  # far past MAX_SIZE: not worth computing
                raise ValueError(
                    f"--shape value {key}={raw} must be at most {MAX_SIZE} (2**31 - 1)."
                )
            value = int(base) ** int(exp)
        elif low.endswith("k") and low[:-1].isdigit():
            value = int(low[:-1]) * 1024
        else:
            value = int(raw.replace("_", ""), 10)
    except ValueError as e:
        if "at most" in str(e):
            raise
        raise ValueError(
            f"--shape value {key}={raw!r} is not a whole number (or true/false); "
            "expected e.g. 4096, 4k or 2**12."
        ) from None
    if not 0 < value <= MAX_SIZE:
        raise ValueError(
            f"--shape value {key}={raw} must be a positive integer of at most {MAX_SIZE} "
            "(2**31 - 1)."
        )
    return value


def shape_distance(a: Mapping[str, ShapeValue], b: Mapping[str, ShapeValue]) -> float:
    """How far apart two shapes are: ``sum_k |log2(a_k / b_k)|`` over the size keys.

    Size keys are those with integer (not bool) values; every other key (``causal``) must be
    equal, and both shapes must have the same keys, else the distance is infinite.
    """
    if set(a) != set(b):
        return math.inf
    total = 0.0
    for key, x in a.items():
        y = b[key]
        if isinstance(x, int) and not isinstance(x, bool) and isinstance(y, int) and not isinstance(
            y, bool
        ):
            total += abs(math.log2(x / y))
        elif x != y:
            return math.inf
    return total

"""The value grammar of `.pnnx.param` items: parameters (`k=v`) and shape/dtype annotations (`(d0,d1)f32`).

Parsing raises `ValueError` with a short reason; the reader turns it into a ModelFormatError that names the
file and line (these helpers do not know either).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# pnnx type codes (ir.h). None marks a code we know but cannot hold in numpy without a conversion.
DTYPE_CODES: dict[str, np.dtype | None] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "i16": np.dtype(np.int16),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
    "c32": None,  # complex32: numpy has no such type
    "bf16": None,  # bfloat16: stored as the top 16 bits of a float32
    "null": None,
}
ELEM_SIZES = {"c32": 4, "bf16": 2, "null": 0}

_NUMBER_START = re.compile(r"^-?[0-9]")  # pnnx: a digit, or "-" then a digit
# A list of plain ints, or of floats each written with '.' or an exponent, is read with int / float over the whole
# list: the values parse_scalar gives each item, without its Python-level tests per item (a 50 MB list took
# minutes). A list with anything else in it is read item by item.
_INT_CHARS = str.maketrans("", "", "0123456789,-")
_INT_DIGITS = 4000  # longer: int() refuses it (sys.get_int_max_str_digits), and parse_scalar says so
_FLOAT = re.compile(r"-?[0-9]+(?:\.[0-9]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)")
_ANNOTATION = re.compile(r"^\((.*)\)([a-z0-9]+)$")
_FLOAT_WORDS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def parse_scalar(text: str) -> Any:
    """One scalar: None / True / False / int / float / complex / bare string."""
    if text == "":
        raise ValueError("empty value")
    if text == "None":
        return None
    if text == "True":
        return True
    if text == "False":
        return False
    if text in _FLOAT_WORDS:
        return _FLOAT_WORDS[text]
    if not _NUMBER_START.match(text):
        return text
    # "1.000000e+00+2.000000e+00j": complex values are written with %e parts and a trailing j.
    if text.endswith("j"):
        try:
            return complex(text)
        except ValueError:
            raise ValueError(f"malformed complex number {clip(text)}") from None
    try:
        # Floats are always written with '.' or an exponent, so "2.0" never turns into an int.
        return float(text) if ("." in text or "e" in text or "E" in text) else int(text)
    except ValueError:
        raise ValueError(f"malformed number {clip(text)}") from None


def parse_param(text: str) -> Any:
    """A parameter value: a scalar, or a list written `(a,b)` / `[a,b]`. `()`, `[]` and `None` read as None."""
    if text in ("()", "[]"):
        return None
    if text[:1] in ("(", "["):
        close = ")" if text[0] == "(" else "]"
        if not text.endswith(close):
            raise ValueError(f"unterminated list {clip(text)}")
        inner = text[1:-1]
        if "(" in inner or "[" in inner:
            raise ValueError(f"nested list {clip(text)}")
        parts = inner.split(",")
        if _plain_ints(inner, parts):
            return list(map(int, parts))
        if all(map(_FLOAT.fullmatch, parts)):
            return list(map(float, parts))
        return [parse_scalar(part) for part in parts]
    return parse_scalar(text)


def _plain_ints(inner: str, parts: list[str]) -> bool:
    """Whether every item is `-?[0-9]+`, told by string operations over the whole list (a regex per item costs
    more than int() itself): only digits, commas and minus signs; a minus sign only at an item's start; no empty
    item."""
    if inner.translate(_INT_CHARS) or max(map(len, parts)) > _INT_DIGITS:
        return False
    unsigned = inner.replace(",-", ",").removeprefix("-")
    return bool(unsigned) and "-" not in unsigned and ",," not in unsigned and unsigned[0] != "," \
        and unsigned[-1] != ","


def clip(text: str, keep: int = 60) -> str:
    """`text` for an error message: its repr, or for a long value (a list of a million items) the repr of its
    start and its length, so that the message stays one readable line."""
    if len(text) <= keep:
        return repr(text)
    return f"{text[:keep]!r}... ({len(text)} characters)"


def parse_annotation(text: str, *, allow_unknown: bool = True) -> tuple[tuple[int, ...], str]:
    """`(1,3,?,?)f32` -> ((1, 3, -1, -1), "f32"). `?` and symbolic `%name` dims read as -1 (dynamic)."""
    m = _ANNOTATION.match(text)
    if not m:
        raise ValueError(f"malformed shape/dtype {clip(text)}")
    dims_text, code = m.groups()
    if code not in DTYPE_CODES:
        raise ValueError(f"unknown dtype code {code!r}")
    dims: list[int] = []
    if dims_text:
        for part in dims_text.split(","):
            if part == "?" or (part.startswith("%") and len(part) > 1):
                if not allow_unknown:
                    raise ValueError(f"dynamic dim {part!r} in a weight shape")
                dims.append(-1)
            elif part.isdigit() and part.isascii():
                dims.append(size(part, "dim"))
            else:
                raise ValueError(f"bad dim {clip(part)} in {clip(text)}")
    return tuple(dims), code


MAX_SIZE_DIGITS = 18  # any count or dim in a file: below 10**18, within int64, before anything uses it


def size(text: str, what: str) -> int:
    """A count or a dim (ASCII digits) as an int; one of more than MAX_SIZE_DIGITS digits is an error (int() would
    refuse a few thousand with a message about Python's limits, and fewer make no sense either)."""
    if len(text) > MAX_SIZE_DIGITS:
        raise ValueError(f"{what} {clip(text)} is too large")
    return int(text)


def elem_size(code: str) -> int:
    dt = DTYPE_CODES[code]
    return ELEM_SIZES[code] if dt is None else dt.itemsize


def annotation_dtype(code: str) -> np.dtype | None:
    """The dtype a value annotated with `code` holds at run time (bf16 is computed in float32)."""
    if code == "bf16":
        return np.dtype(np.float32)
    return DTYPE_CODES[code]


def format_param(value: Any) -> str:
    """The inverse of parse_param, in pnnx's spelling (used by the writer and tests)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(format_param(v) for v in value) + ")"
    if isinstance(value, float):
        text = repr(value)
        return text if ("." in text or "e" in text or "n" in text) else text + ".0"
    return str(value)

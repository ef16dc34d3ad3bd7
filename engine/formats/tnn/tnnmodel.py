"""Reader for `.tnnmodel`, the binary half of a TNN model: per-layer resources and the constant map.

Every length, count and dims list is checked against the bytes that are left BEFORE anything is
allocated, so a corrupted file costs at most its own size in memory and fails with the byte offset.
Each buffer is read straight into an aligned, read-only array of its own (engine/formats/model_files.py):
the file is read once, front to back, and closed; the model never looks at it again. Half and bfloat16
data are widened exactly to float32 (TNN's converter truncates when it writes half, we decode what is
stored and do not "correct").
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from engine.errors import ModelFormatError
from engine.formats.model_files import empty_array, file_size, open_model_file, read_array, read_exact, read_float32
from engine.formats.tnn.constants import (
    DATA_TYPES,
    DT_BF16,
    DT_FLOAT,
    DT_HALF,
    DT_INT8,
    LAYER_TYPES,
    MAGIC_V2,
    MAGICS,
    TYPE_ALIASES,
)

MAX_RESOURCES = 1 << 20
MAX_NAME = 1 << 16
MAX_DIMS = 8
BLOB_SCALE_SUFFIX = "_scale_data_"


@dataclass
class RawBuffer:
    code: int  # TNN DataType as stored (0 float, 1 half, 2 int8, 3 int32, ...)
    data: np.ndarray  # shaped by `dims` when the buffer stores them; half/bfloat16 widened to float32
    dims: tuple[int, ...] | None
    offset: int


@dataclass
class TnnResource:
    type: str
    name: str
    offset: int
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class TnnModelData:
    path: str
    version: int
    resources: dict[str, TnnResource] = field(default_factory=dict)
    blob_scales: dict[str, TnnResource] = field(default_factory=dict)  # keyed by blob name (suffix removed)
    consts: dict[str, RawBuffer] = field(default_factory=dict)


class _Cursor:
    """Reads a .tnnmodel front to back from `stream`, which holds `size` bytes; `pos` is the byte offset."""

    def __init__(self, stream: BinaryIO, size: int, path: str):
        self.stream, self.size, self.pos, self.path = stream, size, 0, path

    def _take(self, n: int, what: str) -> bytearray:
        """The next `n` bytes (the caller has checked with `need` that the file holds them)."""
        buf = bytearray(n)
        read_exact(self.stream, memoryview(buf), self.path, self.pos, what)
        self.pos += n
        return buf

    def rewind(self) -> None:
        self.stream.seek(0)
        self.pos = 0

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, message: str, at: int | None = None):
        raise ModelFormatError(self.path, message, offset=self.pos if at is None else at)

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            self.fail(f"{what}: needs {n} bytes, only {self.left()} left (truncated file?)")

    def i32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack("<i", self._take(4, what))
        return v

    def u32(self, what: str) -> int:
        return self.i32(what) & 0xFFFFFFFF

    def flag(self, what: str) -> bool:
        self.need(1, what)
        return self._take(1, what)[0] != 0

    def string(self, what: str) -> str:
        at = self.pos
        n = self.i32(f"{what} length")
        if not 0 <= n <= MAX_NAME:
            self.fail(f"{what}: string length {n} out of range", at)
        self.need(n, what)
        try:
            return self._take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what}: string is not UTF-8", at + 4)

    def raw(self, what: str) -> RawBuffer:
        at = self.pos
        magic = self.u32(f"{what} magic")
        if magic not in MAGICS:
            self.fail(f"{what}: bad buffer magic 0x{magic:08X} (expected 0xFABC0002 or 0xFABC0004)", at)
        code = self.i32(f"{what} data type")
        if code not in DATA_TYPES:
            self.fail(f"{what}: unknown data type code {code}", at + 4)
        length = self.i32(f"{what} byte length")
        if length <= 0:  # empty buffer: nothing follows, not even dims
            return RawBuffer(code, empty_array(_widened(code)), None, at)
        dims = self._dims(what) if magic == MAGIC_V2 else None
        return RawBuffer(code, self._payload(code, length, dims, what, at), dims, at)

    def _dims(self, what: str) -> tuple[int, ...]:
        at = self.pos
        ndims = self.i32(f"{what} dims count")
        if not 0 <= ndims <= MAX_DIMS:
            self.fail(f"{what}: dims count {ndims} out of range 0..{MAX_DIMS}", at)
        self.need(4 * ndims, f"{what} dims")
        dims = struct.unpack(f"<{ndims}i", self._take(4 * ndims, f"{what} dims"))
        if any(d < 0 for d in dims):
            self.fail(f"{what}: negative dimension in {list(dims)}", at)
        return tuple(dims)

    def _payload(self, code: int, length: int, dims, what: str, at: int) -> np.ndarray:
        dtype = DATA_TYPES[code]
        if length % dtype.itemsize:
            self.fail(f"{what}: byte length {length} is not a multiple of {dtype.itemsize}", at + 8)
        self.need(length, f"{what} data")
        count = length // dtype.itemsize
        if dims and math.prod(dims) != count:
            self.fail(f"{what}: dims {list(dims)} do not match {count} stored elements", at)
        shape = dims if dims else () if dims == () and count == 1 else (count,)
        if code in (DT_HALF, DT_BF16):
            arr = read_float32(self.stream, self.path, self.pos, shape, f"{what} data", bfloat16=code == DT_BF16)
        else:
            arr = read_array(self.stream, self.path, self.pos, dtype, shape, f"{what} data")
        self.pos += length
        return arr


def _widened(code: int) -> np.dtype:
    return np.dtype(np.float32) if code in (DT_HALF, DT_BF16) else DATA_TYPES[code].newbyteorder("=")


# -- resource bodies --------------------------------------------------------------------------------------------
def _quant_tail(cur: _Cursor, res: dict, weight_key: str) -> None:
    """After an int8 weight: new files store zero_point (int8) then scale, old files only a float scale."""
    if res[weight_key].code != DT_INT8:
        return
    first = cur.raw("quantization buffer")
    if first.code == DT_INT8:
        res["zero_point"], res["scale"] = first, cur.raw("scale")
    elif first.code == DT_FLOAT:
        res["scale"] = first
    else:
        cur.fail(f"quantized resource: expected an int8 zero point or float scale, got type {first.code}",
                 first.offset)


def _body_conv(cur: _Cursor) -> dict:
    res: dict[str, Any] = {"name_again": cur.string("layer name"), "has_bias": cur.i32("has_bias")}
    res["filter"] = cur.raw("filter")
    if res["has_bias"]:
        res["bias"] = cur.raw("bias")
    _quant_tail(cur, res, "filter")
    return res


def _body_scale(cur: _Cursor) -> dict:
    res: dict[str, Any] = {"name_again": cur.string("layer name"), "has_bias": cur.i32("has_bias")}
    res["scale"] = cur.raw("scale")
    if res["has_bias"]:
        res["bias"] = cur.raw("bias")
    return res


def _body_inner_product(cur: _Cursor) -> dict:
    res: dict[str, Any] = {"name_again": cur.string("layer name"), "weight": cur.raw("weight")}
    res["bias"] = cur.raw("bias")
    _quant_tail(cur, res, "weight")
    return res


def _body_gather(cur: _Cursor) -> dict:
    res: dict[str, Any] = {"data_in_resource": cur.i32("data_in_resource")}
    if res["data_in_resource"]:
        res["data"] = cur.raw("data")
    res["indices_in_resource"] = cur.i32("indices_in_resource")
    if res["indices_in_resource"]:
        res["indices"] = cur.raw("indices")
    if "data" in res and res["data"].code == DT_INT8:
        res["scale"] = cur.raw("scale")
    return res


def _body_scatter(cur: _Cursor) -> dict:
    res: dict[str, Any] = {}
    if cur.flag("has_indices"):
        res["indices"] = cur.raw("indices")
    if cur.flag("has_updates"):
        res["updates"] = cur.raw("updates")
    return res


def _body_matmul(cur: _Cursor) -> dict:
    res = {"weight": cur.raw("weight")}
    if res["weight"].code == DT_INT8:
        res["scale"] = cur.raw("scale")
    return res


def _body_blob_scale(cur: _Cursor) -> dict:
    res: dict[str, Any] = {}
    first = cur.raw("blob scale")
    if first.code == DT_INT8:
        res["zero_point"], res["scale"] = first, cur.raw("scale")
    else:
        res["scale"] = first
    res["bias"] = cur.raw("bias")
    return res


def _fixed(*names: str):
    return lambda cur: {n: cur.raw(n) for n in names}


def _with_name(*names: str):
    return lambda cur: {"name_again": cur.string("layer name"), **{n: cur.raw(n) for n in names}}


_CONV = ("Convolution", "Deconvolution", "QuantizedConvolution", "DynamicRangeQuantizedConvolution",
         "Convolution1D", "Convolution3D", "Deconvolution1D", "Deconvolution3D", "QuantizedDeconvolution")
_ELTWISE = ("Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "SquaredDifference", "And", "Greater", "Less",
            "Equal", "QuantizedAdd", "Pow", "Or", "Xor")
BODIES = {
    **dict.fromkeys(_CONV, _body_conv),
    **dict.fromkeys(("BatchNormCxx", "BatchNormalization", "InstBatchNormCxx"), _fixed("scale", "bias")),
    **dict.fromkeys(("InnerProduct", "QuantizedInnerProduct", "DynamicRangeQuantizedInnerProduct"),
                    _body_inner_product),
    **dict.fromkeys(_ELTWISE, _fixed("element")),
    **dict.fromkeys(("MatMul", "DynamicRangeQuantizedMatMul"), _body_matmul),
    "Scale": _body_scale,
    "PReLU": _with_name("slope"),
    "Const": _fixed("weight"),
    "ConstantOfShape": _fixed("value"),
    **dict.fromkeys(("Gather", "DynamicRangeQuantizedGather"), _body_gather),
    "ScatterND": _body_scatter,
    "Scatter": _body_scatter,
    "BiasAdd": _fixed("bias"),
    "DetectionPostProcess": _with_name("anchors"),
    "BlobScale": _body_blob_scale,
    "HdrGuide": _fixed("ccm_weight", "ccm_bias", "shifts", "slopes", "projection_weight", "projection_bias"),
}
BODIES["HDRGuide"] = BODIES["HdrGuide"]
BODIES |= {alias: BODIES[base] for alias, base in TYPE_ALIASES.items() if base in BODIES}
_BY_ENUM = {num: name for name, num in reversed(list(LAYER_TYPES.items())) if num}


# -- file structure ------------------------------------------------------------------------------------------
def read_model(path: str | Path) -> TnnModelData:
    with open_model_file(path, "cannot read weights") as f:
        return _read_model(_Cursor(f, file_size(f), str(path)))


def read_model_bytes(data: bytes, path: str = "<tnnmodel>") -> TnnModelData:
    return _read_model(_Cursor(io.BytesIO(data), len(data), path))


def _read_model(cur: _Cursor) -> TnnModelData:
    first = cur.u32("file magic")
    version = MAGICS.get(first)
    if version is None:  # the magic is optional: those 4 bytes were the resource count
        cur.rewind()
        version = 1
    out = TnnModelData(cur.path, version)
    at = cur.pos
    count = cur.i32("resource count") & 0x1FFFFFFF
    if count > MAX_RESOURCES or count * 12 > cur.left():
        cur.fail(f"resource count {count} cannot fit in the {cur.left()} bytes left", at)
    for _ in range(count):
        res = _read_resource(cur)
        if res.name.endswith(BLOB_SCALE_SUFFIX):
            out.blob_scales[res.name[: -len(BLOB_SCALE_SUFFIX)]] = res
        elif res.name in out.resources:
            cur.fail(f"second resource for layer {res.name!r}", res.offset)
        else:
            out.resources[res.name] = res
    if cur.left() >= 4:
        _read_const_map(cur, out)
    if cur.left():
        cur.fail(f"{cur.left()} unexpected bytes after the last record")
    return out


def _read_resource(cur: _Cursor) -> TnnResource:
    at = cur.pos
    type_num = cur.i32("layer type")
    first = cur.string("layer type name")
    if first in LAYER_TYPES:
        type_name, name = first, cur.string("layer name")
    else:  # oldest files: no type string, `first` is the layer name and the int is the type
        type_name, name = _BY_ENUM.get(type_num, ""), first
    body = BODIES.get(type_name)
    if body is None:
        cur.fail(f"resource {name!r}: layer type {type_name or type_num!r} has no resource format", at)
    return TnnResource(type_name, name, at, body(cur))


def _read_const_map(cur: _Cursor, out: TnnModelData) -> None:
    cur.u32("constant map magic")  # TNN ignores its value
    at = cur.pos
    count = cur.i32("constant count")
    if not 0 <= count <= MAX_RESOURCES or count * 16 > cur.left():
        cur.fail(f"constant count {count} cannot fit in the {cur.left()} bytes left", at)
    for _ in range(count):
        at = cur.pos
        name = cur.string("constant name")
        if name in out.consts:
            cur.fail(f"constant {name!r} stored twice", at)
        out.consts[name] = cur.raw(f"constant {name!r}")


__all__ = ["BLOB_SCALE_SUFFIX", "DT_FLOAT", "RawBuffer", "TnnModelData", "TnnResource", "read_model",
           "read_model_bytes"]

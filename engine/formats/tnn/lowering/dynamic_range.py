"""TNN's DynamicRangeQuantized* layers -> the float layers' lowering, on weights dequantized at load.

A `DynamicRangeQuantized<Type>` layer (written by TNN's dynamic_range_quantization tool) is a float layer whose
weight is stored as int8 with float scales. TNN's NetOptimizerDynamicRangeDequant turns the weight back into
float32 before the network runs, w = scale * (float)q, and the layer then runs as the plain float layer; these
handlers do the same and call the float handler:
- Convolution: the filter, one scale per output channel (the filter's first stored dim);
- InnerProduct: the weight, its first scale (TNN reads scale[0] only);
- MatMul: with weight_position 1 the stored weight, scale[0]; with -1 the constant operand (input 0 if it is a
  constant, else input 1) and the scale stored beside it in the constant map;
- LSTMONNX: the W and R operands (inputs 1 and 2), each with its constant-map scale[0];
- Gather: the stored data (data_in_resource), one scale per row (its first dim).
An operand that is not int8 is left as it is (TNN's pass skips it as already dequantized). The cases where TNN's
pass leaves int8 data for a float acc to read as floats, reads a scale it does not have, or stops early, are
refused: a Gather whose scales do not match its rows, a MatMul weight at position 0, an LSTM whose W is float but
whose R is int8, a filter without stored dims, non-zero zero points (TNN's pass ignores them).
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import F32, Ctx
from engine.formats.tnn.lowering.conv_pool import lower_conv
from engine.formats.tnn.lowering.linear import lower_inner_product, lower_matmul
from engine.formats.tnn.lowering.recurrent import lower_lstm
from engine.formats.tnn.lowering.registry import handles
from engine.formats.tnn.lowering.tensor import lower_gather


def _is_int8(a) -> bool:
    return a is not None and np.asarray(a).dtype == np.int8


def _scales(c: Ctx, key: str, what: str) -> np.ndarray:
    s = c.node.attrs.get(key)
    if s is None or np.asarray(s).size == 0:
        c.fail(f"int8 {what} without its dynamic-range scale")
    s = np.asarray(s)
    if s.dtype.kind != "f":
        c.fail(f"dynamic-range scale of the {what} is {s.dtype}, expected float")
    return s.astype(F32).reshape(-1)


def _no_zero_point(c: Ctx) -> None:
    zp = c.node.attrs.get("zero_point")
    if zp is not None and np.any(np.asarray(zp) != 0):
        c.unsupported("with non-zero zero points (TNN's dynamic-range dequantization ignores them)")


def _per_tensor(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (scale[0] * np.asarray(q).astype(F32)).astype(F32)


def _per_row(c: Ctx, key: str, scale_key: str, what: str) -> None:
    q = c.node.attrs[key]
    dims = (c.node.params.get("resource_dims") or {}).get(key)
    if not dims:
        c.unsupported(f"with an int8 {what} stored without dims (TNN's dequantization reads its first dim)")
    scale = _scales(c, scale_key, what)
    if scale.size != dims[0]:
        c.unsupported(f"with {scale.size} scales for the {dims[0]} rows of its int8 {what} (TNN reads one per row)")
    rows = np.asarray(q).reshape(dims[0], -1).astype(F32)
    c.node.attrs[key] = (scale[:, None] * rows).astype(F32).reshape(np.shape(q))


@handles("DynamicRangeQuantizedConvolution")
def lower_dr_conv(c: Ctx) -> None:
    if _is_int8(c.attr("filter")):
        _no_zero_point(c)
        _per_row(c, "filter", "scale", "filter")
    lower_conv(c)


@handles("DynamicRangeQuantizedInnerProduct")
def lower_dr_inner_product(c: Ctx) -> None:
    if _is_int8(c.attr("weight")):
        _no_zero_point(c)
        c.node.attrs["weight"] = _per_tensor(c.node.attrs["weight"], _scales(c, "scale", "weight"))
    lower_inner_product(c)


@handles("DynamicRangeQuantizedMatMul")
def lower_dr_matmul(c: Ctx) -> None:
    position, w = c.i(0, -1), c.node.attrs.get("weight")
    if _is_int8(w):
        if position != 1 or len(c.inputs) != 1:
            c.unsupported(f"with an int8 stored weight at position {position} (TNN dequantizes it only at "
                          "position 1: its float acc would read int8 data)")
        c.node.attrs["weight"] = _per_tensor(w, _scales(c, "scale", "weight"))
    elif position == -1 and len(c.inputs) == 2:
        k = 0 if c.inputs[0].is_const else 1
        if c.inputs[k].is_const and _is_int8(c.inputs[k].const):
            c.node.inputs[k] = c.const(_per_tensor(c.inputs[k].const, _scales(c, f"input{k}_scale", "operand")),
                                       f"dequantized{k}")
    lower_matmul(c)


@handles("DynamicRangeQuantizedLSTMONNX")
def lower_dr_lstm(c: Ctx) -> None:
    if len(c.inputs) < 3:
        c.fail(f"has {len(c.inputs)} inputs (takes X, W, R, B and optionally h0, c0)")
    for k in (1, 2):
        v = c.inputs[k]
        if not (v.is_const and _is_int8(v.const)):
            if k == 2:
                break
            if c.inputs[2].is_const and _is_int8(c.inputs[2].const):
                c.unsupported("with a float W and an int8 R (TNN's dequantization stops at the float W)")
            break
        c.node.inputs[k] = c.const(_per_tensor(v.const, _scales(c, f"input{k}_scale", "W" if k == 1 else "R")),
                                   "W" if k == 1 else "R")
    lower_lstm(c)


@handles("DynamicRangeQuantizedGather")
def lower_dr_gather(c: Ctx) -> None:
    data = c.node.attrs.get("data")
    if c.i(1, 0) and _is_int8(data):
        dims = (c.node.params.get("resource_dims") or {}).get("data")
        if dims is not None and len(dims) < 2:
            c.unsupported("with 1-D int8 data (TNN's dequantization leaves it int8 for its float acc)")
        _per_row(c, "data", "scale", "data")
    lower_gather(c)

"""The NHWC twins of TNN's int8 ops (engine/ops/quant.py): the same meaning, on values laid out (N, H, W, C).

Each twin names its base op and which of its sides are NHWC; params and attrs are the base op's (axis params stay
logical: a Concat on axis 1 joins channels). `Int8ConvNhwc` adds `src_unsigned` (its input is never negative, so
oneDNN may read it as u8). A quantize with `zero_point` (128) writes q + zero_point as uint8, and the convs that
read it say so in `src_zero_point`: they take it off again. `Int8DequantizeToNhwc` is a dequantize whose float
output is NHWC too (it stands for a dequantize and the Transpose to channels-last that read it, as detection heads
do); `Int8DequantizeConcatNhwc` stands for several such heads, each reshaped and all joined on axis 1 (a
detector's scores or boxes), written straight into the joined float value; `Int8DequantizeMeanNhwc` for a
dequantize whose only reader is a GlobalAvgPool (a classifier's head), writing the pooled (N, C, 1, 1) float value
from the int8 pixels, no float map made. `Int8ToNhwc` / `Int8ToNchw` move an
int8 value between the layouts. These ops are the CPU device's own: its int8 rewrite (rewrite.py) inserts them,
their kernels are in kernels.py, and each reference transposes to NCHW, runs the base op's reference and
transposes back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops import OPS as SHARED
from engine.ops.registry import OpDef, TensorInfo


def nhwc_shape(shape: Sequence[int]) -> tuple[int, ...]:
    n, c, h, w = shape
    return n, h, w, c


def nchw_shape(shape: Sequence[int]) -> tuple[int, ...]:
    n, h, w, c = shape
    return n, c, h, w


def to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1))


def to_nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))


def _check4(node: Node, shape) -> None:
    if len(shape) != 4:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 4-D values, got {tuple(shape)}")


def twin(op_type: str, base: str, nhwc_in: Sequence[bool] | None, nhwc_out: bool) -> OpDef:
    """The OpDef of `base` with the inputs flagged in `nhwc_in` (all when None) and its output in NHWC."""
    base_def = SHARED[base]

    def is_nhwc(k: int) -> bool:
        return nhwc_in is None or (k < len(nhwc_in) and nhwc_in[k])

    def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
        logical = []
        for k, i in enumerate(ins):
            if is_nhwc(k):
                _check4(node, i.shape)
                i = TensorInfo(nchw_shape(i.shape), i.dtype)
            logical.append(i)
        outs = base_def.infer(node, logical)
        if nhwc_out:
            for o in outs:
                _check4(node, o.shape)
        return [TensorInfo(nhwc_shape(o.shape), o.dtype) if nhwc_out else o for o in outs]

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        logical = [to_nchw(a) if is_nhwc(k) else a for k, a in enumerate(arrays)]
        outs = base_def.reference(node, logical)
        return [to_nhwc(o) if nhwc_out else o for o in outs]

    return OpDef(op_type, infer, reference)


def _transpose(op_type: str, to: str) -> OpDef:
    def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
        _check4(node, ins[0].shape)
        shape = nhwc_shape(ins[0].shape) if to == "nhwc" else nchw_shape(ins[0].shape)
        return [TensorInfo(shape, ins[0].dtype)]

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [to_nhwc(arrays[0]) if to == "nhwc" else to_nchw(arrays[0])]

    return OpDef(op_type, infer, reference)


def _join_shape(node: Node, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """(N, rows, *trailing) of the joined heads: every image's values of every head, in order, as rows of
    `trailing`."""
    trailing = tuple(int(d) for d in node.params["trailing"])
    row = int(np.prod(trailing))
    rows = 0
    for shape in shapes:
        _check4(node, shape)
        if shape[0] != shapes[0][0] or (shape[1] * shape[2] * shape[3]) % row:
            raise ShapeError(f"{node.where()}: {node.op_type} cannot join {[tuple(s) for s in shapes]} as rows "
                             f"of {trailing}")
        rows += shape[1] * shape[2] * shape[3] // row
    return (shapes[0][0], rows, *trailing)


def _dequantize_concat() -> OpDef:
    """Int8DequantizeConcatNhwc: NHWC int8 heads (N, H_i, W_i, C_i), each dequantized by its scales (attr
    `scales`, one per head, per channel or one), reshaped to (N, -1, *trailing) and all concatenated on axis 1;
    with param `softmax`, then a Softmax over the last axis (a detector's class scores)."""
    def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
        return [TensorInfo(_join_shape(node, [i.shape for i in ins]), np.dtype(np.float32))]

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        shape = _join_shape(node, [a.shape for a in arrays])
        parts = [(np.asarray(s, np.float32).reshape(-1) * a.astype(np.float32)).astype(np.float32)
                 .reshape(shape[0], -1, *shape[2:]) for a, s in zip(arrays, node.attrs["scales"], strict=True)]
        joined = np.concatenate(parts, axis=1)
        if not node.params.get("softmax"):
            return [joined]
        shifted = joined.astype(np.float64) - np.max(joined, axis=-1, keepdims=True)
        e = np.exp(shifted)
        return [(e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32)]

    return OpDef("Int8DequantizeConcatNhwc", infer, reference)


def _dequantize_mean() -> OpDef:
    """Int8DequantizeMeanNhwc: an NHWC int8 (N, H, W, C) dequantized by attr `scale` (per channel or one), then
    averaged over its pixels as GlobalAvgPool does: float32 (N, C, 1, 1)."""
    dequantize, pool = SHARED["TnnDequantize"], SHARED["GlobalAvgPool"]

    def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
        _check4(node, ins[0].shape)
        n, _, _, c = ins[0].shape
        return [TensorInfo((n, c, 1, 1), np.dtype(np.float32))]

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return pool.reference(node, dequantize.reference(node, [to_nchw(arrays[0])]))

    return OpDef("Int8DequantizeMeanNhwc", infer, reference)


def _zero_point(base: OpDef, key: str) -> OpDef:
    """`base` (a twin) with the zero point of param `key`: on a quantize's output (added, as uint8), or on a
    conv's input (taken off first)."""
    def shifted(node: Node) -> int:
        return int(node.params.get(key, 0))

    def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
        if key == "src_zero_point" and shifted(node):
            ins = [TensorInfo(ins[0].shape, np.dtype(np.int8)), *ins[1:]]
        outs = base.infer(node, ins)
        if key == "zero_point" and shifted(node):
            outs = [TensorInfo(outs[0].shape, np.dtype(np.uint8))]
        return outs

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        zp = shifted(node)
        if key == "src_zero_point" and zp:
            arrays = [(arrays[0].astype(np.int16) - zp).astype(np.int8), *arrays[1:]]
        outs = base.reference(node, arrays)
        if key == "zero_point" and zp:
            outs = [(outs[0].astype(np.int16) + zp).astype(np.uint8)]
        return outs

    return OpDef(base.op_type, infer, reference)


def _relu(base: OpDef) -> OpDef:
    """`base` followed by the TnnQRelu the rewrite folded into it (param `relu`): max(q, 0) of its int8 output."""
    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        outs = base.reference(node, arrays)
        return [np.maximum(outs[0], np.int8(0))] if node.params.get("relu") else outs

    return OpDef(base.op_type, base.infer, reference)


# base op -> its twin's op type (the rewrite's table)
TWINS = {"TnnQConv": "Int8ConvNhwc", "TnnQAdd": "Int8AddNhwc", "TnnQPool": "Int8PoolNhwc",
         "TnnQConcat": "Int8ConcatNhwc", "TnnQuantize": "Int8QuantizeNhwc", "TnnDequantize": "Int8DequantizeNhwc",
         "TnnQUpsample": "Int8UpsampleNhwc"}

OPS: dict[str, OpDef] = {
    "Int8ConvNhwc": _zero_point(twin("Int8ConvNhwc", "TnnQConv", None, True), "src_zero_point"),
    "Int8AddNhwc": _relu(twin("Int8AddNhwc", "TnnQAdd", None, True)),
    "Int8PoolNhwc": twin("Int8PoolNhwc", "TnnQPool", None, True),
    "Int8ConcatNhwc": twin("Int8ConcatNhwc", "TnnQConcat", None, True),
    "Int8UpsampleNhwc": twin("Int8UpsampleNhwc", "TnnQUpsample", None, True),
    "Int8QuantizeNhwc": _zero_point(twin("Int8QuantizeNhwc", "TnnQuantize", [False], True), "zero_point"),
    "Int8DequantizeNhwc": twin("Int8DequantizeNhwc", "TnnDequantize", [True], False),
    # a dequantize whose only reader was a Transpose to channels-last: the float value stays NHWC, no transpose
    "Int8DequantizeToNhwc": twin("Int8DequantizeToNhwc", "TnnDequantize", [True], True),
    # several of those heads, each reshaped and all concatenated on axis 1
    "Int8DequantizeConcatNhwc": _dequantize_concat(),
    # a dequantize whose only reader was a GlobalAvgPool: the pooled float value, from the int8 pixels
    "Int8DequantizeMeanNhwc": _dequantize_mean(),
    "Int8ToNhwc": _transpose("Int8ToNhwc", "nhwc"),
    "Int8ToNchw": _transpose("Int8ToNchw", "nchw"),
}

"""TNN's int8 ops, bit-exact with TNN's CPU (naive) kernels.

Activations are int8 with one float scale per channel (axis 1) or per tensor: real = scale * q. Rounding
everywhere is TNN's `float2int8`: add +-0.5 in float32, clamp to [-128, 127], truncate toward zero.
- `TnnQuantize` (float -> int8, q = float2int8(x / scale)) and `TnnDequantize` (int8 -> float, scale * q)
  stand where TNN inserts reformat layers.
- `TnnQConv`: int8 x int8 products accumulated exactly in int32, plus the int32 bias, times the per-channel
  requantization factor (weight scale / output scale, float32), then ReLU or the ReLU6 clamp, then float2int8.
  The factors and the int8 ReLU6 ceilings are attrs `scale` / `relu6_max`, or, where those are absent (a layer
  loaded from a TNN file), derived from its `weight_scale` and `out_scale` as TNN's layer setup does
  (qconv_factors): the file's scales are kept to write the model again, so storing both would double them.
  With `fusion` it also adds a second int8 input times `add_scale` (TNN fuses a 1x1 conv into the int8 Add
  that consumes it, rounding once instead of twice).
- `TnnQInnerProduct`: TNN's quantized InnerProduct (axis 1): the input flattened to (N, K), int8 x int8 sums
  exact in int32 plus the int32 bias, times the per-channel factor, float2int8; the output keeps the input's rank
  (N, O, 1, 1 for a 4-D input), as TNN's.
- `TnnQAdd`: scale_a * a + scale_b * b in float32, divided by the output scale, float2int8.
- `TnnQPool`: int8 max or average pooling with an int32 sum and truncating division, as TNN's naive pooling.
- `TnnQConcat`: byte-wise when any scale is per channel; with per-tensor scales each input is requantized
  to the output scale first, as TNN does. `TnnQRelu`: max(q, 0).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import EngineError, InputValueError, ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import norm_axis

I8 = np.dtype(np.int8)
F32 = np.dtype(np.float32)


FLT_MIN = np.finfo(F32).tiny


def float2int8(val: np.ndarray) -> np.ndarray:
    val = np.asarray(val, dtype=F32)
    half = np.where(val >= 0, F32.type(0.5), F32.type(-0.5))
    return np.trunc(np.clip(val + half, -128.0, 127.0)).astype(I8)


def requant_factors(w_scale: np.ndarray, o_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w_scale / o_scale, 0 where o_scale is denormal) and the int8 ReLU6 ceiling float2int8(6 / o_scale), as
    TNN's conv layer setup computes them."""
    o_scale = np.asarray(o_scale, F32)
    ok = o_scale >= FLT_MIN
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(ok, np.asarray(w_scale, F32) / np.where(ok, o_scale, 1), 0).astype(F32)
        relu6_max = float2int8(F32.type(6.0) / o_scale)
    return scale, relu6_max


def qconv_factors(node: Node) -> tuple[np.ndarray, np.ndarray]:
    """A TnnQConv's or TnnQInnerProduct's per-channel (O,) factors (float32) and int8 ReLU6 ceilings: the attrs
    `scale` / `relu6_max` where present, else derived from `weight_scale` and `out_scale` (requant_factors); a
    ceiling with neither is 127, the int8 saturation."""
    o = node.attrs["weight"].shape[0]
    scale, top = node.attrs.get("scale"), node.attrs.get("relu6_max")
    if (scale is None or top is None) and "weight_scale" in node.attrs:
        derived = requant_factors(_per_channel(node.attrs["weight_scale"], o, F32),
                                  _per_channel(node.attrs["out_scale"], o, F32))
        scale, top = derived[0] if scale is None else scale, derived[1] if top is None else top
    if scale is None:
        raise EngineError(f"{node.where()}: {node.op_type} has neither scale nor weight_scale / out_scale")
    return _per_channel(scale, o, F32), _per_channel(127 if top is None else top, o, I8)


def _per_channel(a, o: int, dtype) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype).reshape(-1), (o,)))


def _channel_scale(node: Node, key: str, x: np.ndarray) -> np.ndarray:
    s = np.asarray(node.attrs[key], dtype=F32).reshape(-1)
    if s.size == 1 or x.ndim < 2:
        return s[:1].reshape(())
    if s.size != x.shape[1]:
        raise ShapeError(f"{node.where()}: {s.size} scales for {x.shape[1]} channels")
    return s.reshape((1, -1) + (1,) * (x.ndim - 2))


# -- quantize / dequantize ----------------------------------------------------------------------------------------
def _same_shape(dtype):
    return lambda node, ins: [TensorInfo(tuple(ins[0].shape), np.dtype(dtype))]


def holds_nan(x: np.ndarray) -> bool:
    """Whether a float array holds a NaN (min propagates it: one pass, no temporary)."""
    return x.dtype.kind == "f" and x.size > 0 and bool(np.isnan(x.min()))


def refuse_nan(node: Node, x: np.ndarray) -> None:
    """int8 has no NaN: quantizing one would serve a number for it (float2int8 of NaN is undefined; our loops give
    0, and a NaN pixel into an int8 classifier gave the clean image's logits), so the run is refused instead."""
    if holds_nan(x):
        raise InputValueError(f"{node.where()}: {node.op_type} node {node.name!r} met a NaN, which int8 cannot "
                              f"represent (a NaN in the model's input, or one computed before this layer)")


def quantize_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0], dtype=F32)
    refuse_nan(node, x)
    s = np.broadcast_to(_channel_scale(node, "scale", x), x.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = float2int8(np.where(s != 0, x / np.where(s != 0, s, 1), 0))
    return [q]


def dequantize_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    return [(_channel_scale(node, "scale", x) * x.astype(F32)).astype(F32)]


# -- convolution ----------------------------------------------------------------------------------------------------
def _pair(v) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, list | tuple) else (int(v), int(v))


def conv_geometry(node: Node, shape) -> tuple:
    if len(shape) != 4:
        raise ShapeError(f"{node.where()}: {node.op_type} expects NCHW input, got {tuple(shape)}")
    n, c, h, w = shape
    o, icg, kh, kw = node.attrs["weight"].shape
    g = int(node.params.get("groups", 1))
    if c != icg * g:
        raise ShapeError(f"{node.where()}: input has {c} channels, the filter expects {icg * g}")
    (sh, sw), (dh, dw) = _pair(node.params.get("stride", 1)), _pair(node.params.get("dilation", 1))
    t, l = _pair(node.params.get("pads", (0, 0))[:2])
    oh = (h + 2 * t - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * l - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{node.where()}: input {tuple(shape)} is too small for a {kh}x{kw} kernel")
    return (n, o, oh, ow), (kh, kw), (sh, sw), (dh, dw), (t, l), g


def qconv_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(conv_geometry(node, ins[0].shape)[0], I8)]


def qconv_accumulate(node: Node, x: np.ndarray) -> np.ndarray:
    """Exact int32 sums of int8 products plus the bias: int32 shifts for depthwise, float64 GEMM otherwise
    (every partial sum is an integer far below 2**53, so the GEMM is exact)."""
    (n, o, oh, ow), (kh, kw), (sh, sw), (dh, dw), (t, l), g = conv_geometry(node, x.shape)
    c = x.shape[1]
    w = node.attrs["weight"]
    bias = node.attrs["bias"].astype(np.int64).reshape(1, o, 1, 1)
    if g == c == o:  # depthwise: one multiply-add per kernel tap
        xp = np.pad(x.astype(np.int32), ((0, 0), (0, 0), (t, t), (l, l)))
        acc = np.zeros((n, o, oh, ow), np.int32)
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                acc += tap * w[:, 0, i, j].astype(np.int32).reshape(1, o, 1, 1)
        return acc + bias
    if (kh, kw, sh, sw, t, l) == (1, 1, 1, 1, 0, 0):  # pointwise: the input already is the column matrix
        win = x.astype(np.float64).reshape(n, g, c // g, oh * ow).transpose(0, 1, 3, 2)
    else:
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, t), (l, l)))
        span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
        win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]
        win = win.reshape(n, g, c // g, oh, ow, kh, kw).transpose(0, 1, 3, 4, 2, 5, 6).reshape(n, g, oh * ow, -1)
    wg = w.astype(np.float64).reshape(g, o // g, -1)
    acc = np.matmul(win, wg.transpose(0, 2, 1))  # (n, g, oh*ow, o/g)
    acc = acc.transpose(0, 1, 3, 2).reshape(n, o, oh, ow)
    return acc.astype(np.int64) + bias


def qconv_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    acc = qconv_accumulate(node, arrays[0])
    o = acc.shape[1]
    scale, relu6_max = qconv_factors(node)
    val = acc.astype(F32) * scale.reshape(1, o, 1, 1)
    act, fusion = node.params.get("activation"), node.params.get("fusion")
    if fusion is not None:  # a following int8 Add folded in (TNN fuses 1x1 convs with the Add they feed)
        z = arrays[1].astype(F32) * np.asarray(node.attrs["add_scale"], F32).reshape(1, o, 1, 1)
    if fusion == "add_then_act":
        val = val + z
    if act == "relu":
        val = np.maximum(val, F32.type(0))
    elif act == "relu6":  # TNN clamps in int8 and, like TNN, skips a fused add here
        q = float2int8(val)
        return [np.maximum(np.minimum(q, relu6_max.reshape(1, o, 1, 1)), 0).astype(I8)]
    if fusion == "act_then_add":
        val = val + z
    return [float2int8(val)]


def _linear_geometry(node: Node, shape) -> tuple[int, int, tuple[int, ...]]:
    w = node.attrs["weight"]
    if len(shape) < 2:
        raise ShapeError(f"{node.where()}: {node.op_type} needs an input of rank >= 2, got {tuple(shape)}")
    k = int(np.prod(shape[1:], dtype=np.int64))
    if w.ndim != 2 or w.shape[1] != k:
        raise ShapeError(f"{node.where()}: input {tuple(shape)} flattens to {k} values, the weight is {w.shape}")
    o = int(w.shape[0])
    return k, o, (int(shape[0]), o) + (1,) * (len(shape) - 2)


def qlinear_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(_linear_geometry(node, ins[0].shape)[2], I8)]


def qlinear_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    k, o, out_shape = _linear_geometry(node, x.shape)
    acc = x.reshape(x.shape[0], k).astype(np.float64) @ node.attrs["weight"].astype(np.float64).T  # exact
    acc = acc.astype(np.int64) + node.attrs["bias"].astype(np.int64).reshape(1, o)
    val = acc.astype(F32) * qconv_factors(node)[0].reshape(1, o)
    return [float2int8(val).reshape(out_shape)]


# -- add, pooling, concat, relu -----------------------------------------------------------------------------------
def qadd_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if tuple(ins[0].shape) != tuple(ins[1].shape):
        raise ShapeError(f"{node.where()}: int8 Add needs equal shapes, got {ins[0].shape} and {ins[1].shape}")
    return [TensorInfo(tuple(ins[0].shape), I8)]


def qadd_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays
    acc = _channel_scale(node, "scale_a", a) * a.astype(F32)
    acc = acc + _channel_scale(node, "scale_b", b) * b.astype(F32)
    return [float2int8(acc.astype(F32) / _channel_scale(node, "scale_out", a))]


def pool_geometry(node: Node, shape) -> tuple:
    n, c, h, w = shape
    kh, kw = _pair(node.params["kernel"])
    kh, kw = kh or h, kw or w  # 0 means the whole input (global pooling)
    (sh, sw), (ph, pw) = _pair(node.params.get("stride", 1)), _pair(node.params.get("pads", 0))
    rnd = np.ceil if node.params.get("ceil_mode") else np.floor
    oh = int(rnd((h + 2 * ph - kh) / sh + 1))
    ow = int(rnd((w + 2 * pw - kw) / sw + 1))
    return (n, c, oh, ow), (kh, kw), (sh, sw), (ph, pw)


def qpool_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(pool_geometry(node, ins[0].shape)[0], I8)]


def qpool_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    (n, c, oh, ow), (kh, kw), (sh, sw), (ph, pw) = pool_geometry(node, x.shape)
    out = np.empty((n, c, oh, ow), I8)
    h, w = x.shape[2:]
    is_max = node.params.get("mode", "max") == "max"
    for i in range(oh):
        h0, h1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h)
        for j in range(ow):
            w0, w1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w)
            win = x[:, :, h0:h1, w0:w1].astype(np.int32)
            if is_max:  # TNN starts its max at -127
                out[:, :, i, j] = np.maximum(win.max(axis=(2, 3), initial=-127), -127)
            else:  # int32 sum, C++ division (truncates toward zero)
                total, count = win.sum(axis=(2, 3)), max((h1 - h0) * (w1 - w0), 1)
                out[:, :, i, j] = (np.abs(total) // count * np.sign(total)).astype(I8)
    return [out]


def qconcat_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    axis = norm_axis(node, int(node.params.get("axis", 1)), len(ins[0].shape))
    shape = list(ins[0].shape)
    shape[axis] = sum(int(i.shape[axis]) for i in ins)
    return [TensorInfo(tuple(shape), I8)]


def qconcat_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    if "scales" in node.attrs:  # all scales per tensor: TNN requantizes every input to the output scale
        s_out = F32.type(node.attrs["scale_out"].reshape(-1)[0])
        arrays = [float2int8(a.astype(F32) * F32.type(s) / s_out) for a, s in zip(arrays, node.attrs["scales"],
                                                                                strict=True)]
    return [np.concatenate(arrays, axis=int(node.params.get("axis", 1)))]


register(
    OpDef("TnnQuantize", _same_shape(I8), quantize_reference),
    OpDef("TnnDequantize", _same_shape(F32), dequantize_reference),
    OpDef("TnnQConv", qconv_infer, qconv_reference),
    OpDef("TnnQInnerProduct", qlinear_infer, qlinear_reference),
    OpDef("TnnQAdd", qadd_infer, qadd_reference),
    OpDef("TnnQPool", qpool_infer, qpool_reference),
    OpDef("TnnQConcat", qconcat_infer, qconcat_reference),
    OpDef("TnnQRelu", _same_shape(I8), lambda node, arrays: [np.maximum(arrays[0], 0).astype(I8)]),
)

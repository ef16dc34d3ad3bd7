"""TNN's int8 ops, bit-exact with TNN's CPU (naive) kernels.

Activations are int8 with one float scale per channel (axis 1) or per tensor: real = scale * q. Rounding
everywhere is TNN's `float2int8`: add +-0.5 in float32, clamp to [-128, 127], truncate toward zero.
- `TnnQuantize` (float -> int8, q = float2int8(x / scale)) and `TnnDequantize` (int8 -> float, scale * q)
  stand where TNN inserts reformat layers.
- `TnnQConv`: int8 x int8 products accumulated exactly in int32, plus the int32 bias, times the per-channel
  requantization factor (weight scale / output scale, float32), then ReLU or the ReLU6 clamp, then float2int8.
  With `fusion` it also adds a second int8 input times `add_scale` (TNN fuses a 1x1 conv into the int8 Add
  that consumes it, rounding once instead of twice).
- `TnnQAdd`: scale_a * a + scale_b * b in float32, divided by the output scale, float2int8.
- `TnnQPool`: int8 max or average pooling with an int32 sum and truncating division, as TNN's naive pooling.
- `TnnQConcat`: byte-wise when any scale is per channel; with per-tensor scales each input is requantized
  to the output scale first, as TNN does. `TnnQRelu`: max(q, 0).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.devices.cpu.loops import quant as QK
from engine.devices.cpu.threads import parallel_for
from engine.errors import KernelError, ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import norm_axis

I8 = np.dtype(np.int8)
F32 = np.dtype(np.float32)


def float2int8(val: np.ndarray) -> np.ndarray:
    val = np.asarray(val, dtype=F32)
    half = np.where(val >= 0, F32.type(0.5), F32.type(-0.5))
    return np.trunc(np.clip(val + half, -128.0, 127.0)).astype(I8)


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


def quantize_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0], dtype=F32)
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
    val = acc.astype(F32) * np.asarray(node.attrs["scale"], F32).reshape(1, o, 1, 1)
    act, fusion = node.params.get("activation"), node.params.get("fusion")
    if fusion is not None:  # a following int8 Add folded in (TNN fuses 1x1 convs with the Add they feed)
        z = arrays[1].astype(F32) * np.asarray(node.attrs["add_scale"], F32).reshape(1, o, 1, 1)
    if fusion == "add_then_act":
        val = val + z
    if act == "relu":
        val = np.maximum(val, F32.type(0))
    elif act == "relu6":  # TNN clamps in int8 and, like TNN, skips a fused add here
        q = float2int8(val)
        return [np.maximum(np.minimum(q, node.attrs["relu6_max"].reshape(1, o, 1, 1)), 0).astype(I8)]
    if fusion == "act_then_add":
        val = val + z
    return [float2int8(val)]


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


# -- kernels (numba, bit-exact with the references above) -------------------------------------------------------
def _per_channel(node: Node, key: str, shape) -> np.ndarray:
    """A scale attr as one float32 per channel (axis 1) of `shape`, as _channel_scale broadcasts it."""
    c = int(shape[1]) if len(shape) >= 2 else 1
    s = np.asarray(node.attrs[key], dtype=F32).reshape(-1)
    if s.size != 1 and len(shape) >= 2 and s.size != c:
        raise ShapeError(f"{node.where()}: {s.size} scales for {c} channels")
    return np.ascontiguousarray(np.broadcast_to(s if s.size == c else s[:1], (c,)))


def _rows(a: np.ndarray) -> np.ndarray:
    """(n, c, rest) view of an array with channels on axis 1 (one row for 0/1-d arrays)."""
    return a.reshape(a.shape[0], a.shape[1], -1) if a.ndim >= 2 else a.reshape(1, 1, -1)


def _items(a: np.ndarray) -> int:
    return a.shape[0] * a.shape[1] if a.ndim >= 2 else 1


def _scale_kernel(fn, key: str):
    def build(node: Node, ins: list[TensorInfo]):
        scale = _per_channel(node, key, ins[0].shape)

        def run(inputs, outputs, workspace):
            x = inputs[0]
            parallel_for(fn, _items(x), x.size, _rows(x), scale, _rows(outputs[0]))
        return run
    return build


def build_qadd(node: Node, ins: list[TensorInfo]):
    sa, sb, so = (_per_channel(node, k, ins[0].shape) for k in ("scale_a", "scale_b", "scale_out"))

    def run(inputs, outputs, workspace):
        a, b = inputs
        parallel_for(QK.add, _items(a), a.size, _rows(a), _rows(b), sa, sb, so, _rows(outputs[0]))
    return run


def build_qpool(node: Node, ins: list[TensorInfo]):
    is_max = node.params.get("mode", "max") == "max"

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        _, (kh, kw), (sh, sw), (ph, pw) = pool_geometry(node, x.shape)
        parallel_for(QK.pool, _items(x), out.size * kh * kw, x, out, kh, kw, sh, sw, ph, pw, is_max)
    return run


def build_qconcat(node: Node, ins: list[TensorInfo]):
    axis = int(node.params.get("axis", 1))
    factors = [F32.type(s) for s in node.attrs["scales"]] if "scales" in node.attrs else None
    s_out = F32.type(node.attrs["scale_out"].reshape(-1)[0]) if factors else None

    def run(inputs, outputs, workspace):
        out, at = outputs[0], 0
        ax = axis % out.ndim
        for i, a in enumerate(inputs):
            view = out[(slice(None),) * ax + (slice(at, at + a.shape[ax]),)]
            at += a.shape[ax]
            if factors is None:
                view[...] = a
            elif view.flags.c_contiguous:
                QK.requantize(a.reshape(-1), factors[i], s_out, view.reshape(-1))
            else:  # a strided slab: requantize row by row along the leading axes
                for idx in np.ndindex(*a.shape[:ax]):
                    QK.requantize(a[idx].reshape(-1), factors[i], s_out, view[idx].reshape(-1))
    return run


_ACTS, _FUSIONS = {None: 0, "relu": 1, "relu6": 2}, {None: 0, "add_then_act": 1, "act_then_add": 2}


def qconv_workspace(node: Node, ins: list[TensorInfo]) -> int:
    n, o, oh, ow = conv_geometry(node, ins[0].shape)[0]
    return n * o * oh * ow * 4  # the int32 sums


def build_qconv(node: Node, ins: list[TensorInfo]):
    w = np.ascontiguousarray(node.attrs["weight"], dtype=I8)
    o = w.shape[0]
    bias = np.ascontiguousarray(np.broadcast_to(np.asarray(node.attrs["bias"], np.int32).reshape(-1), (o,)))
    scale = np.ascontiguousarray(np.broadcast_to(np.asarray(node.attrs["scale"], F32).reshape(-1), (o,)))
    add_scale = np.ascontiguousarray(np.broadcast_to(
        np.asarray(node.attrs.get("add_scale", 0), F32).reshape(-1), (o,)))
    top = np.ascontiguousarray(np.broadcast_to(
        np.asarray(node.attrs.get("relu6_max", 127), np.int8).reshape(-1), (o,)))
    act, fusion = _ACTS[node.params.get("activation")], _FUSIONS[node.params.get("fusion")]
    w2 = w.reshape(o, -1)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        (n, _, oh, ow), (kh, kw), (sh, sw), (dh, dw), (t, l), g = conv_geometry(node, x.shape)
        pointwise = (kh, kw, sh, sw, t, l) == (1, 1, 1, 1, 0, 0)
        acc = _int32_scratch(workspace, node, n * o * oh * ow).reshape(n * o, oh * ow)
        work = n * o * oh * ow * w[0].size
        if pointwise:
            parallel_for(QK.pointwise_accumulate, n * o, work, _rows(x), w2, bias, acc, g)
        else:
            parallel_for(QK.conv_accumulate, n * o, work, x, w, bias, acc, oh, ow, sh, sw, dh, dw, t, l, g)
        z = _rows(inputs[1]) if fusion else _rows(out)
        parallel_for(QK.conv_epilogue, n * o, out.size, acc, scale, z, add_scale, top, act, fusion, _rows(out))
    return run


def _int32_scratch(workspace: np.ndarray | None, node: Node, count: int) -> np.ndarray:
    if workspace is None or workspace.nbytes < count * 4:
        raise KernelError(f"{node.where()}: {node.op_type} needs {count * 4} bytes of workspace")
    return workspace.reshape(-1).view(np.uint8)[:count * 4].view(np.int32)


register(
    OpDef("TnnQuantize", _same_shape(I8), quantize_reference, _scale_kernel(QK.quantize, "scale")),
    OpDef("TnnDequantize", _same_shape(F32), dequantize_reference, _scale_kernel(QK.dequantize, "scale")),
    OpDef("TnnQConv", qconv_infer, qconv_reference, build_qconv, workspace=qconv_workspace),
    OpDef("TnnQAdd", qadd_infer, qadd_reference, build_qadd),
    OpDef("TnnQPool", qpool_infer, qpool_reference, build_qpool),
    OpDef("TnnQConcat", qconcat_infer, qconcat_reference, build_qconcat),
    OpDef("TnnQRelu", _same_shape(I8), lambda node, arrays: [np.maximum(arrays[0], 0).astype(I8)]),
)

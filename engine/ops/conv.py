"""Conv and ConvTranspose (NCHW, 2-D): shape inference and the numpy references.

Semantics are torch's `F.conv2d` / `F.conv_transpose2d`, plus SPEC.md's fused epilogue
`y = act(conv(x) + bias + z)` with an optional residual input z.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.conv_geometry import NP_PAD, conv_geom, tconv_geom, weight_of
from engine.ops.epilogue import EPILOGUES, apply_activation
from engine.ops.registry import OpDef, TensorInfo, register


# -- inference --------------------------------------------------------------------------------------
def _check_act(node: Node) -> None:
    act = node.params.get("activation")
    if act is not None and act not in EPILOGUES:
        raise UnsupportedOpError(f"{node.op_type} with fused activation {act!r}", node.name, node.where())


def infer_conv(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    geo = conv_geom(node, ins[0].shape)
    _check_act(node)
    if len(ins) > 1 and tuple(ins[1].shape) != geo.out_shape:
        raise ShapeError(f"{node.where()}: Conv residual input has shape {tuple(ins[1].shape)}, "
                         f"the output is {geo.out_shape}")
    return [TensorInfo(geo.out_shape, ins[0].dtype)]


def infer_tconv(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    _check_act(node)
    return [TensorInfo(tconv_geom(node, ins[0].shape).out_shape, ins[0].dtype)]


# -- references -------------------------------------------------------------------------------------
def _with_bias(node: Node, acc: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """Bias and residual added in float64."""
    bias = node.attrs.get("bias")
    if bias is not None:
        acc += bias.astype(np.float64).reshape(1, -1, 1, 1)
    if extra is not None:
        acc += extra
    return acc


def _finish(node: Node, acc: np.ndarray, dtype) -> np.ndarray:
    """The activation in float64, then the output dtype."""
    apply_activation(node.params.get("activation"), node.params.get("activation_params"), acc)
    return acc.astype(dtype)


def conv_sums(node: Node, arrays: list[np.ndarray]) -> np.ndarray:
    """conv(x) + bias + z in float64, before the activation."""
    x = arrays[0]
    geo = conv_geom(node, x.shape)
    t, l, b, r = geo.pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)), mode=NP_PAD[geo.pad_mode])
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    span = ((geo.kh - 1) * dh + 1, (geo.kw - 1) * dw + 1)
    win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :geo.oh, :geo.ow]
    g = geo.groups
    win = win.reshape(geo.n, g, geo.c // g, geo.oh, geo.ow, geo.kh, geo.kw)
    wg = weight_of(node).astype(np.float64).reshape(g, geo.o // g, geo.c // g, geo.kh, geo.kw)
    acc = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(geo.out_shape)
    z = arrays[1].astype(np.float64) if len(arrays) > 1 else None
    return _with_bias(node, np.ascontiguousarray(acc), z)


def conv_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [_finish(node, conv_sums(node, arrays), arrays[0].dtype)]


def tconv_sums(node: Node, arrays: list[np.ndarray]) -> np.ndarray:
    """conv_transpose(x) + bias in float64, before the activation."""
    x = arrays[0]
    geo = tconv_geom(node, x.shape)
    (sh, sw), (dh, dw), g = geo.stride, geo.dilation, geo.groups
    t, l = geo.pads[0], geo.pads[1]
    # Full (uncropped) output: each input pixel scatters a kh x kw patch; output_padding only adds room.
    full_h = max((geo.h - 1) * sh + (geo.kh - 1) * dh + 1, t + geo.oh)
    full_w = max((geo.w - 1) * sw + (geo.kw - 1) * dw + 1, l + geo.ow)
    full = np.zeros((geo.n, g, geo.o // g, full_h, full_w))
    xg = x.astype(np.float64).reshape(geo.n, g, geo.c // g, geo.h, geo.w)
    wg = weight_of(node).astype(np.float64).reshape(g, geo.c // g, geo.o // g, geo.kh, geo.kw)
    for i in range(geo.kh):
        for j in range(geo.kw):
            rows = slice(i * dh, i * dh + (geo.h - 1) * sh + 1, sh)
            cols = slice(j * dw, j * dw + (geo.w - 1) * sw + 1, sw)
            full[:, :, :, rows, cols] += np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, i, j])
    acc = full.reshape(geo.n, geo.o, full_h, full_w)[:, :, t:t + geo.oh, l:l + geo.ow]
    return _with_bias(node, np.ascontiguousarray(acc))


def tconv_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [_finish(node, tconv_sums(node, arrays), arrays[0].dtype)]


register(OpDef("Conv", infer_conv, conv_reference, arity=(1, 2), float_inputs=(0, 1)),
         OpDef("ConvTranspose", infer_tconv, tconv_reference, arity=(1, 1), float_inputs=(0,)))

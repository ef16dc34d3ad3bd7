"""Volumetric (NCDHW) ops: `Conv3d` and `Pool3d`, shape inference and numpy references.

`Conv3d`: input x (N, C, D, H, W); attrs weight (O, C/groups, kd, kh, kw), [bias (O,)]; params stride (3),
dilation (3), pads (6: begin d, h, w then end d, h, w; zeros), groups. Output side = (X + pb + pe - dil·(k-1) - 1)
// s + 1 (torch's F.conv3d with explicit pads).
`Pool3d`: params mode `max`/`avg`, kernel (3), stride (3), pads (6, as Conv3d), ceil_mode. Output side =
floor-or-ceil((X + pb + pe - k) / s) + 1. Each window is clipped to the input: max over the input elements it
covers, average over their count (padding never counts: TNN's NaivePooling3D). A window that covers no input
element is refused at load (TNN's kernels give 0 for max, 0/0 for average there).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register


def _triple(node: Node, name: str, default: int) -> tuple[int, int, int]:
    v = node.params.get(name, default)
    v = (v,) * 3 if isinstance(v, int) else tuple(int(a) for a in v)
    if len(v) != 3:
        raise ShapeError(f"{node.where()}: {node.op_type} {name} {v} is not 3 values")
    return v  # type: ignore[return-value]


def _pads(node: Node) -> tuple[int, ...]:
    p = tuple(int(a) for a in node.params.get("pads", (0,) * 6))
    if len(p) != 6 or min(p) < 0:
        raise ShapeError(f"{node.where()}: {node.op_type} pads {p} are not 6 values >= 0")
    return p


def _check_x(node: Node, shape) -> tuple[int, ...]:
    if len(shape) != 5:
        raise ShapeError(f"{node.where()}: {node.op_type} takes an NCDHW input, got {tuple(shape)}")
    return tuple(int(d) for d in shape)


# -- Conv3d ---------------------------------------------------------------------------------------------------------
def conv_geometry(node: Node, shape) -> tuple:
    n, c, *space = _check_x(node, shape)
    w = node.attrs.get("weight")
    if w is None or np.ndim(w) != 5:
        raise ShapeError(f"{node.where()}: Conv3d needs a 5-D weight, got {None if w is None else np.shape(w)}")
    o, cg, *k = (int(d) for d in np.shape(w))
    g = int(node.params.get("groups", 1))
    if g <= 0 or c != cg * g or o % g:
        raise ShapeError(f"{node.where()}: Conv3d input has {c} channels, the weight {np.shape(w)} with {g} groups")
    bias = node.attrs.get("bias")
    if bias is not None and np.size(bias) != o:
        raise ShapeError(f"{node.where()}: Conv3d bias has {np.size(bias)} values for {o} output channels")
    stride, dil, pads = _triple(node, "stride", 1), _triple(node, "dilation", 1), _pads(node)
    if min(stride) <= 0 or min(dil) <= 0:
        raise ShapeError(f"{node.where()}: Conv3d stride {stride} / dilation {dil} must be positive")
    out = [(x + pads[a] + pads[a + 3] - dil[a] * (k[a] - 1) - 1) // stride[a] + 1 for a, x in enumerate(space)]
    if min(out) <= 0:
        raise ShapeError(f"{node.where()}: Conv3d input {tuple(shape)} is smaller than its kernel {tuple(k)}")
    return (n, o, *out), k, stride, dil, pads, g


def conv3d_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(conv_geometry(node, ins[0].shape)[0], ins[0].dtype)]


def conv3d_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    out_shape, k, stride, dil, pads, g = conv_geometry(node, x.shape)
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[a], pads[a + 3]) for a in range(3)])
    ext = [dil[a] * (k[a] - 1) + 1 for a in range(3)]
    win = sliding_window_view(xp, ext, axis=(2, 3, 4))  # (N, C, D', H', W', ed, eh, ew)
    win = win[:, :, ::stride[0], ::stride[1], ::stride[2], ::dil[0], ::dil[1], ::dil[2]]
    win = win[:, :, :out_shape[2], :out_shape[3], :out_shape[4]]
    w = np.asarray(node.attrs["weight"], np.float64)
    cg, og = x.shape[1] // g, w.shape[0] // g
    y = np.concatenate([np.einsum("ncdhwijk,ocijk->nodhw", win[:, j * cg:(j + 1) * cg], w[j * og:(j + 1) * og])
                        for j in range(g)], axis=1)
    bias = node.attrs.get("bias")
    if bias is not None:
        y = y + np.asarray(bias, np.float64).reshape(1, -1, 1, 1, 1)
    return [y.astype(x.dtype)]


# -- Pool3d ---------------------------------------------------------------------------------------------------------
def pool_geometry(node: Node, shape) -> tuple:
    n, c, *space = _check_x(node, shape)
    if node.params.get("mode") not in ("max", "avg"):
        raise ShapeError(f"{node.where()}: Pool3d mode {node.params.get('mode')!r} is not max or avg")
    k, stride, pads = _triple(node, "kernel", 1), _triple(node, "stride", 1), _pads(node)
    if min(k) <= 0 or min(stride) <= 0:
        raise ShapeError(f"{node.where()}: Pool3d kernel {k} / stride {stride} must be positive")
    try:
        out = pool3d_out(space, k, stride, pads, bool(node.params.get("ceil_mode")))
    except ValueError as e:
        raise ShapeError(f"{node.where()}: Pool3d {e}") from None
    return (n, c, *out), k, stride, pads


def pool3d_out(space, k, stride, pads, ceil: bool) -> list[int]:
    """Output sides; ValueError when the kernel exceeds the padded input or a window covers only padding."""
    out = []
    for a, x in enumerate(space):
        span = x + pads[a] + pads[a + 3] - k[a]
        if span < 0:
            raise ValueError(f"input side {x} (axis {a + 2}) is smaller than its kernel {k[a]}")
        o = (-(-span // stride[a]) if ceil else span // stride[a]) + 1
        # every window must cover an input element: it starts before the input's end and ends after its start
        if (o - 1) * stride[a] - pads[a] >= x or k[a] <= pads[a]:
            raise ValueError(f"windows on axis {a + 2} cover only padding (input {x}, kernel {k[a]}, pads "
                             f"{pads[a]}/{pads[a + 3]}, stride {stride[a]})")
        out.append(o)
    return out


def pool3d_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(pool_geometry(node, ins[0].shape)[0], ins[0].dtype)]


def pool3d_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    out_shape, k, stride, pads = pool_geometry(node, x.shape)
    y = np.empty(out_shape, np.float64)
    xf = x.astype(np.float64)
    for d in range(out_shape[2]):
        d0 = d * stride[0] - pads[0]
        for h in range(out_shape[3]):
            h0 = h * stride[1] - pads[1]
            for w in range(out_shape[4]):
                w0 = w * stride[2] - pads[2]
                part = xf[:, :, max(d0, 0):d0 + k[0], max(h0, 0):h0 + k[1], max(w0, 0):w0 + k[2]]
                y[:, :, d, h, w] = part.max(axis=(2, 3, 4)) if node.params["mode"] == "max" else \
                    part.mean(axis=(2, 3, 4))
    return [y.astype(x.dtype)]


register(OpDef("Conv3d", conv3d_infer, conv3d_reference, arity=(1, 1), float_inputs=(0,)))
register(OpDef("Pool3d", pool3d_infer, pool3d_reference, arity=(1, 1), float_inputs=(0,)))

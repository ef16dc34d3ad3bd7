"""Conv / ConvTranspose geometry at a concrete input shape: checks, auto_pad and output sizes (torch formulas)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.spatial import auto_pads, check_rank, out_size, pads4, pair

# Conv pad_mode -> np.pad mode.
NP_PAD = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@dataclass(frozen=True)
class ConvGeom:
    """Everything a conv needs at one concrete input shape."""
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]  # t, l, b, r
    groups: int
    oh: int
    ow: int
    pad_mode: str = "zeros"

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return self.n, self.o, self.oh, self.ow


def weight_of(node: Node) -> np.ndarray:
    w = node.attrs.get("weight")
    if w is None or w.ndim != 4:
        raise ShapeError(f"{node.where()}: {node.op_type} needs a 4-D 'weight' attr, got "
                         f"{None if w is None else w.shape}")
    return w


def _common(node: Node, x_shape) -> tuple:
    check_rank(node, x_shape, 4)
    groups = int(node.params.get("groups", 1) or 1)
    if groups <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} groups={groups} must be positive")
    return pair(node, "stride", 1), pair(node, "dilation", 1), groups


def _check_bias(node: Node, o: int) -> None:
    b = node.attrs.get("bias")
    if b is not None and b.size != o:
        raise ShapeError(f"{node.where()}: {node.op_type} bias has {b.size} values for {o} output channels")


def conv_geom(node: Node, x_shape) -> ConvGeom:
    stride, dil, g = _common(node, x_shape)
    n, c, h, w = (int(d) for d in x_shape)
    o, ipg, kh, kw = weight_of(node).shape
    if c != ipg * g:
        raise ShapeError(f"{node.where()}: Conv input has {c} channels but weight {weight_of(node).shape} "
                         f"with groups={g} expects {ipg * g}")
    if o % g:
        raise ShapeError(f"{node.where()}: Conv groups={g} does not divide {o} output channels")
    _check_bias(node, o)
    mode = node.params.get("pad_mode", "zeros") or "zeros"
    if mode not in NP_PAD:
        raise UnsupportedOpError(f"Conv pad_mode={mode!r} (supported: {sorted(NP_PAD)})", node.name, node.where())
    pads = auto_pads(node, (h, w), (kh, kw), stride, dil)
    oh = out_size(node, h, kh, stride[0], dil[0], pads[0], pads[2])
    ow = out_size(node, w, kw, stride[1], dil[1], pads[1], pads[3])
    if mode == "reflect" and max(pads) > 0 and (max(pads[0], pads[2]) >= h or max(pads[1], pads[3]) >= w):
        raise ShapeError(f"{node.where()}: Conv reflect padding {pads} needs pads smaller than the input {h}x{w}")
    return ConvGeom(n, c, h, w, o, kh, kw, stride, dil, pads, g, oh, ow, mode)


def tconv_geom(node: Node, x_shape) -> ConvGeom:
    stride, dil, g = _common(node, x_shape)
    n, c, h, w = (int(d) for d in x_shape)
    i_n, opg, kh, kw = weight_of(node).shape
    if c != i_n:
        raise ShapeError(f"{node.where()}: ConvTranspose input has {c} channels, weight expects {i_n}")
    if c % g:
        raise ShapeError(f"{node.where()}: ConvTranspose groups={g} does not divide {c} input channels")
    o = opg * g
    _check_bias(node, o)
    pads = pads4(node)
    oph, opw = pair(node, "output_padding", 0)
    if not (0 <= oph < max(stride[0], dil[0]) and 0 <= opw < max(stride[1], dil[1])):
        raise ShapeError(f"{node.where()}: ConvTranspose output_padding ({oph}, {opw}) must be smaller than "
                         f"stride {stride} or dilation {dil}")
    oh = (h - 1) * stride[0] - pads[0] - pads[2] + dil[0] * (kh - 1) + oph + 1
    ow = (w - 1) * stride[1] - pads[1] - pads[3] + dil[1] * (kw - 1) + opw + 1
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{node.where()}: ConvTranspose output size ({oh}, {ow}) is not positive")
    return ConvGeom(n, c, h, w, o, kh, kw, stride, dil, pads, g, oh, ow)

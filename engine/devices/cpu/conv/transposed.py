"""ConvTranspose on oneDNN's deconvolution, through onednn.py's plan (reorders at the edges, bias and activation
as post-ops, scratchpad in the workspace).

oneDNN's deconvolution weights are (O, I, kh, kw) per group, torch's (I, O/g, kh, kw): the weights keep torch's
memory and get an oneDNN descriptor with the matching strides. torch's output_padding widens the output at the
end, which oneDNN expresses as that much less end padding; a negative result keeps the numpy path.
"""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.conv.onednn import ConvSpec, build, workspace
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, tconv_geom
from engine.ops.registry import TensorInfo
from engine.ops.spatial import pair

DECONVOLUTION_DIRECT = 0xA


def _end_pads(node: Node, geo: ConvGeom) -> tuple[int, int]:
    oph, opw = pair(node, "output_padding", 0)
    return geo.pads[2] - oph, geo.pads[3] - opw


def supported(node: Node, ins: list[TensorInfo]) -> bool:
    """Whether oneDNN computes this ConvTranspose; the caller checks oneDNN is on."""
    if np.dtype(ins[0].dtype) != np.float32 or len(ins[0].shape) != 4:
        return False
    return min(_end_pads(node, tconv_geom(node, ins[0].shape))) >= 0


class DeconvSpec(ConvSpec):
    def __init__(self, node: Node, residual: bool = False):
        super().__init__(node, residual, tconv_geom)

    def w_plain(self, geo: ConvGeom) -> D.MemoryDesc:
        g, og, ig, kh, kw = geo.groups, geo.o // geo.groups, geo.c // geo.groups, geo.kh, geo.kw
        # torch's (g, I/g, O/g, kh, kw) memory seen as (g, O/g, I/g, kh, kw)
        strides = [ig * og * kh * kw, kh * kw, og * kh * kw, kw, 1]
        dims = [g, og, ig, kh, kw]
        if g == 1:
            dims, strides = dims[1:], strides[1:]
        return D.MemoryDesc.strided(dims, strides)

    def primitive_desc(self, geo: ConvGeom, x_md: D.MemoryDesc, w_md: D.MemoryDesc, b_md: D.MemoryDesc | None,
                       y_md: D.MemoryDesc, attr: D.Attr) -> D.PrimitiveDesc:
        return D.PrimitiveDesc.create(
            "dnnl_deconvolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
            DECONVOLUTION_DIRECT, x_md.h, w_md.h, None if b_md is None else b_md.h, y_md.h,
            L.dims(geo.stride), L.dims(d - 1 for d in geo.dilation), L.dims(geo.pads[:2]),
            L.dims(_end_pads(self.node, geo)), attr.h)


def tconv_workspace(node: Node, ins: list[TensorInfo]) -> int:
    return workspace(DeconvSpec(node, len(ins) > 1), ins)


def build_tconv(node: Node, ins: list[TensorInfo]) -> Kernel:
    return build(DeconvSpec(node, len(ins) > 1), ins)

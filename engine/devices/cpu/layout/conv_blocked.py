"""ConvBlocked: Conv on values in the blocked layout nChw{B}c (see blocked_ops.py), on either side or both.

Params and attrs are Conv's (SPEC.md) plus `src_blocked`, `dst_blocked` (bool) and `block`. Shapes are physical:
a blocked side is (N, ceil(C/B), H, W, B), a plain side NCHW; the residual z has the output's layout. The logical
input channel count is weight.shape[1] * groups. The reference unblocks, runs Conv's numpy reference and blocks
the result (padding lanes zero); the kernel is a oneDNN convolution in those layouts, or Winograd
(engine/devices/cpu/conv/blocked.py).
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.layout.blocked_ops import blocked_shape, to_blocked, to_plain
from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.conv import conv_reference
from engine.ops.conv_geometry import ConvGeom, conv_geom, weight_of
from engine.ops.epilogue import EPILOGUES
from engine.ops.registry import OpDef, TensorInfo


def block_of(node: Node) -> int:
    block = node.params.get("block")
    if not isinstance(block, int) or block <= 0:
        raise ShapeError(f"{node.where()}: ConvBlocked needs a positive int param block, got {block!r}")
    return block


def in_channels(node: Node) -> int:
    return int(weight_of(node).shape[1]) * int(node.params.get("groups", 1) or 1)


def logical_input(node: Node, shape) -> tuple[int, ...]:
    """NCHW shape of input 0 given its physical shape."""
    shape = tuple(int(d) for d in shape)
    if not node.params.get("src_blocked"):
        return shape
    block, c = block_of(node), in_channels(node)
    if len(shape) != 5 or shape[4] != block or shape[1] != -(-c // block):
        raise ShapeError(f"{node.where()}: ConvBlocked blocked input for {c} channels must be "
                         f"(N, {-(-c // block)}, H, W, {block}), got {shape}")
    return shape[0], c, shape[2], shape[3]


def geometry(node: Node, shape) -> ConvGeom:
    """The conv's geometry at physical input shape `shape`."""
    mode = node.params.get("pad_mode") or "zeros"
    if mode != "zeros":
        raise UnsupportedOpError(f"ConvBlocked with pad_mode={mode!r} (zeros only)", node.name, node.where())
    act = node.params.get("activation")
    if act is not None and act not in EPILOGUES:
        raise UnsupportedOpError(f"ConvBlocked with fused activation {act!r}", node.name, node.where())
    return conv_geom(node, logical_input(node, shape))


def output_shape(node: Node, geo: ConvGeom) -> tuple[int, ...]:
    return blocked_shape(geo.out_shape, block_of(node)) if node.params.get("dst_blocked") else geo.out_shape


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) not in (1, 2):
        raise ShapeError(f"{node.where()}: ConvBlocked takes x and an optional residual z, got {len(ins)} inputs")
    out = output_shape(node, geometry(node, ins[0].shape))
    if len(ins) > 1 and tuple(ins[1].shape) != out:
        raise ShapeError(f"{node.where()}: ConvBlocked residual input has shape {tuple(ins[1].shape)}, "
                         f"the output is {out}")
    return [TensorInfo(out, ins[0].dtype)]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    geometry(node, arrays[0].shape)
    x = to_plain(arrays[0], in_channels(node)) if node.params.get("src_blocked") else arrays[0]
    rest = list(arrays[1:])
    out_channels = int(weight_of(node).shape[0])
    if rest and node.params.get("dst_blocked"):
        rest = [to_plain(rest[0], out_channels)]
    y = conv_reference(node, [x, *rest])[0]
    return [to_blocked(y, block_of(node)) if node.params.get("dst_blocked") else y]


OPS = {"ConvBlocked": OpDef("ConvBlocked", _infer, reference)}

"""Blocked activation layout: `ToBlocked` and `ToPlain`, the reorders between NCHW and nChw{B}c, and
`GlobalPoolBlocked` (GlobalAvgPool / GlobalMaxPool over a blocked value, output (N, Cb, 1, 1, B)) and
`MaxPoolBlocked` (MaxPool's params; the lanes of a block pool like channels) and `BroadcastBlocked` (a binary
op with one operand (N, Cb, 1, 1, B): numpy's broadcast over B-lane rows is several times slower than this loop).

A blocked value's shape is its physical shape (N, ceil(C/B), H, W, B): channel c lives at [:, c // B, :, :, c % B].
Lanes past C (the last block's padding) are zero after ToBlocked; ops that keep a value blocked keep them finite
(see engine/ops/SPEC.md, "layout"). These ops are the CPU device's own (not in the shared registry): its layout
rewrite (rewrite.py) inserts them; their kernels are in kernels.py.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.pool import maxpool_reference, pool_geom
from engine.ops.registry import OpDef, TensorInfo


def blocked_shape(shape, block: int) -> tuple[int, ...]:
    """(N, C, H, W) -> (N, ceil(C/B), H, W, B)."""
    n, c, h, w = (int(d) for d in shape)
    return n, -(-c // block), h, w, block


def plain_shape(shape, channels: int) -> tuple[int, ...]:
    """(N, Cb, H, W, B) -> (N, channels, H, W)."""
    n, _, h, w, _ = (int(d) for d in shape)
    return n, int(channels), h, w


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """A new C-contiguous blocked copy of NCHW `x`, padding lanes zero."""
    n, c, h, w = x.shape
    cb = -(-c // block)
    padded = np.zeros((n, cb * block, h, w), x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def to_plain(x: np.ndarray, channels: int) -> np.ndarray:
    """A new C-contiguous NCHW copy of blocked `x` (padding lanes dropped)."""
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels])


def layout_params(node: Node) -> tuple[int, int]:
    block, channels = node.params.get("block"), node.params.get("channels")
    if not isinstance(block, int) or block <= 0 or not isinstance(channels, int) or channels <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} needs positive int params block and channels, "
                         f"got block={block!r} channels={channels!r}")
    return block, channels


def _infer_to_blocked(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    block, channels = layout_params(node)
    shape = tuple(ins[0].shape)
    if len(shape) != 4 or shape[1] != channels:
        raise ShapeError(f"{node.where()}: ToBlocked expects (N, {channels}, H, W), got {shape}")
    return [TensorInfo(blocked_shape(shape, block), ins[0].dtype)]


def _infer_to_plain(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    block, channels = layout_params(node)
    shape = tuple(ins[0].shape)
    if len(shape) != 5 or shape[4] != block or shape[1] != -(-channels // block):
        raise ShapeError(f"{node.where()}: ToPlain expects (N, {-(-channels // block)}, H, W, {block}) for "
                         f"{channels} channels, got {shape}")
    return [TensorInfo(plain_shape(shape, channels), ins[0].dtype)]


def _ref_to_blocked(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [to_blocked(np.asarray(arrays[0]), layout_params(node)[0])]


def _ref_to_plain(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [to_plain(np.asarray(arrays[0]), layout_params(node)[1])]


# -- global pooling on blocked values ------------------------------------------------------------------
def _infer_global(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    if len(shape) != 5 or node.params.get("mode") not in ("avg", "max"):
        raise ShapeError(f"{node.where()}: GlobalPoolBlocked expects (N, Cb, H, W, B) and mode avg or max, got "
                         f"{shape} and {node.params.get('mode')!r}")
    return [TensorInfo((shape[0], shape[1], 1, 1, shape[4]), ins[0].dtype)]


def global_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    if node.params.get("mode") == "max":
        return [x.max(axis=(2, 3), keepdims=True)]
    return [x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(x.dtype)]


# -- MaxPool on blocked values: the B lanes of a block are independent channels -----------------------
def lanes_as_channels(shape) -> tuple[int, ...]:
    if len(shape) != 5:
        raise ShapeError(f"blocked pooling expects (N, Cb, H, W, B), got {tuple(shape)}")
    n, cb, h, w, b = (int(d) for d in shape)
    return n, cb * b, h, w


def as_maxpool(node: Node) -> Node:
    """The MaxPool the node pools like (pool_geom and the reference read op_type: dilation is MaxPool's)."""
    return Node("MaxPool", node.name, params=node.params, source=node.source)


def _infer_maxpool(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    geo = pool_geom(as_maxpool(node), lanes_as_channels(shape))
    return [TensorInfo((shape[0], shape[1], geo.oh, geo.ow, shape[4]), ins[0].dtype)]


def maxpool_reference_blocked(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    n, cb, h, w, b = x.shape
    y = maxpool_reference(as_maxpool(node), [to_plain(x, cb * b)])[0]
    return [to_blocked(y, b)]


# -- a binary op with one operand (N, Cb, 1, 1, B) broadcast over H, W (squeeze-excite scales) -------------
BROADCAST_OPS = {"Add": (0, np.add), "Sub": (1, np.subtract), "Mul": (2, np.multiply),
                 "Maximum": (3, np.maximum), "Minimum": (4, np.minimum)}


def broadcast_operands(node: Node, shapes) -> bool:
    """Whether input 0 is the broadcast one; checks the shapes."""
    a, b = (tuple(s) for s in shapes)
    op = node.params.get("op")
    if op not in BROADCAST_OPS or len(a) != 5 or len(b) != 5:
        raise ShapeError(f"{node.where()}: BroadcastBlocked needs op in {sorted(BROADCAST_OPS)} and two blocked "
                         f"operands, got {op!r} with {a} and {b}")
    full, small = (b, a) if a[2:4] == (1, 1) and b[2:4] != (1, 1) else (a, b)
    if small[2:4] != (1, 1) or small[:2] + small[4:] != full[:2] + full[4:]:
        raise ShapeError(f"{node.where()}: BroadcastBlocked operands {a} and {b} are not (N, Cb, H, W, B) and "
                         f"(N, Cb, 1, 1, B)")
    return full is b


def _infer_broadcast(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    first = broadcast_operands(node, [i.shape for i in ins])
    return [TensorInfo(tuple(ins[1 if first else 0].shape), ins[0].dtype)]


def broadcast_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    broadcast_operands(node, [a.shape for a in arrays])
    return [BROADCAST_OPS[node.params["op"]][1](arrays[0], arrays[1])]


OPS = {d.op_type: d for d in (
    OpDef("BroadcastBlocked", _infer_broadcast, broadcast_reference, inplace=True),
    OpDef("MaxPoolBlocked", _infer_maxpool, maxpool_reference_blocked),
    OpDef("GlobalPoolBlocked", _infer_global, global_reference),
    OpDef("ToBlocked", _infer_to_blocked, _ref_to_blocked),
    OpDef("ToPlain", _infer_to_plain, _ref_to_plain),
)}

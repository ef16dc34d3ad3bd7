"""Blocked activation layout: `ToBlocked` and `ToPlain`, the reorders between NCHW and nChw{B}c, and
`GlobalPoolBlocked` (GlobalAvgPool / GlobalMaxPool over a blocked value, output (N, Cb, 1, 1, B)) and
`MaxPoolBlocked` (MaxPool's params; the lanes of a block pool like channels) and `BroadcastBlocked` (a binary
op with one operand (N, Cb, 1, 1, B): numpy's broadcast over B-lane rows is several times slower than this loop).

A blocked value's shape is its physical shape (N, ceil(C/B), H, W, B): channel c lives at [:, c // B, :, :, c % B].
Lanes past C (the last block's padding) are zero after ToBlocked; ops that keep a value blocked keep them finite
(see SPEC.md, "layout"). Kernels use oneDNN's reorder when the library is there, a numpy transpose-copy otherwise.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.layout import kernels as _layout_kernels
from engine.devices.cpu.layout.loops import broadcast_binary, global_pool, max_pool
from engine.devices.cpu.onednn import binary as _binary_onednn
from engine.devices.cpu.onednn import pool as _pool_onednn
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.pool import maxpool_reference, pool_geom
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import reference_kernel


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


def _params(node: Node) -> tuple[int, int]:
    block, channels = node.params.get("block"), node.params.get("channels")
    if not isinstance(block, int) or block <= 0 or not isinstance(channels, int) or channels <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} needs positive int params block and channels, "
                         f"got block={block!r} channels={channels!r}")
    return block, channels


def _infer_to_blocked(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    block, channels = _params(node)
    shape = tuple(ins[0].shape)
    if len(shape) != 4 or shape[1] != channels:
        raise ShapeError(f"{node.where()}: ToBlocked expects (N, {channels}, H, W), got {shape}")
    return [TensorInfo(blocked_shape(shape, block), ins[0].dtype)]


def _infer_to_plain(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    block, channels = _params(node)
    shape = tuple(ins[0].shape)
    if len(shape) != 5 or shape[4] != block or shape[1] != -(-channels // block):
        raise ShapeError(f"{node.where()}: ToPlain expects (N, {-(-channels // block)}, H, W, {block}) for "
                         f"{channels} channels, got {shape}")
    return [TensorInfo(plain_shape(shape, channels), ins[0].dtype)]


def _ref_to_blocked(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [to_blocked(np.asarray(arrays[0]), _params(node)[0])]


def _ref_to_plain(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [to_plain(np.asarray(arrays[0]), _params(node)[1])]


def _kernel_to_blocked(node: Node, ins: list[TensorInfo]):
    return _layout_kernels.build(True, _params(node)[0], np.dtype(ins[0].dtype))


def _kernel_to_plain(node: Node, ins: list[TensorInfo]):
    return _layout_kernels.build(False, _params(node)[0], np.dtype(ins[0].dtype))


# -- global pooling on blocked values ------------------------------------------------------------------
def _infer_global(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    if len(shape) != 5 or node.params.get("mode") not in ("avg", "max"):
        raise ShapeError(f"{node.where()}: GlobalPoolBlocked expects (N, Cb, H, W, B) and mode avg or max, got "
                         f"{shape} and {node.params.get('mode')!r}")
    return [TensorInfo((shape[0], shape[1], 1, 1, shape[4]), ins[0].dtype)]


def _ref_global(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    if node.params.get("mode") == "max":
        return [x.max(axis=(2, 3), keepdims=True)]
    return [x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(x.dtype)]


def _kernel_global(node: Node, ins: list[TensorInfo]):
    is_max = node.params.get("mode") == "max"
    if np.dtype(ins[0].dtype) != np.float32:
        return reference_kernel(node, _ref_global)
    global_pool(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.float32), is_max, 0, 1)  # compile now

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        n, cb, h, w, b = x.shape
        parallel_for(global_pool, n * cb, x.size, x.reshape(n * cb, h * w, b), outputs[0].reshape(n * cb, b),
                     is_max)
    if _layout_kernels.onednn_available():  # oneDNN's jit pooling, the window the whole plane: ~3x the loop
        pool = Node("MaxPool" if is_max else "AvgPool", node.name, source=node.source)

        def geom(_, shape):
            window = {"kernel": (shape[2], shape[3]), "stride": (1, 1), "pads": (0, 0, 0, 0)}
            return pool_geom(Node(pool.op_type, node.name, params=window), _lanes_as_channels(shape))
        return _pool_onednn.build(pool, ins, geom, run, int(ins[0].shape[4]))
    return run


# -- MaxPool on blocked values: the B lanes of a block are independent channels -----------------------
def _lanes_as_channels(shape) -> tuple[int, ...]:
    if len(shape) != 5:
        raise ShapeError(f"blocked pooling expects (N, Cb, H, W, B), got {tuple(shape)}")
    n, cb, h, w, b = (int(d) for d in shape)
    return n, cb * b, h, w


def _as_maxpool(node: Node) -> Node:
    """The MaxPool the node pools like (pool_geom and the reference read op_type: dilation is MaxPool's)."""
    return Node("MaxPool", node.name, params=node.params, source=node.source)


def _infer_maxpool(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    geo = pool_geom(_as_maxpool(node), _lanes_as_channels(shape))
    return [TensorInfo((shape[0], shape[1], geo.oh, geo.ow, shape[4]), ins[0].dtype)]


def _ref_maxpool(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    n, cb, h, w, b = x.shape
    y = maxpool_reference(_as_maxpool(node), [to_plain(x, cb * b)])[0]
    return [to_blocked(y, b)]


def _kernel_maxpool(node: Node, ins: list[TensorInfo]):
    if np.dtype(ins[0].dtype) != np.float32:
        return reference_kernel(node, _ref_maxpool)
    max_pool(np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32), 1, 1, 1, 1, 1, 1, 0, 0, 0, 1)
    plain = _as_maxpool(node)
    geoms: dict[tuple[int, ...], object] = {}  # per input shape, so a run computes no geometry

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        n, cb, h, w, b = x.shape
        g = geoms.get(x.shape)
        if g is None:
            g = geoms[x.shape] = pool_geom(plain, (n, cb * b, h, w))
        parallel_for(max_pool, n * cb, out.size * g.kernel[0] * g.kernel[1], x.reshape(n * cb, h, w, b),
                     out.reshape(n * cb, g.oh, g.ow, b), *g.kernel, *g.stride, *g.dilation, g.pads[0], g.pads[1])
    if _layout_kernels.onednn_available():  # oneDNN's jit pooling on nChw{B}c: 64ch@111 b1 0.57 -> 0.10 ms
        block = int(ins[0].shape[4])
        return _pool_onednn.build(plain, ins, lambda _, shape: pool_geom(plain, _lanes_as_channels(shape)), run,
                                  block)
    return run


# -- a binary op with one operand (N, Cb, 1, 1, B) broadcast over H, W (squeeze-excite scales) -------------
BROADCAST_OPS = {"Add": (0, np.add), "Sub": (1, np.subtract), "Mul": (2, np.multiply),
                 "Maximum": (3, np.maximum), "Minimum": (4, np.minimum)}


def _broadcast_operands(node: Node, shapes) -> bool:
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
    first = _broadcast_operands(node, [i.shape for i in ins])
    return [TensorInfo(tuple(ins[1 if first else 0].shape), ins[0].dtype)]


def _ref_broadcast(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    _broadcast_operands(node, [a.shape for a in arrays])
    return [BROADCAST_OPS[node.params["op"]][1](arrays[0], arrays[1])]


def _kernel_broadcast(node: Node, ins: list[TensorInfo]):
    if any(np.dtype(i.dtype) != np.float32 for i in ins):
        return reference_kernel(node, _ref_broadcast)
    code = BROADCAST_OPS[node.params["op"]][0]
    broadcast_binary(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.float32), np.zeros((1, 1, 1), np.float32),
                     code, False, 0, 1)

    def run(inputs, outputs, workspace):
        s_first = _broadcast_operands(node, (inputs[0].shape, inputs[1].shape))
        x, s = (inputs[1], inputs[0]) if s_first else (inputs[0], inputs[1])
        x, s = np.ascontiguousarray(x), np.ascontiguousarray(s)
        n, cb, h, w, b = x.shape
        parallel_for(broadcast_binary, n * cb, x.size, x.reshape(n * cb, h * w, b), s.reshape(n * cb, b),
                     outputs[0].reshape(n * cb, h * w, b), code, s_first)
    small_first = _broadcast_operands(node, [i.shape for i in ins])
    if _layout_kernels.onednn_available() and _binary_onednn.supported(node.params["op"], small_first):
        return _binary_onednn.build(node.params["op"], small_first, run)
    return run


register(
    OpDef("BroadcastBlocked", _infer_broadcast, _ref_broadcast, kernel=_kernel_broadcast, inplace=True),
    OpDef("MaxPoolBlocked", _infer_maxpool, _ref_maxpool, kernel=_kernel_maxpool),
    OpDef("GlobalPoolBlocked", _infer_global, _ref_global, kernel=_kernel_global),
    OpDef("ToBlocked", _infer_to_blocked, _ref_to_blocked, kernel=_kernel_to_blocked),
    OpDef("ToPlain", _infer_to_plain, _ref_to_plain, kernel=_kernel_to_plain),
)

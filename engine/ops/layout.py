"""Blocked activation layout: `ToBlocked` and `ToPlain`, the reorders between NCHW and nChw{B}c.

A blocked value's shape is its physical shape (N, ceil(C/B), H, W, B): channel c lives at [:, c // B, :, :, c % B].
Lanes past C (the last block's padding) are zero after ToBlocked; ops that keep a value blocked keep them finite
(see SPEC.md, "layout"). Kernels use oneDNN's reorder when the library is there, a numpy transpose-copy otherwise.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops import _layout_kernels
from engine.ops.registry import OpDef, TensorInfo, register


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


register(
    OpDef("ToBlocked", _infer_to_blocked, _ref_to_blocked, kernel=_kernel_to_blocked),
    OpDef("ToPlain", _infer_to_plain, _ref_to_plain, kernel=_kernel_to_plain),
)

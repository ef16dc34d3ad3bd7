"""Pad over any rank: pads in ONNX order [d0_begin, d1_begin, ..., d0_end, d1_end, ...], negative = crop.

Modes: constant (with `value`), reflect (mirror without the edge, torch/ONNX `reflect`), edge (torch
`replicate`), circular (wrap). As in torch, reflect pads must be smaller than the dimension and circular pads
at most the dimension.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "replicate": "edge", "circular": "circular",
          "wrap": "circular"}
_NP_MODE = {"constant": "constant", "reflect": "reflect", "edge": "edge", "circular": "wrap"}


def pad_mode(node: Node) -> str:
    mode = node.params.get("mode", "constant")
    if mode not in _MODES:
        raise UnsupportedOpError(f"Pad mode={mode!r} (supported: {sorted(_MODES)})", node.name, node.where())
    return _MODES[mode]


def pad_plan(node: Node, shape) -> tuple[list[int], list[int]]:
    """(begin, end) per dim, checked against `shape` and the mode's limits."""
    pads = [int(p) for p in node.params.get("pads", ())]
    rank = len(shape)
    if len(pads) != 2 * rank:
        raise ShapeError(f"{node.where()}: Pad has {len(pads)} pads for a rank-{rank} input {tuple(shape)} "
                         f"(ONNX order needs {2 * rank})")
    begin, end = pads[:rank], pads[rank:]
    mode = pad_mode(node)
    for d, (n, b, e) in enumerate(zip(shape, begin, end, strict=True)):
        kept = n + min(b, 0) + min(e, 0)
        if kept < 0 or n + b + e < 0:
            raise ShapeError(f"{node.where()}: Pad crops dim {d} of size {n} by ({b}, {e}): nothing is left")
        grow = max(b, e)
        if mode != "constant" and grow > 0 and (kept == 0 or (mode == "reflect" and grow >= kept)
                                                or (mode == "circular" and grow > kept)):
            raise ShapeError(f"{node.where()}: Pad {mode} pads ({b}, {e}) on dim {d} of size {kept} are too large")
    return begin, end


def infer_pad(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    begin, end = pad_plan(node, ins[0].shape)
    return [TensorInfo(tuple(n + b + e for n, b, e in zip(ins[0].shape, begin, end, strict=True)), ins[0].dtype)]


def crop(x: np.ndarray, begin: list[int], end: list[int]) -> np.ndarray:
    return x[tuple(slice(-min(b, 0), n + min(e, 0)) for n, b, e in zip(x.shape, begin, end, strict=True))]


def pad_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    begin, end = pad_plan(node, x.shape)
    src = crop(x, begin, end)
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    mode = pad_mode(node)
    if mode == "constant":
        return [np.pad(src, widths, constant_values=np.asarray(node.params.get("value", 0)).astype(x.dtype))]
    return [np.pad(src, widths, mode=_NP_MODE[mode])]


register(OpDef("Pad", infer_pad, pad_reference, arity=(1, 1)))

"""Shared parameter handling for the 2-D spatial ops (conv, pool): pairs, pads, auto_pad and output sizes.

Params follow engine/ops/SPEC.md: spatial pairs are (h, w), 2-D pads are (top, left, bottom, right). A scalar
is accepted wherever a pair is expected (torch writes `stride=2`), and a 2-long pads list means symmetric pads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node

AUTO_PADS = (None, "same_upper", "same_lower", "valid")


def pair(node: Node, key: str, default: int) -> tuple[int, int]:
    """params[key] as an (h, w) pair of ints."""
    v = node.params.get(key)
    if v is None:
        return default, default
    if isinstance(v, int | float):
        return int(v), int(v)
    v = [int(t) for t in v]
    if len(v) == 1:
        return v[0], v[0]
    if len(v) != 2:
        raise ShapeError(f"{node.where()}: {node.op_type} param {key}={v} is not an (h, w) pair")
    return v[0], v[1]


def pads4(node: Node) -> tuple[int, int, int, int]:
    """params['pads'] as (top, left, bottom, right)."""
    v = node.params.get("pads")
    if v is None:
        return 0, 0, 0, 0
    if isinstance(v, int | float):
        v = [int(v)] * 4
    v = [int(t) for t in v]
    if len(v) == 1:
        v = v * 4
    elif len(v) == 2:
        v = [v[0], v[1], v[0], v[1]]
    if len(v) != 4 or min(v) < 0:
        raise ShapeError(f"{node.where()}: {node.op_type} pads={v} must be 4 non-negative ints (t, l, b, r)")
    return v[0], v[1], v[2], v[3]


def auto_pads(node: Node, size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
              dilation: Sequence[int]) -> tuple[int, int, int, int]:
    """The (t, l, b, r) pads to use at this input size: explicit pads, or computed from `auto_pad`.

    same_upper/same_lower make out = ceil(in / stride), the odd pixel going at the end (upper) or the
    beginning (lower), as ONNX and TNN's pad_type 0 do; for stride 1 this is also torch's padding='same'.
    """
    mode = node.params.get("auto_pad")
    if mode in (None, "notset", "NOTSET"):
        return pads4(node)
    if mode not in AUTO_PADS:
        raise UnsupportedOpError(f"{node.op_type} auto_pad={mode!r} (supported: {AUTO_PADS})", node.name, node.where())
    if mode == "valid":
        return 0, 0, 0, 0
    begin, end = [], []
    for n, k, s, d in zip(size, kernel, stride, dilation, strict=True):
        out = -(-n // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "same_upper" else big)
        end.append(big if mode == "same_upper" else small)
    return begin[0], begin[1], end[0], end[1]


def out_size(node: Node, n: int, k: int, s: int, d: int, p0: int, p1: int, ceil_mode: bool = False) -> int:
    """torch's output length along one axis, with pooling's ceil_mode rule (last window must start inside)."""
    if s <= 0 or d <= 0 or k <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} kernel/stride/dilation must be positive "
                         f"(kernel {k}, stride {s}, dilation {d})")
    span = n + p0 + p1 - d * (k - 1) - 1
    out = (math.ceil(span / s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + p0:
        out -= 1
    if span < 0 or out <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} input size {n} with pads ({p0}, {p1}) is smaller "
                         f"than the kernel extent {d * (k - 1) + 1}")
    return out


def check_rank(node: Node, shape: Sequence[int], rank: int, what: str = "input") -> None:
    if len(shape) != rank:
        raise ShapeError(f"{node.where()}: {node.op_type} expects a rank-{rank} {what} (NCHW), got shape "
                         f"{tuple(shape)}")

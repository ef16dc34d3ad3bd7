"""pnnx's nn.Unfold / F.unfold (im2col: torch's sliding blocks) -> Pad, a Gather of every block's elements from
the flattened image, and Reshapes. Exact: each output element is one input element or a padding zero, read by a
constant index (no arithmetic). The index is fixed by H and W, so both must be known at load; the batch may vary.

torch: (N, C, H, W) -> (N, C·kh·kw, L), L = oh·ow; output channel c·kh·kw + i·kw + j at block l = y·ow + x holds
padded[n, c, y·sh + i·dh, x·sw + j·dw], with oh = (H + 2·ph - dh·(kh-1) - 1) // sh + 1 (ow alike).
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import pair

# At most this many entries the block index (a constant made at load) holds: 256 MiB of int64; a 3x3 unfold of a
# 512 x 512 map needs 2.4M. The sides come from the file, which may declare them 65536 or more.
MAX_INDEX = 1 << 25


def block_index(hp: int, wp: int, k: list[int], d: list[int], s: list[int]) -> tuple[np.ndarray, int]:
    """(kh·kw, L) positions in the flattened (Hp·Wp) padded image of each block element, and L."""
    oh, ow = (hp - d[0] * (k[0] - 1) - 1) // s[0] + 1, (wp - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"kernel {k} dilation {d} does not fit the padded {hp}x{wp} input")
    if k[0] * k[1] * oh * ow > MAX_INDEX:
        raise ValueError(f"{k[0] * k[1]} x {oh * ow} block elements, more than the {MAX_INDEX} a constant index "
                         "of them may hold")
    rows = (np.arange(k[0]) * d[0])[:, None, None, None] + (np.arange(oh) * s[0])[None, None, :, None]
    cols = (np.arange(k[1]) * d[1])[None, :, None, None] + (np.arange(ow) * s[1])[None, None, None, :]
    return (rows * wp + cols).reshape(k[0] * k[1], oh * ow).astype(np.int64), oh * ow


@handles("nn.Unfold", "F.unfold")
def unfold(ctx: Ctx) -> None:
    x = ctx.x()
    shape = x.shape
    if shape is None or len(shape) != 4:
        raise ctx.unsupported(f"input of shape {shape} (a batched (N, C, H, W) input only)")
    c, h, w = shape[1:]
    if not all(isinstance(v, int) and v >= 0 for v in (c, h, w)):
        raise ctx.unsupported(f"input sides C, H, W {tuple(shape[1:])} not known at load (the block index needs them)")
    k, d = pair(ctx.p("kernel_size")), pair(ctx.p("dilation"), 1)
    p, s = pair(ctx.p("padding"), 0), pair(ctx.p("stride"), 1)
    if min(k + d + s) <= 0 or min(p) < 0:
        raise ctx.fail(f"kernel_size {k}, dilation {d}, padding {p}, stride {s}")
    try:
        index, blocks = block_index(h + 2 * p[0], w + 2 * p[1], k, d, s)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    if any(p):
        (x,) = ctx.emit("Pad", [x], {"pads": [0, 0, p[0], p[1], 0, 0, p[0], p[1]], "mode": "constant", "value": 0.0})
    (flat,) = ctx.emit("Reshape", [x], {"shape": [0, c, -1]})
    (picked,) = ctx.emit("Gather", [flat, ctx.const(index)], {"axis": 2})  # (N, C, kh·kw, L)
    ctx.become("Reshape", {"shape": [0, c * k[0] * k[1], blocks]}, inputs=[picked])

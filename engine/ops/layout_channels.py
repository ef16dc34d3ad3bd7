"""RegroupBlocked: outputs whose channels are copies of input channels, on blocked values.

The blocked twin of Concat and Split on axis 1 and of ChannelShuffle, and of chains of them (the layout pass
composes a Concat -> ChannelShuffle -> Split into one node, so each element is copied once), for channel counts
that do not fall on whole blocks (ShuffleNetV2's 58 / 116 / 232): without it every shuffle unit reorders to NCHW
and back and its 1x1 convs run on plain sides. Shapes are physical (N, ceil(C/B), H, W, B).

Params: `block`; `channels`, the inputs' logical channel counts; `sources`, per output the list of
[input index, input channel] each of its channels copies. Padding lanes of every output are written zero.
`concat_sources` / `split_sources` / `shuffle_sources` give the lists for the plain ops.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.layout.loops import copy_lanes, zero_lanes
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.layout import to_blocked, to_plain
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import reference_kernel

Sources = list[list[tuple[int, int]]]


def concat_sources(channels: list[int]) -> Sources:
    return [[(i, c) for i, n in enumerate(channels) for c in range(n)]]


def split_sources(sizes: list[int]) -> Sources:
    starts = np.cumsum([0] + list(sizes[:-1]))
    return [[(0, int(s) + c) for c in range(n)] for s, n in zip(starts, sizes, strict=True)]


def shuffle_sources(channels: int, groups: int) -> Sources:
    per = channels // groups  # out channel j * groups + i is input channel i * per + j (torch's channel_shuffle)
    return [[(0, (o % groups) * per + o // groups) for o in range(channels)]]


def _params(node: Node) -> tuple[int, list[int], Sources]:
    block, chans, sources = node.params.get("block"), node.params.get("channels"), node.params.get("sources")
    if not isinstance(block, int) or block <= 0 or not isinstance(chans, (list, tuple)) or not chans:
        raise ShapeError(f"{node.where()}: RegroupBlocked needs int param block and a list of channels, got "
                         f"block={block!r} channels={chans!r}")
    if not isinstance(sources, (list, tuple)) or not sources or not all(sources):
        raise ShapeError(f"{node.where()}: RegroupBlocked needs a non-empty source list per output")
    srcs = [[(int(i), int(c)) for i, c in out] for out in sources]
    for out in srcs:
        for i, c in out:
            if not (0 <= i < len(chans) and 0 <= c < chans[i]):
                raise ShapeError(f"{node.where()}: RegroupBlocked source channel {c} of input {i} is out of range "
                                 f"(inputs have {list(chans)} channels)")
    return block, [int(c) for c in chans], srcs


def _physical(shape, c: int, block: int) -> tuple[int, ...]:
    return shape[0], -(-c // block), shape[2], shape[3], block


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    block, chans, sources = _params(node)
    if len(ins) != len(chans):
        raise ShapeError(f"{node.where()}: RegroupBlocked has {len(chans)} channel counts for {len(ins)} inputs")
    first = tuple(ins[0].shape)
    if len(first) != 5:
        raise ShapeError(f"{node.where()}: RegroupBlocked inputs must be (N, Cb, H, W, B), got {first}")
    for info, c in zip(ins, chans, strict=True):
        if tuple(info.shape) != _physical(first, c, block):
            raise ShapeError(f"{node.where()}: RegroupBlocked input for {c} channels must be "
                             f"{_physical(first, c, block)}, got {tuple(info.shape)}")
    return [TensorInfo(_physical(first, len(out), block), ins[0].dtype) for out in sources]


def _reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    block, chans, sources = _params(node)
    plain = [to_plain(np.asarray(a), c) for a, c in zip(arrays, chans, strict=True)]
    return [to_blocked(np.stack([plain[i][:, c] for i, c in out], axis=1), block) for out in sources]


class _Copy:
    """One (output, input) pair's lane map for copy_lanes, in flat offsets of one image's input."""

    def __init__(self, chans: list[tuple[int, int]], i: int, block: int, hw: int):
        dst_blocks = -(-len(chans) // block)
        self.count = np.zeros(dst_blocks, np.int64)
        self.dst_lane = np.zeros((dst_blocks, block), np.int64)
        self.src_off = np.zeros((dst_blocks, block), np.int64)
        self.aligned = np.full(dst_blocks, -1, np.int64)
        for k, (j, c) in enumerate(chans):
            if j != i:
                continue
            db, lane = divmod(k, block)
            sb, sl = divmod(c, block)
            n = self.count[db]
            self.dst_lane[db, n], self.src_off[db, n] = lane, sb * hw * block + sl
            self.count[db] += 1
        for db in range(dst_blocks):
            lanes, offs = self.dst_lane[db], self.src_off[db]
            if self.count[db] == block and (lanes == np.arange(block)).all() and (np.diff(offs) == 1).all() \
                    and offs[0] % block == 0:
                self.aligned[db] = offs[0]


def _kernel(node: Node, ins: list[TensorInfo]):
    if any(np.dtype(i.dtype) != np.float32 for i in ins):
        return reference_kernel(node, _reference)
    block, chans, sources = _params(node)
    z, k = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1), np.int64)
    copy_lanes(z.reshape(1, 1), z, k[0], k, k, k[0], 0, 0)  # compile at build
    zero_lanes(z, 1, 0, 0)
    plans: dict[tuple, list] = {}  # per H*W: the copies of each output (offsets depend on the plane size)

    def plan(hw: int) -> list:
        if hw not in plans:
            plans[hw] = [[(i, _Copy(out, i, block, hw)) for i in sorted({i for i, _ in out})] for out in sources]
        return plans[hw]

    def run(inputs, outputs, workspace):
        n, _, h, w, b = inputs[0].shape
        for out, chans_out, copies in zip(outputs, sources, plan(h * w), strict=True):
            dst = out.reshape(n, out.shape[1], h * w, b)
            if len(chans_out) % b:
                zero_lanes(dst, len(chans_out) % b, 0, n)
            for i, c in copies:
                x = inputs[i]
                parallel_for(copy_lanes, n * dst.shape[1], dst.size, x.reshape(n, -1), dst, c.count, c.dst_lane,
                             c.src_off, c.aligned)
    return run


register(OpDef("RegroupBlocked", _infer, _reference, kernel=_kernel))

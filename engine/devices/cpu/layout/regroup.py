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

from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo

Sources = list[list[tuple[int, int]]]


def concat_sources(channels: list[int]) -> Sources:
    return [[(i, c) for i, n in enumerate(channels) for c in range(n)]]


def split_sources(sizes: list[int]) -> Sources:
    starts = np.cumsum([0] + list(sizes[:-1]))
    return [[(0, int(s) + c) for c in range(n)] for s, n in zip(starts, sizes, strict=True)]


def shuffle_sources(channels: int, groups: int) -> Sources:
    per = channels // groups  # out channel j * groups + i is input channel i * per + j (torch's channel_shuffle)
    return [[(0, (o % groups) * per + o // groups) for o in range(channels)]]


def regroup_params(node: Node) -> tuple[int, list[int], Sources]:
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
    block, chans, sources = regroup_params(node)
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


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    block, chans, sources = regroup_params(node)
    plain = [to_plain(np.asarray(a), c) for a, c in zip(arrays, chans, strict=True)]
    return [to_blocked(np.stack([plain[i][:, c] for i, c in out], axis=1), block) for out in sources]


OPS = {"RegroupBlocked": OpDef("RegroupBlocked", _infer, reference)}

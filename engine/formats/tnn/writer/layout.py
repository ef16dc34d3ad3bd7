"""Writer rules for ops that move, cut or join data: Reshape, Flatten, Squeeze, Unsqueeze, Transpose (Permute),
Identity, ChannelShuffle, PixelShuffle, Concat, Stack (Unsqueeze + Concat), Split (SplitV), Slice
(StridedSliceV2)."""

from __future__ import annotations

from engine.formats.tnn.writer.core import Writer, io_names, single_layer
from engine.formats.tnn.writer.registry import register, writes
from engine.ir import Node

INT_MAX = 2**31 - 1


def _reshape(w: Writer, x: str, y: str, shape: list[int], name: str | None = None) -> None:
    w.layer("Reshape", [x], [y], [0, len(shape), len(shape), *shape, 0], name=name)


@writes("Reshape")
def reshape(w: Writer, node: Node) -> None:
    shape = node.params.get("shape")
    if len(node.inputs) > 1:
        known = w.const_of(node.inputs[1])
        if known is None:
            w.unsupported("with a run-time shape")
        shape = [int(s) for s in known.reshape(-1)]
    x, y = io_names(w, node)
    _reshape(w, x, y, [int(s) for s in shape])


def _static_reshape(w: Writer, node: Node) -> None:
    """Any layout-only op by its static output shape; leading dims shared with the input are copied (0)."""
    src, dst = w.shape(node.inputs[0]), list(w.shape(node.outputs[0]))
    same = 0
    while same < min(len(src), len(dst)) and src[same] == dst[same]:
        same += 1
    x, y = io_names(w, node)
    _reshape(w, x, y, [0] * same + dst[same:])


@writes("Flatten")
def flatten(w: Writer, node: Node) -> None:
    rank = len(w.shape(node.inputs[0]))
    start, end = int(node.params.get("start_dim", 1)) % max(rank, 1), int(node.params.get("end_dim", -1)) % max(rank, 1)
    if start == 1 and end == rank - 1:
        x, y = io_names(w, node)
        return w.layer("Flatten", [x], [y], [1])
    _static_reshape(w, node)


def _axes(w: Writer, node: Node, rank: int) -> list[int]:
    axes = node.params.get("axes")
    if axes is None:
        return [k for k, d in enumerate(w.shape(node.inputs[0])) if d == 1]
    return sorted(int(a) % rank for a in ([axes] if isinstance(axes, int) else axes))


@writes("Squeeze")
def squeeze(w: Writer, node: Node) -> None:
    axes = _axes(w, node, len(w.shape(node.inputs[0])))
    x, y = io_names(w, node)
    w.layer("Squeeze", [x], [y], [len(axes), *axes])


@writes("Unsqueeze")
def unsqueeze(w: Writer, node: Node) -> None:
    axes = _axes(w, node, len(w.shape(node.outputs[0])))
    x, y = io_names(w, node)
    w.layer("Unsqueeze", [x], [y], [len(axes), *axes])


@writes("Transpose")
def transpose(w: Writer, node: Node) -> None:
    perm = [int(p) for p in node.params["perm"]]
    x, y = io_names(w, node)
    w.layer("Permute", [x], [y], [len(perm), *perm])


@writes("Identity")
def identity(w: Writer, node: Node) -> None:
    if node.outputs[0] in w.graph.outputs:  # outputs keep their own names: copy through a no-op reshape
        x, y = io_names(w, node)
        return _reshape(w, x, y, [0] * len(w.shape(node.inputs[0])))
    w.alias(node.outputs[0], node.inputs[0])


@writes("Concat")
def concat(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.outputs[0]))
    w.layer("Concat", [w.name(v) for v in node.inputs], [w.name(node.outputs[0])], [axis])


@writes("Stack")
def stack(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.outputs[0]))
    parts = []
    for k, v in enumerate(node.inputs):
        parts.append(w.tmp(f"unsqueeze{k}"))
        w.layer("Unsqueeze", [w.name(v)], [parts[-1]], [1, axis], name=f"{node.name}/unsqueeze")
    w.layer("Concat", parts, [w.name(node.outputs[0])], [axis])


@writes("Split")
def split(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.inputs[0]))
    sizes = [w.shape(v)[axis] for v in node.outputs]
    w.layer("SplitV", [w.name(node.inputs[0])], [w.name(v) for v in node.outputs], [axis, len(sizes), *sizes])


@writes("Slice")
def slice_(w: Writer, node: Node) -> None:
    if len(node.inputs) > 1:  # bounds computed at run time: StridedSliceV2 would need them as listed inputs
        w.unsupported("with bounds computed at run time")
    starts, ends = [int(s) for s in node.params["starts"]], [min(int(e), INT_MAX) for e in node.params["ends"]]
    axes = [int(a) for a in node.params.get("axes") or range(len(starts))]
    steps = [int(s) for s in node.params.get("steps") or [1] * len(starts)]
    x, y = io_names(w, node)
    w.layer("StridedSliceV2", [x], [y], [len(starts), *starts, len(ends), *ends, len(axes), *axes,
                                         len(steps), *steps])


register({
    "ChannelShuffle": lambda w, n: single_layer(w, n, "ShuffleChannel", [int(n.params["groups"])]),
    "PixelShuffle": lambda w, n: single_layer(w, n, "PixelShuffle", [int(n.params["upscale"])]),
})

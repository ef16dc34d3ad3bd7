"""merge_reorders: a reorder between the blocked and plain layouts next to a Transpose, with a reshape between
them, becomes one Transpose between views (passes/merge_transposes.py's composition): EfficientFormer's attention
reads v as ToPlain -> Reshape -> Transpose and writes its output as Transpose -> Reshape -> ToBlocked, two copies
each, one after this.

With every channel in a whole block (C a multiple of B: no padding lanes), ToPlain is a transpose of the blocked
tensor (N, Cb, H, W, B) -> (N, Cb, B, H, W) seen as (N, C, H, W), and ToBlocked the reverse. Chains
ToPlain/Transpose -> reshape -> Transpose/ToBlocked with at least one reorder, static shapes, every intermediate
read once by the next node and not a graph output, are rewritten in place (run on the layout rewrite's copy,
where the reorders were made); anything else stays.
"""

from __future__ import annotations

from engine.devices.cpu.layout.blocked_ops import layout_params
from engine.ir import Graph, Node
from engine.ops.shape import transpose_perm
from engine.passes.graph_edit import is_static, single_consumer
from engine.passes.merge_transposes import RESHAPES, compose, rewrite_chain

_TO_NCBHW = [0, 1, 4, 2, 3]  # (N, Cb, H, W, B) -> (N, Cb, B, H, W): ToPlain before its reshape
_FROM_NCBHW = [0, 1, 3, 4, 2]  # (N, Cb, B, H, W) -> (N, Cb, H, W, B): ToBlocked after its reshape


def merge_reorders(graph: Graph) -> Graph:
    for node in list(graph.nodes):
        if node.op_type in ("ToPlain", "Transpose") and node in graph.nodes:
            _merge(graph, node)
    return graph


def _whole_blocks(node: Node) -> bool:
    block, channels = layout_params(node)
    return channels % block == 0


def _merge(graph: Graph, first: Node) -> None:
    mid = single_consumer(graph, first.outputs[0])
    if mid is None or mid.op_type not in RESHAPES or mid.inputs[0] is not first.outputs[0] or len(mid.outputs) != 1:
        return
    second = single_consumer(graph, mid.outputs[0])
    if second is None or second.op_type not in ("ToBlocked", "Transpose") or len(first.inputs) != 1:
        return
    if "Transpose" == first.op_type == second.op_type or len(second.inputs) != 1:
        return  # no reorder: merge_transposes' case, already done in the pipeline
    x, y2, y3 = first.inputs[0], mid.outputs[0], second.outputs[0]
    if not all(is_static(v.shape) for v in (x, first.outputs[0], y2, y3)):
        return
    if first.op_type == "ToPlain":
        if not _whole_blocks(first) or len(x.shape) != 5:
            return
        p1 = _TO_NCBHW
    else:
        p1 = transpose_perm(first, len(x.shape))
    if second.op_type == "ToBlocked":
        if not _whole_blocks(second) or len(y2.shape) != 4:
            return
        n, c, h, w = y2.shape
        block = layout_params(second)[0]
        mid_shape, p2 = (n, c // block, block, h, w), _FROM_NCBHW
    else:
        mid_shape, p2 = tuple(y2.shape), transpose_perm(second, len(y2.shape))
    plan = compose(tuple(x.shape), list(p1), tuple(mid_shape), list(p2))
    if plan is not None:
        rewrite_chain(first, mid, second, *plan)

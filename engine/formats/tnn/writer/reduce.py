"""Writer rules for reductions (ReduceMean, ..., ReduceLogSumExp) and Softmax / LogSoftmax."""

from __future__ import annotations

from engine.formats.tnn.writer.core import Writer, io_names
from engine.formats.tnn.writer.registry import Rule, register
from engine.ir import Node


def reduce(ltype: str) -> Rule:
    def run(w: Writer, node: Node) -> None:
        rank = len(w.shape(node.inputs[0]))
        axes = node.params.get("axes")
        axes = list(range(rank)) if axes is None or len(axes) == 0 else sorted(int(a) % rank for a in axes)
        x, y = io_names(w, node)
        w.layer(ltype, [x], [y], [int(bool(node.params.get("keepdims", False))), *axes])
    return run


def softmax(ltype: str) -> Rule:
    def run(w: Writer, node: Node) -> None:
        x, y = io_names(w, node)
        w.layer(ltype, [x], [y], [int(node.params.get("axis", -1)) % len(w.shape(node.inputs[0]))])
    return run


register({
    "Softmax": softmax("SoftmaxCaffe"), "LogSoftmax": softmax("LogSoftmax"),
    **{op: reduce(op) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                 "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
})

"""TNN reductions and softmax -> Reduce* (ReduceMean, ..., ReduceLogSumExp), ArgMax / ArgMin (ArgMaxOrMin),
Softmax (Softmax, SoftmaxCaffe) and LogSoftmax."""

from __future__ import annotations

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import Handler, handles, register


def _reduce(op: str) -> Handler:
    def run(c: Ctx) -> None:
        axes = [c.i(k) for k in range(1, len(c.args))]
        c.out(op, [c.inputs[0]], {"axes": axes or None, "keepdims": bool(c.i(0, 1))})
    return run


@handles("ArgMaxOrMin")
def lower_argmax(c: Ctx) -> None:
    op = "ArgMax" if c.i(0, 1) == 1 else "ArgMin"
    c.out(op, [c.inputs[0]], {"axis": c.i(1, 0), "keepdims": bool(c.i(2, 1))})


def _axis_op(op: str, default: int = 1) -> Handler:
    return lambda c: c.out(op, list(c.inputs), {"axis": c.i(0, default)})


register({
    "Softmax": _axis_op("Softmax"), "SoftmaxCaffe": _axis_op("Softmax"), "LogSoftmax": _axis_op("LogSoftmax"),
    **{t: _reduce(t) for t in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                               "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
})

"""TNN reductions and softmax -> Reduce* (ReduceMean, ..., ReduceLogSumExp), ArgMax / ArgMin (ArgMaxOrMin),
TopK, Softmax (Softmax, SoftmaxCaffe) and LogSoftmax."""

from __future__ import annotations

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import Handler, handles, register


def _reduce(op: str) -> Handler:
    def run(c: Ctx) -> None:
        axes = [c.i(k) for k in range(1, len(c.args))]
        c.out(op, [c.inputs[0]], {"axes": axes or None, "keepdims": bool(c.i(0, 1))})
    return run


@handles("TopK")
def lower_topk(c: Ctx) -> None:
    # params axis (-1), largest (1), sorted (1), k (-1); TNN takes min(k, dim) and answers int32 indices
    # (cpu_topk_layer_acc.cc). Unsorted output may come in any order: sorted is one of them.
    if len(c.inputs) != 1 or len(c.outputs) != 2:
        c.fail(f"takes one input and gives (values, indices), has {len(c.inputs)} and {len(c.outputs)}")
    axis, largest, k = c.i(0, -1), c.i(1, 1), c.i(3, -1)
    c.i(2, 1)
    if k <= 0:
        c.fail(f"k={k}; TNN's TopK needs k > 0")
    shape = c.shape(c.inputs[0])
    if shape is not None and -len(shape) <= axis < len(shape):
        k = min(k, shape[axis])
    values, indices = c.outputs
    (index64,) = c.emit("TopK", [c.inputs[0]], {"k": k, "axis": axis, "largest": bool(largest), "sorted": True},
                        outputs=[values, c.graph.value(f"{c.node.name}/indices")])[1:]
    c.emit("Cast", [index64], {"to": "int32"}, outputs=[indices])


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

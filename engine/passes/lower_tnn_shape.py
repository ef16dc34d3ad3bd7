"""TNN element-wise, linear, layout and tensor layers -> canonical ops (used by `engine.passes.lower_tnn`)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn_types import INPUT_DTYPES
from engine.passes.lower_tnn import Ctx, Handler

F32 = np.float32
INT_MAX = 2**31 - 1


# -- element-wise with a stored constant ------------------------------------------------------------------------
def place_element(n: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Where a v1 constant of n elements (no dims stored) goes against an input of `shape`, as TNN reads it."""
    rank = len(shape)
    if n == 1:
        return ()
    if rank >= 2 and n == shape[1]:  # TNN's per-channel constant
        return (1, n) + (1,) * (rank - 2)
    if n == int(np.prod(shape)):
        return tuple(shape)
    if rank >= 3 and n == int(np.prod(shape[2:])):
        return (1, 1) + tuple(shape[2:])
    if rank and n == shape[-1]:
        return (n,)
    return None


def _element_const(c: Ctx, element: np.ndarray, x) -> np.ndarray:
    """The stored constant operand, shaped to broadcast the way TNN does."""
    dims = c.node.params.get("resource_dims", {}).get("element")
    if element.size == 1:
        return element.reshape(())
    if dims:  # v2 stores the ONNX dims: numpy broadcasting applies as is
        return element.reshape(dims)
    shape = c.shape(x)
    if shape is None:
        c.fail(f"cannot place a {element.size}-element constant without knowing the input shape")
    placed = place_element(element.size, shape)
    if placed is None:
        c.fail(f"a {element.size}-element constant does not broadcast against input shape {shape}")
    return element.reshape(placed)


def _operands(c: Ctx) -> list:
    ins = list(c.inputs)
    element = c.node.attrs.get("element")
    if element is not None and element.size and len(ins) == 1:
        data = _element_const(c, element, ins[0])
        if data.dtype.kind == "f":
            data = data.astype(F32)
        k = c.i(0, 1)
        const = c.const(data, "element")
        ins = [const, ins[0]] if k == 0 else [ins[0], const]
    if len(ins) < 2:
        c.fail("needs two operands: a second input or a stored constant")
    return ins


def _binary(op: str) -> Handler:
    def run(c: Ctx) -> None:
        ins = _operands(c)
        acc = ins[0]
        for v in ins[1:-1]:  # TNN folds more than two listed inputs left to right
            acc = c.tmp(op, [acc, v])
        c.out(op, [acc, ins[-1]])
    return run


def lower_squared_difference(c: Ctx) -> None:
    d = c.tmp("Sub", _operands(c))
    c.out("Mul", [d, d])


# -- linear ------------------------------------------------------------------------------------------------------
def lower_inner_product(c: Ctx) -> None:
    n, has_bias, transpose, axis = c.i(0), c.i(1, 0), c.i(2, 0), c.i(3, 1)
    w = c.attr("weight")
    if w.size % max(n, 1):
        c.fail(f"weight has {w.size} values, not a multiple of num_output {n}")
    w = w.reshape(n, -1) if not transpose else w.reshape(-1, n).T
    attrs = {"weight": np.ascontiguousarray(w, dtype=F32)}
    bias = c.attr("bias", required=False)
    if has_bias and bias is not None and bias.size:
        attrs["bias"] = np.ascontiguousarray(bias.reshape(n), dtype=F32)
    shape = c.shape(c.inputs[0])
    x = c.inputs[0]
    if shape is None or len(shape) != axis + 1:
        x = c.tmp("Flatten", [x], {"start_dim": axis, "end_dim": -1})
    if shape is None or len(shape) <= axis + 1:
        return c.out("Gemm", [x], {}, attrs)
    # TNN keeps the rank: the dims after `axis` become 1
    y = c.tmp("Gemm", [x], {}, attrs)
    c.out("Reshape", [y], {"shape": [0] * axis + [n] + [1] * (len(shape) - axis - 1)})


def lower_matmul(c: Ctx) -> None:
    ins = list(c.inputs)
    if len(ins) == 1:
        w, pos = c.attr("weight"), c.i(0, 1)
        if not c.node.params.get("resource_dims", {}).get("weight"):  # v1: only the count is stored
            shape = c.shape(ins[0])
            if shape is None or len(shape) < 2:
                c.fail("cannot shape a v1 MatMul weight without the input shape")
            w = w.reshape(shape[-1], -1) if pos == 1 else w.reshape(-1, shape[-2])
        const = c.const(np.ascontiguousarray(w, dtype=F32), "weight")
        ins = [const, ins[0]] if pos == 0 else [ins[0], const]
    c.out("MatMul", ins[:2])


# -- layout ------------------------------------------------------------------------------------------------------
def lower_reshape(c: Ctx) -> None:
    axis, num_axes = c.i(0, 0), c.i(1, -1)
    shape, after = c.counted(2)
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[1])
        if known is None:
            return c.out("Reshape", [c.inputs[0], c.inputs[1]])
        shape = [int(s) for s in np.asarray(known).reshape(-1)]
    elif axis != 0 or num_axes not in (-1, len(shape)):
        c.unsupported(f"of axes {axis}..{axis + num_axes}")
    if c.i(after, 0) == 1:
        return _reshape_nhwc(c, shape)
    c.out("Reshape", [c.inputs[0]], {"shape": shape})


def _reshape_nhwc(c: Ctx, shape: list[int]) -> None:
    """reshape_type 1: TNN reshapes in NHWC order, i.e. between an NCHW->NHWC and an NHWC->NCHW permute."""
    src = c.shape(c.inputs[0])
    if src is None or len(src) != 4:
        c.unsupported("with reshape_type 1 on a non 4-D input")
    dims = [src[k] if d == 0 else d for k, d in enumerate(shape)]
    if -1 in dims:
        dims[dims.index(-1)] = int(np.prod(src)) // max(-int(np.prod(dims)), 1)
    nhwc = c.tmp("Transpose", [c.inputs[0]], {"perm": [0, 2, 3, 1]})
    if len(dims) != 4:
        return c.out("Reshape", [nhwc], {"shape": dims})
    y = c.tmp("Reshape", [nhwc], {"shape": [dims[0], dims[2], dims[3], dims[1]]})
    c.out("Transpose", [y], {"perm": [0, 3, 1, 2]})


def lower_flatten(c: Ctx) -> None:
    axis = c.i(0, 1)
    x = c.inputs[0]
    if axis <= 0:  # TNN flattens to 2-D: prod(dims[:axis]) x prod(dims[axis:])
        return c.out("Reshape", [x], {"shape": [1, -1]})
    if axis > 1:
        x = c.tmp("Flatten", [x], {"start_dim": 0, "end_dim": axis - 1})
    c.out("Flatten", [x], {"start_dim": 1, "end_dim": -1})


def lower_permute(c: Ctx) -> None:
    order, _ = c.counted(0)
    shape = c.shape(c.inputs[0])
    rank = len(shape) if shape is not None else len(order)
    # fewer orders than dims: the remaining dims stay where they are
    c.out("Transpose", [c.inputs[0]], {"perm": list(order) + list(range(len(order), rank))})


def lower_splitv(c: Ctx) -> None:
    axis = c.i(0, 1)
    sizes, _ = c.counted(1)
    params = {"axis": axis, "sizes": sizes or None}
    if sizes and len(sizes) != len(c.outputs):
        c.fail(f"{len(sizes)} slice sizes for {len(c.outputs)} outputs")
    c.emit("Split", [c.inputs[0]], params, outputs=list(c.outputs))


def lower_split(c: Ctx) -> None:
    for v in c.outputs:  # Caffe's Split copies its input to every output
        c.emit("Identity", [c.inputs[0]], outputs=[v])


def lower_strided_slice(c: Ctx) -> None:
    begins, k = c.counted(0)
    ends, k = c.counted(k)
    strides, _ = c.counted(k)
    if not len(begins) == len(ends) == len(strides):
        c.fail("begins, ends and strides differ in length")
    ends = [INT_MAX if e == 0 else e for e in ends]  # an end of 0 means "to the end"
    c.out("Slice", [c.inputs[0]], {"starts": begins, "ends": ends, "axes": list(range(len(begins))),
                                   "steps": strides})


def lower_strided_slice_v2(c: Ctx) -> None:
    begins, k = c.counted(0)
    ends, k = c.counted(k)
    axes, k = c.counted(k)
    strides, _ = c.counted(k)
    if len(c.inputs) > 1:
        c.unsupported("with slice bounds from inputs")
    c.out("Slice", [c.inputs[0]], {"starts": begins, "ends": ends, "axes": axes,
                                   "steps": strides or [1] * len(axes)})


PAD_MODES = {0: "constant", 1: "reflect", 2: "edge"}


def lower_pad(c: Ctx) -> None:
    t, b, l, r, cb, ce = (c.i(k) for k in range(2, 8))
    mode = PAD_MODES.get(c.i(8, 0)) or c.unsupported(f"mode {c.i(8, 0)}")
    pads = [0, cb, t, l, 0, ce, b, r]
    shape = c.shape(c.inputs[0])
    if shape is not None and len(shape) == 5:
        pads = [0, cb, 0, t, l, 0, ce, 0, b, r]
    c.out("Pad", [c.inputs[0]], {"pads": pads, "mode": mode, "value": c.f(9, 0.0)})


def lower_padv2(c: Ctx) -> None:
    rank = c.i(0)
    pads = [c.i(1 + k) for k in range(2 * rank)]
    mode = PAD_MODES.get(c.i(1 + 2 * rank, 0)) or c.unsupported(f"mode {c.i(1 + 2 * rank, 0)}")
    c.out("Pad", [c.inputs[0]], {"pads": pads, "mode": mode, "value": c.f(2 + 2 * rank, 0.0)})


def lower_upsample(c: Ctx) -> None:
    mode = {1: "nearest", 2: "bilinear", 3: "bicubic"}.get(c.i(0)) or c.unsupported(f"mode {c.i(0)}")
    sh, sw, align = c.f(1, 0.0), c.f(2, 0.0), c.i(3, 0)
    oh, ow = c.i(4, 0), c.i(5, 0)
    params = {"mode": mode, "align_corners": bool(align), "coordinate": "tnn"}
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[-1])
        if known is None:
            c.unsupported("with a run-time size input")
        oh, ow = (int(v) for v in np.asarray(known).reshape(-1)[-2:])
    if oh > 0 and ow > 0:
        params["size"] = (oh, ow)
    elif sh > 0 and sw > 0:
        params["scale"] = (sh, sw)
    else:
        c.fail("neither an output size nor scales")
    c.out("Resize", [c.inputs[0]], params)


# -- tensors -----------------------------------------------------------------------------------------------------
def lower_gather(c: Ctx) -> None:
    axis, data_res, idx_res = c.i(0, 0), c.i(1, 0), c.i(2, 0)
    ins = list(c.inputs)
    data = c.const(c.attr("data"), "data") if data_res else ins.pop(0)
    indices = c.const(c.attr("indices").astype(np.int64), "indices") if idx_res else ins.pop(0)
    c.out("Gather", [data, indices], {"axis": axis})


def lower_const(c: Ctx) -> None:
    data = c.attr("weight")
    dims, _ = c.counted(0) if c.args else ([], 0)
    if dims and int(np.prod(dims)) == data.size:
        data = data.reshape(dims)
    c.alias(c.const(data, "value"))


def lower_constant_of_shape(c: Ctx) -> None:
    value = c.attr("value").reshape(-1)[:1].reshape(())
    c.out("Expand", [c.const(value, "value"), c.inputs[0]])


def lower_cast(c: Ctx) -> None:
    code = c.i(0)
    if code not in INPUT_DTYPES:
        c.unsupported(f"to data type {code}")
    c.out("Cast", [c.inputs[0]], {"to": INPUT_DTYPES[code].name})


def lower_expand(c: Ctx) -> None:
    if len(c.inputs) > 1:
        return c.out("Expand", c.inputs[:2])
    shape, _ = c.counted(0)
    c.out("Expand", [c.inputs[0]], {"shape": shape})


def _reduce(op: str) -> Handler:
    def run(c: Ctx) -> None:
        axes = [c.i(k) for k in range(1, len(c.args))]
        c.out(op, [c.inputs[0]], {"axes": axes or None, "keepdims": bool(c.i(0, 1))})
    return run


def lower_argmax(c: Ctx) -> None:
    op = "ArgMax" if c.i(0, 1) == 1 else "ArgMin"
    c.out(op, [c.inputs[0]], {"axis": c.i(1, 0), "keepdims": bool(c.i(2, 1))})


def _axes_op(op: str) -> Handler:
    return lambda c: c.out(op, [c.inputs[0]], {"axes": c.counted(0)[0] or None})


def _axis_op(op: str, default: int = 1) -> Handler:
    return lambda c: c.out(op, list(c.inputs), {"axis": c.i(0, default)})


SHAPE_HANDLERS: dict[str, Handler] = {
    **{t: _binary(op) for t, op in (("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div"),
                                    ("Maximum", "Maximum"), ("Minimum", "Minimum"), ("Pow", "Pow"),
                                    ("And", "And"), ("Or", "Or"), ("Xor", "Xor"), ("Equal", "Equal"),
                                    ("Greater", "Greater"), ("Less", "Less"))},
    "SquaredDifference": lower_squared_difference,
    "InnerProduct": lower_inner_product, "MatMul": lower_matmul,
    "Concat": _axis_op("Concat"), "Softmax": _axis_op("Softmax"), "SoftmaxCaffe": _axis_op("Softmax"),
    "LogSoftmax": _axis_op("LogSoftmax"),
    "Reshape": lower_reshape, "Flatten": lower_flatten, "Permute": lower_permute,
    "ShuffleChannel": lambda c: c.out("ChannelShuffle", [c.inputs[0]], {"groups": c.i(0, 1)}),
    "PixelShuffle": lambda c: c.out("PixelShuffle", [c.inputs[0]], {"upscale": c.i(0)}),
    "SplitV": lower_splitv, "Split": lower_split,
    "StridedSlice": lower_strided_slice, "StridedSliceV2": lower_strided_slice_v2,
    "Pad": lower_pad, "PadV2": lower_padv2, "Upsample": lower_upsample,
    "Gather": lower_gather, "Const": lower_const, "ConstantOfShape": lower_constant_of_shape,
    "Cast": lower_cast, "Expand": lower_expand,
    "Squeeze": _axes_op("Squeeze"), "Unsqueeze": _axes_op("Unsqueeze"),
    "Shape": lambda c: c.out("Shape", [c.inputs[0]], {"start": 0, "end": None}),
    "Tile": lambda c: c.out("Tile", [c.inputs[0]], {"repeats": [c.i(k) for k in range(len(c.args))]}),
    "ArgMaxOrMin": lower_argmax,
    **{t: _reduce(t) for t in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                               "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
}

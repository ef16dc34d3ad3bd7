"""TNN layers that make, cast, index or repeat tensors -> Gather, constants (Const, ConstantOfShape), Cast, Expand,
Shape, Size, Tile, Range, OneHot (Equal against the classes)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.constants import INPUT_DTYPES
from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles, register


@handles("Gather")
def lower_gather(c: Ctx) -> None:
    axis, data_res, idx_res = c.i(0, 0), c.i(1, 0), c.i(2, 0)
    ins = list(c.inputs)
    data = c.const(c.weight("data"), "data") if data_res else ins.pop(0)
    indices = c.const(c.attr("indices").astype(np.int64), "indices") if idx_res else ins.pop(0)
    c.out("Gather", [data, indices], {"axis": axis})


@handles("Const")
def lower_const(c: Ctx) -> None:
    data = c.attr("weight")
    dims, _ = c.counted(0) if c.args else ([], 0)
    if dims and int(np.prod(dims)) == data.size:
        data = data.reshape(dims)
    c.alias(c.const(data, "value"))


@handles("ConstantOfShape")
def lower_constant_of_shape(c: Ctx) -> None:
    value = c.attr("value").reshape(-1)[:1].reshape(())
    c.out("Expand", [c.const(value, "value"), c.inputs[0]])


@handles("Cast")
def lower_cast(c: Ctx) -> None:
    code = c.i(0)
    if code not in INPUT_DTYPES:
        c.unsupported(f"to data type {code}")
    c.out("Cast", [c.inputs[0]], {"to": INPUT_DTYPES[code].name})


@handles("Expand")
def lower_expand(c: Ctx) -> None:
    if len(c.inputs) > 1:
        return c.out("Expand", c.inputs[:2])
    shape, _ = c.counted(0)
    c.out("Expand", [c.inputs[0]], {"shape": shape})


@handles("Size")
def lower_size(c: Ctx) -> None:
    # the element count as a 1-element int32 tensor (size_layer.cc), known before running like Shape
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    count = c.tmp("ReduceProd", [c.tmp("Shape", [c.inputs[0]], {"start": 0, "end": None})],
                  {"axes": [0], "keepdims": True})
    c.out("Cast", [count], {"to": "int32"})


register({
    "Shape": lambda c: c.out("Shape", [c.inputs[0]], {"start": 0, "end": None}),
    "Tile": lambda c: c.out("Tile", [c.inputs[0]], {"repeats": [c.i(k) for k in range(len(c.args))]}),
})


@handles("Range")
def lower_range(c: Ctx) -> None:
    """Inputs (start, limit, delta), no params. TNN sizes the output at load from constant inputs (RangeLayer) or
    at run time from the inputs' data (CpuRagneLayerAcc): the engine needs them known at load, and of one type,
    float32 or int32 (TNN takes its type from whichever constant it read last)."""
    if len(c.inputs) != 3:
        c.fail(f"takes (start, limit, delta), got {len(c.inputs)} inputs")
    known = [c.value_of(v) for v in c.inputs]
    if any(k is None for k in known):
        c.unsupported("with bounds computed at run time (its output's size would only be known then, and unlike "
                      "NonZero's no upper bound for it is known at load to plan its memory with)")
    arrays = [np.asarray(k) for k in known]
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1 or dtypes - {np.dtype(np.float32), np.dtype(np.int32)} or any(a.size != 1 for a in arrays):
        c.unsupported(f"of {', '.join(f'{a.dtype} {a.shape}' for a in arrays)} (takes three float32 or three "
                      "int32 scalars)")
    start, limit, delta = (a.reshape(()).item() for a in arrays)
    if delta == 0:
        c.fail("delta is 0")
    # TNN's int32 count is ceil() of an integer division, i.e. truncated: one element short of ONNX's Range
    # whenever delta does not divide limit - start.
    if arrays[0].dtype.kind == "i" and (limit - start) % delta and limit != start:
        c.unsupported(f"int32 ({start}, {limit}, {delta}): TNN's count truncates (limit - start) / delta where "
                      "ONNX's rounds it up")
    if arrays[0].dtype.kind == "f":
        f32 = np.float32
        tnn_count = max(int(np.ceil((f32(limit) - f32(start)) / f32(delta))), 0)  # DimsFunctionUtils::Range
        if tnn_count != max(int(np.ceil((limit - start) / delta)), 0):
            c.unsupported(f"({start}, {limit}, {delta}): TNN's float32 count differs from the exact one")
    c.out("Range", list(c.inputs), {"dtype": arrays[0].dtype.name})


# At most this many classes a OneHot's constant of class numbers holds (a language model's vocabulary has ~250k): a
# file's depth of 2**31 would be an 8-16 GiB constant at load.
MAX_ONE_HOT_DEPTH = 1 << 24


@handles("OneHot")
def lower_one_hot(c: Ctx) -> None:
    """Params axis (-1), depth (-1), value_off (0), value_on (1); inputs indices[, depth[, values]] (ONNX's).
    TNN's OneHotLayer takes the depth from a constant input 1, and never reads a values input (its code reads
    input 1 again): a values input is accepted only when known at load and equal to the params. Output: int32
    with fewer than 3 inputs, else the values' type. Negative indices count from the end and out-of-range ones
    give an all-off row, as in ONNX (TNN writes them outside the output)."""
    axis, depth, off, on = c.i(0, -1), c.i(1, -1), c.f(2, 0.0), c.f(3, 1.0)
    idx = c.inputs[0]
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[1])
        if known is not None and np.asarray(known).size == 1:
            depth = int(np.asarray(known).reshape(()))
    if depth <= 0:
        c.unsupported(f"with depth {depth} (a depth must be a param or a constant input)")
    if depth > MAX_ONE_HOT_DEPTH:  # its classes are a constant made at load
        c.fail(f"depth {depth}, more than {MAX_ONE_HOT_DEPTH} classes")
    dtype = np.dtype(np.int32)
    if len(c.inputs) > 2:
        values = c.value_of(c.inputs[2])
        if values is None or np.asarray(values).size != 2 or list(np.asarray(values).reshape(-1)) != [off, on]:
            c.unsupported(f"with a values input {values} other than the params ({off}, {on}) (TNN ignores it)")
        dtype = np.asarray(values).dtype
    shape = c.shape(idx)
    if shape is None:
        c.unsupported("of an input of unknown rank")
    rank = len(shape)
    if not -rank - 1 <= axis <= rank:
        c.fail(f"axis {axis} out of range for a rank-{rank} input")
    axis = axis + rank + 1 if axis < 0 else axis
    idx_dtype = c.low.info(idx).dtype
    if np.dtype(idx_dtype).kind not in "iu":
        c.fail(f"indices must be integers, got {np.dtype(idx_dtype)}")
    depth_c = c.const(np.asarray(depth, idx_dtype), "depth")
    wrapped = c.tmp("Where", [c.tmp("Less", [idx, c.const(np.asarray(0, idx_dtype), "zero")]),
                              c.tmp("Add", [idx, depth_c]), idx])
    classes = c.const(np.arange(depth, dtype=idx_dtype).reshape((depth,) + (1,) * (rank - axis)), "classes")
    hot = c.tmp("Equal", [c.tmp("Unsqueeze", [wrapped], {"axes": [axis]}), classes])
    c.out("Where", [hot, c.const(np.asarray(on, dtype), "on"), c.const(np.asarray(off, dtype), "off")])

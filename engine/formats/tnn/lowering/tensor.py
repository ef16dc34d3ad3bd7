"""TNN layers that make, cast, index or repeat tensors -> Gather, constants (Const, ConstantOfShape), Cast, Expand,
Shape, Size, Tile."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.constants import INPUT_DTYPES
from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles, register


@handles("Gather")
def lower_gather(c: Ctx) -> None:
    axis, data_res, idx_res = c.i(0, 0), c.i(1, 0), c.i(2, 0)
    ins = list(c.inputs)
    data = c.const(c.attr("data"), "data") if data_res else ins.pop(0)
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

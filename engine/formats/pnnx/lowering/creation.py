"""pnnx ops that make tensors from numbers and shapes -> Range / Full: torch.arange, torch.zeros / ones / full /
empty and their `_like` and `Tensor.new_*` forms. pnnx folds them into pnnx.Attribute constants when the shape is
static, so they reach the file with sizes computed from an input's shape (`$size` from an Expression, `$end`
from `size(@0,1)`).

dtype=None follows torch: arange is int64 unless a bound is a float; zeros / ones / empty are float32; full takes
its fill value's kind; the `_like` and `new_*` forms take their input's dtype. `layout`, `device`, `pin_memory`,
`requires_grad` and `memory_format` say where and how torch keeps the tensor, not what it holds: ignored.
`empty` is zeros (its contents are unspecified in torch).
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.indexing import known
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list, dtype_param
from engine.ir import Value


def _scalar_kind(value) -> str:
    return "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "float32"


@handles("torch.arange")
def arange(ctx: Ctx) -> None:
    bounds: list[Value] = []
    floats = False
    for name, default in (("start", 0), ("end", None), ("step", 1)):
        v = ctx.arg(name)
        if v is not None and not known(v):
            bounds.append(v)  # shape arithmetic, known at infer time
            floats |= v.dtype is not None and np.dtype(v.dtype).kind == "f"
            continue
        value = ctx.literal(v, name) if v is not None else ctx.p(name, default)
        if value is None:
            raise ctx.fail(f"has no {name}")
        floats |= isinstance(value, float)
        bounds.append(ctx.const(np.array(value, np.float64 if isinstance(value, float) else np.int64)))
    ctx.become("Range", {"dtype": dtype_param(ctx, "float32" if floats else "int64")}, inputs=bounds)


def _shape_input(ctx: Ctx) -> list[Value]:
    """The `$size` operand (a shape list computed at run time), else the `size` param as a constant."""
    size = ctx.arg("size")
    if size is not None:
        return [size]
    shape = axes_list(ctx.p("size"))
    if shape is None:
        raise ctx.fail("has neither a $size input nor a size param")
    return [ctx.const(np.array(shape, np.int64))]


def _fill_value(ctx: Ctx) -> object:
    if ctx.type.endswith(("zeros", "zeros_like", "empty", "empty_like")):
        return 0
    if ctx.type.endswith(("ones", "ones_like")):
        return 1
    if not ctx.has("fill_value"):
        raise ctx.fail("has no fill_value")
    return ctx.p("fill_value")


@handles("torch.zeros", "torch.ones", "torch.full", "torch.empty")
def full(ctx: Ctx) -> None:
    value = _fill_value(ctx)
    dtype = dtype_param(ctx, _scalar_kind(value) if ctx.type == "torch.full" else "float32")
    ctx.become("Full", {"value": value, "dtype": dtype}, inputs=_shape_input(ctx))


@handles("torch.zeros_like", "torch.ones_like", "torch.full_like", "torch.empty_like")
def full_like(ctx: Ctx) -> None:
    x = ctx.x()
    (shape,) = ctx.emit("Shape", [x])
    dtype = dtype_param(ctx, None if x.dtype is None else str(x.dtype))
    ctx.become("Full", {"value": _fill_value(ctx), "dtype": dtype}, inputs=[shape])


@handles("Tensor.new_zeros", "Tensor.new_ones", "Tensor.new_full", "Tensor.new_empty")
def new_full(ctx: Ctx) -> None:
    x = ctx.x()
    dtype = dtype_param(ctx, None if x.dtype is None else str(x.dtype))
    ctx.folded.append(x)  # only its dtype matters
    ctx.become("Full", {"value": _fill_value(ctx), "dtype": dtype}, inputs=_shape_input(ctx))


# c10::ScalarType codes: how a traced aten op's `dtype` argument reaches the file (`expr=6`)
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                7: "float64", 11: "bool"}


@handles("aten::new_full")
def aten_new_full(ctx: Ctx) -> None:
    # aten::new_full(self, size, fill_value, dtype, layout, device, pin_memory), all positional (pnnx keeps the
    # traced op where the size is computed at run time); the last four are literals
    if len(ctx.node.inputs) != 7:
        raise ctx.fail(f"has {len(ctx.node.inputs)} inputs; aten::new_full takes 7")
    x, size, fill, dtype, layout, device, pin = ctx.node.inputs
    value = ctx.literal(fill, "fill_value")
    if not isinstance(value, (bool, int, float)):
        raise ctx.unsupported(f"fill_value={value!r}")
    code = ctx.literal(dtype, "dtype")
    if isinstance(code, bool):
        raise ctx.unsupported(f"dtype={code!r}")
    if code is None and x.dtype is None:
        raise ctx.unsupported("dtype=None and an input of unknown dtype")
    if code is not None and code not in SCALAR_TYPES:
        raise ctx.unsupported(f"dtype={code!r} (a c10::ScalarType code the engine has no dtype for)")
    for what, v, ok in (("layout", layout, (None, 0)), ("device", device, (None, "cpu")),
                        ("pin_memory", pin, (None, False))):
        given = ctx.literal(v, what)  # where torch keeps the tensor (strided, on the CPU), never what it holds
        if not any(given is o or (type(given) is type(o) and given == o) for o in ok):
            raise ctx.unsupported(f"{what}={given!r}")
    ctx.folded.append(x)  # only its dtype matters
    out_dtype = str(x.dtype) if code is None else SCALAR_TYPES[code]
    ctx.become("Full", {"value": value, "dtype": out_dtype}, inputs=[size])

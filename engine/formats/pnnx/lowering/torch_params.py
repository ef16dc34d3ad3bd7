"""Torch's param spellings on pnnx ops, read as canonical params: (h, w) pairs, symmetric pads, axis lists, and
weights passed as constant inputs (F.conv2d, F.linear, ...)."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx

TORCH_DTYPES = {"torch.float": "float32", "torch.float32": "float32", "torch.float16": "float16",
                "torch.half": "float16", "torch.float64": "float64", "torch.double": "float64", "torch.int": "int32",
                "torch.int32": "int32", "torch.long": "int64", "torch.int64": "int64", "torch.bool": "bool",
                "torch.uint8": "uint8", "torch.int8": "int8"}


def dtype_param(ctx: Ctx, like: str | None = None) -> str:
    """The numpy name of the op's `dtype` param; when it is None (torch's default), `like` (the dtype torch
    takes from an operand), else the dtype the file annotates the output with."""
    dtype = ctx.p("dtype")
    if dtype is not None:
        if dtype not in TORCH_DTYPES:
            raise ctx.unsupported(f"dtype={dtype}")
        return TORCH_DTYPES[dtype]
    if like is not None:
        return like
    out = ctx.node.outputs[0]
    if out.dtype is None:
        raise ctx.unsupported("dtype=None and no annotated output dtype to take it from")
    return str(out.dtype)


def pair(v, default: int = 0) -> list[int]:
    if v is None or v == []:
        return [default, default]
    if isinstance(v, (int, float)):
        return [int(v), int(v)]
    v = [int(x) for x in v]
    return v * 2 if len(v) == 1 else v[-2:]


def symmetric_pads(padding) -> list[int]:
    ph, pw = pair(padding)
    return [ph, pw, ph, pw]


def axes_list(v) -> list[int] | None:
    if v is None:
        return None
    return [int(v)] if isinstance(v, int) else [int(a) for a in v]


def const_input(ctx: Ctx, name: str, position: int | None):
    """A weight passed as an input (F.conv2d, F.linear, ...): only constant ones can be lowered."""
    v = ctx.arg(name, position)
    if v is None:
        return None
    return ctx.const_array(v, f"{name} input")

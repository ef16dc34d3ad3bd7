"""Torch's param spellings on pnnx ops, read as canonical params: (h, w) pairs, symmetric pads, axis lists, and
weights passed as constant inputs (F.conv2d, F.linear, ...)."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx


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
    if not v.is_const:
        raise ctx.unsupported(f"a run-time {name} input")
    return np.asarray(v.const, np.float32)

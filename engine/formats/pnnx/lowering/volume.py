"""pnnx volumetric (NCDHW) convolutions and poolings -> Conv3d / Pool3d (engine/ops/volume.py), or a global mean /
max over (D, H, W) for the adaptive pools of video classifiers' heads.

What Pool3d computes is TNN's NaivePooling3D: a window clipped to the input, the max or the average over the
elements inside it. That is torch's max_pool3d (its padding is -inf) and torch's avg_pool3d wherever padding never
enters a divisor: no padding, or count_include_pad=False. Anything else (dilated or index-returning max pools,
count_include_pad with padding, divisor_override, a padding mode other than zeros, an adaptive size that is not
an exact tiling) is refused at load naming the line: the canonical ops cannot say it.
"""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.convolution import conv_weights
from engine.formats.pnnx.lowering.registry import handles
from engine.ops.volume import pool3d_out


def _triple(ctx: Ctx, name: str, default: int) -> list[int]:
    v = ctx.p(name, default)
    if v == []:
        v = default
    v = [int(v)] * 3 if isinstance(v, (int, float)) else [int(a) for a in v]
    if len(v) == 1:
        v = v * 3
    if len(v) != 3:
        raise ctx.fail(f"{name} {v} is not 3 values")
    return v


def _space(ctx: Ctx) -> list[int] | None:
    """(D, H, W) of the data input where the file gives them (a dynamic export leaves them unknown)."""
    shape = ctx.x().shape
    if shape is not None and len(shape) != 5:
        raise ctx.fail(f"takes an NCDHW input, got {len(shape)}-D {tuple(shape)}")
    if shape is None or any(not isinstance(d, int) or d < 0 for d in shape[2:]):
        return None
    return [int(d) for d in shape[2:]]


@handles("nn.Conv3d", "F.conv3d")
def conv3d(ctx: Ctx) -> None:
    w, b = conv_weights(ctx, 5)
    mode = ctx.p("padding_mode", "zeros")
    if mode != "zeros":
        raise ctx.unsupported(f"padding_mode {mode!r} on a 3-D convolution (zeros only)")
    dilation, padding = _triple(ctx, "dilation", 1), ctx.p("padding", 0)
    k = [int(d) for d in w.shape[2:]]
    if padding == "same":  # torch: d*(k-1) in total, the odd element at the end
        total = [d * (n - 1) for n, d in zip(k, dilation, strict=True)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    elif padding == "valid":
        pads = [0] * 6
    else:
        p = _triple(ctx, "padding", 0)
        pads = p + p
    params = {"stride": _triple(ctx, "stride", 1), "dilation": dilation, "pads": pads,
              "groups": int(ctx.p("groups", 1))}
    ctx.become("Conv3d", params, {"weight": w} | ({} if b is None else {"bias": b}), inputs=[ctx.x()])


def _torch_pool_out(space: list[int], k: list[int], s: list[int], p: list[int], ceil: bool) -> list[int]:
    """torch's pooling output sides: in ceil mode a last window that would start in the right padding is dropped."""
    out = []
    for x, kk, ss, pp in zip(space, k, s, p, strict=True):
        span = x + 2 * pp - kk
        o = (-(-span // ss) if ceil else span // ss) + 1
        if ceil and (o - 1) * ss >= x + pp:
            o -= 1
        out.append(o)
    return out


@handles("nn.MaxPool3d", "F.max_pool3d", "nn.AvgPool3d", "F.avg_pool3d")
def pool3d(ctx: Ctx) -> None:
    is_max = "max" in ctx.type.lower()
    ctx.drop_outputs(1, "the pooling indices output")  # pnnx writes return_indices=True even when unused
    if is_max:
        if _triple(ctx, "dilation", 1) != [1, 1, 1]:
            raise ctx.unsupported(f"dilation {ctx.p('dilation')} on a 3-D max pooling")
    k = _triple(ctx, "kernel_size", 1)
    s = k if ctx.p("stride") in (None, []) else _triple(ctx, "stride", 1)
    p, ceil = _triple(ctx, "padding", 0), bool(ctx.p("ceil_mode", False))
    if not is_max:
        if ctx.p("divisor_override") is not None:
            raise ctx.unsupported("divisor_override on a 3-D average pooling")
        if bool(ctx.p("count_include_pad", True)) and any(p):
            raise ctx.unsupported(f"count_include_pad=True with padding {p} (padding would count in the divisor)")
    if min(k + s) <= 0 or min(p) < 0 or any(2 * pp > kk for pp, kk in zip(p, k, strict=True)):
        raise ctx.fail(f"kernel {k}, stride {s}, padding {p}: torch needs padding <= kernel / 2")
    if ceil:
        # Pool3d keeps every ceil-mode window; torch drops one that starts in the right padding. Where the sides
        # are known and the two agree, ceil mode is exact; where they are not known it cannot be shown.
        space = _space(ctx)
        if space is None:
            raise ctx.unsupported("ceil_mode=True on an input whose D, H, W the file does not give")
        try:
            ours = pool3d_out(space, k, s, p + p, True)
        except ValueError:
            ours = None
        if ours != _torch_pool_out(space, k, s, p, True):
            ceil = False
            if pool3d_out(space, k, s, p + p, False) != _torch_pool_out(space, k, s, p, True):
                raise ctx.unsupported(f"ceil_mode windows on input {space} that torch and Pool3d count differently")
    params = {"mode": "max" if is_max else "avg", "kernel": k, "stride": s, "pads": p + p, "ceil_mode": ceil}
    ctx.become("Pool3d", params, inputs=[ctx.x()])


@handles("nn.AdaptiveAvgPool3d", "F.adaptive_avg_pool3d", "nn.AdaptiveMaxPool3d", "F.adaptive_max_pool3d")
def adaptive_pool3d(ctx: Ctx) -> None:
    is_max = "max" in ctx.type.lower()
    ctx.drop_outputs(1, "the pooling indices output")
    size = ctx.node.params.get("output_size")
    size = [size] * 3 if isinstance(size, int) or size is None else [int(a) for a in size]
    if len(size) == 1:
        size *= 3
    space = _space(ctx)
    # pnnx writes torch's None (keep that side) as 0
    if space is not None:
        size = [x if o in (0, None) else o for o, x in zip(size, space, strict=True)]
    if size == [1, 1, 1]:
        ctx.become("ReduceMax" if is_max else "ReduceMean", {"axes": [2, 3, 4], "keepdims": True}, inputs=[ctx.x()])
        return
    if space is None or len(size) != 3 or any(o <= 0 or x % o for o, x in zip(size, space, strict=True)):
        raise ctx.unsupported(f"output_size {size} on input sides {space} (only (1, 1, 1) or sides that divide the "
                              "input's)")
    k = [x // o for o, x in zip(size, space, strict=True)]
    params = {"mode": "max" if is_max else "avg", "kernel": k, "stride": k, "pads": [0] * 6, "ceil_mode": False}
    ctx.become("Pool3d", params, inputs=[ctx.x()])

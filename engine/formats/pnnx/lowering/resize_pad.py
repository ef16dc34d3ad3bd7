"""pnnx resizing and padding -> Resize (nn.Upsample, F.interpolate, ...), Pad (F.pad, nn.*Pad2d) and GridSample
(F.grid_sample)."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import pair

_RESIZE_MODES = {"nearest": "nearest", "nearest-exact": "nearest_exact", "bilinear": "bilinear", "bicubic": "bicubic"}


@handles("nn.Upsample", "F.upsample", "F.interpolate", "F.upsample_nearest", "F.upsample_bilinear",
         "nn.UpsamplingNearest2d", "nn.UpsamplingBilinear2d")
def resize(ctx: Ctx) -> None:
    default_mode = "bilinear" if "ilinear" in ctx.type else "nearest"
    mode = ctx.p("mode", default_mode)
    if mode not in _RESIZE_MODES:
        raise ctx.unsupported(f"mode={mode}")
    # upsample_bilinear / UpsamplingBilinear2d always align corners
    align = bool(ctx.p("align_corners", "ilinear" in ctx.type)) and not mode.startswith("nearest")
    size, scale = ctx.p("size"), ctx.p("scale_factor")
    recompute = bool(ctx.p("recompute_scale_factor", False))  # only changes anything with a scale_factor
    if ctx.p("antialias", False):
        raise ctx.unsupported("antialias=True")
    params = {"mode": _RESIZE_MODES[mode], "align_corners": align, "coordinate": "torch",
              "size": None if size is None else pair(size), "scale": None}
    if scale is not None:
        scale = [float(scale)] * 2 if isinstance(scale, (int, float)) else [float(s) for s in scale]
        params["scale"] = scale * 2 if len(scale) == 1 else scale[-2:]
    inputs = [ctx.arg("input", 0) or ctx.x()]
    dyn = ctx.arg("size") or ctx.arg("scale_factor")
    if dyn is not None:
        if ctx.arg("scale_factor") is not None:
            raise ctx.unsupported("a run-time scale_factor")
        inputs.append(dyn)
        params["size"] = None
    elif params["size"] is None and params["scale"] is None:
        raise ctx.fail("has neither size nor scale_factor")
    elif params["scale"] is not None and recompute:
        # torch: out = floor(in * scale), then sample as if that size had been asked for
        sh, sw = params["scale"]
        expr = f"[int(floor(mul(size(@0,2),{sh!r}))),int(floor(mul(size(@0,3),{sw!r})))]"
        inputs += ctx.emit("Expression", [inputs[0]], {"expr": expr})
        params["scale"] = None
    ctx.become("Resize", params, inputs=inputs)


_PAD_MODULES = {"nn.ReflectionPad1d": "reflect", "nn.ReflectionPad2d": "reflect", "nn.ReplicationPad1d": "replicate",
                "nn.ReplicationPad2d": "replicate", "nn.ReplicationPad3d": "replicate"}


@handles("F.pad", "nn.ZeroPad2d", "nn.ConstantPad1d", "nn.ConstantPad2d", "nn.ConstantPad3d", *_PAD_MODULES)
def pad(ctx: Ctx) -> None:
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "circular"}
    module_modes = _PAD_MODULES
    mode = module_modes.get(ctx.type) or ctx.p("mode", "constant")
    if mode not in modes:
        raise ctx.unsupported(f"mode={mode}")
    torch_pad = ctx.p("pad", ctx.p("padding"))
    torch_pad = [int(torch_pad)] * 4 if isinstance(torch_pad, int) else [int(p) for p in torch_pad]
    rank = ctx.rank(ctx.x())
    if len(torch_pad) % 2 or len(torch_pad) // 2 > rank:
        raise ctx.fail(f"pad {torch_pad} does not fit a rank-{rank} input")
    begin, end = [0] * rank, [0] * rank
    for i in range(len(torch_pad) // 2):  # torch lists the last dim first
        begin[rank - 1 - i], end[rank - 1 - i] = torch_pad[2 * i], torch_pad[2 * i + 1]
    value = float(ctx.p("value", 0.0))
    ctx.become("Pad", {"pads": begin + end, "mode": modes[mode], "value": value}, inputs=[ctx.x()])


@handles("F.grid_sample")
def grid_sample(ctx: Ctx) -> None:
    """torch's F.grid_sample(input, grid, mode, padding_mode, align_corners) on 4-D inputs; reflection padding and
    bicubic mode are refused."""
    mode, padding = ctx.p("mode", "bilinear"), ctx.p("padding_mode", "zeros")
    if mode not in ("bilinear", "nearest") or padding not in ("zeros", "border"):
        raise ctx.unsupported(f"mode={mode} padding_mode={padding}")
    x, grid = ctx.arg("input", 0) or ctx.x(), ctx.arg("grid", 1)
    if grid is None:
        raise ctx.fail("has no grid operand")
    if ctx.rank(x) != 4:
        raise ctx.unsupported(f"of a {ctx.rank(x)}-D input (4-D only)")
    ctx.become("GridSample", {"mode": mode, "padding_mode": padding,
                              "align_corners": bool(ctx.p("align_corners", False))}, inputs=[x, grid])

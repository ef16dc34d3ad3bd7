"""pnnx normalizations -> BatchNorm (running statistics folded into scale and bias), LayerNorm, GroupNorm,
InstanceNorm, F.normalize -> LpNormalize, RMSNorm as the element-wise ops of its definition, and
LocalResponseNorm -> LRN."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import const_input


def _folded_bn(ctx: Ctx, mean, var, gamma, beta, eps: float) -> dict:
    # y = (x - mean) / sqrt(var + eps) * gamma + beta, folded in float64 once
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    bias = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    return {"scale": scale.astype(np.float32), "bias": bias.astype(np.float32)}


@handles("nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d")
def batch_norm(ctx: Ctx) -> None:
    mean, var = ctx.weight("running_mean"), ctx.weight("running_var")
    gamma = ctx.weight("weight", required=False)
    beta = ctx.weight("bias", required=False)
    gamma = np.ones_like(mean) if gamma is None else gamma
    beta = np.zeros_like(mean) if beta is None else beta
    ctx.become("BatchNorm", {}, _folded_bn(ctx, mean, var, gamma, beta, float(ctx.p("eps", 1e-5))),
               inputs=[ctx.x()])


def _affine(ctx: Ctx) -> dict:
    """weight / bias as attrs: module attributes, or constant inputs of the functional form (F.layer_norm)."""
    attrs = {}
    for name in ("weight", "bias"):
        if ctx.type.startswith("F."):
            w = const_input(ctx, name, None)  # only a `$weight` / `$bias` input; `weight=None` is a param
        else:
            w = ctx.weight(name, required=False)
        if w is not None:
            attrs[name] = w
    return attrs


@handles("nn.LayerNorm", "F.layer_norm")
def layer_norm(ctx: Ctx) -> None:
    shape = ctx.p("normalized_shape", [])
    ndim = 1 if isinstance(shape, int) else len(shape)
    ctx.become("LayerNorm", {"normalized_ndim": ndim, "eps": float(ctx.p("eps", 1e-5))}, _affine(ctx),
               inputs=[ctx.x()])


@handles("nn.GroupNorm", "F.group_norm")
def group_norm(ctx: Ctx) -> None:
    ctx.become("GroupNorm", {"num_groups": int(ctx.p("num_groups")), "eps": float(ctx.p("eps", 1e-5))},
               _affine(ctx), inputs=[ctx.x()])


@handles("nn.InstanceNorm1d", "nn.InstanceNorm2d", "nn.InstanceNorm3d", "F.instance_norm")
def instance_norm(ctx: Ctx) -> None:
    eps = float(ctx.p("eps", 1e-5))
    if ctx.arg("running_mean") is not None and not ctx.p("use_input_stats", True):
        raise ctx.unsupported("running statistics")
    if ctx.p("track_running_stats", False) and "running_mean" in ctx.node.attrs:
        # eval mode with running statistics: a per-channel affine map, like BatchNorm
        mean, var = ctx.weight("running_mean"), ctx.weight("running_var")
        aff = _affine(ctx)
        attrs = _folded_bn(ctx, mean, var, aff.get("weight", np.ones_like(mean)),
                           aff.get("bias", np.zeros_like(mean)), eps)
        ctx.become("BatchNorm", {}, attrs, inputs=[ctx.x()])
        return
    ctx.become("InstanceNorm", {"eps": eps}, _affine(ctx), inputs=[ctx.x()])


@handles("F.normalize")
def normalize(ctx: Ctx) -> None:
    p = float(ctx.p("p", 2.0))
    if p not in (1.0, 2.0):
        raise ctx.unsupported(f"p={p}")
    ctx.become("LpNormalize", {"axis": int(ctx.p("dim", 1)), "p": int(p), "eps": float(ctx.p("eps", 1e-12))},
               inputs=[ctx.x()])


@handles("nn.RMSNorm", "F.rms_norm")
def rms_norm(ctx: Ctx) -> None:
    """x * rsqrt(mean(x², last k dims) + eps) * weight, as torch.nn.functional.rms_norm computes it, in the
    element-wise and reduce ops every device has. eps=None is the input dtype's machine epsilon, torch's
    default."""
    shape = ctx.p("normalized_shape", [])
    k = 1 if isinstance(shape, int) else len(shape)
    x = ctx.x()
    ctx.floats(x)
    dtype = np.dtype(x.dtype) if x.dtype is not None and np.dtype(x.dtype).kind == "f" else np.dtype(np.float32)
    eps = ctx.p("eps")
    eps = float(np.finfo(dtype).eps) if eps is None else float(eps)
    weight = _affine(ctx).get("weight")
    if weight is not None and weight.shape != tuple(np.atleast_1d(shape)):
        raise ctx.fail(f"weight {weight.shape} does not match normalized_shape {shape}")
    (sq,) = ctx.emit("Mul", [x, x])
    (ms,) = ctx.emit("ReduceMean", [sq], {"axes": list(range(-k, 0)), "keepdims": True})
    (den,) = ctx.emit("Add", [ms, ctx.const(np.array(eps, dtype))])
    (inv,) = ctx.emit("Rsqrt", [den])
    out = ctx.node.outputs[0]
    if weight is None:
        ctx.emit("Mul", [x, inv], outputs=[out])
    else:
        (y,) = ctx.emit("Mul", [x, inv])
        ctx.emit("Mul", [y, ctx.const(weight.astype(dtype), name=f"{ctx.node.name}.weight")], outputs=[out])
    ctx.done()


@handles("nn.LocalResponseNorm", "F.local_response_norm")
def local_response_norm(ctx: Ctx) -> None:
    """torch: x / (k + alpha / size * sum of x^2 over channels [c - size // 2, c + (size - 1) // 2]) ** beta (it
    pads size // 2 channels before and (size - 1) // 2 after, then averages over size). The LRN op's window is
    ONNX's, [c - (size - 1) // 2, c + size // 2]: the same for an odd size, mirrored for an even one, refused."""
    size = int(ctx.p("size", 0))
    if size <= 0 or size % 2 == 0:
        raise ctx.unsupported(f"size={size} (torch's window for an even size is not the LRN op's)")
    if ctx.rank(ctx.x()) < 3:
        raise ctx.unsupported(f"of a {ctx.rank(ctx.x())}-D input (torch takes 3-D and more)")
    ctx.become("LRN", {"size": size, "alpha": float(ctx.p("alpha", 1e-4)), "beta": float(ctx.p("beta", 0.75)),
                       "bias": float(ctx.p("k", 1.0))}, inputs=[ctx.x()])

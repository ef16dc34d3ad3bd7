"""`aten::_transformer_encoder_layer_fwd`: torch's fused fast path for nn.TransformerEncoderLayer in eval mode,
which tracing records and pnnx leaves as is. Its 20 positional inputs follow the aten schema:

    src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
    norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
    mask, mask_type

Scalars arrive as input-less pnnx.Expression nodes (`expr=32`, `expr=True`, `expr=None`), weights as
pnnx.Attribute constants. The layer is batch-first (the fast path requires it) and lowers to
LayerNorm / self-attention (Gemm, Split, Reshape, Transpose, Attention, Flatten, Gemm) / Add / Gemm-act-Gemm.
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.attention import GEMM, self_attention
from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.ir import Value


def _const(ctx: Ctx, v: Value) -> np.ndarray:
    return ctx.const_array(v, "weight")


@handles("aten::_transformer_encoder_layer_fwd")
def encoder_layer(ctx: Ctx) -> None:
    ins = ctx.node.inputs
    if len(ins) < 18:
        raise ctx.fail(f"expects at least 18 inputs, has {len(ins)}")
    if len(ins) > 18 and ctx.literal(ins[18]) is not None:
        raise ctx.unsupported("a mask")
    src = ins[0]
    embed, heads = int(ctx.literal(ins[1])), int(ctx.literal(ins[2]))
    w_qkv, b_qkv, w_proj, b_proj = (_const(ctx, v) for v in ins[3:7])
    use_gelu, norm_first, eps = bool(ctx.literal(ins[7])), bool(ctx.literal(ins[8])), float(ctx.literal(ins[9]))
    n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b = (_const(ctx, v) for v in ins[10:18])
    if w_qkv.shape != (3 * embed, embed) or heads <= 0 or embed % heads:
        raise ctx.fail(f"qkv weight {w_qkv.shape} does not fit embed_dim={embed}, num_heads={heads}")
    shape = src.shape if src.shape is not None and len(src.shape) == 3 else (-1, -1, -1)
    dims = (shape[0], shape[1])

    def norm(x: Value, w: np.ndarray, b: np.ndarray, out: Value | None = None) -> Value:
        return ctx.emit("LayerNorm", [x], {"normalized_ndim": 1, "eps": eps}, {"weight": w, "bias": b},
                        outputs=[out] if out is not None else 1)[0]

    def add(a: Value, b: Value, out: Value | None = None) -> Value:
        return ctx.emit("Add", [a, b], {}, outputs=[out] if out is not None else 1)[0]

    def attention(x: Value) -> Value:
        return self_attention(ctx, x, dims, heads, w_qkv, b_qkv, w_proj, b_proj)

    def feed_forward(x: Value) -> Value:
        h = ctx.emit("Gemm", [x], dict(GEMM), {"weight": f1w, "bias": f1b})[0]
        h = ctx.emit("Gelu", [h], {"approximate": "none"})[0] if use_gelu else ctx.emit("Relu", [h])[0]
        return ctx.emit("Gemm", [h], dict(GEMM), {"weight": f2w, "bias": f2b})[0]

    out = ctx.node.outputs[0]
    if norm_first:
        x = add(src, attention(norm(src, n1w, n1b)))
        add(x, feed_forward(norm(x, n2w, n2b)), out=out)
    else:
        x = norm(add(src, attention(src)), n1w, n1b)
        norm(add(x, feed_forward(x)), n2w, n2b, out=out)
    ctx.done()

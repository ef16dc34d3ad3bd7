"""pnnx attention -> Attention: F.scaled_dot_product_attention directly; nn.MultiheadAttention as Gemm (projections) /
Reshape / Transpose / Attention / Flatten / Gemm (output).

pnnx gives nn.MultiheadAttention 1 input when query, key and value are one tensor, else 2 (key = value) or 3,
plus an optional mask. torch's MHA mask is additive when float and means "masked out" when bool, the opposite of
the canonical Attention's bool mask ("may attend"), so a bool mask goes through Not. A query row with every key
masked is NaN in torch's MHA (its softmax of a row of -inf), zeros in F.scaled_dot_product_attention: the
Attention node's masked_rows says which.

pnnx writes a key_padding_mask (N, S) like an attn_mask (L, S): untagged when bool, tagged `$attn_mask` when
float (and its own generated Python then passes it as attn_mask, or as the query). The shapes tell them apart
when the mask's first dim is the batch and not the query length: it is then a key padding mask, broadcast over
heads and queries as (N, 1, 1, S). When N == L the file cannot say which it is and the mask stays an attn_mask,
as pnnx reads it.
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.ir import Value


@handles("F.scaled_dot_product_attention")
def sdpa(ctx: Ctx) -> None:
    if ctx.p("enable_gqa", False):
        raise ctx.unsupported("enable_gqa=True")
    names = ("query", "key", "value")
    q, k, v = (ctx.arg(n, i) for i, n in enumerate(names))
    if q is None or k is None or v is None:
        raise ctx.fail("needs query, key and value inputs")
    mask = ctx.arg("attn_mask", 3)
    scale = ctx.node.params.get("scale")
    params = {"scale": None if scale is None else float(scale), "is_causal": bool(ctx.p("is_causal", False))}
    ctx.become("Attention", params, inputs=[q, k, v] + ([mask] if mask is not None else []))


GEMM = {"activation": None, "activation_params": {}}


def _head_shape(batch: int, length: int, heads: int, dim: int) -> list[int]:
    """Reshape target (N, L, H, D) with at most one -1; 0 ("copy the input dim") only when N and L are both
    dynamic, the one case a single -1 cannot express."""
    if batch >= 0:
        return [batch, -1, heads, dim]
    if length >= 0:
        return [-1, length, heads, dim]
    return [0, -1, heads, dim]


def _inputs(ctx: Ctx) -> tuple[Value, Value, Value, Value | None]:
    if "key_padding_mask" in ctx.arg_names and "attn_mask" in ctx.arg_names:
        raise ctx.unsupported("both an attn_mask and a key_padding_mask")
    # pnnx sometimes lists the mask first and tags the wrong operand `$attn_mask` (seen with key = value and
    # with masks built inside the model), so a lone bool or 2-D input is taken as the mask whatever the tag says;
    # query, key and value are 3-D.
    looks_like_mask = [v for v in ctx.node.inputs
                       if v.dtype == np.bool_ or (v.shape is not None and len(v.shape) == 2)]
    tagged = ctx.arg("attn_mask") if "attn_mask" in ctx.arg_names else ctx.arg("key_padding_mask")
    mask = looks_like_mask[0] if len(looks_like_mask) == 1 else tagged
    tensors = [v for v in ctx.node.inputs if v is not mask]
    named = [ctx.arg(n) for n in ("query", "key", "value")]
    if all(v is not None for v in named):
        q, k, v = named
    elif len(tensors) == 1:
        q = k = v = tensors[0]
    elif len(tensors) == 2:
        q, (k, v) = tensors[0], (tensors[1], tensors[1])
    elif len(tensors) == 3:
        q, k, v = tensors
    else:
        raise ctx.fail(f"expects 1 to 3 tensor inputs, has {len(tensors)}")
    return q, k, v, mask


def _projections(ctx: Ctx, embed: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(weight, bias) for q, k and v."""
    packed = ctx.weight("in_proj_weight", required=False)
    if packed is not None:
        ws = [packed[i * embed : (i + 1) * embed] for i in range(3)]
    else:
        ws = [ctx.weight(f"{n}_proj_weight") for n in "qkv"]
    bias = ctx.weight("in_proj_bias", required=False)
    bs = [None] * 3 if bias is None else [bias[i * embed : (i + 1) * embed] for i in range(3)]
    return list(zip(ws, bs, strict=True))


def _gemm(ctx: Ctx, x: Value, w: np.ndarray, b: np.ndarray | None) -> Value:
    attrs = {"weight": np.ascontiguousarray(w)} | ({} if b is None else {"bias": np.ascontiguousarray(b)})
    return ctx.emit("Gemm", [x], dict(GEMM), attrs)[0]


def is_key_padding(ctx: Ctx, mask: Value, batch: int, length: int) -> bool:
    """A (N, S) key_padding_mask rather than a (L, S) attn_mask (see the module's doc)."""
    if "key_padding_mask" in ctx.arg_names:
        return ctx.arg("key_padding_mask") is mask
    shape = mask.shape
    return (shape is not None and len(shape) == 2 and batch >= 0 and length >= 0 and shape[0] == batch
            and batch != length)


def _mask(ctx: Ctx, mask: Value, heads: int, key_padding: bool) -> Value:
    # torch takes bool and float masks only, 2-D (L, S) / (N, S) or 3-D (N*H, L, S)
    if mask.dtype is not None and mask.dtype != np.bool_ and np.dtype(mask.dtype).kind != "f":
        raise ctx.fail(f"mask {mask.name!r} is {np.dtype(mask.dtype)} (torch takes bool and float masks)")
    if mask.shape is not None and len(mask.shape) not in (2, 3):
        raise ctx.fail(f"mask {mask.name!r} is {len(mask.shape)}-D (torch takes 2-D and 3-D masks)")
    if mask.dtype == np.bool_:
        mask = ctx.emit("Not", [mask])[0]
    if key_padding:  # (N, S) -> (N, 1, 1, S): the same keys hidden from every head and query of a sequence
        return ctx.emit("Reshape", [mask], {"shape": [0, 1, 1, -1]})[0]
    shape = mask.shape
    if shape is not None and len(shape) == 3:  # (N*H, L, S) -> (N, H, L, S)
        if shape[1] < 0 or shape[2] < 0:
            raise ctx.unsupported("a 3-D attn_mask with dynamic L or S")
        mask = ctx.emit("Reshape", [mask], {"shape": [-1, heads, shape[1], shape[2]]})[0]
    return mask


def split_heads(ctx: Ctx, x: Value, dims: tuple[int, int], heads: int, embed: int) -> Value:
    """(N, L, E) -> (N, H, L, D); `dims` = the (N, L) known from annotations (-1 when dynamic)."""
    y = ctx.emit("Reshape", [x], {"shape": _head_shape(*dims, heads, embed // heads)})[0]
    return ctx.emit("Transpose", [y], {"perm": [0, 2, 1, 3]})[0]


def attend_and_project(ctx: Ctx, heads_qkv: list[Value], w_out: np.ndarray, b_out: np.ndarray | None,
                       out: Value | None = None) -> Value:
    """Attention over (N, H, L, D) heads (+ mask), heads merged back to (N, L, E), then the output Gemm."""
    # torch's MHA softmaxes each row: a row whose every key is masked is NaN there, not zeros as in F.sdpa
    att = ctx.emit("Attention", heads_qkv, {"scale": None, "is_causal": False, "masked_rows": "nan"})[0]
    merged = ctx.emit("Transpose", [att], {"perm": [0, 2, 1, 3]})[0]
    flat = ctx.emit("Flatten", [merged], {"start_dim": 2, "end_dim": -1})[0]
    attrs = {"weight": w_out} | ({} if b_out is None else {"bias": b_out})
    return ctx.emit("Gemm", [flat], dict(GEMM), attrs, outputs=[out] if out is not None else 1)[0]


def self_attention(ctx: Ctx, x: Value, dims: tuple[int, int], heads: int, w_in: np.ndarray,
                   b_in: np.ndarray | None, w_out: np.ndarray, b_out: np.ndarray | None,
                   out: Value | None = None) -> Value:
    """Batch-major self-attention with a packed (3E, E) input projection: one Gemm, then Split."""
    embed = w_in.shape[0] // 3
    packed = _gemm(ctx, x, w_in, b_in)
    qkv = ctx.emit("Split", [packed], {"axis": -1, "sizes": [embed] * 3}, outputs=3)
    return attend_and_project(ctx, [split_heads(ctx, t, dims, heads, embed) for t in qkv], w_out, b_out, out)


@handles("nn.MultiheadAttention")
def lower_mha(ctx: Ctx) -> None:
    if ctx.p("add_bias_kv", False) or ctx.p("add_zero_attn", False):
        raise ctx.unsupported("add_bias_kv or add_zero_attn")
    embed, heads = int(ctx.p("embed_dim")), int(ctx.p("num_heads"))
    if heads <= 0 or embed % heads:
        raise ctx.fail(f"embed_dim={embed} is not a multiple of num_heads={heads}")
    batch_first = bool(ctx.p("batch_first", False))
    q, k, v, mask = _inputs(ctx)

    def batch_major(x: Value) -> Value:  # (L, N, E) -> (N, L, E)
        return x if batch_first else ctx.emit("Transpose", [x], {"perm": [1, 0, 2]})[0]

    def dims(x: Value) -> tuple[int, int]:  # (N, L) of a batch-major view of x
        s = x.shape if x.shape is not None and len(x.shape) == 3 else (-1, -1, -1)
        return (s[0], s[1]) if batch_first else (s[1], s[0])

    w_out, b_out = ctx.weight("out_proj.weight"), ctx.weight("out_proj.bias", required=False)
    out = ctx.node.outputs[0] if batch_first else None
    qb = batch_major(q)
    if q is k is v and mask is None and "in_proj_weight" in ctx.node.attrs:
        w_in, b_in = ctx.weight("in_proj_weight"), ctx.weight("in_proj_bias", required=False)
        y = self_attention(ctx, qb, dims(q), heads, w_in, b_in, w_out, b_out, out)
    else:
        kb = qb if k is q else batch_major(k)
        vb = kb if v is k else (qb if v is q else batch_major(v))
        proj = _projections(ctx, embed)
        qp, kp, vp = (_gemm(ctx, x, w, b) for x, (w, b) in zip((qb, kb, vb), proj, strict=True))
        ins = [split_heads(ctx, t, dims(like), heads, embed) for t, like in ((qp, q), (kp, k), (vp, v))]
        if mask is not None:
            ins.append(_mask(ctx, mask, heads, is_key_padding(ctx, mask, *dims(q))))
        y = attend_and_project(ctx, ins, w_out, b_out, out)
    if not batch_first:
        ctx.emit("Transpose", [y], {"perm": [1, 0, 2]}, outputs=[ctx.node.outputs[0]])
    ctx.done()

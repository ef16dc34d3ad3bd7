"""Writes tests/fixtures/ops/nonspatial.npz: PyTorch outputs for the activation, elementwise, softmax, reduce, norm,
shape, tensor and attention ops on small awkward shapes (broadcasting, negative axes, keepdim, odd sizes), plus
ONNX Runtime outputs where the semantics are ONNX's rather than torch's (Slice clamping, Reshape 0, Expand).

Run with the dev environment (torch, onnx, onnxruntime): `.venv-dev/bin/python tools/make_op_goldens_nonspatial.py`.
Each case `c` is stored as `c/op`, `c/params` (JSON), `c/in<i>`, `c/attr_<name>`, `c/out<i>`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ops" / "nonspatial.npz"
RNG = np.random.default_rng(20261122)
CASES: dict[str, np.ndarray] = {}


def case(name: str, op: str, inputs: list, outputs: list, params: dict | None = None, attrs: dict | None = None):
    assert f"{name}/op" not in CASES, name
    CASES[f"{name}/op"] = np.array(op)
    CASES[f"{name}/params"] = np.array(json.dumps(params or {}))
    for i, a in enumerate(inputs):
        CASES[f"{name}/in{i}"] = np.asarray(a)
    for k, a in (attrs or {}).items():
        CASES[f"{name}/attr_{k}"] = np.asarray(a)
    for i, t in enumerate(outputs):
        CASES[f"{name}/out{i}"] = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def randn(*shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, order="C"))  # a copy that keeps 0-d arrays 0-d


def activations() -> None:
    x = randn(2, 3, 5, 7, scale=3.0)
    x.flat[:6] = [0.0, -30.0, 30.0, 25.0, -25.0, 3.0]  # zeros, saturation, softplus threshold
    tx = t(x)
    simple = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Silu": F.silu,
              "HardSwish": F.hardswish, "HardSigmoid": F.hardsigmoid, "Mish": F.mish, "Softplus": F.softplus}
    for op, fn in simple.items():
        case(f"act_{op}", op, [x], [fn(tx)])
    case("act_Gelu", "Gelu", [x], [F.gelu(tx)], {"approximate": "none"})
    case("act_Gelu_tanh", "Gelu", [x], [F.gelu(tx, approximate="tanh")], {"approximate": "tanh"})
    case("act_Clip", "Clip", [x], [torch.clamp(tx, -0.5, 1.25)], {"min": -0.5, "max": 1.25})
    case("act_Clip_min", "Clip", [x], [torch.clamp(tx, min=-1.0)], {"min": -1.0, "max": None})
    case("act_Relu6", "Clip", [x], [F.relu6(tx)], {"min": 0.0, "max": 6.0})
    case("act_LeakyRelu", "LeakyRelu", [x], [F.leaky_relu(tx, 0.2)], {"alpha": 0.2})
    case("act_Elu", "Elu", [x], [F.elu(tx, 0.7)], {"alpha": 0.7})
    case("act_Softplus_beta", "Softplus", [x], [F.softplus(tx, beta=2.0, threshold=5.0)],
         {"beta": 2.0, "threshold": 5.0})
    case("act_HardSigmoid_onnx", "HardSigmoid", [x], [torch.clamp(0.2 * tx + 0.5, 0, 1)], {"alpha": 0.2, "beta": 0.5})
    slope = randn(3, scale=0.3)
    case("act_PRelu", "PRelu", [x], [F.prelu(tx, t(slope))], attrs={"slope": slope})
    one = np.array([0.25], np.float32)
    x3 = randn(4, 6, scale=2.0)
    case("act_PRelu_one_2d", "PRelu", [x3], [F.prelu(t(x3), t(one))], attrs={"slope": one})


def binaries() -> None:
    a, b = randn(2, 1, 5, scale=3.0), randn(3, 1, scale=2.0)
    b[b == 0] = 0.5
    ta, tb = t(a), t(b)
    fns = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Maximum": torch.maximum,
           "Minimum": torch.minimum, "FloorDiv": torch.floor_divide, "Mod": torch.remainder, "Fmod": torch.fmod,
           "Atan2": torch.atan2, "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessEqual": torch.le,
           "GreaterEqual": torch.ge, "NotEqual": torch.ne}
    for op, fn in fns.items():
        case(f"bin_{op}", op, [a, b], [fn(ta, tb)])
    pa = np.abs(a) + 0.1
    case("bin_Pow", "Pow", [pa, b], [torch.pow(t(pa), tb)])
    ia, ib = RNG.integers(-9, 10, (3, 4)).astype(np.int64), RNG.integers(1, 4, (4,)).astype(np.int64) * [1, -1, 1, -1]
    tia, tib = t(ia), t(ib)
    int_fns = {"Mod": torch.remainder, "FloorDiv": torch.floor_divide, "Fmod": torch.fmod, "Div": torch.div,
               "Mul": torch.mul, "And": torch.bitwise_and, "Or": torch.bitwise_or, "Xor": torch.bitwise_xor}
    for op, fn in int_fns.items():
        case(f"bin_{op}_int", op, [ia, ib], [fn(tia, tib)])
    case("bin_Pow_int", "Pow", [ia, np.abs(ib)], [torch.pow(tia, t(np.abs(ib)))])
    ba, bb = a > 0, b > 0.5
    for op, fn in {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor}.items():
        case(f"bin_{op}_bool", op, [ba, bb], [fn(t(ba), t(bb))])
    three = np.array(3, np.int64)
    case("bin_Add_scalar_int", "Add", [a, three], [ta + t(three)])
    half = np.array(2.5, np.float32)
    case("bin_Mul_int_by_float_scalar", "Mul", [ia.astype(np.int32), half], [t(ia.astype(np.int32)) * t(half)])
    cond = RNG.random((3, 1)) > 0.5
    case("bin_Where", "Where", [cond, a, b], [torch.where(t(cond), ta, tb)])


def unaries() -> None:
    x = randn(3, 5, 7, scale=2.0)
    x.flat[:6] = [0.5, 1.5, 2.5, -0.5, -2.5, 0.0]  # half-to-even rounding, zero sign
    pos = np.abs(x) + 0.05
    unit = np.tanh(x) * 0.99
    tx = t(x)
    ops = {"Abs": (x, torch.abs), "Neg": (x, torch.neg), "Exp": (x, torch.exp), "Log": (pos, torch.log),
           "Log10": (pos, torch.log10), "Log1p": (pos, torch.log1p), "Expm1": (x, torch.expm1),
           "Sqrt": (pos, torch.sqrt), "Rsqrt": (pos, torch.rsqrt), "Reciprocal": (pos, torch.reciprocal),
           "Square": (x, torch.square), "Floor": (x, torch.floor), "Ceil": (x, torch.ceil), "Round": (x, torch.round),
           "Trunc": (x, torch.trunc), "Sign": (x, torch.sign), "Sin": (x, torch.sin), "Cos": (x, torch.cos),
           "Tan": (unit, torch.tan), "Asin": (unit, torch.asin), "Acos": (unit, torch.acos), "Atan": (x, torch.atan),
           "Sinh": (x, torch.sinh), "Cosh": (x, torch.cosh), "Asinh": (x, torch.asinh), "Acosh": (pos + 1, torch.acosh),
           "Atanh": (unit, torch.atanh), "Erf": (x, torch.erf)}
    for op, (data, fn) in ops.items():
        case(f"un_{op}", op, [data], [fn(t(data))])
    case("un_Not", "Not", [x > 0], [torch.logical_not(tx > 0)])
    ints = np.arange(-3, 4, dtype=np.int64)
    case("un_Exp_int", "Exp", [ints], [torch.exp(t(ints))])
    case("un_Abs_int", "Abs", [ints], [torch.abs(t(ints))])


def softmax_reduce() -> None:
    x = randn(3, 4, 5, scale=4.0)
    x[0, 0, 0] = 80.0  # stability
    tx = t(x)
    for axis in (1, -1, 0):
        case(f"softmax_{axis}", "Softmax", [x], [torch.softmax(tx, axis)], {"axis": axis})
        case(f"logsoftmax_{axis}", "LogSoftmax", [x], [torch.log_softmax(tx, axis)], {"axis": axis})
    y = randn(2, 3, 4, 5)
    ty = t(y)
    pos = np.abs(y) + 0.1
    for axes, keep in (([1, -1], True), ([-2], False), (None, False), ([0, 2, 3], True)):
        dims = tuple(range(4)) if axes is None else tuple(a % 4 for a in axes)
        p = {"axes": axes, "keepdims": keep}
        tag = f"{'all' if axes is None else '_'.join(map(str, axes))}_{int(keep)}"
        case(f"rmean_{tag}", "ReduceMean", [y], [ty.mean(dims, keepdim=keep)], p)
        case(f"rsum_{tag}", "ReduceSum", [y], [ty.sum(dims, keepdim=keep)], p)
        case(f"rmax_{tag}", "ReduceMax", [y], [torch.amax(ty, dims, keepdim=keep)], p)
        case(f"rmin_{tag}", "ReduceMin", [y], [torch.amin(ty, dims, keepdim=keep)], p)
        prod = ty
        for d in sorted(dims, reverse=True):
            prod = prod.prod(d, keepdim=keep)
        case(f"rprod_{tag}", "ReduceProd", [y], [prod], p)
        case(f"rl1_{tag}", "ReduceL1", [y], [ty.abs().sum(dims, keepdim=keep)], p)
        case(f"rl2_{tag}", "ReduceL2", [y], [torch.linalg.vector_norm(ty, 2, dims, keepdim=keep)], p)
        case(f"rss_{tag}", "ReduceSumSquare", [y], [(ty * ty).sum(dims, keepdim=keep)], p)
        case(f"rlogsum_{tag}", "ReduceLogSum", [pos], [t(pos).sum(dims, keepdim=keep).log()], p)
        case(f"rlse_{tag}", "ReduceLogSumExp", [y], [torch.logsumexp(ty, dims, keepdim=keep)], p)
    ties = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # repeated maxima: first index wins
    for op, fn in (("ArgMax", torch.argmax), ("ArgMin", torch.argmin)):
        case(f"{op}_ax1_keep", op, [ties], [fn(t(ties), 1, keepdim=True)], {"axis": 1, "keepdims": True})
        case(f"{op}_neg", op, [y], [fn(ty, -1)], {"axis": -1, "keepdims": False})
        case(f"{op}_all", op, [y], [fn(ty)], {"axis": None})


def norms() -> None:
    x = randn(2, 3, 5, 4, scale=2.0) + 1.0
    tx = t(x)
    mean, var = randn(3), np.abs(randn(3)) + 0.5
    gamma, beta = randn(3), randn(3)
    scale = (gamma / np.sqrt(var + 1e-5)).astype(np.float32)
    bias = (beta - mean * scale).astype(np.float32)
    bn = F.batch_norm(tx, t(mean), t(var), t(gamma), t(beta), training=False, eps=1e-5)
    case("bn", "BatchNorm", [x], [bn], attrs={"scale": scale, "bias": bias})
    w2, b2 = randn(5, 4), randn(5, 4)
    case("ln_2", "LayerNorm", [x], [F.layer_norm(tx, (5, 4), t(w2), t(b2), 1e-5)],
         {"normalized_ndim": 2, "eps": 1e-5}, {"weight": w2, "bias": b2})
    case("ln_1_noaffine", "LayerNorm", [x], [F.layer_norm(tx, (4,), eps=1e-6)], {"normalized_ndim": 1, "eps": 1e-6})
    w1 = randn(4)
    case("ln_1_weight", "LayerNorm", [x], [F.layer_norm(tx, (4,), t(w1), None, 1e-5)],
         {"normalized_ndim": 1, "eps": 1e-5}, {"weight": w1})
    g = randn(2, 6, 3, 5) * 3 + 1
    wg, bg = randn(6), randn(6)
    case("gn_3", "GroupNorm", [g], [F.group_norm(t(g), 3, t(wg), t(bg), 1e-5)],
         {"num_groups": 3, "eps": 1e-5}, {"weight": wg, "bias": bg})
    case("gn_2_noaffine", "GroupNorm", [g], [F.group_norm(t(g), 2, eps=1e-3)], {"num_groups": 2, "eps": 1e-3})
    g3 = randn(2, 6, 7)
    case("gn_1d", "GroupNorm", [g3], [F.group_norm(t(g3), 6, t(wg), t(bg), 1e-5)],
         {"num_groups": 6, "eps": 1e-5}, {"weight": wg, "bias": bg})
    case("in_affine", "InstanceNorm", [g], [F.instance_norm(t(g), weight=t(wg), bias=t(bg), eps=1e-5)],
         {"eps": 1e-5}, {"weight": wg, "bias": bg})
    case("in_plain", "InstanceNorm", [g], [F.instance_norm(t(g), eps=1e-5)], {"eps": 1e-5})
    z = x.copy()
    z[0, :, 0, 0] = 0.0  # a zero vector: the eps floor
    for p in (1, 2):
        case(f"lpnorm_{p}", "LpNormalize", [z], [F.normalize(t(z), p=p, dim=1, eps=1e-12)],
             {"axis": 1, "p": p, "eps": 1e-12})
    case("lpnorm_neg_axis", "LpNormalize", [z], [F.normalize(t(z), p=2, dim=-1, eps=0.5)],
         {"axis": -1, "p": 2, "eps": 0.5})


def shapes() -> None:
    x = randn(2, 3, 4, 5)
    tx = t(x)
    case("reshape_0_m1", "Reshape", [x], [tx.reshape(2, 12, 5)], {"shape": [0, -1, 5]})
    case("reshape_input", "Reshape", [x, np.array([-1, 20], np.int64)], [tx.reshape(-1, 20)])
    case("flatten_1_2", "Flatten", [x], [torch.flatten(tx, 1, 2)], {"start_dim": 1, "end_dim": 2})
    case("flatten_1", "Flatten", [x], [torch.flatten(tx, 1)], {"start_dim": 1, "end_dim": -1})
    s = randn(1, 3, 1, 5)
    case("squeeze_all", "Squeeze", [s], [torch.squeeze(t(s))], {"axes": None})
    case("squeeze_neg", "Squeeze", [s], [torch.squeeze(t(s), -2)], {"axes": [-2]})
    case("squeeze_non1", "Squeeze", [s], [torch.squeeze(t(s), (0, 1))], {"axes": [0, 1]})
    case("unsqueeze_2", "Unsqueeze", [x], [tx.unsqueeze(0).unsqueeze(-1)], {"axes": [0, -1]})
    case("transpose", "Transpose", [x], [tx.permute(0, 2, 3, 1)], {"perm": [0, 2, 3, 1]})
    case("transpose_neg", "Transpose", [x], [tx.transpose(-1, 1)], {"perm": [0, -1, 2, 1]})
    e = randn(3, 1, 5)
    case("expand_torch", "Expand", [e], [t(e).expand(2, -1, 4, 5)], {"shape": [2, -1, 4, 5]})
    case("expand_input", "Expand", [e, np.array([3, 6, 5], np.int64)], [t(e).expand(3, 6, 5)])
    case("tile", "Tile", [e], [torch.tile(t(e), (2, 3))], {"repeats": [2, 3]})
    case("tile_more", "Tile", [e], [torch.tile(t(e), (2, 1, 2, 1))], {"repeats": [2, 1, 2, 1]})
    c = randn(3, 4, scale=3.0)
    case("cast_int32", "Cast", [c], [t(c).to(torch.int32)], {"to": "int32"})
    case("cast_bool", "Cast", [np.round(c)], [t(np.round(c)).to(torch.bool)], {"to": "bool"})
    ints = RNG.integers(-5, 5, (4,)).astype(np.int64)
    case("cast_float", "Cast", [ints], [t(ints).to(torch.float32)], {"to": "float32"})
    case("shape_all", "Shape", [x], [torch.tensor(tx.shape)], {})
    case("shape_slice", "Shape", [x], [torch.tensor(tx.shape[1:-1])], {"start": 1, "end": -1})


def tensors() -> None:
    x, y = randn(2, 3, 4), randn(2, 1, 4)
    case("concat_1", "Concat", [x, y, x], [torch.cat([t(x), t(y), t(x)], 1)], {"axis": 1})
    case("concat_neg", "Concat", [x, x[:, :, :1].copy()], [torch.cat([t(x), t(x[:, :, :1])], -1)], {"axis": -1})
    case("stack_neg", "Stack", [x, x * 2], [torch.stack([t(x), t(x * 2)], -1)], {"axis": -1})
    case("stack_0", "Stack", [x, x * 2, x], [torch.stack([t(x), t(x * 2), t(x)], 0)], {"axis": 0})
    z = randn(2, 7, 3)
    case("split_sizes", "Split", [z], list(torch.split(t(z), [2, 4, 1], 1)), {"axis": 1, "sizes": [2, 4, 1]})
    case("split_chunk", "Split", [z], list(torch.chunk(t(z), 3, -2)), {"axis": -2, "sizes": None})
    w = randn(3, 6, 7)
    tw = t(w)
    case("slice_basic", "Slice", [w], [tw[:, 1:5:2, -3:]], {"starts": [1, -3], "ends": [5, 2**31 - 1],
                                                            "axes": [1, 2], "steps": [2, 1]})
    case("slice_clamp", "Slice", [w], [tw[-100:100, 2:3]], {"starts": [-100, 2], "ends": [100, 3]})
    # negative steps (torch slicing has none): the indices ONNX defines, taken with index_select
    case("slice_neg_step", "Slice", [w], [tw.index_select(2, torch.tensor([6, 4, 2, 0]))],
         {"starts": [-1], "ends": [-2**31], "axes": [-1], "steps": [-2]})
    case("slice_neg_step_mid", "Slice", [w], [tw.index_select(1, torch.tensor([4, 3, 2]))],
         {"starts": [4], "ends": [1], "axes": [1], "steps": [-1]})
    idx = np.array([[-1, 0], [2, -6]], np.int64)
    case("gather_2d_neg", "Gather", [w, idx], [tw[:, t(idx)]], {"axis": 1})
    case("gather_scalar", "Gather", [w, np.array(-2, np.int64)], [tw.select(2, -2)], {"axis": -1})
    emb = randn(10, 4)
    tokens = np.array([[1, 3, 9], [0, 0, 5]], np.int64)
    case("gather_embedding", "Gather", [emb, tokens], [F.embedding(t(tokens), t(emb))], {"axis": 0})


def attention() -> None:
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 6)
    tq, tk, tv = t(q), t(k), t(v)
    sdpa = F.scaled_dot_product_attention
    case("attn_plain", "Attention", [q, k, v], [sdpa(tq, tk, tv)], {"scale": None, "is_causal": False})
    case("attn_scale", "Attention", [q, k, v], [sdpa(tq, tk, tv, scale=0.3)], {"scale": 0.3, "is_causal": False})
    fm = randn(5, 7)
    case("attn_float_mask", "Attention", [q, k, v, fm], [sdpa(tq, tk, tv, attn_mask=t(fm))], {"is_causal": False})
    bm = RNG.random((2, 1, 5, 7)) > 0.4
    bm[0, 0, 1] = False  # a row with nothing to attend to
    case("attn_bool_mask", "Attention", [q, k, v, bm], [sdpa(tq, tk, tv, attn_mask=t(bm))], {"is_causal": False})
    case("attn_causal", "Attention", [q, k, v], [sdpa(tq, tk, tv, is_causal=True)], {"is_causal": True})
    q3 = randn(4, 6, 16)
    tq3, s8 = t(q3), 1 / math.sqrt(8)
    case("attn_3d_causal_square", "Attention", [q3, q3, q3], [sdpa(tq3, tq3, tq3, is_causal=True, scale=s8)],
         {"scale": s8, "is_causal": True})


def run_onnx(op_type: str, x: np.ndarray, consts: dict[str, np.ndarray], **attrs) -> np.ndarray:
    """One ONNX node on `x` with `consts` as initializer inputs, run by ONNX Runtime."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node(op_type, ["x", *consts], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(x.shape))],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def onnx_semantics() -> None:
    w = randn(3, 6, 7)
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    slices = {
        "ort_slice_neg_start_neg_step": ([-100], [0], [1], [-1]),
        "ort_slice_big_start_neg_step": ([100], [-100], [2], [-2]),
        "ort_slice_end_min_int": ([5, 2], [-2**63, 2**63 - 1], [1, -1], [-1, 3]),
        "ort_slice_empty": ([4], [2], [1], [1]),
        "ort_slice_two_axes": ([-2, 1], [2**31 - 1, -1], [0, 2], [1, 2]),
    }
    for name, (starts, ends, axes, steps) in slices.items():
        y = run_onnx("Slice", w, {"starts": i64(*starts), "ends": i64(*ends), "axes": i64(*axes),
                                  "steps": i64(*steps)})
        case(name, "Slice", [w], [y], {"starts": starts, "ends": ends, "axes": axes, "steps": steps})
    for target in ([0, -1], [3, 0, 7], [0, 0, -1, 1]):
        y = run_onnx("Reshape", w, {"shape": i64(*target)})
        case(f"ort_reshape_{'_'.join(map(str, target))}", "Reshape", [w], [y], {"shape": target})
    e = randn(3, 1, 5)
    for target in ([2, 1, 4, 1], [1, 7, 1], [5]):
        y = run_onnx("Expand", e, {"shape": i64(*target)})
        case(f"ort_expand_{'_'.join(map(str, target))}", "Expand", [e], [y], {"shape": target})
    y = run_onnx("Gather", w, {"indices": i64(-1, 0, -7, 3)}, axis=2)
    case("ort_gather_neg", "Gather", [w, i64(-1, 0, -7, 3)], [y], {"axis": 2})


def promotion_table() -> None:
    """torch.result_type for every pair of dtypes, tensor or 0-d: the binary ops' output dtypes."""
    import itertools

    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
    rows = []
    for a, b in itertools.product(names, names):
        for da, db in ((1, 1), (1, 0), (0, 1), (0, 0)):
            x, y = np.zeros((2,) * da, a), np.zeros((2,) * db, b)
            r = torch.empty(0, dtype=torch.result_type(t(x), t(y))).numpy().dtype
            rows.append(f"{a}|{da}|{b}|{db}|{r.name}")
    CASES["promotion/table"] = np.array(rows)


def main() -> None:
    torch.manual_seed(0)
    for build in (activations, binaries, unaries, softmax_reduce, norms, shapes, tensors, attention, onnx_semantics,
                  promotion_table):
        build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **CASES)
    print(f"{OUT.name}: {sum(k.endswith('/op') for k in CASES)} cases, {OUT.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

"""Writer rules for activations, normalization, layout and tensor ops (see engine/formats/tnn_writer_ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.formats.tnn_types import DTYPE_CODES
from engine.formats.tnn_writer import Writer
from engine.ir import Node

F32 = np.float32
INT_MAX = 2**31 - 1
Rule = Callable[[Writer, Node], None]
PAD_CODES = {"constant": 0, "reflect": 1, "edge": 2}


def _io(w: Writer, node: Node) -> tuple[str, str]:
    return w.name(node.inputs[0]), w.name(node.outputs[0])


def one(w: Writer, node: Node, ltype: str, params: list | None = None, resource: list | None = None) -> None:
    """A single-input, single-output layer."""
    x, y = _io(w, node)
    w.layer(ltype, [x], [y], params or [], resource)


def simple(ltype: str) -> Rule:
    return lambda w, node: one(w, node, ltype)


def with_floats(ltype: str, *names_defaults) -> Rule:
    return lambda w, node: one(w, node, ltype, [float(node.params.get(n, d)) for n, d in names_defaults])


def clip(w: Writer, node: Node) -> None:
    lo, hi = node.params.get("min"), node.params.get("max")
    if lo is not None and hi is not None and (float(lo), float(hi)) == (0.0, 6.0):
        return simple("ReLU6")(w, node)
    x, y = _io(w, node)
    w.layer("Clip", [x], [y], [-np.inf if lo is None else float(lo), np.inf if hi is None else float(hi)])


def leaky_relu(w: Writer, node: Node) -> None:
    x, y = _io(w, node)
    w.layer("PReLU", [x], [y], [1, 0], [("name",), w.raw(F32([node.params.get("alpha", 0.01)]), False)])


def prelu(w: Writer, node: Node) -> None:
    slope = np.asarray(node.attrs["slope"], F32).reshape(-1)
    x, y = _io(w, node)
    w.layer("PReLU", [x], [y], [int(slope.size == 1), 0], [("name",), w.raw(slope, False)])


def gelu(w: Writer, node: Node) -> None:
    if node.params.get("approximate", "none") == "none":
        return simple("GELU")(w, node)
    # TNN's GELU is the erf form: write 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) out
    x, y = _io(w, node)
    steps = [("Power", [3.0, 1.0, 0.0], None), ("Mul", [1], F32(0.044715)), ("Add", [-1], "x"),
             ("Mul", [1], F32(np.sqrt(2 / np.pi))), ("Tanh", [], None), ("Add", [1], F32(1.0)),
             ("Mul", [1], F32(0.5)), ("Mul", [-1], "x")]
    src = x
    for k, (ltype, params, operand) in enumerate(steps):
        dst = y if k == len(steps) - 1 else w.tmp(f"gelu{k}")
        ins = [src, x] if operand == "x" else [src]
        res = [w.raw(operand, False)] if isinstance(operand, np.floating) else None
        w.layer(ltype, ins, [dst], params, res, name=f"{node.name}/{ltype.lower()}")
        src = dst


# -- normalization --------------------------------------------------------------------------------------------------
def batchnorm(w: Writer, node: Node) -> None:
    x, y = _io(w, node)
    w.layer("BatchNormCxx", [x], [y], [], [w.raw(node.attrs["scale"]), w.raw(node.attrs["bias"])])


def instance_norm(w: Writer, node: Node) -> None:
    c = w.shape(node.inputs[0])[1]
    scale = node.attrs.get("weight", np.ones(c, F32))
    bias = node.attrs.get("bias", np.zeros(c, F32))
    x, y = _io(w, node)
    w.layer("InstBatchNormCxx", [x], [y], [c, float(node.params.get("eps", 1e-5))], [w.raw(scale), w.raw(bias)])


def _affine_inputs(w: Writer, node: Node, shape: tuple[int, ...]) -> list[str]:
    gamma = node.attrs.get("weight", np.ones(shape, F32))
    beta = node.attrs.get("bias", np.zeros(shape, F32))
    return [w.name(node.inputs[0]), w.new_const(np.asarray(gamma, F32), "weight"),
            w.new_const(np.asarray(beta, F32), "bias")]


def layer_norm(w: Writer, node: Node) -> None:
    k = int(node.params.get("normalized_ndim", 1))
    shape = w.shape(node.inputs[0])[-k:]
    w.layer("LayerNorm", _affine_inputs(w, node, shape), [w.name(node.outputs[0])],
            [k, float(node.params.get("eps", 1e-5))])


def group_norm(w: Writer, node: Node) -> None:
    c = w.shape(node.inputs[0])[1]
    w.layer("GroupNorm", _affine_inputs(w, node, (c,)), [w.name(node.outputs[0])],
            [int(node.params["num_groups"]), float(node.params.get("eps", 1e-5))])


def lp_normalize(w: Writer, node: Node) -> None:
    x, y = _io(w, node)
    axis = int(node.params.get("axis", 1)) % len(w.shape(node.inputs[0]))
    w.layer("Normalize", [x], [y], [0, float(node.params.get("eps", 1e-12)), 0, axis, int(node.params.get("p", 2))])


# -- layout ----------------------------------------------------------------------------------------------------
def _reshape(w: Writer, x: str, y: str, shape: list[int], name: str | None = None) -> None:
    w.layer("Reshape", [x], [y], [0, len(shape), len(shape), *shape, 0], name=name)


def reshape(w: Writer, node: Node) -> None:
    shape = node.params.get("shape")
    if len(node.inputs) > 1:
        known = w.const_of(node.inputs[1])
        if known is None:
            w.unsupported("with a run-time shape")
        shape = [int(s) for s in known.reshape(-1)]
    x, y = _io(w, node)
    _reshape(w, x, y, [int(s) for s in shape])


def _static_reshape(w: Writer, node: Node) -> None:
    """Any layout-only op by its static output shape; leading dims shared with the input are copied (0)."""
    src, dst = w.shape(node.inputs[0]), list(w.shape(node.outputs[0]))
    same = 0
    while same < min(len(src), len(dst)) and src[same] == dst[same]:
        same += 1
    x, y = _io(w, node)
    _reshape(w, x, y, [0] * same + dst[same:])


def flatten(w: Writer, node: Node) -> None:
    rank = len(w.shape(node.inputs[0]))
    start, end = int(node.params.get("start_dim", 1)) % max(rank, 1), int(node.params.get("end_dim", -1)) % max(rank, 1)
    if start == 1 and end == rank - 1:
        x, y = _io(w, node)
        return w.layer("Flatten", [x], [y], [1])
    _static_reshape(w, node)


def _axes(w: Writer, node: Node, rank: int) -> list[int]:
    axes = node.params.get("axes")
    if axes is None:
        return [k for k, d in enumerate(w.shape(node.inputs[0])) if d == 1]
    return sorted(int(a) % rank for a in ([axes] if isinstance(axes, int) else axes))


def squeeze(w: Writer, node: Node) -> None:
    axes = _axes(w, node, len(w.shape(node.inputs[0])))
    x, y = _io(w, node)
    w.layer("Squeeze", [x], [y], [len(axes), *axes])


def unsqueeze(w: Writer, node: Node) -> None:
    axes = _axes(w, node, len(w.shape(node.outputs[0])))
    x, y = _io(w, node)
    w.layer("Unsqueeze", [x], [y], [len(axes), *axes])


def transpose(w: Writer, node: Node) -> None:
    perm = [int(p) for p in node.params["perm"]]
    x, y = _io(w, node)
    w.layer("Permute", [x], [y], [len(perm), *perm])


def identity(w: Writer, node: Node) -> None:
    if node.outputs[0] in w.graph.outputs:  # outputs keep their own names: copy through a no-op reshape
        x, y = _io(w, node)
        return _reshape(w, x, y, [0] * len(w.shape(node.inputs[0])))
    w.alias(node.outputs[0], node.inputs[0])


# -- tensors ----------------------------------------------------------------------------------------------------
def concat(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.outputs[0]))
    w.layer("Concat", [w.name(v) for v in node.inputs], [w.name(node.outputs[0])], [axis])


def stack(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.outputs[0]))
    parts = []
    for k, v in enumerate(node.inputs):
        parts.append(w.tmp(f"unsqueeze{k}"))
        w.layer("Unsqueeze", [w.name(v)], [parts[-1]], [1, axis], name=f"{node.name}/unsqueeze")
    w.layer("Concat", parts, [w.name(node.outputs[0])], [axis])


def split(w: Writer, node: Node) -> None:
    axis = int(node.params.get("axis", 0)) % len(w.shape(node.inputs[0]))
    sizes = [w.shape(v)[axis] for v in node.outputs]
    w.layer("SplitV", [w.name(node.inputs[0])], [w.name(v) for v in node.outputs], [axis, len(sizes), *sizes])


def slice_(w: Writer, node: Node) -> None:
    if len(node.inputs) > 1:  # bounds computed at run time: StridedSliceV2 would need them as listed inputs
        w.unsupported("with bounds computed at run time")
    starts, ends = [int(s) for s in node.params["starts"]], [min(int(e), INT_MAX) for e in node.params["ends"]]
    axes = [int(a) for a in node.params.get("axes") or range(len(starts))]
    steps = [int(s) for s in node.params.get("steps") or [1] * len(starts)]
    x, y = _io(w, node)
    w.layer("StridedSliceV2", [x], [y], [len(starts), *starts, len(ends), *ends, len(axes), *axes,
                                         len(steps), *steps])


def pad(w: Writer, node: Node) -> None:
    mode = node.params.get("mode", "constant")
    if mode not in PAD_CODES:
        w.unsupported(f"with mode {mode!r}")
    pads = [int(p) for p in node.params["pads"]]
    x, y = _io(w, node)
    w.layer("PadV2", [x], [y], [len(pads) // 2, *pads, PAD_CODES[mode], float(node.params.get("value", 0.0))])


def resize(w: Writer, node: Node) -> None:
    mode = {"nearest": 1, "bilinear": 2, "linear": 2}.get(node.params.get("mode", "nearest"))
    if mode is None:
        w.unsupported(f"with mode {node.params.get('mode')!r}")
    oh, ow = w.shape(node.outputs[0])[2:]
    x, y = _io(w, node)
    w.layer("Upsample", [x], [y], [mode, 0.0, 0.0, int(bool(node.params.get("align_corners"))), oh, ow])


def gather(w: Writer, node: Node) -> None:
    data, idx = node.inputs
    axis = int(node.params.get("axis", 0)) % len(w.shape(data))
    res: list = [("int", int(data.is_const))]
    if data.is_const:
        if w.version == 1 and np.asarray(data.const).ndim != 1:
            w.unsupported("with a constant table of rank > 1 in a v1 file")
        res.append(w.raw(data.const))
    res.append(("int", int(idx.is_const)))
    if idx.is_const:
        if w.version == 1 and np.asarray(idx.const).ndim != 1:
            w.unsupported("with constant indices of rank != 1 in a v1 file")
        res.append(w.raw(np.asarray(idx.const).astype(np.int32), False))
    ins = [w.name(v) for v in node.inputs if not v.is_const]
    w.layer("Gather", ins, [w.name(node.outputs[0])], [axis, int(data.is_const), int(idx.is_const)], res)


def cast(w: Writer, node: Node) -> None:
    code = DTYPE_CODES.get(np.dtype(node.params["to"]))
    if code is None:
        w.unsupported(f"to {node.params['to']}")
    x, y = _io(w, node)
    w.layer("Cast", [x], [y], [code])


def reduce(ltype: str) -> Rule:
    def run(w: Writer, node: Node) -> None:
        rank = len(w.shape(node.inputs[0]))
        axes = node.params.get("axes")
        axes = list(range(rank)) if axes is None or len(axes) == 0 else sorted(int(a) % rank for a in axes)
        x, y = _io(w, node)
        w.layer(ltype, [x], [y], [int(bool(node.params.get("keepdims", False))), *axes])
    return run


def softmax(ltype: str) -> Rule:
    def run(w: Writer, node: Node) -> None:
        x, y = _io(w, node)
        w.layer(ltype, [x], [y], [int(node.params.get("axis", -1)) % len(w.shape(node.inputs[0]))])
    return run


def attention(w: Writer, node: Node) -> None:
    """softmax(q k^T * scale + mask) v, written out as TNN layers."""
    if node.params.get("is_causal") or (len(node.inputs) > 3 and node.inputs[3].dtype == np.bool_):
        w.unsupported("with a causal or boolean mask")
    q, k, v = node.inputs[:3]
    rank = len(w.shape(q))
    scale = node.params.get("scale") or 1.0 / np.sqrt(w.shape(q)[-1])
    kt, scores, scaled, probs = w.tmp("kt"), w.tmp("scores"), w.tmp("scaled"), w.tmp("probs")
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    w.layer("Permute", [w.name(k)], [kt], [rank, *perm], name=f"{node.name}/kt")
    w.layer("MatMul", [w.name(q), kt], [scores], [-1], name=f"{node.name}/qk")
    w.layer("Mul", [scores], [scaled], [1], [w.raw(F32(scale), False)], name=f"{node.name}/scale")
    if len(node.inputs) > 3:
        masked = w.tmp("masked")
        w.layer("Add", [scaled, w.name(node.inputs[3])], [masked], [-1], name=f"{node.name}/mask")
        scaled = masked
    w.layer("SoftmaxCaffe", [scaled], [probs], [rank - 1], name=f"{node.name}/softmax")
    w.layer("MatMul", [probs, w.name(v)], [w.name(node.outputs[0])], [-1], name=f"{node.name}/pv")


MORE_RULES: dict[str, Rule] = {
    "Relu": simple("ReLU"), "Sigmoid": simple("Sigmoid"), "Tanh": simple("Tanh"), "Silu": simple("Swish"),
    "Softplus": simple("Softplus"), "Gelu": gelu, "Clip": clip, "LeakyRelu": leaky_relu, "PRelu": prelu,
    "HardSwish": with_floats("HardSwish", ("alpha", 1 / 6), ("beta", 0.5)),
    "HardSigmoid": with_floats("HardSigmoid", ("alpha", 0.2), ("beta", 0.5)),
    "Elu": with_floats("Elu", ("alpha", 1.0)),
    **{op: simple(op) for op in ("Abs", "Exp", "Log", "Neg", "Sqrt", "Rsqrt", "Square", "Floor", "Ceil", "Sign",
                                 "Reciprocal", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Not")},
    "BatchNorm": batchnorm, "InstanceNorm": instance_norm, "LayerNorm": layer_norm, "GroupNorm": group_norm,
    "LpNormalize": lp_normalize,
    "Reshape": reshape, "Flatten": flatten, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Transpose": transpose,
    "Identity": identity,
    "ChannelShuffle": lambda w, n: one(w, n, "ShuffleChannel", [int(n.params["groups"])]),
    "PixelShuffle": lambda w, n: one(w, n, "PixelShuffle", [int(n.params["upscale"])]),
    "Concat": concat, "Stack": stack, "Split": split, "Slice": slice_, "Pad": pad, "Resize": resize,
    "Gather": gather, "Cast": cast, "Softmax": softmax("SoftmaxCaffe"), "LogSoftmax": softmax("LogSoftmax"),
    "Attention": attention,
    **{op: reduce(op) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                 "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
}

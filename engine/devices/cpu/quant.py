"""CPU kernels of TNN's int8 ops (engine/ops/quant.py) on NCHW values: numba loops bit-exact with the references,
and TnnQInnerProduct on the int8 conv kernel of int8/conv.py. With oneDNN, the device's int8 rewrite moves most of
these ops to their NHWC twins (int8/kernels.py, TnnQRelu's kernel included)."""

from __future__ import annotations

import weakref

import numpy as np

from engine.devices.cpu.int8 import kernels as int8_kernels
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.devices.cpu.loops import quant as QK
from engine.devices.cpu.threads import parallel_for
from engine.errors import KernelError, ShapeError
from engine.ir import Node
from engine.ops.quant import F32, I8, conv_geometry, pool_geometry, qconv_factors, refuse_nan
from engine.ops.registry import TensorInfo


def _per_channel(node: Node, key: str, shape) -> np.ndarray:
    """A scale attr as one float32 per channel (axis 1) of `shape`, as the references broadcast it."""
    c = int(shape[1]) if len(shape) >= 2 else 1
    s = np.asarray(node.attrs[key], dtype=F32).reshape(-1)
    if s.size != 1 and len(shape) >= 2 and s.size != c:
        raise ShapeError(f"{node.where()}: {s.size} scales for {c} channels")
    return np.ascontiguousarray(np.broadcast_to(s if s.size == c else s[:1], (c,)))


def _rows(a: np.ndarray) -> np.ndarray:
    """(n, c, rest) view of an array with channels on axis 1 (one row for 0/1-d arrays)."""
    return a.reshape(a.shape[0], a.shape[1], -1) if a.ndim >= 2 else a.reshape(1, 1, -1)


def _items(a: np.ndarray) -> int:
    return a.shape[0] * a.shape[1] if a.ndim >= 2 else 1


def _scale_kernel(fn, key: str, finite: bool = False):
    """`finite`: refuse a NaN input (quantizing to int8: refuse_nan)."""
    def build(backends: Backends, node: Node, ins: list[TensorInfo]):
        scale = _per_channel(node, key, ins[0].shape)

        def run(inputs, outputs, workspace):
            x = inputs[0]
            if finite:
                refuse_nan(node, x)
            parallel_for(fn, _items(x), x.size, _rows(x), scale, _rows(outputs[0]))
        return run
    return build


def build_qadd(backends: Backends, node: Node, ins: list[TensorInfo]):
    sa, sb, so = (_per_channel(node, k, ins[0].shape) for k in ("scale_a", "scale_b", "scale_out"))

    def run(inputs, outputs, workspace):
        a, b = inputs
        parallel_for(QK.add, _items(a), a.size, _rows(a), _rows(b), sa, sb, so, _rows(outputs[0]))
    return run


def build_qpool(backends: Backends, node: Node, ins: list[TensorInfo]):
    is_max = node.params.get("mode", "max") == "max"

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        _, (kh, kw), (sh, sw), (ph, pw) = pool_geometry(node, x.shape)
        parallel_for(QK.pool, _items(x), out.size * kh * kw, x, out, kh, kw, sh, sw, ph, pw, is_max)
    return run


def build_qconcat(backends: Backends, node: Node, ins: list[TensorInfo]):
    axis = int(node.params.get("axis", 1))
    factors = [F32.type(s) for s in node.attrs["scales"]] if "scales" in node.attrs else None
    s_out = F32.type(node.attrs["scale_out"].reshape(-1)[0]) if factors else None

    def run(inputs, outputs, workspace):
        out, at = outputs[0], 0
        ax = axis % out.ndim
        for i, a in enumerate(inputs):
            view = out[(slice(None),) * ax + (slice(at, at + a.shape[ax]),)]
            at += a.shape[ax]
            if factors is None:
                view[...] = a
            elif view.flags.c_contiguous:
                QK.requantize(a.reshape(-1), factors[i], s_out, view.reshape(-1))
            else:  # a strided slab: requantize row by row along the leading axes
                for idx in np.ndindex(*a.shape[:ax]):
                    QK.requantize(a[idx].reshape(-1), factors[i], s_out, view[idx].reshape(-1))
    return run


_ACTS, _FUSIONS = {None: 0, "relu": 1, "relu6": 2}, {None: 0, "add_then_act": 1, "act_then_add": 2}


def qconv_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    n, o, oh, ow = conv_geometry(node, ins[0].shape)[0]
    return n * o * oh * ow * 4  # the int32 sums


def build_qconv(backends: Backends, node: Node, ins: list[TensorInfo]):
    w = np.ascontiguousarray(node.attrs["weight"], dtype=I8)
    o = w.shape[0]
    bias = np.ascontiguousarray(np.broadcast_to(np.asarray(node.attrs["bias"], np.int32).reshape(-1), (o,)))
    scale, top = qconv_factors(node)
    add_scale = np.ascontiguousarray(np.broadcast_to(
        np.asarray(node.attrs.get("add_scale", 0), F32).reshape(-1), (o,)))
    act, fusion = _ACTS[node.params.get("activation")], _FUSIONS[node.params.get("fusion")]
    w2 = w.reshape(o, -1)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        (n, _, oh, ow), (kh, kw), (sh, sw), (dh, dw), (t, l), g = conv_geometry(node, x.shape)
        pointwise = (kh, kw, sh, sw, t, l) == (1, 1, 1, 1, 0, 0)
        acc = _int32_scratch(workspace, node, n * o * oh * ow).reshape(n * o, oh * ow)
        work = n * o * oh * ow * w[0].size
        if pointwise:
            parallel_for(QK.pointwise_accumulate, n * o, work, _rows(x), w2, bias, acc, g)
        else:
            parallel_for(QK.conv_accumulate, n * o, work, x, w, bias, acc, oh, ow, sh, sw, dh, dw, t, l, g)
        z = _rows(inputs[1]) if fusion else _rows(out)
        parallel_for(QK.conv_epilogue, n * o, out.size, acc, scale, z, add_scale, top, act, fusion, _rows(out))
    return run


def _as_pointwise(node: Node) -> Node:
    """TnnQInnerProduct as the 1x1 int8 conv it is on its input viewed (1, 1, N, K): the NHWC conv kernel's node."""
    w = node.attrs["weight"]
    attrs = {"weight": w.reshape(w.shape[0], w.shape[1], 1, 1), "bias": node.attrs["bias"],
             "scale": qconv_factors(node)[0]}
    params = {"groups": 1, "stride": (1, 1), "pads": (0, 0, 0, 0), "dilation": (1, 1), "activation": None}
    return Node("Int8ConvNhwc", node.name, params=params, attrs=attrs, source=node.source)


_POINTWISE: weakref.WeakKeyDictionary[Node, Node] = weakref.WeakKeyDictionary()


def _pointwise(node: Node) -> Node:
    """One conv node per inner product: the workspace sizer and the builder then share its kernel spec."""
    conv = _POINTWISE.get(node)
    if conv is None:
        conv = _POINTWISE[node] = _as_pointwise(node)
    return conv


def _rows_info(ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = ins[0].shape
    return [TensorInfo((1, 1, shape[0], int(np.prod(shape[1:], dtype=np.int64))), I8)]


def build_qinner_product(backends: Backends, node: Node, ins: list[TensorInfo]):
    """Runs on the NHWC int8 conv kernel (oneDNN where exact, engine/devices/cpu/int8/conv.py), the batch as the
    pixels of one image: oneDNN's 1x1 kernels block over pixels, and N images of one pixel each ran 10-20x slower
    than one of N pixels at batch 8 (MobileNetV2's classifier)."""
    inner = int8_kernels.build_conv(backends, _pointwise(node), _rows_info(ins))

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        inner([x.reshape(1, 1, x.shape[0], -1)], [out.reshape(1, 1, out.shape[0], -1)], workspace)
    run.impl = inner.impl  # type: ignore[attr-defined]
    return run


def qinner_product_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    return int8_kernels.conv_workspace(backends, _pointwise(node), _rows_info(ins))


def _int32_scratch(workspace: np.ndarray | None, node: Node, count: int) -> np.ndarray:
    if workspace is None or workspace.nbytes < count * 4:
        raise KernelError(f"{node.where()}: {node.op_type} needs {count * 4} bytes of workspace")
    return workspace.reshape(-1).view(np.uint8)[:count * 4].view(np.int32)


KERNELS = {
    "TnnQuantize": CpuKernel(_scale_kernel(QK.quantize, "scale", finite=True)),
    "TnnDequantize": CpuKernel(_scale_kernel(QK.dequantize, "scale")),
    "TnnQConv": CpuKernel(build_qconv, qconv_workspace),
    "TnnQInnerProduct": CpuKernel(build_qinner_product, qinner_product_workspace),
    "TnnQAdd": CpuKernel(build_qadd),
    "TnnQPool": CpuKernel(build_qpool),
    "TnnQConcat": CpuKernel(build_qconcat),
}

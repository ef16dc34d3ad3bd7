"""Conv on oneDNN for float32 2-D convolutions with zero padding (any groups, strides, dilations, pads).

oneDNN picks blocked layouts (`format_tag_any`); a run reorders NCHW x into the instance workspace, convolves
into a blocked dst there and reorders it into the output view (a reorder is skipped when the chosen layout is
plain NCHW). The weights are reordered once into the primitive's layout. Bias is the primitive's; SPEC.md's
epilogue `y = act(conv + bias + z)` is a `sum` post-op (z reordered into dst first) then an eltwise post-op
when oneDNN has the same function, else our apply_activation on the NCHW output. Workspace layout (each part
64-byte aligned): blocked src | blocked dst | scratchpad. Primitives depend on the shape: the max-shape one is
built with the kernel, smaller shapes get theirs on first use (cached).
"""

from __future__ import annotations

import logging

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, conv_geom, weight_of
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")
_F32_MAX = float(np.finfo(np.float32).max)


def supported(node: Node, ins: list[TensorInfo]) -> bool:
    """Whether oneDNN computes this conv (float32, 2-D, zero padding); the caller checks oneDNN is on."""
    if np.dtype(ins[0].dtype) != np.float32 or len(ins[0].shape) != 4:
        return False
    return (node.params.get("pad_mode") or "zeros") == "zeros"


def eltwise(name: str | None, params: dict | None) -> tuple[str, float, float] | None:
    """The oneDNN eltwise post-op (alg, alpha, beta) computing the same function as our activation `name`."""
    p = params or {}

    def get(key: str, default: float) -> float:
        v = p.get(key)
        return default if v is None else float(v)

    if name == "relu":
        return "relu", 0.0, 0.0
    if name == "leaky_relu":
        return "relu", get("alpha", 0.01), 0.0
    if name == "relu6":
        return "clip", 0.0, 6.0
    if name == "clip":
        return "clip", get("min", -_F32_MAX), get("max", _F32_MAX)
    if name == "sigmoid":
        return "logistic", 0.0, 0.0
    if name == "silu":
        return "swish", 1.0, 0.0
    if name == "tanh":
        return "tanh", 0.0, 0.0
    if name == "elu":
        return "elu", get("alpha", 1.0), 0.0
    if name in ("hardswish", "hardsigmoid"):
        return name, get("alpha", 1 / 6), get("beta", 0.5)
    if name == "gelu":
        return ("gelu_tanh" if p.get("approximate", "none") == "tanh" else "gelu_erf"), 0.0, 0.0
    return None


class _Conv:
    """The node's fixed parts: weights, bias, post-ops; weights kept in every layout a primitive asked for."""

    def __init__(self, node: Node):
        self.node = node
        self.w = np.ascontiguousarray(weight_of(node), np.float32)
        self.bias = node.attrs.get("bias")
        if self.bias is not None:
            self.bias = np.ascontiguousarray(np.ravel(self.bias), np.float32)
        self.act = node.params.get("activation"), node.params.get("activation_params")
        self.elt = eltwise(*self.act)
        self.weights: list[tuple[D.MemoryDesc, np.ndarray]] = []

    op = "Conv"

    def geom(self, shape: tuple[int, ...]) -> ConvGeom:
        return conv_geom(self.node, shape)

    def wshape(self, geo: ConvGeom) -> tuple[int, ...]:
        g = geo.groups
        kh, kw = geo.kh, geo.kw
        return (geo.o, geo.c, kh, kw) if g == 1 else (g, geo.o // g, geo.c // g, kh, kw)

    def w_plain(self, geo: ConvGeom) -> D.MemoryDesc:
        """How self.w is laid out, in oneDNN's weight dims."""
        return D.MemoryDesc.plain(self.wshape(geo))

    def primitive_desc(self, geo: ConvGeom, shape: tuple[int, ...], b_md: D.MemoryDesc | None,
                       attr: D.Attr) -> D.PrimitiveDesc:
        # Locals keep the descriptors alive through the call (a temporary's handle would be freed first).
        x_any, w_any, y_any = (D.MemoryDesc.any(s) for s in (shape, self.wshape(geo), geo.out_shape))
        return D.PrimitiveDesc.create(
            "dnnl_convolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
            L.CONVOLUTION_DIRECT, x_any.h, w_any.h, None if b_md is None else b_md.h, y_any.h, L.dims(geo.stride),
            L.dims(d - 1 for d in geo.dilation), L.dims(geo.pads[:2]), L.dims(geo.pads[2:]), attr.h)

    def post_ops(self, residual: bool) -> list[tuple]:
        ops: list[tuple] = [("sum",)] if residual else []
        return ops + ([self.elt] if self.elt else [])

    def weights_in(self, md: D.MemoryDesc, geo: ConvGeom) -> np.ndarray:
        for have, buf in self.weights:
            if have == md:
                return buf
        buf = D.reorder_into(self.w, self.w_plain(geo), md)
        self.weights.append((md, buf))
        return buf


class _Plan:
    """The primitives for one input shape, and where their buffers go in the workspace."""

    def __init__(self, conv: _Conv, shape: tuple[int, ...], residual: bool):
        geo = conv.geom(shape)
        self.geo, self.residual = geo, residual
        x_plain, y_plain = D.MemoryDesc.plain(shape), D.MemoryDesc.plain(geo.out_shape)
        b_md = D.MemoryDesc.plain((geo.o,)) if conv.bias is not None else None
        self.pd = conv.primitive_desc(geo, shape, b_md, D.Attr(conv.post_ops(residual)))
        src, wts, dst, pad = (self.pd.md(q) for q in (L.QUERY_SRC_MD, L.QUERY_WEIGHTS_MD, L.QUERY_DST_MD,
                                                       L.QUERY_SCRATCHPAD_MD))
        self.weights = conv.weights_in(wts, geo)
        self.bias = conv.bias
        args = {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}
        if b_md is not None:
            args[L.ARG_BIAS] = b_md
        self.conv = D.Step(D.Primitive(self.pd), args)
        self.src_in = None if src == x_plain else D.reorder_step(x_plain, src)
        blocked = not dst == y_plain
        self.dst_out = D.reorder_step(dst, y_plain) if blocked else None
        self.z_in = D.reorder_step(y_plain, dst) if blocked and residual else None
        self.src_bytes = D.aligned(src.nbytes) if self.src_in else 0
        self.dst_bytes = D.aligned(dst.nbytes) if blocked else 0
        self.pad_bytes = D.aligned(pad.nbytes)
        self.private: np.ndarray | None = None  # only when the instance workspace is too small for this shape

    @property
    def nbytes(self) -> int:
        return self.src_bytes + self.dst_bytes + self.pad_bytes

    @property
    def impl(self) -> str:
        return self.pd.impl

    def base(self, workspace: np.ndarray | None) -> int:
        ptr, size = D.workspace_base(workspace)
        if size >= self.nbytes:
            return ptr
        if self.private is None:  # a layout for a smaller shape that needs more room than the max shape's
            log.debug("oneDNN conv %s at %s: %d bytes beyond the workspace, own buffer", self.geo, self.impl,
                      self.nbytes)
            self.private = D.aligned_buffer(self.nbytes)
        return self.private.ctypes.data

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None) -> None:
        base = self.base(workspace)
        src = D.address(x)
        if self.src_in is not None:
            self.src_in.run({L.ARG_SRC: src, L.ARG_DST: base})
            src = base
        dst = base + self.src_bytes if self.dst_out is not None else D.address(out)
        if z is not None:
            if self.z_in is not None:
                self.z_in.run({L.ARG_SRC: D.address(z), L.ARG_DST: dst})
            else:
                np.copyto(out, z)
        ptrs = {L.ARG_SRC: src, L.ARG_WEIGHTS: self.weights.ctypes.data, L.ARG_DST: dst,
                L.ARG_SCRATCHPAD: base + self.src_bytes + self.dst_bytes}
        if self.bias is not None:
            ptrs[L.ARG_BIAS] = self.bias.ctypes.data
        self.conv.run(ptrs)
        if self.dst_out is not None:
            self.dst_out.run({L.ARG_SRC: dst, L.ARG_DST: D.address(out)})
        D.wait()


def workspace(node: Node, ins: list[TensorInfo], kind: type[_Conv] = _Conv) -> int:
    """Bytes for the max shape's blocked src, blocked dst and scratchpad, plus room to align the start."""
    D.sync_threads()
    return _Plan(kind(node), tuple(ins[0].shape), len(ins) > 1).nbytes + D.ALIGN


def build(node: Node, ins: list[TensorInfo], kind: type[_Conv] = _Conv) -> Kernel:
    conv = kind(node)
    residual = len(ins) > 1
    D.sync_threads()
    max_shape = tuple(ins[0].shape)
    first = _Plan(conv, max_shape, residual)
    plans = {max_shape: first}
    late = conv.elt is None and conv.act[0] is not None

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if residual else None
        D.sync_threads()
        plan = plans.get(x.shape)
        if plan is None:
            if any(a > b for a, b in zip(x.shape, max_shape, strict=True)):
                raise KernelError(f"{node.where()}: {conv.op} input {x.shape} is beyond the max shape {max_shape} "
                                  f"its workspace was planned for")
            plan = plans[x.shape] = _Plan(conv, x.shape, residual)
            log.debug("%s: oneDNN %s for input %s: %s", node.where(), conv.op, x.shape, plan.impl)
        plan.run(x, z, out, workspace)
        if late:
            apply_activation(conv.act[0], conv.act[1], out)

    log.debug("%s: oneDNN %s for input %s: %s", node.where(), conv.op, max_shape, first.impl)
    run.impl = f"onednn:{first.impl}"  # type: ignore[attr-defined]
    run.plans = plans  # type: ignore[attr-defined]
    return run

"""CPU kernels of the activations (engine/ops/activation.py): numba loops or ufunc chains that may run with the
output sharing the input's buffer; integer activations (rare) run the reference. With oneDNN, large float32
tensors of the transcendental ones (tanh GELU, tanh, ELU, hard-swish, ...) run its eltwise primitive
(onednn/unary.py: vectorised, threaded), the loops the rest; float32 SiLU, sigmoid and erf GELU run vectorised
rational approximations over the engine's threads (epilogue.py), faster than oneDNN's."""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.epilogue import gelu_f32, pass_records, sigmoid_f32, silu_f32
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, reference_fallback
from engine.devices.cpu.loops import pointwise as mk
from engine.devices.cpu.onednn import unary
from engine.devices.cpu.onednn.eltwise import ours, unless_ours
from engine.ir import Node
from engine.ops import activation
from engine.ops.activation import clip_bounds, param, prelu_slope
from engine.ops.registry import TensorInfo


def _flat_loop(loop, dtype, *args):
    """Kernel from a numba loop over flat views (x may be the output buffer), compiled now for `dtype`."""
    loop(empty(1, dtype), empty(1, dtype), *args)

    def run(inputs, outputs, workspace):
        loop(np.ascontiguousarray(inputs[0]).reshape(-1), outputs[0].reshape(-1), *args)
    return run


def _rational_kernel(name: str):
    """A float32 sigmoid, SiLU or erf GELU by the epilogue's pass (_RATIONAL_F32), recorded into native programs
    as the pass's region function (epilogue.pass_records): the loops its Python path runs."""
    f32_pass, kind = _RATIONAL_F32[name], _PASS_KIND[name]
    mk.pass_team()  # compiled (or loaded) with the kernel

    def run(inputs, outputs, workspace):
        f32_pass(np.ascontiguousarray(inputs[0]).reshape(-1), outputs[0].reshape(-1))

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if not (x.dtype == out.dtype == np.float32 and x.size == out.size and x.flags.c_contiguous
                and out.flags.c_contiguous):
            return None
        got = pass_records(kind, x, out)
        return None if got is None else Native(got[0], [], got[1])

    run.native = native  # type: ignore[attr-defined]
    return run


def _ufunc(fn):
    def run(inputs, outputs, workspace):
        fn(inputs[0], outputs[0])
    return run


def _prelu_kernel(node: Node, ins: list[TensorInfo]):
    slope = np.ascontiguousarray(prelu_slope(node, np.empty(ins[0].shape, np.uint8)), dtype=ins[0].dtype)
    if slope.size == 1:  # one shared slope is a leaky relu
        return _flat_loop(mk.leaky_relu_loop, slope.dtype, float(slope[0]))
    mk.prelu_loop(empty(3, slope.dtype), empty(3, slope.dtype), slope)

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        view = (x.shape[0], x.shape[1], -1) if x.ndim >= 2 else (1, x.size, 1)
        mk.prelu_loop(x.reshape(view), out.reshape(view), slope)
    return run


# op -> (the fused-epilogue name oneDNN's eltwise mapping knows, its params)
_EPILOGUE = {"Gelu": ("gelu", ("approximate",)), "Silu": ("silu", ()), "Sigmoid": ("sigmoid", ()),
             "Tanh": ("tanh", ()), "Elu": ("elu", ("alpha",)), "HardSwish": ("hardswish", ("alpha", "beta")),
             "HardSigmoid": ("hardsigmoid", ("alpha", "beta")), "LeakyRelu": ("leaky_relu", ("alpha",))}


# the epilogue's vectorised rational passes over the engine's threads, for the float32 activations that
# eltwise.ours says they compute faster than oneDNN's exp-based eltwise
_RATIONAL_F32 = {"sigmoid": sigmoid_f32, "silu": silu_f32, "gelu": gelu_f32}
_PASS_KIND = {"sigmoid": mk.PASS_SIGMOID, "silu": mk.PASS_SILU, "gelu": mk.PASS_GELU}


def _epilogue_of(node: Node) -> tuple[str, dict]:
    """The op as a fused-epilogue activation: its name and the params that name takes (node.op_type in _EPILOGUE)."""
    name, keys = _EPILOGUE[node.op_type]
    return name, {k: node.params[k] for k in keys if node.params.get(k) is not None}


def build(backends: Backends, node: Node, ins: list[TensorInfo]):
    loop = _build_loop(node, ins)
    if backends.onednn and np.dtype(ins[0].dtype) == np.float32 and node.op_type in _EPILOGUE:
        elt = unless_ours(*_epilogue_of(node))
        if elt is not None and len(elt) == 1:  # a longer chain (ReLU-like clamps keeping NaN) is our loop's work
            return unary.build(unary.eltwise_desc(*elt[0]), lambda shape: (int(np.prod(shape)),), loop,
                               f"eltwise_{elt[0][0]}", tuple(ins[0].shape))
    return loop


def _build_loop(node: Node, ins: list[TensorInfo]):
    op, dt = node.op_type, np.dtype(ins[0].dtype)
    if dt not in (np.float32, np.float64):
        return reference_fallback(node, activation.reference)  # integer activations are rare
    if op == "Relu":
        return _ufunc(lambda x, out: np.maximum(x, 0, out=out))
    if op == "Clip":
        lo, hi = clip_bounds(node)
        return _ufunc(lambda x, out: np.clip(x, lo, hi, out=out))
    if op == "Tanh":
        return _ufunc(lambda x, out: np.tanh(x, out=out))
    if op == "PRelu":
        return _prelu_kernel(node, ins)
    if dt == np.float32 and op in _EPILOGUE and ours(*_epilogue_of(node)):
        return _rational_kernel(_EPILOGUE[op][0])
    if op == "Gelu":
        return _flat_loop(mk.gelu_tanh_loop if param(node, "approximate", "none") == "tanh" else mk.gelu_loop, dt)
    loops = {
        "LeakyRelu": (mk.leaky_relu_loop, float(param(node, "alpha", 0.01))),
        "Sigmoid": (mk.sigmoid_loop,), "Silu": (mk.silu_loop,), "Mish": (mk.mish_loop,),
        "HardSwish": (mk.hardswish_loop, float(param(node, "alpha", 1 / 6)), float(param(node, "beta", 0.5))),
        "HardSigmoid": (mk.hardsigmoid_loop, float(param(node, "alpha", 1 / 6)), float(param(node, "beta", 0.5))),
        "Elu": (mk.elu_loop, float(param(node, "alpha", 1.0))),
        "Softplus": (mk.softplus_loop, float(param(node, "beta", 1.0)), float(param(node, "threshold", 20.0))),
    }
    loop, *args = loops[op]
    return _flat_loop(loop, dt, *args)


KERNELS = {name: CpuKernel(build) for name in activation.REFERENCES}

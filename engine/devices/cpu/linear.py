"""CPU kernels of Gemm and MatMul (engine/ops/linear.py): the BLAS GEMM (blas.py), then Gemm's bias and activation
fused into one numba pass over the output."""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.kernel import Backends, CpuKernel, packed
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.linear import gemm_weight
from engine.ops.registry import TensorInfo


def build_gemm(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    w = gemm_weight(node)
    matmul = backends.blas.matmul
    dtype = np.dtype(ins[0].dtype)
    wt = packed(w.T, dtype)  # (K, N): x @ wt reads both operands row-major
    bias = node.attrs.get("bias")
    has_bias = bias is not None
    bias = packed(np.ravel(bias), dtype) if has_bias else np.zeros(1, dtype)
    act, params = node.params.get("activation"), node.params.get("activation_params")
    code = E.act_code(act, params)
    c, *p = code or (E.ACT_NONE, 0.0, 0.0, 0.0)
    p = [dtype.type(v) for v in p]
    k, n = wt.shape

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        out = outputs[0].reshape(-1, n)
        matmul(x.reshape(-1, k), wt, out)
        if has_bias or c:
            parallel_for(E.epilogue_cols, out.shape[0], out.size, out, bias, has_bias, c, *p)
        if code is None:
            apply_activation(act, params, out)
    return run


def build_matmul(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    matmul = backends.blas.matmul
    # A constant operand (a weight) is packed once: file-backed data may be unaligned, which costs a copy per call.
    consts = [None if i.value is None or i.dtype.kind != "f" else packed(i.value, i.dtype) for i in ins[:2]]

    def run(inputs, outputs, workspace):
        a, b = (c if c is not None else x for c, x in zip(consts, inputs, strict=False))
        matmul(a, b, outputs[0])
    return run


KERNELS = {"Gemm": CpuKernel(build_gemm), "MatMul": CpuKernel(build_matmul)}

"""CPU kernels of Gemm and MatMul (engine/ops/linear.py).

float32 with oneDNN on (the default install): oneDNN's matmul primitive (onednn/matmul.py), the weight packed once
at build, bias, residual and activation fused into the primitive. Otherwise the BLAS GEMM (blas.py), then Gemm's
bias, residual and activation in one numba pass over the output.
"""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.epilogue import activation_records, apply_activation
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import Backends, CpuKernel, packed
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn.eltwise import eltwise
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.linear import einsum_shape, gemm_weight, matmul_shape
from engine.ops.registry import TensorInfo

_F32 = np.dtype(np.float32)


def _on_onednn(backends: Backends, ins: list[TensorInfo]) -> bool:
    return backends.onednn and all(np.dtype(i.dtype) == _F32 for i in ins)


def _gemm_onednn(node: Node, ins: list[TensorInfo]) -> tuple[dnn.Gemm, tuple | None]:
    act, params = node.params.get("activation"), node.params.get("activation_params")
    elt = eltwise(act, params)
    late = (act, params) if elt is None and act is not None else None
    return dnn.Gemm(gemm_weight(node), node.attrs.get("bias"), elt, residual=len(ins) > 1), late


def build_gemm(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if _on_onednn(backends, ins):
        return _build_gemm_onednn(node, ins)
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
    residual = len(ins) > 1

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        out = outputs[0].reshape(-1, n)
        matmul(x.reshape(-1, k), wt, out)
        if residual:  # act(x W^T + b + z): z joins before the activation
            out += inputs[1].reshape(-1, n)
        if has_bias or c:
            parallel_for(E.epilogue_cols, out.shape[0], out.size, out, bias, has_bias, c, *p)
        if code is None:
            apply_activation(act, params, out)
    return run


def _build_gemm_onednn(node: Node, ins: list[TensorInfo]) -> Kernel:
    gemm, late = _gemm_onednn(node, ins)
    first = gemm.plan(int(np.prod(ins[0].shape[:-1])))
    residual = len(ins) > 1

    def run(inputs, outputs, workspace):
        out = outputs[0]
        gemm.run(np.ascontiguousarray(inputs[0]), np.ascontiguousarray(inputs[1]) if residual else None, out,
                 workspace)
        if late is not None:
            apply_activation(late[0], late[1], out)

    def native(inputs, outputs, workspace):
        x, z = inputs[0], inputs[1] if residual else None
        if not x.flags.c_contiguous or (z is not None and not z.flags.c_contiguous):
            return None
        got = gemm.records(x, z, outputs[0], workspace)
        act = activation_records(late[0], late[1], outputs[0]) if late is not None else ([], [])
        if got is None or act is None:
            return None
        return Native(got.records + act[0], got.checks, got.keep + act[1])

    run.native = native  # type: ignore[attr-defined]
    run.impl = f"onednn:{first.impl}"  # type: ignore[attr-defined]
    return run


def gemm_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    if not _on_onednn(backends, ins):
        return 0
    gemm, _ = _gemm_onednn(node, ins)
    return dnn.scratchpad_bytes(gemm.plan(int(np.prod(ins[0].shape[:-1]))))


def _onednn_matmul_ok(backends: Backends, ins: list[TensorInfo]) -> bool:
    return _on_onednn(backends, ins) and all(len(i.shape) >= 2 for i in ins[:2])


def build_matmul(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if _onednn_matmul_ok(backends, ins):
        mm = dnn.MatMul(ins[1].value if ins[1].value is not None else None)
        b_const = mm.b_const
        a_const = None if ins[0].value is None else np.ascontiguousarray(ins[0].value, np.float32)

        def run_onednn(inputs, outputs, workspace):
            a = a_const if a_const is not None else inputs[0]
            b = b_const if b_const is not None else inputs[1]
            mm.run(a, b, outputs[0], workspace)

        def native(inputs, outputs, workspace):
            a = a_const if a_const is not None else inputs[0]
            b = b_const if b_const is not None else inputs[1]
            return mm.records(a, b, outputs[0], workspace)

        run_onednn.native = native  # type: ignore[attr-defined]
        run_onednn.impl = "onednn:matmul"  # type: ignore[attr-defined]
        return run_onednn
    matmul = backends.blas.matmul
    # A constant operand (a weight) is packed once: file-backed data may be unaligned, which costs a copy per call.
    consts = [None if i.value is None or i.dtype.kind != "f" else packed(i.value, i.dtype) for i in ins[:2]]

    def run(inputs, outputs, workspace):
        a, b = (c if c is not None else x for c, x in zip(consts, inputs, strict=False))
        matmul(a, b, outputs[0])
    return run


def matmul_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    if not _onednn_matmul_ok(backends, ins):
        return 0
    a, b = tuple(ins[0].shape), tuple(ins[1].shape)
    out = matmul_shape(node, a, b)
    mm = dnn.MatMul(None if ins[1].value is None else np.asarray(ins[1].value, np.float32))
    return dnn.scratchpad_bytes(mm.plan_for(a, b, out))


def _einsum_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # numpy's einsum with its contraction order search (it hands pairwise products to BLAS), in the operands' type
    equation = str(node.params["equation"]).replace(" ", "")

    def run(inputs, outputs, workspace):
        einsum_shape(node, [x.shape for x in inputs])
        np.copyto(outputs[0], np.einsum(equation, *inputs, optimize=True), casting="unsafe")
    return run


KERNELS = {"Gemm": CpuKernel(build_gemm, gemm_workspace), "MatMul": CpuKernel(build_matmul, matmul_workspace),
           "Einsum": CpuKernel(_einsum_kernel)}

"""Gemm and MatMul CPU kernels vs the references (also below max shape, unaligned weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_kernel, infer, load_cases, make_node, reference

GOLDENS = Path(__file__).resolve().parents[3] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Gemm", "MatMul"})
RNG = np.random.default_rng(3)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def gemm_node(k: int, n: int, bias: bool = True, **params):
    attrs = {"weight": rand(n, k)}
    if bias:
        attrs["bias"] = rand(n)
    return make_node("Gemm", 1, params=params, attrs=attrs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference(case):
    check_kernel(case.node(), case.inputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,params", [(None, None), ("relu", None), ("leaky_relu", {"alpha": 0.3}),
                                        ("hardswish", None), ("clip", {"min": -0.2, "max": 0.4})])
def test_gemm_kernel_built_at_max_runs_smaller(act, params):
    node = gemm_node(7, 5, activation=act, activation_params=params)
    check_kernel(node, [rand(2, 3, 7)], [rand(4, 6, 7)], rtol=1e-5, atol=1e-5)
    check_kernel(node, [rand(1, 7)], [rand(8, 7)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a,b", [((5, 3), (3, 4)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (2, 4, 3)), ((2, 3), (3,)),
                                 ((6,), (6,))])
def test_matmul_kernel_and_shapes(a, b):
    node = make_node("MatMul", 2)
    arrays = [rand(*a), rand(*b)]
    assert infer(node, arrays)[0].shape == np.matmul(*arrays).shape
    check_kernel(node, arrays, rtol=1e-5, atol=1e-5)


def test_matmul_small_batch_below_max():
    node = make_node("MatMul", 2)
    check_kernel(node, [rand(2, 3, 4), rand(4, 5)], [rand(8, 3, 4), rand(4, 5)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,params", [("sigmoid", None), ("silu", None), ("tanh", None), ("elu", {"alpha": 0.5}),
                                        ("gelu", {"approximate": "none"}), ("gelu", {"approximate": "tanh"}),
                                        ("hardsigmoid", None), ("relu6", None)])
def test_gemm_every_fused_activation(act, params):
    for bias in (True, False):
        node = gemm_node(6, 5, bias=bias, activation=act, activation_params=params)
        check_kernel(node, [rand(3, 6) * 3], rtol=1e-5, atol=1e-5)


def test_unaligned_weights_and_const_operands_work():
    raw = np.zeros(6 * 5 * 4 + 1, np.uint8)
    w = raw[1:].view(np.float32).reshape(5, 6)
    w[...] = rand(5, 6)
    assert not w.flags.aligned
    check_kernel(make_node("Gemm", 1, attrs={"weight": w}), [rand(3, 6)], rtol=1e-5, atol=1e-5)
    node = make_node("MatMul", 2)
    b = w.T  # a const operand: its value is known when the kernel is built
    from op_harness import build_kernel, run_kernel

    from engine.ops.registry import TensorInfo
    a = rand(2, 3, 6)
    fn = build_kernel(node, [TensorInfo(a.shape, a.dtype), TensorInfo(b.shape, b.dtype, b)])[0]
    out = np.empty((2, 3, 5), np.float32)
    fn([a, b], [out], None)
    np.testing.assert_allclose(out, reference(node, [a, b])[0], rtol=1e-5, atol=1e-6)
    assert run_kernel(node, [a, np.ascontiguousarray(b)])[0].shape == (2, 3, 5)


def device_for(which: str):
    from op_harness import cpu_device

    return cpu_device() if which == "onednn" else cpu_device(onednn=False)


@pytest.mark.parametrize("which", ["onednn", "blas"])
@pytest.mark.parametrize("act,params", [(None, None), ("gelu", {"approximate": "none"}),
                                        ("gelu", {"approximate": "tanh"}), ("silu", None), ("relu", None),
                                        ("mish_like_unfused", None)])
def test_gemm_residual_and_activation_both_paths(which, act, params):
    if act == "mish_like_unfused":  # an activation oneDNN has no post-op for: applied after the primitive
        act, params = "leaky_relu", {"alpha": 0.1}
    node = gemm_node(24, 40, activation=act, activation_params=params)
    x, z = rand(2, 9, 24), rand(2, 9, 40)
    check_kernel(node, [x, z], [rand(3, 16, 24), rand(3, 16, 40)], rtol=1e-5, atol=1e-5,
                 device=device_for(which))
    check_kernel(node, [x, z], rtol=1e-5, atol=1e-5, device=device_for(which))


def test_float32_gemm_and_matmul_run_on_onednn_with_the_weight_packed_once():
    from op_harness import build_kernel, cpu_device

    from engine.ops.registry import TensorInfo

    if not cpu_device().backends.onednn:
        pytest.skip("oneDNN is not installed")
    fn, _ = build_kernel(gemm_node(64, 96), [TensorInfo((4, 64), np.float32)])
    assert fn.impl.startswith("onednn:")
    b = rand(64, 32)
    fn, _ = build_kernel(make_node("MatMul", 2), [TensorInfo((2, 5, 64), np.float32), TensorInfo(b.shape, b.dtype, b)])
    assert fn.impl == "onednn:matmul"


@pytest.mark.parametrize("which", ["onednn", "blas"])
def test_matmul_transposed_and_broadcast_operands(which):
    node = make_node("MatMul", 2)
    q, k = rand(2, 3, 7, 8), rand(2, 3, 9, 8)
    check_kernel(node, [q, np.swapaxes(k, -1, -2)], rtol=1e-5, atol=1e-5, device=device_for(which))
    check_kernel(node, [rand(3, 1, 4, 5), rand(2, 5, 6)], rtol=1e-5, atol=1e-5, device=device_for(which))
    check_kernel(node, [rand(1, 5), rand(5, 3)], [rand(6, 5), rand(5, 3)], rtol=1e-5, atol=1e-5,
                 device=device_for(which))


def test_onednn_matmul_reads_strided_views_without_copies():
    from op_harness import cpu_device

    if not cpu_device().backends.onednn:
        pytest.skip("oneDNN is not installed")
    from engine.devices.cpu.onednn.matmul import MatMul

    q, k = rand(2, 3, 7, 8), rand(2, 9, 3, 8)
    kt = np.transpose(k, (0, 2, 3, 1))  # (2, 3, 8, 9) as a permuted view of a (B, S, H, E) tensor
    out = np.empty((2, 3, 7, 9), np.float32)
    MatMul(None).run(q, kt, out, None)
    np.testing.assert_allclose(out, q.astype(np.float64) @ kt, rtol=1e-5, atol=1e-5)

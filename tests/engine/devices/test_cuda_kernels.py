"""Every CUDA kernel against the numpy reference, under numba's simulator (run by test_cuda_sim.py).

The cases are the committed op goldens (tests/fixtures/ops/*.npz, written from PyTorch / ONNX Runtime): each is
run through CudaDevice.build_kernel on device arrays and compared with the op's numpy reference, the oracle.
Outputs start as garbage (NaN / 77) so an element a kernel forgets to write fails the comparison.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numba import cuda
from op_harness import HOST_INPUTS, assert_close, infos_of, load_cases, make_node, reference

from engine.devices.cuda import CudaDevice
from engine.devices.cuda.kernels import KERNELS
from engine.errors import UnsupportedOpError
from engine.ops.registry import all_ops, get_op

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ops"
CASES = [c for f in ("nonspatial.npz", "spatial.npz") for c in load_cases(FIXTURES / f)]
# ops that never reach a device kernel: Shape is a host value; the others are refused on CUDA (see kernels.py)
NOT_ON_CUDA = {"Shape", "Expression", "TnnQuantize", "TnnDequantize", "TnnQConv", "TnnQAdd", "TnnQConcat",
               "TnnQPool", "TnnQRelu", "TnnQInnerProduct", "TnnQUpsample", "RNN", "SliceAssign", "IndexPut", "Index",
               "GatherElements", "RepeatInterleave", "Trilu", "TopK", "Sort", "CumSum", "ReduceVar", "Full", "Range",
               "DetectionOutput", "Meshgrid", "PixelUnshuffle", "LRN", "ScatterElements", "BitShift", "GridSample",
               "Einsum", "Conv3d", "Pool3d", "RoiAlign", "Histogram", "NonZero", "NonMaxSuppression"}
# the blocked-layout ops are the CPU device's own (engine/devices/cpu/layout/), never in the shared registry
NOT_ON_CUDA |= {"ToBlocked", "ToPlain", "ConvBlocked", "GlobalPoolBlocked", "MaxPoolBlocked", "BroadcastBlocked",
                "RegroupBlocked"}
RNG = np.random.default_rng(3)


def _garbage(shape, dtype):
    a = np.empty(shape, dtype)
    a[...] = 77 if np.dtype(dtype).kind in "iub" else np.nan
    return a


def run_cuda(node, arrays, max_arrays=None):
    """Builds the CUDA kernel at `max_arrays`' shapes (default `arrays`) and runs it on `arrays`."""
    dev = CudaDevice("cuda")
    op = get_op(node.op_type)
    kins = infos_of(max_arrays if max_arrays is not None else arrays, node=node)
    fn = dev.build_kernel(node, op, kins)
    host = HOST_INPUTS.get(node.op_type, len(arrays))
    ins = [np.asarray(a) if i >= host else cuda.to_device(np.ascontiguousarray(a)) for i, a in enumerate(arrays)]
    outs_info = op.infer(node, infos_of(arrays, node=node))
    outs = [cuda.to_device(_garbage(o.shape, o.dtype)) for o in outs_info]
    ws = dev.allocate(dev.workspace_bytes(node, op, kins)).buffer
    fn(ins, outs, ws)
    return [dev.copy_out(o) for o in outs]


def check(node, arrays, max_arrays=None, rtol=1e-4, atol=1e-5):
    want = reference(node, arrays)
    got = run_cuda(node, arrays, max_arrays)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, rtol, atol, f"{node.op_type} {node.name} out{i}")


def test_every_registered_op_has_a_cuda_kernel_or_is_listed():
    missing = set(all_ops()) - set(KERNELS) - NOT_ON_CUDA
    assert not missing, f"ops with neither a CUDA kernel nor a documented refusal: {sorted(missing)}"


def test_every_cuda_kernel_is_exercised_by_a_golden_case():
    untested = set(KERNELS) - {c.op for c in CASES} - {"Identity"}  # Identity: test_strided_copy_ops_...
    assert not untested, f"CUDA kernels without a golden case: {sorted(untested)}"


@pytest.mark.parametrize("case", [c for c in CASES if c.op not in NOT_ON_CUDA], ids=lambda c: c.name)
def test_golden_case_matches_reference(case):
    check(case.node(), case.inputs)


@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AvgPool", "Softmax", "LayerNorm", "Resize", "Add"])
def test_kernel_built_at_max_shape_runs_smaller(op):
    case = next(c for c in CASES if c.op == op)
    small = [a[:1] if np.ndim(a) >= 1 and np.shape(a)[0] > 1 else a for a in case.inputs]
    if op in ("Conv", "MaxPool", "AvgPool", "Resize"):
        small = [case.inputs[0][..., : case.inputs[0].shape[-2] - 1, : case.inputs[0].shape[-1] - 1],
                 *case.inputs[1:]]
    check(case.node(), small, max_arrays=case.inputs)


def test_strided_copy_ops_on_awkward_shapes():
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    check(make_node("Transpose", 1, params={"perm": [3, 1, 0, 2]}), [x])
    check(make_node("Slice", 1, params={"starts": [4, -1], "ends": [0, -100], "axes": [2, 3], "steps": [-2, -3]}),
          [x])
    check(make_node("Tile", 1, params={"repeats": [2, 1, 1, 3]}), [x[:, :, :2]])
    check(make_node("Concat", 3, params={"axis": 2}), [x, x[:, :, :1], x[:, :, :3]])
    check(make_node("Stack", 2, params={"axis": -1}), [x, x * 2])
    check(make_node("Split", 1, 3, params={"axis": 3, "sizes": [2, 4, 1]}), [x])
    check(make_node("Cast", 1, params={"to": "int64"}), [x * 10])
    check(make_node("Identity", 1), [x])


def test_pad_modes():
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    for mode in ("constant", "reflect", "edge", "circular"):
        check(make_node("Pad", 1, params={"pads": [0, 0, 1, 2, 0, 1, 3, -1], "mode": mode, "value": 1.5}), [x])


def test_conv_fused_epilogue_residual_and_pad_modes():
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    z = RNG.standard_normal((2, 6, 4, 3)).astype(np.float32)
    base = {"stride": [2, 2], "pads": [1, 1, 1, 1], "groups": 2}
    for act, ap in (("relu6", {}), ("leaky_relu", {"alpha": 0.2}), ("hardswish", {}), ("gelu", {}),
                    ("clip", {"min": -0.5, "max": 0.5}), ("elu", {"alpha": 0.7})):
        node = make_node("Conv", 2, params={**base, "activation": act, "activation_params": ap},
                         attrs={"weight": w, "bias": b})
        check(node, [x, z])
    for mode in ("reflect", "replicate", "circular"):
        check(make_node("Conv", 1, params={**base, "pad_mode": mode}, attrs={"weight": w}), [x])
    w1 = RNG.standard_normal((5, 4, 1, 1)).astype(np.float32)  # 1x1: no im2col
    check(make_node("Conv", 1, params={}, attrs={"weight": w1, "bias": b[:5]}), [x])


def test_gemm_fused_residual_and_activation():
    x = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    z = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    attrs = {"weight": RNG.standard_normal((6, 7)).astype(np.float32),
             "bias": RNG.standard_normal(6).astype(np.float32)}
    for act, ap in ((None, {}), ("gelu", {"approximate": "tanh"}), ("silu", {})):
        check(make_node("Gemm", 2, params={"activation": act, "activation_params": ap}, attrs=attrs), [x, z])


def test_matmul_broadcast_and_vectors():
    a = RNG.standard_normal((3, 1, 5, 19)).astype(np.float32)
    b = RNG.standard_normal((4, 19, 6)).astype(np.float32)
    check(make_node("MatMul", 2), [a, b])
    check(make_node("MatMul", 2), [a[0, 0, 0], b[0]])
    check(make_node("MatMul", 2), [a[0, 0], b[0, :, 0]])


def test_unsupported_op_is_refused_naming_the_node():
    node = make_node("TnnQuantize", 1, params={})
    dev = CudaDevice("cuda")
    with pytest.raises(UnsupportedOpError, match="tnnquantize_0.*no CUDA kernel.*device='cpu'"):
        dev.build_kernel(node, get_op("TnnQuantize"), infos_of([np.zeros((1, 2), np.float32)]))


def test_float64_matmul_is_refused_not_miscomputed():
    a = np.zeros((2, 3))
    dev = CudaDevice("cuda")
    with pytest.raises(UnsupportedOpError, match="float64"):
        dev.build_kernel(make_node("MatMul", 2), get_op("MatMul"), infos_of([a, a.T]))


@pytest.mark.parametrize("masked_rows", ["zero", "nan"])
def test_attention_rows_with_nothing_to_attend_to(masked_rows):
    """zeros as torch's scaled_dot_product_attention, NaN as its MultiheadAttention (masked_rows)."""
    q, k, v = (RNG.standard_normal((1, 2, n, 4)).astype(np.float32) for n in (3, 5, 5))
    mask = RNG.random((1, 1, 3, 5)) > 0.3
    mask[0, 0, 1] = False
    check(make_node("Attention", 4, params={"masked_rows": masked_rows}), [q, k, v, mask])


def test_nan_goes_through_clamps_maxima_and_reductions():
    """A NaN comes out NaN, as in torch, where libdevice's fmaxf/fminf (numba's device max/min on a GPU) return the
    other operand. The simulator runs Python's max, which drops only a NaN second operand: here the Maximum/Minimum,
    pooling and reduction cases fail without nan_max/nan_min; the clamps (NaN first: x, bound) check the helpers'
    results, and their NaN-dropping form only on a real GPU (where conftest.py runs this module on the device)."""
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    x[0, 1, 2, 3] = x[1, 2, 5, 5] = np.nan
    y = RNG.standard_normal(x.shape).astype(np.float32)
    y[0, 0, 0, 0] = np.nan
    for op, p in (("Relu", {}), ("Clip", {"min": 0.0, "max": 6.0}), ("HardSigmoid", {}), ("HardSwish", {})):
        check(make_node(op, 1, params=p), [x])
    for op in ("Maximum", "Minimum"):
        check(make_node(op, 2), [x, y])
        check(make_node(op, 2), [y, x])
    check(make_node("MaxPool", 1, params={"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1]}), [x])
    check(make_node("AdaptiveMaxPool", 1, params={"output_size": [2, 2]}), [x])
    for op in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
        check(make_node(op, 1, params={"axes": [3], "axis": 3, "keepdims": True}), [x])
    rows = x.reshape(12, 18)
    attrs = {"weight": np.eye(18, dtype=np.float32)}  # each output a copy of its input: a NaN stays where it was
    for act, ap in (("relu", {}), ("relu6", {}), ("clip", {"min": 0.0, "max": 1.0}), ("hardsigmoid", {}),
                    ("hardswish", {})):
        check(make_node("Gemm", 1, params={"activation": act, "activation_params": ap}, attrs=attrs), [rows])

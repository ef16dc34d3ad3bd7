"""Activation kernels vs references (also in place, below max shape, integer dtypes), the CPU's fused epilogue
(both code paths) vs the references, no temporaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
from op_harness import (
    build_kernel,
    check_kernel,
    cpu_device,
    force_native_regions,
    infos_of,
    kernel_peak_bytes,
    make_node,
    reference,
    replay,
    run_kernel,
)

from engine.devices.cpu import epilogue as cpu_epilogue
from engine.devices.cpu import native_program as N
from engine.ops import epilogue
from engine.ops.epilogue import EPILOGUES

PARAMS = {
    "Relu": {}, "Clip": {"min": -0.3, "max": 0.8}, "LeakyRelu": {"alpha": 0.05}, "Sigmoid": {}, "Tanh": {},
    "Silu": {}, "Gelu": {"approximate": "none"}, "HardSwish": {}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Elu": {"alpha": 1.3}, "Mish": {}, "Softplus": {"beta": 1.5, "threshold": 10.0},
}
RNG = np.random.default_rng(1)


@pytest.mark.parametrize("op", sorted(PARAMS))
@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (2, 1, 9, 1)])
def test_kernel_matches_reference(op, shape):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    node = make_node(op, 1, params=PARAMS[op])
    check_kernel(node, [x])
    check_kernel(node, [x], inplace=True)


@pytest.mark.parametrize("op", sorted(PARAMS) + ["PRelu"])
def test_kernel_below_max_shape(op):
    big = RNG.standard_normal((4, 3, 6, 6)).astype(np.float32)
    small = RNG.standard_normal((2, 3, 5, 1)).astype(np.float32)
    attrs = {"slope": np.array([0.1, -0.2, 0.3], np.float32)} if op == "PRelu" else None
    node = make_node(op, 1, params=PARAMS.get(op, {}), attrs=attrs)
    check_kernel(node, [small], [big])
    check_kernel(node, [small], [big], inplace=True)


def test_gelu_tanh_kernel_and_float64():
    x = np.linspace(-6, 6, 101)
    node = make_node("Gelu", 1, params={"approximate": "tanh"})
    check_kernel(node, [x], rtol=1e-12, atol=1e-12)
    check_kernel(node, [x.astype(np.float32)])


def test_prelu_single_slope_and_1d():
    one = make_node("PRelu", 1, attrs={"slope": np.array([0.25], np.float32)})
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    check_kernel(one, [x], inplace=True)
    per_channel = make_node("PRelu", 1, attrs={"slope": np.array([0.1, 0.2, 0.3, 0.4], np.float32)})
    check_kernel(per_channel, [x[0, :, 0].copy()])


def test_integer_input_uses_reference_path():
    x = np.arange(-4, 5, dtype=np.int32)
    node = make_node("Relu", 1)
    np.testing.assert_array_equal(run_kernel(node, [x])[0], np.maximum(x, 0))


EPILOGUE_OPS = {"relu": "Relu", "relu6": "Clip", "clip": "Clip", "leaky_relu": "LeakyRelu", "sigmoid": "Sigmoid",
                "silu": "Silu", "hardswish": "HardSwish", "hardsigmoid": "HardSigmoid", "gelu": "Gelu",
                "tanh": "Tanh", "elu": "Elu"}
EPILOGUE_PARAMS = {"relu6": {"min": 0.0, "max": 6.0}, "clip": {"min": -1.0, "max": 2.0}, "leaky_relu": {"alpha": 0.1},
                   "hardswish": {"alpha": 0.2, "beta": 0.4}, "hardsigmoid": {"alpha": 0.2, "beta": 0.5},
                   "elu": {"alpha": 0.5}, "gelu": {"approximate": "none"}}


@pytest.mark.parametrize("apply", [cpu_epilogue.apply_activation, epilogue.apply_activation], ids=["cpu", "meaning"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_epilogue_matches_activation_reference(name, contiguous, apply):
    # the fused epilogue (Conv/Gemm) and the standalone op must agree: the numpy definition the references use, and
    # the CPU's, on both of its code paths (numba loops on contiguous outputs, numpy otherwise)
    params = EPILOGUE_PARAMS.get(name, {})
    x = (RNG.standard_normal((6, 17)) * 4).astype(np.float32)
    buf = x.copy()
    out = buf if contiguous else buf[:, ::2]
    apply(name, params, out)
    (want,) = reference(make_node(EPILOGUE_OPS[name], 1, params=params), [x if contiguous else x[:, ::2]])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    if not contiguous:
        np.testing.assert_array_equal(buf[:, 1::2], x[:, 1::2])  # the untouched half stays


@pytest.mark.parametrize("op", sorted(PARAMS) + ["PRelu"])
def test_kernel_allocates_no_temporaries(op):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)  # 256 KiB
    attrs = {"slope": np.full(16, 0.1, np.float32)} if op == "PRelu" else None
    assert kernel_peak_bytes(make_node(op, 1, params=PARAMS.get(op, {}), attrs=attrs), [x]) < 16 * 1024


@pytest.mark.parametrize("op,params", [("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"}),
                                       ("Silu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Elu", {"alpha": 0.7}),
                                       ("HardSwish", {}), ("HardSigmoid", {"alpha": 0.2, "beta": 0.4}),
                                       ("LeakyRelu", {"alpha": 0.1})])
def test_large_float32_activations_on_both_paths(op, params):
    """Large float32 tensors run oneDNN's eltwise primitive where it is installed (SiLU and sigmoid: our rational
    logistic, faster), small ones and the NNSERVE_ONEDNN=0 device the numba loops: both match the reference, also
    in place and below the max shape."""
    from op_harness import build_kernel, cpu_device, infos_of

    from engine.devices.cpu.onednn import unary

    x = (np.random.default_rng(2).standard_normal((3, 40, 300)) * 4).astype(np.float32)
    assert x[:1].size >= unary.MIN_ELEMENTS
    node = make_node(op, 1, params=params)
    for device in (cpu_device(), cpu_device(onednn=False)):
        check_kernel(node, [x], device=device, rtol=1e-5, atol=2e-6)
        check_kernel(node, [x[:1].copy()], [x], device=device, inplace=True, rtol=1e-5, atol=2e-6)
    fn, _ = build_kernel(node, infos_of([x], node=node))
    onednn = fn.impl.startswith("onednn:eltwise") if hasattr(fn, "impl") else False
    ours = op in ("Silu", "Sigmoid") or (op == "Gelu" and params["approximate"] == "none")
    loop = op == "HardSigmoid"  # oneDNN's clamps drop NaN: its NaN-keeping form is a post-op chain (onednn/eltwise.py)
    assert onednn == (not ours and not loop and cpu_device().backends.onednn)


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [1, 7, 4099, 200_003])  # odd sizes: vector tails and uneven thread chunks
def test_rational_logistic_against_float64(size, threads, inplace):
    """The float32 sigmoid, SiLU (Eigen's rational logistic) and erf GELU (Eigen's rational erf) against float64
    numpy over [-100, 100]: sigmoid within 2e-7 absolute, SiLU and GELU within 2.5e-7 * max(1, |x|), sigmoid in
    [0, 1], over one and two threads."""
    from engine.devices.cpu import threads as T

    x = np.linspace(-100.0, 100.0, size).astype(np.float32)
    x[size // 3:size // 2] = (RNG.standard_normal(size // 2 - size // 3) * 6).astype(np.float32)
    x64 = x.astype(np.float64)
    sig = 1.0 / (1.0 + np.exp(-x64))
    gelu = 0.5 * x64 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x64]))
    scaled = 2.5e-7 * np.maximum(1.0, np.abs(x64))
    before = T.get_threads()
    T.set_threads(threads)
    try:
        for fn, want, bound in ((cpu_epilogue.sigmoid_f32, sig, 2e-7), (cpu_epilogue.silu_f32, x64 * sig, scaled),
                                (cpu_epilogue.gelu_f32, gelu, scaled)):
            out = x.copy() if inplace else np.full_like(x, np.nan)
            fn(out if inplace else x, out)
            assert out.dtype == np.float32
            assert np.all(np.abs(out - want) <= bound), float(np.max(np.abs(out - want) / bound))
    finally:
        T.set_threads(before)
    s = np.empty_like(x)
    cpu_epilogue.sigmoid_f32(x, s)
    assert s.min() >= 0.0 and s.max() <= 1.0


def test_rational_logistic_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 18.0, -18.0, 1e30, -1e30], np.float32)
    s, y = np.empty_like(x), np.empty_like(x)
    cpu_epilogue.sigmoid_f32(x, s)
    cpu_epilogue.silu_f32(x, y)
    np.testing.assert_array_equal(s[1:], [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0])
    g = np.empty_like(x)
    cpu_epilogue.gelu_f32(x, g)
    assert np.isnan(s[0]) and np.isnan(y[0]) and np.isnan(g[0])  # NaN stays NaN (the clamps keep it)
    np.testing.assert_array_equal(y[[1, 3, 7, 8]], np.array([np.inf, 0.0, 1e30, 0.0], np.float32))
    np.testing.assert_array_equal(g[[1, 3, 7, 8]], np.array([np.inf, 0.0, 1e30, 0.0], np.float32))


@pytest.mark.parametrize("split", [False, True], ids=["one-call", "region"])
@pytest.mark.parametrize("op", ["Sigmoid", "Silu", "Gelu"])
def test_rational_activations_replay_as_they_ran(op, split, monkeypatch, request):
    """A float32 sigmoid, SiLU or erf GELU op recorded into a native program (the epilogue pass's region
    function): bit for bit what its Python path wrote, into another buffer and in place, on this thread or split
    as a region; special values included."""
    if split:
        force_native_regions(monkeypatch, request, 3, cpu_epilogue)
        monkeypatch.setattr(cpu_epilogue, "NATIVE_PASS_ELEMENTS", 0)
    else:
        cpu_device()
    x = (np.random.default_rng(3).standard_normal((2, 5, 7, 11)) * 6).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 40.0, -40.0]
    node = make_node(op, 1)
    fn, ws = build_kernel(node, infos_of([x], node=node))
    want = np.full_like(x, 7)
    fn([x], [want], ws)
    for inplace in (False, True):
        got = x.copy() if inplace else np.full_like(x, 7)
        native = fn.native([got if inplace else x], [got], ws)
        assert (N.OP_REGION in {r[0] for r in native.records}) == split
        assert replay(native) is None
        np.testing.assert_array_equal(got, want)

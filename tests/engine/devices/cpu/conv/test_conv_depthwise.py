"""The vector depthwise kernel (engine/devices/cpu/conv/depthwise.py) against Conv's numpy float64 reference on the
unblocked data: kernels 3/5/7, strides 1 and 2, paddings (none, same, asymmetric, wider than the kernel), odd and
tiny maps, channels off the block, blocks of 8 and 16, bias or none, fused activations (inline and applied after),
a residual, several threads; and which convs ConvBlocked gives it."""

from __future__ import annotations

import numpy as np
import pytest
from test_conv_blocked import B, make, run_case

from engine.devices.cpu import threads
from engine.devices.cpu.conv import depthwise
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.ir import Node
from engine.ops.conv import conv_reference
from engine.ops.conv_geometry import conv_geom

rng = np.random.default_rng(7)


def _case(c: int, k: int, shape: tuple[int, int], stride=(1, 1), pads=None, block: int = 16, bias: bool = True,
          act=None, act_params=None, residual: bool = False, batch: int = 2) -> None:
    kh, kw = (k, k) if isinstance(k, int) else k
    pads = pads if pads is not None else (kh // 2, kw // 2, kh // 2, kw // 2)
    w = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if bias else None
    params = {"stride": stride, "pads": pads, "dilation": (1, 1), "groups": c, "activation": act,
              "activation_params": act_params or {}}
    node = Node("Conv", "dw", params=params, attrs={"weight": w, **({"bias": b} if bias else {})})
    x = rng.standard_normal((batch, c, *shape)).astype(np.float32)
    geo = conv_geom(node, x.shape)
    assert depthwise.computes(geo, block, True, True)
    z = rng.standard_normal(geo.out_shape).astype(np.float32) if residual else None
    want = conv_reference(node, [x] if z is None else [x, z])[0]
    conv = depthwise.DepthwiseConv(w, b, act, act_params, block)
    out = np.full(to_blocked(want, block).shape, np.nan, np.float32)  # every element must be written
    conv.run(geo, to_blocked(x, block), None if z is None else to_blocked(z, block), out)
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(to_plain(out, c), want, rtol=1e-4, atol=tol)
    if c % block and (act is None or act in ("relu", "relu6", "leaky_relu")):  # f(0) = 0: padding lanes stay zero
        assert not out[:, -1, :, :, c % block:].any()


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [3, 5, 7])
def test_kernel_sizes_and_strides(k, stride, block):
    _case(20, k, (23, 37), (stride, stride), block=block)


@pytest.mark.parametrize("shape", [(1, 1), (3, 2), (5, 9), (9, 5), (13, 17), (31, 8), (8, 47)])
@pytest.mark.parametrize("k", [3, 7])
def test_odd_and_tiny_maps(k, shape):
    _case(33, k, shape)
    _case(17, k, shape, (2, 2), block=8)


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 2, 0, 3), (3, 0, 2, 1), (5, 6, 4, 5)])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (2, 1), (3, 2)])
def test_paddings(pads, stride):
    _case(24, 5, (19, 21), stride, pads)


def test_non_square_kernel():
    _case(16, (5, 3), (14, 30))
    _case(16, (1, 7), (11, 29), (2, 1))


@pytest.mark.parametrize("act,act_params", [("relu", None), ("relu6", None), ("clip", {"min": -0.3, "max": 0.7}),
                                            ("leaky_relu", {"alpha": 0.2}), ("gelu", None),
                                            ("gelu", {"approximate": "none"}), ("hardswish", None),
                                            ("sigmoid", None), ("gelu", {"approximate": "tanh"})])
def test_activations(act, act_params):
    """Fused in the epilogue (relu, relu6, clip, leaky_relu, erf GELU) or applied to the output after."""
    _case(40, 3, (12, 30), act=act, act_params=act_params)
    _case(24, 5, (9, 21), act=act, act_params=act_params, residual=True, block=8)


def test_gelu_over_its_whole_range():
    """The epilogue's float32 erf (a rational approximation, clamped beyond +-4) against float64 erf: inputs from
    -8 to 8 through a 1x1-tap identity filter."""
    c, k = 16, 3
    w = np.zeros((c, 1, k, k), np.float32)
    w[:, 0, 1, 1] = 1.0
    node = Node("Conv", "dw", params={"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": c,
                                      "activation": "gelu", "activation_params": {}}, attrs={"weight": w})
    x = np.linspace(-8, 8, c * 40 * 40, dtype=np.float32).reshape(1, c, 40, 40)
    want = conv_reference(node, [x])[0]
    out = np.empty(to_blocked(want, 16).shape, np.float32)
    depthwise.DepthwiseConv(w, None, "gelu", {}, 16).run(conv_geom(node, x.shape), to_blocked(x, 16), None, out)
    np.testing.assert_allclose(to_plain(out, c), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_residual_and_bias(bias, act):
    _case(48, 7, (10, 19), bias=bias, act=act, residual=True)


def test_several_threads_and_bands(monkeypatch):
    """Split over the pool in bands of rows (every conv counts as big here): the same sums."""
    monkeypatch.setattr(threads, "FORK_WORK", 0)
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    before = threads.get_threads()
    threads.set_threads(3)
    try:
        _case(64, 5, (61, 40), batch=1)
        _case(32, 3, (57, 29), (2, 2), act="relu", residual=True, batch=3)
        _case(8, 7, (9, 30), batch=1)  # fewer rows than bands would give
    finally:
        threads.set_threads(before)


def test_convblocked_takes_it_where_measured_faster():
    node, plain = make(32, 32, 5, groups=32, act="relu")
    run_case(node, plain, [(2, 32, 30, 30), (1, 32, 30, 30), (1, 32, 17, 29)], residual=False,
             impl="numba:depthwise" if B in depthwise.MEASURED_BLOCKS else "onednn:")
    node, plain = make(48, 48, 7, groups=48, act="gelu", bias=False)
    run_case(node, plain, [(2, 48, 28, 28), (1, 48, 28, 28)], residual=True,
             impl="numba:depthwise" if B in depthwise.MEASURED_BLOCKS else "onednn:")


@pytest.mark.parametrize("act,act_params", [("hardswish", None), ("sigmoid", None),
                                            ("gelu", {"approximate": "tanh"})])
def test_convblocked_keeps_onednn_for_activations_it_does_not_fuse(act, act_params):
    """oneDNN fuses these as post-ops; here they would be one more pass over the output."""
    node, plain = make(32, 32, 5, groups=32, act=act, act_params=act_params)
    run_case(node, plain, [(1, 32, 30, 30)], residual=False, impl="onednn:")


@pytest.mark.parametrize("k,stride,hw,dilation", [(3, 2, 56, 1), (3, 1, 14, 1), (5, 1, 7, 1), (3, 1, 56, 2)])
def test_convblocked_keeps_onednn_elsewhere(k, stride, hw, dilation):
    """Stride 2, narrow rows, dilation: oneDNN's jit_dw (measured faster, or not computed by the kernel)."""
    node, plain = make(32, 32, k, stride, groups=32, dilation=dilation)
    run_case(node, plain, [(1, 32, hw, hw)], residual=False, impl="onednn:")


def test_multiplier_and_one_plain_side_are_not_computed():
    geo = conv_geom(Node("Conv", "c", params={"groups": 16}, attrs={"weight": np.zeros((32, 1, 3, 3), np.float32)}),
                    (1, 16, 30, 30))
    assert not depthwise.computes(geo, 16, True, True)
    geo = conv_geom(Node("Conv", "c", params={"groups": 16}, attrs={"weight": np.zeros((16, 1, 3, 3), np.float32)}),
                    (1, 16, 30, 30))
    assert depthwise.computes(geo, 16, True, True)
    assert not depthwise.computes(geo, 16, False, True) and not depthwise.computes(geo, 4, True, True)

"""The numba int8 kernels match the numpy references of engine/ops/quant.py bit for bit on awkward shapes.

The references are themselves checked against TNN's own outputs (tests/engine/test_tnn_models.py) and
test_tnn_int8.py; here every kernel runs in arena-like garbage-filled outputs, also below its max shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import make_node, reference, run_kernel

from engine.ops.quant import conv_geometry

RNG = np.random.default_rng(16)


def _i8(*shape):
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def _scales(n):
    return RNG.uniform(0.002, 0.05, n).astype(np.float32)


def _check(node, arrays, max_arrays=None):
    want = reference(node, arrays)
    got = run_kernel(node, arrays, max_arrays)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def _qconv(o, c, k, groups=1, stride=1, pads=0, dilation=1, activation=None, fusion=None):
    attrs = {"weight": _i8(o, c // groups, k, k), "bias": RNG.integers(-3000, 3000, o).astype(np.int32),
             "scale": RNG.uniform(0.0005, 0.003, o).astype(np.float32),
             "relu6_max": RNG.integers(20, 120, o).astype(np.int8)}
    if fusion:
        attrs["add_scale"] = RNG.uniform(0.2, 1.5, o).astype(np.float32)
    params = {"groups": groups, "stride": [stride, stride], "pads": [pads, pads], "dilation": [dilation, dilation],
              "activation": activation, "fusion": fusion}
    return make_node("TnnQConv", 2 if fusion else 1, params=params, attrs=attrs)


CONVS = [
    dict(o=5, c=3, k=3, stride=2, pads=1),                      # first-layer conv, odd sizes
    dict(o=6, c=4, k=3, groups=2, dilation=2, pads=2, activation="relu"),
    dict(o=7, c=7, k=3, groups=7, stride=2, pads=1, activation="relu6"),   # depthwise
    dict(o=9, c=6, k=1, activation="relu"),                      # pointwise
    dict(o=4, c=6, k=1, groups=2),                               # grouped pointwise
    dict(o=3, c=5, k=2, stride=3),                               # kernel narrower than the stride
    dict(o=5, c=4, k=1, fusion="add_then_act", activation="relu"),
    dict(o=5, c=4, k=1, fusion="act_then_add", activation="relu"),
    dict(o=5, c=4, k=1, fusion="add_then_act", activation="relu6"),
    dict(o=5, c=4, k=3, pads=1, fusion="add_then_act"),
]


@pytest.mark.parametrize("cfg", CONVS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_qconv_kernel_is_bit_exact(cfg):
    node = _qconv(**cfg)
    x, x_big = _i8(2, cfg["c"], 9, 11), _i8(2, cfg["c"], 13, 12)
    arrays, big = [x], [x_big]
    if cfg.get("fusion"):
        arrays.append(_i8(*conv_geometry(node, x.shape)[0]))
        big.append(_i8(*conv_geometry(node, x_big.shape)[0]))
    _check(node, big)
    _check(node, arrays, max_arrays=big)  # smaller than the shapes the kernel and workspace were built for


def test_qconv_saturates_both_ends():
    node = _qconv(o=2, c=8, k=1)
    node.attrs["scale"][:] = 1.0
    node.attrs["bias"][:] = 0
    x = np.full((1, 8, 3, 5), 127, np.int8)
    x[:, :, 1] = -128
    _check(node, [x])


@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_and_dequantize_kernels(per_channel):
    c = 5
    scale = _scales(c) if per_channel else _scales(1)
    scale[-1 if per_channel else 0] = 0.0 if per_channel else scale[0]  # a zero scale quantizes to 0
    x = (RNG.standard_normal((2, c, 3, 7)) * 2).astype(np.float32)
    x.flat[::11] = [v * 50 for v in x.flat[::11]]  # some values saturate
    _check(make_node("TnnQuantize", 1, attrs={"scale": scale}), [x])
    _check(make_node("TnnDequantize", 1, attrs={"scale": scale}), [_i8(2, c, 3, 7)])


def test_quantize_kernel_on_2d_and_1d_inputs():
    _check(make_node("TnnQuantize", 1, attrs={"scale": _scales(6)}), [RNG.standard_normal((3, 6)).astype(np.float32)])
    _check(make_node("TnnQuantize", 1, attrs={"scale": _scales(1)}), [RNG.standard_normal(7).astype(np.float32)])


@pytest.mark.parametrize("lo,hi", [(0, 40), (3, 17), (8, 9), (7, 39), (0, 0)])
def test_one_value_rows_split_anywhere_match_the_reference(lo, hi):
    """(N, C) values (a classifier's) go across the channels in spans of an image each: items [lo, hi) of the
    (n, c) pairs, cut anywhere (a split's share), each written once; a zero scale quantizes to 0."""
    from engine.devices.cpu.loops import quant as QK

    scale = _scales(8)
    scale[2] = 0
    x = (RNG.standard_normal((5, 8, 1)) * 3).astype(np.float32)
    x[1, 3, 0] = 1e6  # saturates
    q = np.full((5, 8, 1), 99, np.int8)
    QK.quantize(x, scale, q, lo, hi)
    want_q = reference(make_node("TnnQuantize", 1, attrs={"scale": scale}), [x[..., 0]])[0][..., None]
    f = np.full((5, 8, 1), 99, np.float32)
    QK.dequantize(want_q, scale, f, lo, hi)
    want_f = reference(make_node("TnnDequantize", 1, attrs={"scale": scale}), [want_q[..., 0]])[0][..., None]
    done = np.zeros(40, bool)
    done[lo:hi] = True
    done = done.reshape(5, 8, 1)
    np.testing.assert_array_equal(q[done], want_q[done])
    np.testing.assert_array_equal(f[done], want_f[done])
    assert (q[~done] == 99).all() and (f[~done] == 99).all()


@pytest.mark.parametrize("per_channel", [True, False])
def test_qadd_kernel(per_channel):
    c = 6
    n = c if per_channel else 1
    attrs = {"scale_a": _scales(n), "scale_b": _scales(n), "scale_out": _scales(n)}
    node = make_node("TnnQAdd", 2, attrs=attrs)
    _check(node, [_i8(2, c, 5, 3), _i8(2, c, 5, 3)], max_arrays=[_i8(2, c, 6, 6), _i8(2, c, 6, 6)])


@pytest.mark.parametrize("params", [
    {"mode": "max", "kernel": [3, 3], "stride": [2, 2], "pads": [1, 1]},
    {"mode": "max", "kernel": [2, 3], "stride": [2, 1], "pads": [0, 1], "ceil_mode": True},
    {"mode": "avg", "kernel": [3, 3], "stride": [2, 2], "pads": [1, 1], "ceil_mode": True},
    {"mode": "avg", "kernel": [0, 0]},                            # global
])
def test_qpool_kernel(params):
    node = make_node("TnnQPool", 1, params=params)
    x = _i8(2, 3, 7, 9)
    x[0, 0] = -128  # max pooling starts at -127, as TNN does
    _check(node, [x], max_arrays=[_i8(2, 3, 9, 9)] if params["kernel"][0] else None)


@pytest.mark.parametrize("axis", [1, 2, -1])
@pytest.mark.parametrize("per_tensor", [True, False])
def test_qconcat_kernel(axis, per_tensor):
    shapes = [(2, 3, 4, 5), (2, 3, 4, 5)]
    for i, s in enumerate(shapes):
        s = list(s)
        s[axis] += i * 2 + 1
        shapes[i] = tuple(s)
    attrs = {"scales": _scales(2), "scale_out": _scales(1)} if per_tensor else {}
    node = make_node("TnnQConcat", 2, params={"axis": axis}, attrs=attrs)
    _check(node, [_i8(*s) for s in shapes])

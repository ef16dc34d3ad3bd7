"""Conv and ConvTranspose: references vs PyTorch goldens and a plain loop, auto_pad, geometry errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Conv", "ConvTranspose"})
RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_node(c: int, o: int, k=(3, 3), bias: bool = True, residual: bool = False, **params):
    g = params.get("groups", 1)
    attrs = {"weight": rand(o, c // g, *k)}
    if bias:
        attrs["bias"] = rand(o)
    return make_node("Conv", 2 if residual else 1, params=params, attrs=attrs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-5)


def test_relu_conv_matches_a_plain_loop():
    """An independent direct loop (no windows, no einsum) on one small case, asymmetric pads and stride."""
    x, w, b = rand(1, 2, 5, 6), rand(3, 2, 3, 2), rand(3)
    node = make_node("Conv", 1, params={"stride": [2, 1], "pads": [1, 0, 0, 1], "activation": "relu"},
                     attrs={"weight": w, "bias": b})
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 0), (0, 1)))
    want = np.zeros((3, 2, 6))
    for o in range(3):
        for i in range(2):
            for j in range(6):
                want[o, i, j] = max(0.0, b[o] + (xp[:, 2 * i:2 * i + 3, j:j + 2] * w[o]).sum())
    np.testing.assert_allclose(reference(node, [x])[0][0], want, rtol=1e-5, atol=1e-6)


# -- shapes and errors -------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,shape", [
    (dict(auto_pad="same_upper", stride=(2, 2)), (1, 3, 7, 8)),
    (dict(auto_pad="valid", stride=(3, 2)), (1, 3, 10, 9)),
    (dict(pads=(0, 2, 1, 0), dilation=(1, 3)), (2, 3, 6, 9)),
])
def test_infer_matches_reference(cfg, shape):
    node = conv_node(3, 2, **cfg)
    x = rand(*shape)
    assert infer(node, [x])[0].shape == reference(node, [x])[0].shape


def test_same_upper_keeps_ceil_of_size_over_stride():
    node = conv_node(3, 2, auto_pad="same_upper", stride=(2, 3))
    assert infer(node, [rand(1, 3, 7, 8)])[0].shape == (1, 2, 4, 3)


@pytest.mark.parametrize("node_args,shape,match", [
    (dict(c=4, o=2), (1, 3, 5, 5), "3 channels"),
    (dict(c=6, o=5, groups=3), (1, 6, 5, 5), "does not divide"),
    (dict(c=3, o=2, k=(5, 5)), (1, 3, 4, 4), "smaller than the kernel"),
    (dict(c=3, o=2, pads=(3, 3, 3, 3), pad_mode="reflect"), (1, 3, 3, 3), "reflect"),
    (dict(c=3, o=2), (3, 5, 5), "rank-4"),
])
def test_conv_shape_errors_name_the_node(node_args, shape, match):
    args = dict(node_args)
    node = conv_node(args.pop("c"), args.pop("o"), args.pop("k", (3, 3)), **args)
    with pytest.raises(ShapeError, match=match) as err:
        infer(node, [np.zeros(shape, np.float32)])
    assert "test:1" in str(err.value)


def test_conv_residual_shape_and_missing_weight_and_activation_errors():
    node = conv_node(3, 2, residual=True)
    with pytest.raises(ShapeError, match="residual"):
        infer(node, [rand(1, 3, 5, 5), rand(1, 2, 5, 5)])
    with pytest.raises(ShapeError, match="weight"):
        infer(make_node("Conv", 1), [rand(1, 3, 5, 5)])
    with pytest.raises(UnsupportedOpError, match="swish7"):
        infer(conv_node(3, 2, activation="swish7"), [rand(1, 3, 5, 5)])
    with pytest.raises(UnsupportedOpError, match="mirror") as err:
        infer(conv_node(3, 2, pad_mode="mirror"), [rand(1, 3, 5, 5)])
    assert "conv_0" in str(err.value) and "test:1" in str(err.value)


def test_tconv_errors():
    node = make_node("ConvTranspose", 1, params={"stride": [2, 2], "output_padding": [2, 0]},
                     attrs={"weight": rand(4, 3, 3, 3)})
    with pytest.raises(ShapeError, match="output_padding"):
        infer(node, [rand(1, 4, 5, 5)])
    with pytest.raises(ShapeError, match="expects 4"):
        infer(node, [rand(1, 5, 5, 5)])
    crop = make_node("ConvTranspose", 1, params={"pads": [3, 3, 3, 3]}, attrs={"weight": rand(2, 1, 3, 3)})
    with pytest.raises(ShapeError, match="not positive"):
        infer(crop, [rand(1, 2, 2, 2)])

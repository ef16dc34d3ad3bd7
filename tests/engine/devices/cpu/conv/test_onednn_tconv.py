"""ConvTranspose on oneDNN's deconvolution (engine/devices/cpu/conv/transposed.py) against the numpy float64 reference:
strides, dilations, groups, output_padding, asymmetric pads, fused activations, smaller shapes after the max."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, infos_of, make_node

from engine.devices.cpu.conv import transposed as _tconv_onednn
from engine.devices.cpu.onednn import objects as _onednn

if not _onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

RNG = np.random.default_rng(17)
TOL = dict(rtol=1e-4, atol=1e-5)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def tconv_node(c: int, o: int, k=(3, 3), bias: bool = True, **params):
    g = params.get("groups", 1)
    attrs = {"weight": rand(c, o // g, *k)}
    if bias:
        attrs["bias"] = rand(o)
    return make_node("ConvTranspose", 1, params=params, attrs=attrs)


CONFIGS = {
    "s2_outpad": (4, 6, (3, 3), dict(stride=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1))),
    "k4_s2_relu": (8, 4, (4, 4), dict(stride=(2, 2), pads=(1, 1, 1, 1), activation="relu")),
    "k2_s2_no_bias": (6, 6, (2, 2), dict(stride=(2, 2), bias=False)),
    "groups_dil_asym": (4, 6, (3, 3), dict(stride=(3, 2), dilation=(1, 2), groups=2, pads=(0, 1, 2, 0))),
    "depthwise_s2": (8, 8, (3, 3), dict(stride=(2, 2), groups=8, pads=(1, 1, 1, 1), output_padding=(1, 0))),
    "s1_sigmoid": (5, 3, (3, 3), dict(pads=(1, 1, 1, 1), activation="sigmoid")),
    "rect_leaky": (4, 4, (2, 3), dict(stride=(1, 2), pads=(0, 1, 1, 0), activation="leaky_relu",
                                      activation_params=dict(alpha=0.2))),
}


def node_of(name: str):
    c, o, k, params = CONFIGS[name]
    params = dict(params)
    bias = params.pop("bias", True)
    return tconv_node(c, o, k, bias=bias, **params), c


@pytest.mark.parametrize("name", CONFIGS)
def test_matches_reference_at_max_and_smaller(name):
    node, c = node_of(name)
    big, small = rand(3, c, 9, 8), rand(1, c, 5, 7)
    fn = build_kernel(node, infos_of([big], node=node))[0]
    assert fn.impl.startswith("onednn:")
    check_kernel(node, [big], **TOL)
    check_kernel(node, [small], [big], **TOL)


def test_output_padding_beyond_the_end_pad_keeps_the_numpy_path():
    node = tconv_node(4, 6, stride=(2, 2), output_padding=(1, 1))  # end pads 0 - 1 < 0
    x = rand(1, 4, 6, 6)
    assert not _tconv_onednn.supported(node, infos_of([x], node=node))
    assert build_kernel(node, infos_of([x], node=node))[0].impl == "direct:gemm+col2im"
    check_kernel(node, [x], **TOL)

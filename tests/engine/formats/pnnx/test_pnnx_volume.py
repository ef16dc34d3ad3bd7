"""pnnx's 3-D convolutions and poolings: what the lowering refuses (the canonical Pool3d cannot say it), and torch's
ceil-mode rule where it drops a last window. The supported forms run against PyTorch in test_pnnx_op_goldens.py
(the `volumetric` case)."""

from __future__ import annotations

import numpy as np
import pytest
from test_pnnx_lowering import lower, ops, run

from engine.errors import UnsupportedOpError

X = "pnnx.Input in0 0 1 x #x=(1,2,5,5,5)f32"
OUT = "pnnx.Output out 1 0 y"
MAX_POOL = "nn.MaxPool3d p 1 1 x y ceil_mode=True dilation=(1,1,1) kernel_size=(2,2,2) return_indices=False"


def torch_max_pool3d(x: np.ndarray, k: int, s: int, p: int, out: int) -> np.ndarray:
    """torch's max_pool3d, cubic windows: -inf padding, `out` windows per side (torch's count, ceil mode included)."""
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p + k)] * 3, constant_values=-np.inf)
    y = np.empty(x.shape[:2] + (out,) * 3, x.dtype)
    for d in range(out):
        for h in range(out):
            for w in range(out):
                y[:, :, d, h, w] = xp[:, :, d * s:d * s + k, h * s:h * s + k, w * s:w * s + k].max(axis=(2, 3, 4))
    return y


def test_ceil_mode_window_torch_drops_is_dropped(tmp_path):
    # side 5, kernel 2, stride 2, padding 1: a 4th ceil-mode window would start in the right padding; torch
    # gives 3 windows, so the node runs as floor mode
    g = lower(tmp_path, f"""
{X}
{MAX_POOL} padding=(1,1,1) stride=(2,2,2) #x=(1,2,5,5,5)f32 #y=(1,2,3,3,3)f32
{OUT}
""")
    assert ops(g) == ["Pool3d"] and g.nodes[0].params["ceil_mode"] is False
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)[0], torch_max_pool3d(x, 2, 2, 1, 3))


def test_global_adaptive_pools_are_reductions(tmp_path):
    g = lower(tmp_path, f"""
{X}
nn.AdaptiveMaxPool3d p 1 1 x y output_size=(1,1,1) return_indices=False #x=(1,2,5,5,5)f32 #y=(1,2,1,1,1)f32
{OUT}
""")
    assert ops(g) == ["ReduceMax"]
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)[0], x.max(axis=(2, 3, 4), keepdims=True))


@pytest.mark.parametrize("line, why", [
    ("nn.AvgPool3d p 1 1 x y ceil_mode=False count_include_pad=True divisor_override=None kernel_size=(3,3,3) "
     "padding=(1,1,1) stride=(1,1,1) #x=(1,2,5,5,5)f32 #y=(1,2,5,5,5)f32", "count_include_pad=True"),
    ("nn.AvgPool3d p 1 1 x y ceil_mode=False count_include_pad=False divisor_override=3 kernel_size=(3,3,3) "
     "padding=(0,0,0) stride=(1,1,1) #x=(1,2,5,5,5)f32 #y=(1,2,3,3,3)f32", "divisor_override"),
    ("nn.MaxPool3d p 1 1 x y ceil_mode=False dilation=(2,2,2) kernel_size=(2,2,2) padding=(0,0,0) "
     "return_indices=False stride=(1,1,1) #x=(1,2,5,5,5)f32 #y=(1,2,3,3,3)f32", "dilation"),
    ("nn.Conv3d c 1 1 x y bias=False dilation=(1,1,1) groups=1 in_channels=2 kernel_size=(3,3,3) out_channels=2 "
     "padding=(1,1,1) padding_mode=reflect stride=(1,1,1) @weight=(2,2,3,3,3)f32 #x=(1,2,5,5,5)f32 "
     "#y=(1,2,5,5,5)f32", "padding_mode"),
    ("nn.AdaptiveAvgPool3d p 1 1 x y output_size=(2,2,2) #x=(1,2,5,5,5)f32 #y=(1,2,2,2,2)f32", "output_size"),
])
def test_forms_pool3d_cannot_say_are_refused(tmp_path, line, why):
    with pytest.raises(UnsupportedOpError, match=why) as e:
        lower(tmp_path, f"{X}\n{line}\n{OUT}\n")
    assert "m.pnnx.param:4" in str(e.value)


def test_ceil_mode_on_unknown_sides_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="ceil_mode"):
        lower(tmp_path, f"""
pnnx.Input in0 0 1 x #x=(1,2,?,?,?)f32
{MAX_POOL} padding=(0,0,0) stride=(2,2,2) #x=(1,2,?,?,?)f32 #y=(1,2,?,?,?)f32
pnnx.Output out 1 0 y
""")


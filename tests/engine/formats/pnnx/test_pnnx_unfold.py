"""pnnx's nn.Unfold / F.unfold (im2col) lowered to a Gather of constant block positions: torch's layout written out
by hand, and the refusal where the image sides are unknown at load. Real exports against PyTorch are the
`unfolds` case of test_pnnx_op_goldens.py."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from test_pnnx_lowering import lower, run

from engine.errors import ModelFormatError, UnsupportedOpError


def test_unfold_needs_the_image_sides_at_load(tmp_path):
    # the block index is fixed by H and W: an export with a dynamic image size is refused, naming the line
    with pytest.raises(UnsupportedOpError, match="not known at load") as e:
        lower(tmp_path, """
pnnx.Input in0 0 1 x #x=(1,3,?,?)f32
nn.Unfold u 1 1 x y dilation=(1,1) kernel_size=(3,3) padding=(1,1) stride=(2,2) #x=(1,3,?,?)f32 #y=(1,27,?)f32
pnnx.Output out 1 0 y
""")
    assert "m.pnnx.param:4" in str(e.value)


def test_unfold_gathers_blocks_in_torchs_order(tmp_path):
    # torch.nn.functional.unfold's layout written out: channel c*kh*kw + i*kw + j, block y*ow + x
    g = lower(tmp_path, """
pnnx.Input in0 0 1 x #x=(2,2,4,5)f32
F.unfold u 1 1 x y dilation=(1,2) kernel_size=(2,2) padding=(1,0) stride=(2,1) $input=x #x=(2,2,4,5)f32 #y=(2,8,9)f32
pnnx.Output out 1 0 y
""")
    x = np.random.default_rng(3).standard_normal((2, 2, 4, 5)).astype(np.float32)
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
    want = np.empty((2, 8, 9), np.float32)
    for c in range(2):
        for i in range(2):
            for j in range(2):
                for y in range(3):
                    for xx in range(3):
                        want[:, c * 4 + i * 2 + j, y * 3 + xx] = xp[:, c, y * 2 + i, xx + j * 2]
    np.testing.assert_array_equal(run(g, x)[0], want)


def test_unfold_of_a_huge_declared_image_is_refused_before_its_index_is_made(tmp_path):
    """An image the file declares 65536 x 65536: its block index (a constant made at load) would be 290 GiB of
    int64; refused naming the line, with nothing of that size allocated."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError, match="block elements, more than") as e:
            lower(tmp_path, """
pnnx.Input in0 0 1 x #x=(1,1,65536,65536)f32
nn.Unfold u 1 1 x y dilation=(1,1) kernel_size=(3,3) padding=(1,1) stride=(1,1) #x=(1,1,65536,65536)f32
pnnx.Output out 1 0 y
""")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "m.pnnx.param:4" in str(e.value) and peak < 64 << 20, peak

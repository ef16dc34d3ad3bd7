"""TNN's QuantizedInnerProduct: read, run (int32 sums of the flattened input, one rounding) and written back, against
a step-by-step reference written here (see test_tnn_int8.py for the conventions)."""

from __future__ import annotations

import numpy as np
import pytest
from test_tnn_int8 import quantized_model, round_away

import engine
from engine.formats.tnn.writer.write import write_tnn

RNG = np.random.default_rng(21)
F32 = np.float32


def _reference(x, s_in, w, bias, w_scale, s_out):
    q = round_away(x / s_in).reshape(x.shape[0], -1).astype(np.int64)
    acc = q @ w.astype(np.int64).T + bias
    return round_away(acc.astype(F32) * (w_scale / s_out)).astype(F32) * s_out


@pytest.mark.parametrize("inputs, shape", [("x 4 2 3 2 2", (2, 3, 2, 2)), ("x 2 3 12", (3, 12))])
def test_quantized_inner_product(tmp_path, inputs, shape):
    w = RNG.integers(-127, 128, (5, 12), dtype=np.int8)
    bias = RNG.integers(-400, 400, 5).astype(np.int32)
    w_scale, s_in, s_out = RNG.uniform(0.002, 0.01, 5).astype(F32), F32([0.03]), F32([0.05])
    layer = "QuantizedInnerProduct fc 1 1 x y 5 1 0 1"
    model = quantized_model(tmp_path, [layer], [("InnerProduct", "fc", ["fc", w, bias, w_scale])],
                            {"x": s_in, "y": s_out}, inputs=inputs)
    assert model.op_counts().get("TnnQInnerProduct") == 1
    x = RNG.standard_normal(shape).astype(F32)
    want = _reference(x, s_in, w, bias, w_scale, s_out)
    got = model.instance().run({"x": x})["y"]
    assert got.shape == (shape[0], 5) + (1,) * (len(shape) - 2)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    proto, _ = write_tnn(model.graph, tmp_path / "again")
    assert "QuantizedInnerProduct fc " in proto.read_text()
    again = engine.load(proto)
    np.testing.assert_array_equal(again.instance().run({"x": x})["y"], got)

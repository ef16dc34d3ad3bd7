"""TNN's Histogram: counts of int32 bin indices, against a Python count; bins out of range fail the request."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.errors import EngineError, UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import run1, tnn_model

RNG = np.random.default_rng(47)


def test_histogram_counts_each_bin(tmp_path):
    model = tnn_model(tmp_path, "x 2 4 6 3", ["Histogram h 1 1 x y 7"], "y")
    x = RNG.integers(0, 7, (4, 6)).astype(np.int32)
    seen = Counter(int(v) for v in x.ravel())
    out = run1(model, x)
    assert out.dtype == np.int32 and out.tolist() == [seen[k] for k in range(7)]


def test_histogram_bin_outside_depth_fails_the_request(tmp_path):
    model = tnn_model(tmp_path, "x 2 4 6 3", ["Histogram h 1 1 x y 7"], "y")
    x = np.zeros((4, 6), np.int32)
    x[1, 2] = 7
    with pytest.raises(EngineError, match="outside"):
        run1(model, x)


@pytest.mark.parametrize("inputs, layer, words", [
    ("x 2 4 6 3", "Histogram odd 1 1 x1 y -1", "depth -1"),
    ("x 2 4 6 0", "Histogram odd 1 1 x1 y 7", "float32 input"),
])
def test_histogram_tnn_does_not_define_is_refused_with_file_and_line(tmp_path, inputs, layer, words):
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, inputs, ["Abs a 1 1 x x1", layer], "y")
    assert "Histogram" in str(e.value) and "odd" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert words in str(e.value)

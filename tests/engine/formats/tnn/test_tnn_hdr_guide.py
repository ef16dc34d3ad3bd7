"""TNN's HDRGuide against its CPU acc's per-pixel loop written out in numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError
from tests.engine.formats.tnn.test_tnn_lowering import run1, tnn_model

RNG = np.random.default_rng(43)
F32 = np.float32


def _resources(n_shifts: int = 12):
    return [RNG.standard_normal(9).astype(F32), RNG.standard_normal(3).astype(F32) * 0.1,
            RNG.uniform(-0.5, 0.5, n_shifts).astype(F32), RNG.uniform(0, 1, 12).astype(F32),
            RNG.uniform(0, 1, 3).astype(F32), F32([0.2])]


def hdr_guide_loop(x, ccm_w, ccm_b, shifts, slopes, proj_w, proj_b):
    r, g, b = (x[:, k].astype(np.float64) for k in range(3))
    new = [ccm_w[3 * k] * r + ccm_w[3 * k + 1] * g + ccm_w[3 * k + 2] * b + ccm_b[k] for k in range(3)]
    guide = [sum(slopes[4 * k + i] * np.maximum(new[k] - shifts[4 * k + i], 0) for i in range(4)) for k in range(3)]
    value = proj_w[0] * guide[0] + proj_w[1] * guide[1] + proj_w[2] * guide[2] + proj_b[0]
    return np.clip(value, 0, 1)[:, None]


def test_hdr_guide_matches_the_acc_loop(tmp_path):
    res = _resources()
    model = tnn_model(tmp_path, "x 4 2 3 5 6 0", ["HDRGuide h 1 1 x y"], "y", [("HDRGuide", "h", res)])
    x = RNG.uniform(0, 1, (2, 3, 5, 6)).astype(F32)
    np.testing.assert_allclose(run1(model, x), hdr_guide_loop(x, *res), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inputs, res, words", [
    ("x 4 1 4 5 6 0", _resources(), "(N, 3, H, W)"),
    ("x 4 1 3 5 6 0", _resources(8), "shifts has 8 values"),
])
def test_hdr_guide_malformed_is_a_format_error_with_line(tmp_path, inputs, res, words):
    with pytest.raises(ModelFormatError) as e:
        tnn_model(tmp_path, inputs, ["HDRGuide odd 1 1 x y"], "y", [("HDRGuide", "odd", res)])
    assert e.value.line == 6 and words in str(e.value)

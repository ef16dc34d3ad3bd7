"""TNN's Caffe-SSD layers against numpy references written from Caffe's definitions (prior_box_layer.cpp)."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.engine.formats.tnn.test_tnn_lowering import tnn_model

SHARED_PROTOS = Path(__file__).resolve().parents[4].parent / "shared" / "models" / "tnn" / "_proto_only"


def caffe_priors(fh, fw, ih, iw, mins, maxs, ratios, variances, clip, offset=0.5, step=None):
    """Caffe SSD PriorBox: per cell (row-major), per min size: the square box, sqrt(min*max) square, then one
    box per aspect ratio other than 1 (w = s*sqrt(r), h = s/sqrt(r)); coordinates normalised by the image."""
    step_h, step_w = step or (ih / fh, iw / fw)
    boxes = []
    for h, w in itertools.product(range(fh), range(fw)):
        cx, cy = (w + offset) * step_w, (h + offset) * step_h
        for s, m in enumerate(mins):
            sizes = [(m, m)] + ([(math.sqrt(m * maxs[s]),) * 2] if maxs else [])
            sizes += [(m * math.sqrt(r), m / math.sqrt(r)) for r in ratios if abs(r - 1) > 1e-6]
            for bw, bh in sizes:
                boxes.append([(cx - bw / 2) / iw, (cy - bh / 2) / ih, (cx + bw / 2) / iw, (cy + bh / 2) / ih])
    boxes = np.array(boxes)
    if clip:
        boxes = np.clip(boxes, 0, 1)
    var = np.tile(np.resize(variances, 4), (len(boxes), 1))
    return np.stack([boxes.reshape(-1), var.reshape(-1)]).reshape(1, 2, -1, 1)


INPUTS = "img 4 1 3 30 40 0 :feat 4 1 8 3 5 0"
X = np.zeros((1, 3, 30, 40), np.float32)
F = np.ones((1, 8, 3, 5), np.float32)


@pytest.mark.parametrize("params, kwargs", [
    ("1 12 1 20 0 1 4 0.1 0.1 0.2 0.2 3 1 2 0.5 0 0 0 0 0.5",
     dict(mins=[12], maxs=[20], ratios=[1, 2, 0.5], variances=[0.1, 0.1, 0.2, 0.2], clip=False)),
    ("2 8 16 0 1 1 1 0.1 5 1 2 0.5 3 0.333333 0 0 0 0 0.5",
     dict(mins=[8, 16], maxs=[], ratios=[1, 2, 0.5, 3, 0.333333], variances=[0.1], clip=True)),
    ("1 10 0 0 1 4 0.1 0.1 0.2 0.2 1 1 0 0 8 6 0.25",
     dict(mins=[10], maxs=[], ratios=[1], variances=[0.1, 0.1, 0.2, 0.2], clip=False, offset=0.25, step=(6, 8))),
])
def test_prior_box_lowers_to_caffe_priors(tmp_path, params, kwargs):
    layers = [f"PriorBox pb 2 1 feat img priors {params}", "Add a 2 1 priors priors y -1"]
    model = tnn_model(tmp_path, INPUTS, layers, "y")
    assert "PriorBox" not in str(model.op_counts())
    (y,) = model.instance().run({"img": X, "feat": F}).values()
    ref = 2 * caffe_priors(3, 5, 30, 40, **kwargs)
    assert y.shape == ref.shape == (1, 2, 3 * 5 * (len(ref[0, 0]) // 60) * 4, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)


def test_prior_box_with_image_size_from_params(tmp_path):
    layers = ["PriorBox pb 2 1 feat img priors 1 9 0 0 1 1 0.2 1 1 60 50 0 0 0.5", "Add a 2 1 priors priors y -1"]
    model = tnn_model(tmp_path, INPUTS, layers, "y")
    (y,) = model.instance().run({"img": X, "feat": F}).values()
    ref = 2 * caffe_priors(3, 5, 50, 60, mins=[9], maxs=[], ratios=[1], variances=[0.2], clip=False)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.shared
@pytest.mark.skipif(not SHARED_PROTOS.is_dir(), reason="../shared/models/tnn/_proto_only is not available")
def test_every_prior_box_of_the_real_ssd_protos_lowers(tmp_path):
    records = [r for p in SHARED_PROTOS.glob("mobilenet_v2-ssd__*.tnnproto")
               for r in re.findall(r'"(PriorBox [^"]*?) ?,"', p.read_text())]
    assert len(records) == 6  # the tf_fix_box variant has none
    for k, record in enumerate(records):
        params = record.split()[7:]
        mins, maxs = [float(params[1])], [float(params[3])] if params[2] == "1" else []
        n_var = int(params[5 + len(maxs)])  # n_min min n_max [max] clip flip n_var vars.. n_ratios ratios..
        ratios_at = 6 + len(maxs) + n_var
        ratios = [float(r) for r in params[ratios_at + 1:ratios_at + 1 + int(params[ratios_at])]]
        layers = [f"PriorBox pb 2 1 feat img priors {' '.join(params)}", "Add a 2 1 priors priors y -1"]
        folder = tmp_path / str(k)
        folder.mkdir()
        model = tnn_model(folder, "img 4 1 3 300 300 0 :feat 4 1 8 10 10 0", layers, "y")
        (y,) = model.instance().run({"img": np.zeros((1, 3, 300, 300), np.float32),
                                     "feat": np.zeros((1, 8, 10, 10), np.float32)}).values()
        ref = 2 * caffe_priors(10, 10, 300, 300, mins=mins, maxs=maxs, ratios=ratios,
                               variances=[0.1, 0.1, 0.2, 0.2], clip=False)
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7, err_msg=record)

"""TNN's Caffe-SSD layers against numpy references written from Caffe's and TNN's definitions (prior_box_layer.cpp;
TNN's bbox_util.cc and NaiveDetectionOutput for DetectionOutput)."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError, UnsupportedOpError
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


# -- DetectionOutput -------------------------------------------------------------------------------------------
def caffe_detections(loc, conf, priors, classes, share, background, in_target, code, keep_top_k, conf_thresh,
                     nms_thresh, top_k, eta):
    """Caffe SSD's DetectionOutput as TNN's CPU runtime runs it, box by box in float32 (bbox_util.cc): decode,
    per class scores above the threshold best first, greedy NMS with eta, keep_top_k per image; rows [image,
    label, score, xmin, ymin, xmax, ymax]."""
    f = np.float32
    n, p = loc.shape[0], priors.shape[2] // 4
    boxes, var = priors.reshape(2, p, 4)
    rows = []
    for img in range(n):
        lc = loc[img].reshape(p, 1 if share else classes, 4)
        sc = conf[img].reshape(p, classes)

        def box(i, c, lc=lc):
            pr, v, lo = boxes[i], var[i], lc[i, 0 if share else c]
            v = np.ones(4, f) if in_target else v
            pw, ph = pr[2] - pr[0], pr[3] - pr[1]
            if code == 1:
                return [pr[k] + v[k] * lo[k] for k in range(4)]
            if code == 3:
                return [pr[k] + v[k] * lo[k] * (pw if k % 2 == 0 else ph) for k in range(4)]
            cx, cy = (pr[0] + pr[2]) / f(2), (pr[1] + pr[3]) / f(2)
            x, y = v[0] * lo[0] * pw + cx, v[1] * lo[1] * ph + cy
            w, h = np.exp(v[2] * lo[2]) * pw, np.exp(v[3] * lo[3]) * ph
            return [x - w / f(2), y - h / f(2), x + w / f(2), y + h / f(2)]

        def size(b):
            return f(0) if b[2] < b[0] or b[3] < b[1] else f((b[2] - b[0]) * (b[3] - b[1]))

        def iou(a, b):
            if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
                return f(0)
            iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
            if iw <= 0 or ih <= 0:
                return f(0)
            inter = f(iw * ih)
            return f(inter / (size(a) + size(b) - inter))

        kept = {}
        for c in range(classes):
            if c == background:
                continue
            cand = sorted((i for i in range(p) if sc[i, c] > f(conf_thresh)), key=lambda i, c=c: -sc[i, c])
            cand = cand[:top_k] if top_k > -1 else cand
            thresh, keep = f(nms_thresh), []
            for i in cand:
                if all(iou(box(i, c), box(j, c)) <= thresh for j in keep):
                    keep.append(i)
                    if eta < 1 and thresh > 0.5:
                        thresh = f(thresh * f(eta))
            kept[c] = keep
        if sum(map(len, kept.values())) > keep_top_k:
            best = sorted(((sc[i, c], c, i) for c in kept for i in kept[c]), key=lambda t: -t[0])[:keep_top_k]
            kept = {}
            for _, c, i in best:
                kept.setdefault(c, []).append(i)
        rows += [[img, c, sc[i, c], *box(i, c)] for c in sorted(kept) for i in kept[c]]
    out = np.full((n * keep_top_k, 7), -1, f)
    if rows:
        out[:len(rows)] = np.array(rows, f)
    else:
        out[:n, 0] = np.arange(n)
    return out.reshape(1, 1, -1, 7)


def _detection_inputs(rng, n, p, classes, share, spread=0.3):
    centers = rng.uniform(0.1, 0.9, (p, 2)).astype(np.float32)
    sizes = rng.uniform(0.05, 0.3, (p, 2)).astype(np.float32)
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1)
    var = np.tile(np.array([0.1, 0.1, 0.2, 0.2], np.float32), (p, 1))
    priors = np.stack([boxes.reshape(-1), var.reshape(-1)]).reshape(1, 2, p * 4, 1).astype(np.float32)
    loc = (rng.standard_normal((n, p * (1 if share else classes) * 4)) * spread).astype(np.float32)
    logits = rng.standard_normal((n, p, classes)) * 2
    conf = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).reshape(n, -1).astype(np.float32)
    return loc, conf, priors


DETECTION_CASES = {  # num_classes share background variance_flag code keep_top_k conf nms top_k eta
    "ssd_center_size": (5, 1, 0, 0, 2, 20, 0.3, 0.45, 40, 1.0),
    "per_class_locations": (4, 0, 0, 1, 2, 10, 0.25, 0.5, 30, 1.0),
    "corner_keep_top_k_cut": (6, 1, 0, 1, 1, 3, 0.05, 0.6, 50, 1.0),
    "corner_size_eta": (3, 1, 2, 1, 3, 30, 0.1, 0.9, -1, 0.9),
    "nothing_kept": (3, 1, 0, 0, 2, 5, 0.999, 0.45, 10, 1.0),
}


@pytest.mark.parametrize("case", sorted(DETECTION_CASES))
@pytest.mark.parametrize("batch", [1, 2])
def test_detection_output_matches_the_caffe_reference(tmp_path, case, batch):
    classes, share, bg, flag, code, keep, conf_t, nms_t, top_k, eta = DETECTION_CASES[case]
    p = 40
    loc, conf, priors = _detection_inputs(np.random.default_rng(batch), batch, p, classes, share)
    inputs = (f"loc 2 {batch} {loc.shape[1]} 0 :conf 2 {batch} {conf.shape[1]} 0 :priors 4 1 2 {p * 4} 1 0")
    params = f"{classes} {share} {bg} {flag} {code} {keep} {conf_t} {nms_t} {top_k} {eta}"
    model = tnn_model(tmp_path, inputs, [f"DetectionOutput det 3 1 loc conf priors y {params}"], "y")
    (y,) = model.instance().run({"loc": loc, "conf": conf, "priors": priors}).values()
    # TNN reads the variance flag inverted: 0 in the file means the variance is encoded in the target
    ref = caffe_detections(loc, conf, priors, classes, bool(share), bg, flag == 0, code, keep, conf_t, nms_t,
                           top_k, eta)
    assert y.shape == ref.shape == (1, 1, batch * keep, 7)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    if case != "nothing_kept":
        assert (y[0, 0, :, 1] >= 0).any(), "the case keeps no box: it tests nothing"


def test_a_prior_box_over_a_huge_declared_map_is_refused(tmp_path):
    """A feature map the file declares 65536 x 65536: refused at load, naming the layer, before any box is made
    (the constant would be hundreds of GiB)."""
    layers = ["PriorBox pb 2 1 feat img priors 1 12 1 20 0 1 4 0.1 0.1 0.2 0.2 3 1 2 0.5 0 0 0 0 0.5"]
    with pytest.raises(ModelFormatError, match=r"'pb'.*prior boxes \(65536 x 65536 cells\)"):
        tnn_model(tmp_path, "img 4 1 3 30 40 0 :feat 4 1 8 65536 65536 0", layers, "priors")


def test_detection_output_refuses_what_it_does_not_run(tmp_path):
    inputs = "loc 2 1 16 0 :conf 2 1 12 0 :priors 4 1 2 16 1 0 :arm 2 1 8 0"
    with pytest.raises(UnsupportedOpError, match="RefineDet"):
        tnn_model(tmp_path, inputs, ["DetectionOutput det 4 1 loc conf priors arm y 3 1 0 0 2 5 0.1 0.4 5 1"], "y")
    with pytest.raises(ShapeError, match="do not fit"):  # conf for 4 classes, the params say 3
        tnn_model(tmp_path, inputs.replace("conf 2 1 12", "conf 2 1 16"),
                  ["DetectionOutput det 3 1 loc conf priors y 3 1 0 0 2 5 0.1 0.4 5 1"], "y").instance()


@pytest.mark.shared
@pytest.mark.skipif(not SHARED_PROTOS.is_dir(), reason="../shared/models/tnn/_proto_only is not available")
def test_the_real_ssd_detection_output_record(tmp_path):
    """mobilenet_v2-ssd's own DetectionOutput record (21 classes, center-size, keep_top_k 100), on priors from its
    own PriorBox records and random predictions."""
    text = (SHARED_PROTOS / "mobilenet_v2-ssd__mobilenetv2_ssd.tnnproto").read_text()
    (record,) = re.findall(r'"(DetectionOutput [^"]*?) ?,"', text)
    params = record.split()[8:]  # type, name, 3 1, three inputs, one output, then the params
    p = 2 * 2 * 6
    rng = np.random.default_rng(0)
    loc, conf, priors = _detection_inputs(rng, 1, p, 21, True)
    inputs = f"loc 2 1 {p * 4} 0 :conf 2 1 {p * 21} 0 :priors 4 1 2 {p * 4} 1 0"
    model = tnn_model(tmp_path, inputs, [f"DetectionOutput det 3 1 loc conf priors y {' '.join(params)}"], "y")
    (y,) = model.instance().run({"loc": loc, "conf": conf, "priors": priors}).values()
    ref = caffe_detections(loc, conf, priors, 21, True, 0, params[3] == "0", 2, 100, float(params[6]),
                           float(params[7]), int(params[8]), float(params[9]))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)

"""Every real TNN model in ../shared/models/tnn loads through engine.load and matches TNN's own outputs.

References were made by TNN's CPU runtime (see each folder's SOURCE_TNN_RUN.txt): `output_tnn.npy` or one
`output_tnn__<name>.npy` per output. Converted models also carry ONNX Runtime outputs of the ONNX source.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.runtime.instance import FUSE_AFTER_RUNS

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TNN_MODELS = SHARED / "models" / "tnn"
pytestmark = [pytest.mark.shared,
              pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")]

TOL = 1e-4  # of the output's scale (max abs value)
FOLDERS = ["ultraface_slim320", "retinaface_mobile", "nanodet_m_sim_opt", "mobilenetv2_quantized",
           "converted/misc_conv", "converted/misc_conv_fp16", "converted/misc_norm_op17",
           "converted/misc_transformer", "converted/mobilenet_v2_fp16", "converted/shufflenet_v2_x1_0",
           "converted/squeezenet1_1"]
SLOW = {"nanodet_m_sim_opt", "converted/mobilenet_v2_fp16", "converted/shufflenet_v2_x1_0",
        "converted/squeezenet1_1", "mobilenetv2_quantized"}

_models: dict[str, tuple] = {}


def _run(folder: str) -> tuple[engine.Model, dict[str, np.ndarray]]:
    if folder not in _models:
        d = TNN_MODELS / folder
        model = engine.load(next(d.glob("*.tnnproto")))
        x = np.load(d / "input.npy")
        _models[folder] = model, model.instance().run({model.inputs[0].name: x})
    return _models[folder]


def _references(folder: str, model: engine.Model) -> dict[str, np.ndarray]:
    d = TNN_MODELS / folder
    if (d / "output_tnn.npy").exists():
        return {model.outputs[0].name: np.load(d / "output_tnn.npy")}
    return {p.stem[len("output_tnn__"):]: np.load(p) for p in d.glob("output_tnn__*.npy")}


def _assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, TNN gives {ref.shape}"
    scale = max(float(np.abs(ref).max()), 1e-12)
    err = float(np.abs(got.astype(np.float64) - ref).max()) / scale
    assert err < TOL, f"{what}: max abs error {err:.2e} of the output scale"


def _params():
    return [pytest.param(f, marks=[pytest.mark.slow] if f in SLOW else [], id=f) for f in FOLDERS]


@pytest.mark.parametrize("folder", _params())
def test_matches_tnn_outputs(folder):
    model, outputs = _run(folder)
    refs = _references(folder, model)
    assert refs, f"no TNN reference outputs in {folder}"
    assert sorted(outputs) == sorted(refs) == sorted(o.name for o in model.outputs)
    for name, ref in refs.items():
        _assert_close(outputs[name], ref, f"{folder}:{name}")
    assert model.format == "tnn"


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f.startswith("converted/") and "fp16" not in f])
def test_fp32_conversions_match_onnx_runtime(folder):
    model, outputs = _run(folder)
    _assert_close(outputs[model.outputs[0].name], np.load(TNN_MODELS / folder / "output_ort.npy"), folder)


@pytest.mark.parametrize("folder", ["converted/misc_conv_fp16",
                                    pytest.param("converted/mobilenet_v2_fp16", marks=pytest.mark.slow)])
def test_fp16_weights_match_onnx_runtime_on_truncated_weights(folder):
    # TNN's converter truncates weights to half; ORT run on equally truncated weights is the independent check.
    model, outputs = _run(folder)
    ref = np.load(TNN_MODELS / folder / "output_ort_fp16trunc.npy")
    _assert_close(outputs[model.outputs[0].name], ref, folder)


def test_v1_file_keeps_4d_outputs_and_matches_onnx_twin():
    model, _ = _run("ultraface_slim320")
    assert {o.name: o.shape for o in model.outputs} == {"scores": (1, 4420, 2, 1), "boxes": (1, 4420, 4, 1)}
    ref = np.load(TNN_MODELS / "ultraface_slim320" / "reference.npz")
    out = model.instance().run({"input": ref["input"]})
    for name in ("scores", "boxes"):
        _assert_close(out[name][..., 0], ref[name], f"ultraface:{name} vs ONNX Runtime")


def test_quantized_model_runs_int8_ops():
    model, _ = _run("mobilenetv2_quantized")
    counts = model.op_counts()
    assert counts.get("TnnQConv", 0) >= 40 and "Conv" not in counts
    assert model.inputs[0].dtype == np.float32 and model.outputs[0].dtype == np.float32
    inst = model.instance()
    assert inst.fallback_nodes == []  # every int8 op runs a numba kernel, none the numpy reference
    x = np.load(TNN_MODELS / "mobilenetv2_quantized" / "input.npy")
    for _ in range(FUSE_AFTER_RUNS):  # the runs before and with the merge of its calls into native programs
        inst.run({model.inputs[0].name: x})
    tracemalloc.start()
    try:
        inst.run({model.inputs[0].name: x})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"a run allocated {peak} bytes"  # most activations here are hundreds of KB


@pytest.mark.parametrize("folder, version", [("ultraface_slim320", 2), ("retinaface_mobile", 1),
                                             ("converted/misc_conv_fp16", 1), ("converted/misc_transformer", 2),
                                             pytest.param("nanodet_m_sim_opt", 2, marks=pytest.mark.slow),
                                             pytest.param("mobilenetv2_quantized", 1, marks=pytest.mark.slow)])
def test_rewritten_by_our_writer_still_matches_tnn(tmp_path, folder, version):
    from engine.formats.tnn.writer.write import write_tnn

    model, _ = _run(folder)
    proto, _ = write_tnn(model.graph, tmp_path / "again", version=version)
    again = engine.load(proto)
    outputs = again.instance().run({model.inputs[0].name: np.load(TNN_MODELS / folder / "input.npy")})
    for name, ref in _references(folder, model).items():
        _assert_close(outputs[name], ref, f"{folder} rewritten as v{version}:{name}")

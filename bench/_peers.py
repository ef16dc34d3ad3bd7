"""The peer runtimes of bench/engine.py and the batch-dynamic exports the benches need (needs .venv-dev).

The fixture script (`tools/make_fixtures.py --bench`) writes batch-1 models. Batch 8 needs a dynamic batch
dimension, so `dynamic_exports` rebuilds the same network (same seeds, same weight randomisation, checked
against the fixture's expected.npy) and exports it once more: PNNX with inputshape2 and ONNX with a dynamic
batch axis, into bench/models/<name>/dyn/ (gitignored like the rest of bench/models).
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "bench" / "models"
CORES = os.cpu_count() or 1


def _tools() -> None:
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)


def torch_model(name: str):
    """The fixture's network with its exact random weights (same seeds and randomisation as the fixture)."""
    import torch

    _tools()
    from _fixture_bench import BENCH_MODELS
    from make_fixtures import randomize_norms

    build, size, _ = BENCH_MODELS[name]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = build()
    randomize_norms(model, gen)
    model.eval()
    x = torch.randn(1, 3, size, size, generator=gen)
    expected = np.load(MODELS / name / "expected.npy")
    with torch.no_grad():
        diff = float(np.abs(model(x).numpy() - expected).max())
    if diff > 1e-4 * max(1.0, float(np.abs(expected).max())):
        raise RuntimeError(f"{name}: rebuilt PyTorch model differs from the fixture's expected.npy by {diff}")
    return model


def dynamic_exports(name: str, batch: int = 8) -> Path:
    """bench/models/<name>/dyn/ with model.pnnx.param/.bin (batch dynamic up to any size) and model.onnx."""
    out = MODELS / name / "dyn"
    if (out / "model.pnnx.param").exists() and (out / "model.onnx").exists():
        return out
    import torch

    _tools()
    from _fixture_io import export_pnnx

    model = torch_model(name)
    size = int(np.load(MODELS / name / "input.npy").shape[-1])
    x1, x2 = torch.randn(1, 3, size, size), torch.randn(batch, 3, size, size)
    work = ROOT / ".fixture-work" / "bench-dyn" / name
    paths = export_pnnx(model, [x1], work, name, inputs2=[x2])
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths["param"], out / "model.pnnx.param")
    shutil.copyfile(paths["bin"], out / "model.pnnx.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x1,), str(out / "model.onnx"), input_names=["in0"], output_names=["out0"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"in0": {0: "batch"}, "out0": {0: "batch"}})
    shutil.rmtree(work, ignore_errors=True)
    return out


class OrtRunner:
    def __init__(self, onnx_path: Path):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = CORES
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Interleaved with other engines in one process: idle ORT workers must not spin on the cores the
        # next engine runs on (OMP_WAIT_POLICY=PASSIVE does the same for the OpenMP pools, see engine.py).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: x})[0]


class TorchRunner:
    def __init__(self, name: str):
        import torch

        torch.set_num_threads(CORES)
        self.torch = torch
        self.model = torch_model(name)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.from_numpy(x)).numpy()


class NcnnRunner:
    """ncnn on the .ncnn.param pnnx wrote beside the PNNX files; one image (batch 1) per call."""

    def __init__(self, model_dir: Path):
        import ncnn

        self.ncnn = ncnn
        self.net = ncnn.Net()
        self.net.opt.use_vulkan_compute = False
        self.net.opt.num_threads = CORES
        if self.net.load_param(str(model_dir / "model.ncnn.param")) or \
                self.net.load_model(str(model_dir / "model.ncnn.bin")):
            raise RuntimeError(f"ncnn could not load {model_dir}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        ex = self.net.create_extractor()
        ex.input("in0", self.ncnn.Mat(np.ascontiguousarray(x[0])))
        ret, out = ex.extract("out0")
        if ret != 0:
            raise RuntimeError(f"ncnn extract failed ({ret})")
        return np.array(out).reshape(1, -1)

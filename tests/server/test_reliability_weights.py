"""A loaded model version is immutable: its files changing on disk (truncated in place, rewritten in place with the
same size, replaced with garbage) change nothing it serves and cannot crash the server (weights read through a
mapping of a truncated file would kill it with SIGBUS); they take effect only through a load (explicit mode) or a
poll, and a load of damaged files fails cleanly, naming the file, while the loaded version serves on with the reason
in the repository index and the log. For both formats: PNNX (.pnnx.param + .pnnx.bin) and TNN (.tnnproto +
.tnnmodel), on fixture models whose outputs PyTorch gave (expected.npz)."""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serverproc import ServerProcess

from engine.formats.tnn.tnnmodel import RawBuffer, read_model

pytestmark = pytest.mark.slow  # starts its own servers

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
MODELS = {  # model name -> (fixture, graph file, weights file)
    "pnnx": (FIXTURES / "pnnx" / "resnet", "model.pnnx.param", "model.pnnx.bin"),
    "tnn": (FIXTURES / "tnn" / "transformer_v2", "model.tnnproto", "model.tnnmodel"),
}


def golden(model: str) -> dict[str, np.ndarray]:
    return dict(np.load(MODELS[model][0] / "expected.npz"))


def infer(srv: ServerProcess, model: str) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inputs = []
    for name, value in np.load(MODELS[model][0] / "inputs.npz").items():
        inputs.append(grpcclient.InferInput(name, list(value.shape), "FP32"))
        inputs[-1].set_data_from_numpy(value)
    result = client.infer(model, inputs)
    return {name: result.as_numpy(name) for name in golden(model)}


def close_to(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    """Within 1e-4 of each output's scale (fp32 against PyTorch)."""
    return all(np.max(np.abs(got[k].astype(np.float64) - w)) <= 1e-4 * max(float(np.max(np.abs(w))), 1e-6)
               for k, w in want.items())


def same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(got[k], w) for k, w in want.items())


def largest_weights(path: Path) -> tuple[int, int]:
    """(offset, length) in the file of its largest float32 weight array: bytes that can change with the file's
    structure intact."""
    raw = path.read_bytes()
    if path.suffix == ".tnnmodel":
        arrays = [v.data for r in read_model(path).resources.values() for v in r.fields.values()
                  if isinstance(v, RawBuffer) and v.code == 0]
        blob = max(arrays, key=lambda a: a.nbytes).tobytes()
    else:
        with zipfile.ZipFile(path) as z:
            blob = z.read(max(z.infolist(), key=lambda i: i.file_size))
    return raw.find(blob), len(blob)


def scribble_in_place(path: Path) -> None:
    """Other values over the largest weight array, in place: same size, same inode."""
    at, length = largest_weights(path)
    assert at > 0
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.full(length // 4, 0.75, "<f4").tobytes())


def load(srv: ServerProcess, model: str) -> httpx.Response:
    return httpx.post(f"http://{srv.http_url}/v2/repository/models/{model}/load", timeout=120)


def index_row(srv: ServerProcess, model: str) -> dict:
    rows = httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json()
    return next(r for r in rows if r["name"] == model)


def damaged_reload_keeps_serving(srv: ServerProcess, model: str, file: Path, served: dict[str, np.ndarray]) -> None:
    r = load(srv, model)
    assert r.status_code == 400 and file.name in r.json()["error"], r.text
    row = index_row(srv, model)
    assert row["state"] == "READY" and "reload failed" in row["reason"] and file.name in row["reason"], row
    assert any(" ERROR " in ln and f"model '{model}': reload failed" in ln and file.name in ln for ln in srv.log)
    assert same(infer(srv, model), served)


# The engine still maps .pnnx.bin (engine/formats/pnnx/zip_archive.py): truncating it under a loaded model kills the
# server with SIGBUS. Reading the weights into owned memory fixes it; this marker goes when that change is in.


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Both models without config.pbtxt (auto-complete: their files fix dim 0, so max_batch_size 0)."""
    for model, (fixture, graph, weights) in MODELS.items():
        (tmp_path / model / "1").mkdir(parents=True)
        for f in (graph, weights):
            shutil.copy(fixture / f, tmp_path / model / "1" / f)
    return tmp_path


@pytest.mark.parametrize("model", ["pnnx", "tnn"])
def test_files_changing_under_a_loaded_model(repo, model):
    _, graph, weights = MODELS[model]
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", model)
    version = repo / model / "1"
    original = {f: (version / f).read_bytes() for f in (graph, weights)}
    try:
        served = infer(srv, model)
        assert close_to(served, golden(model))

        # truncated in place: nothing it serves changes, nothing crashes; a load fails naming the file
        os.truncate(version / weights, len(original[weights]) // 3)
        assert same(infer(srv, model), served)
        damaged_reload_keeps_serving(srv, model, version / weights, served)

        # rewritten in place with the same size: the loaded weights serve until a load takes the new ones
        (version / weights).write_bytes(original[weights])
        scribble_in_place(version / weights)
        assert os.path.getsize(version / weights) == len(original[weights])
        assert same(infer(srv, model), served)
        assert load(srv, model).status_code == 200
        changed = infer(srv, model)
        assert not close_to(changed, golden(model))

        # a graph file of garbage: the load fails naming the file; the last loaded version serves on
        (version / graph).write_bytes(b"this is not a model graph\n\x00\xff\xfe")
        damaged_reload_keeps_serving(srv, model, version / graph, changed)

        # the original files back, loaded: PyTorch's outputs again, no reason left on the index
        for f, data in original.items():
            (version / f).write_bytes(data)
        assert load(srv, model).status_code == 200
        assert close_to(infer(srv, model), golden(model))
        assert index_row(srv, model)["reason"] == ""
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0, srv.log_text


def test_poll_mode_a_truncated_file_keeps_the_loaded_version(repo):
    srv = ServerProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    weights = repo / "pnnx" / "1" / MODELS["pnnx"][2]
    try:
        served = infer(srv, "pnnx")
        os.truncate(weights, 1000)
        deadline = time.monotonic() + 60
        while "reload failed" not in index_row(srv, "pnnx")["reason"]:  # the poll saw the change and tried it
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log_text
            time.sleep(0.1)
        assert same(infer(srv, "pnnx"), served)
        assert close_to(infer(srv, "tnn"), golden("tnn"))
    finally:
        assert srv.stop() == 0, srv.log_text

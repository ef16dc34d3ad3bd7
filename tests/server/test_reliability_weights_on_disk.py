"""A served model does not depend on its files after load (issue 17, item 1): rewriting its .pnnx.bin in place with
other bytes of the same size, or truncating it (which used to kill the server with SIGBUS through the mapped
weights), changes nothing in the answers, and the server stays up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from serverproc import ServerProcess

pytestmark = pytest.mark.slow  # starts its own server

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pnnx" / "resnet"
CONFIG = """
name: "resnet"
backend: "pnnx"
max_batch_size: 0
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 1, 3, 64, 64 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 1, 10 ] } ]
"""


def infer(srv: ServerProcess, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "in0", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/resnet/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_weights_changed_on_disk_change_nothing_served(tmp_path: Path) -> None:
    version = tmp_path / "repo" / "resnet" / "1"
    version.mkdir(parents=True)
    for f in FIXTURE.glob("model.*"):
        shutil.copy(f, version / f.name)
    (version.parent / "config.pbtxt").write_text(CONFIG)
    with np.load(FIXTURE / "inputs.npz") as inputs, np.load(FIXTURE / "expected.npz") as expected:
        x, want = inputs["in0"], expected["out0"]
    bin_path = version / "model.pnnx.bin"
    srv = ServerProcess(tmp_path / "repo")
    try:
        first = infer(srv, x)
        np.testing.assert_allclose(first, want, rtol=1e-3, atol=1e-4)  # torch's output for this input
        data = bin_path.read_bytes()
        with open(bin_path, "r+b") as f:  # in place, same size, every byte inverted
            f.write(bytes(255 - b for b in data))
        np.testing.assert_array_equal(infer(srv, x), first)
        os.truncate(bin_path, 0)
        np.testing.assert_array_equal(infer(srv, x), first)
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0, srv.log_text

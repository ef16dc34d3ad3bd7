"""The classification extension: an output requested with `classification: k` answers its top k classes as BYTES
"score:index:label" strings (Triton's format: std::to_string scores, labels from the output's label_filename),
k per batch row for a batching model, over the whole tensor otherwise; on the real server over HTTP and gRPC, and
the formatting rules directly."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository
from tritonclient.utils import InferenceServerException

from server.classification import read_labels, top_classes
from server.errors import InvalidArgumentError, ModelLoadError

X = np.array([[0.5, -1.0, 2.0, 1.5], [1.0, 0.0, -0.5, 3.0]], np.float32)
LABELS = ["cat", "dog"]  # the third class has no line: its entries carry no label
LABELED = AFFINE_CONFIG.replace('{ name: "out1" data_type: TYPE_FP32 dims: [ 3 ] }',
                                '{ name: "out1" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" }')
WHOLE = ('name: "whole"\nbackend: "pnnx"\nmax_batch_size: 0\n'
         'input [ { name: "in0" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]\n'
         'output [ { name: "out0" data_type: TYPE_FP32 dims: [ 2, 3 ] }, '
         '{ name: "out1" data_type: TYPE_FP32 dims: [ 2, 3 ] label_filename: "labels.txt" } ]\n')


def check_classes(got: np.ndarray, scores: np.ndarray, k: int) -> None:
    """`got` (one row's strings) against a plain Python ranking of `scores` (the float64 reference: the scores
    printed by the server, from its float32 outputs, agree to 6 digits), with the labels of LABELS."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:k]
    assert len(got) == len(order)
    for text, index in zip(got, order, strict=True):
        parts = (text.decode() if isinstance(text, bytes) else text).split(":")
        assert int(parts[1]) == index and parts[2:] == ([LABELS[index]] if index < len(LABELS) else [])
        assert len(parts[0].split(".")[1]) == 6  # "%f"
        assert float(parts[0]) == pytest.approx(float(scores[index]), rel=1e-5, abs=1e-6)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    repo = make_repository(tmp_path_factory.mktemp("clsrepo"), {"labeled": LABELED, "whole": WHOLE})
    for name in ("labeled", "whole"):
        (repo / name / "labels.txt").write_text("cat\ndog\n")
    server = ServerProcess(repo)
    yield server
    assert server.stop() == 0, server.log_text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("binary", [False, True])
def test_top_classes_per_batch_row(srv, protocol, binary):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)
    inp = module.InferInput("in0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    kwargs = {"binary_data": binary} if protocol == "http" else {}
    outputs = [module.InferRequestedOutput("out1", class_count=2, **kwargs),
               module.InferRequestedOutput("out0", **kwargs)]
    result = client.infer("labeled", [inp], outputs=outputs)
    classes = result.as_numpy("out1")
    assert classes.shape == (2, 2) and classes.dtype == np.object_
    scores = affine_reference(X)["out1"]
    for row in range(2):
        check_classes(classes[row], scores[row], 2)
    np.testing.assert_allclose(result.as_numpy("out0"), affine_reference(X)["out0"], rtol=1e-5, atol=1e-6)
    # k beyond the classes there are: all of them, in order
    result = client.infer("labeled", [inp], outputs=[module.InferRequestedOutput("out1", class_count=10)])
    assert result.as_numpy("out1").shape == (2, 3)


def test_a_model_without_batching_ranks_the_whole_tensor(srv):
    client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("in0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    result = client.infer("whole", [inp], outputs=[httpclient.InferRequestedOutput("out1", class_count=4)])
    classes = result.as_numpy("out1")
    assert classes.shape == (4,)
    check_classes(classes, affine_reference(X)["out1"].reshape(-1), 4)


def test_classification_parameter_errors(srv):
    url = f"http://{srv.http_url}/v2/models/labeled/infer"
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}],
            "outputs": [{"name": "out1", "parameters": {"classification": -1}}]}
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 400 and "'classification'" in r.json()["error"]
    body["outputs"][0]["parameters"]["classification"] = "two"
    assert httpx.post(url, json=body, timeout=30).status_code == 400
    body["outputs"][0]["parameters"]["classification"] = 0  # 0: the raw scores, as Triton
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["datatype"] == "FP32"
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("in0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    output = grpcclient.InferRequestedOutput("out1")
    output._output.parameters["classification"].string_param = "2"
    with pytest.raises(InferenceServerException, match="'classification'"):
        client.infer("labeled", [inp], outputs=[output])


def test_label_files_stay_inside_the_model_directory(tmp_path):
    repo = make_repository(tmp_path / "repo", {"escape": LABELED.replace("labels.txt", "../secret.txt")})
    (tmp_path / "repo" / "secret.txt").write_text("a\nb\n")
    srv = ServerProcess(repo, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        r = httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}, timeout=10).json()
        row = next(m for m in r if m["name"] == "escape")
        assert row["state"] == "UNAVAILABLE" and "is outside the model directory" in row["reason"]
    finally:
        assert srv.stop() == 0, srv.log_text


# ---- the format ------------------------------------------------------------------------------------------------
def test_formats_as_std_to_string():
    ints = np.array([[3, 9, 9, 1]], np.int32)
    assert top_classes(ints, "INT32", 3, True, ["a", "b", "c"]).tolist() == [[b"9:1:b", b"9:2:c", b"3:0:a"]]
    floats = np.array([0.25, 1e-7, 2.5], np.float64)
    assert top_classes(floats, "FP64", 2, False, []).tolist() == [b"2.500000:2", b"0.250000:0"]
    small = np.array([[200, 7]], np.uint8)
    assert top_classes(small, "UINT8", 1, True, [""]).tolist() == [[b"200:0"]]  # an empty line is no label


def test_unsupported_types_and_sizes():
    with pytest.raises(InvalidArgumentError, match="unsupported type 'BYTES'"):
        top_classes(np.array([b"a"], np.object_), "BYTES", 1, False, [])
    with pytest.raises(InvalidArgumentError, match="unsupported type 'FP16'"):
        top_classes(np.zeros(3, np.float16), "FP16", 1, False, [])
    with pytest.raises(InvalidArgumentError, match="too large"):
        top_classes(np.zeros(1_000_001, np.float32), "FP32", 1, False, [])


def test_label_file_lines(tmp_path):
    (tmp_path / "l.txt").write_bytes(b"a\nb\r\n\nlast")
    assert read_labels(tmp_path, "l.txt", "out", "m") == ["a", "b\r", "", "last"]
    with pytest.raises(ModelLoadError, match="outside the model directory"):
        read_labels(tmp_path, "/etc/hostname", "out", "m")

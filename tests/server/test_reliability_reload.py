"""Reloads swap atomically: clients hammering the model over both protocols while a new version directory appears
(poll mode) or the same name is loaded again with new weights (explicit mode) see no failure, and every answer
comes entirely from one version (the two versions' weights differ, so a mix would show)."""

from __future__ import annotations

import io
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own servers

X = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)
BIAS_SHIFT = 3.0  # the second version adds this to fc.bias


def weights(bin_path: Path) -> tuple[np.ndarray, np.ndarray]:
    with zipfile.ZipFile(bin_path) as z:
        return (np.frombuffer(z.read("fc.weight"), "<f4").reshape(3, 4), np.frombuffer(z.read("fc.bias"), "<f4"))


def reference(bin_path: Path) -> dict[str, np.ndarray]:
    w, b = weights(bin_path)
    h = X.astype(np.float64) @ w.T + b
    return {"out0": np.maximum(h, 0), "out1": 1 / (1 + np.exp(-h))}


def shifted_bin(src: Path) -> bytes:
    """The same .pnnx.bin with fc.bias + BIAS_SHIFT: a model whose outputs differ from the original's."""
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "fc.bias":
                data = (np.frombuffer(data, "<f4") + np.float32(BIAS_SHIFT)).astype("<f4").tobytes()
            zout.writestr(item, data)
    return out.getvalue()


class Hammer:
    """Threads sending X over HTTP and gRPC until stopped; records (protocol, status, model_version, outputs)."""

    def __init__(self, srv: ServerProcess, threads_per_protocol: int = 2):
        self.srv, self.stop_event, self.answers = srv, threading.Event(), []
        self.threads = [threading.Thread(target=fn) for fn in (self._http, self._grpc) for _ in
                        range(threads_per_protocol)]

    def __enter__(self) -> Hammer:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(60)

    def _http(self) -> None:
        body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": X.reshape(-1).tolist()}]}
        with httpx.Client(timeout=60) as client:
            while not self.stop_event.is_set():
                try:
                    r = client.post(f"http://{self.srv.http_url}/v2/models/affine/infer", json=body)
                    doc = r.json()
                except (httpx.HTTPError, ValueError) as exc:  # recorded: classify() fails the test on it
                    self.answers.append(("http", repr(exc), None, {}))
                    continue
                outs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in doc.get("outputs", [])}
                self.answers.append(("http", r.status_code, doc.get("model_version"), outs))

    def _grpc(self) -> None:
        req = pb2.ModelInferRequest(model_name="affine")
        req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(X.tobytes())
        with grpc.insecure_channel(self.srv.grpc_url) as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            while not self.stop_event.is_set():
                try:
                    resp = stub.ModelInfer(req, timeout=60)
                except grpc.RpcError as exc:
                    self.answers.append(("grpc", str(exc.code()), None, {}))
                    continue
                outs = {o.name: np.frombuffer(raw, np.float32).reshape(o.shape)
                        for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)}
                self.answers.append(("grpc", 200, resp.model_version, outs))


def classify(answers: list, refs: dict[str, dict[str, np.ndarray]]) -> Counter:
    """Which reference each answer matches in full; anything else (a failure or a mix) fails the test."""
    seen: Counter = Counter()
    for protocol, status, version, outs in answers:
        assert status == 200, (protocol, status)
        matches = [tag for tag, ref in refs.items()
                   if all(np.allclose(outs[n], ref[n], rtol=1e-5, atol=1e-6) for n in ref)]
        assert len(matches) == 1, f"{protocol} answer matches {matches}: {outs}"
        seen[(matches[0], version)] += 1
    return seen


def wait_for(predicate, timeout: float = 60) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_poll_mode_new_version_swaps_atomically(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    v1 = repo / "affine" / "1" / "model.pnnx.bin"
    srv = ServerProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.3")
    try:
        with Hammer(srv) as hammer:
            wait_for(lambda: len(hammer.answers) >= 20)  # answers from version 1 first
            staging = tmp_path / "staging"  # written next door, then renamed in: the poller never sees half a dir
            staging.mkdir()
            (staging / "model.pnnx.param").write_bytes((v1.parent / "model.pnnx.param").read_bytes())
            (staging / "model.pnnx.bin").write_bytes(shifted_bin(v1))
            staging.rename(repo / "affine" / "2")
            wait_for(lambda: httpx.get(f"http://{srv.http_url}/v2/models/affine").json()["versions"] == ["2"])
            swapped = len(hammer.answers)
            wait_for(lambda: len(hammer.answers) >= swapped + 20)
        refs = {"v1": reference(v1), "v2": reference(repo / "affine" / "2" / "model.pnnx.bin")}
        seen = classify(hammer.answers, refs)
    finally:
        assert srv.stop() == 0, srv.log_text
    assert set(seen) == {("v1", "1"), ("v2", "2")}, seen  # the version field agrees with the numbers


def test_explicit_load_of_the_same_name_swaps_atomically(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    v1 = repo / "affine" / "1" / "model.pnnx.bin"
    old = reference(v1)
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    try:
        with Hammer(srv) as hammer:
            wait_for(lambda: len(hammer.answers) >= 20)
            tmp = v1.with_suffix(".new")
            tmp.write_bytes(shifted_bin(v1))
            tmp.replace(v1)
            r = httpx.post(f"http://{srv.http_url}/v2/repository/models/affine/load", timeout=120)
            assert r.status_code == 200, r.text
            loaded = len(hammer.answers)
            wait_for(lambda: len(hammer.answers) >= loaded + 20)
        seen = classify(hammer.answers, {"old": old, "new": reference(v1)})
    finally:
        assert srv.stop() == 0, srv.log_text
    assert seen[("old", "1")] > 0 and seen[("new", "1")] > 0, seen

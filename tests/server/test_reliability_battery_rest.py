"""Bad requests over REST: every one answers a KServe error (`{"error": ...}`) with Triton's status code, none takes
the server down, and a correct request afterwards still gets the correct answer."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
from serverproc import ServerProcess, affine_reference

GOOD = {"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}


def body(*inputs: dict, **extra: object) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def binary(header: dict, tail: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + tail, {"Inference-Header-Content-Length": str(len(head)),
                         "Content-Type": "application/octet-stream"}


def bin_input(shape: list[int], size: int, datatype: str = "FP32") -> dict:
    return {"name": "in0", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}


def lying_bytes() -> bytes:
    """BYTES wire data whose first element claims 1000 bytes, with 3 behind it."""
    return struct.pack("<I", 1000) + b"abc"


# (id, body, extra headers, expected status, words in the error)
CASES = [
    ("wrong_shape", body({**GOOD, "shape": [1, 5], "data": [1.0] * 5}), {}, 400, "unexpected shape"),
    ("wrong_dtype", body({**GOOD, "datatype": "INT32", "data": [1, 2, 3, 4]}), {}, 400, "data-type"),
    ("unknown_dtype", body({**GOOD, "datatype": "FP8"}), {}, 400, "unsupported datatype"),
    ("wrong_name", body({**GOOD, "name": "inx"}), {}, 400, "unexpected inference input 'inx'"),
    ("missing_input", body(), {}, 400, "missing required input"),
    ("extra_input", body(GOOD, {**GOOD, "name": "extra"}), {}, 400, "unexpected inference input 'extra'"),
    ("non_numeric", body({**GOOD, "data": ["a", "b", "c", "d"]}), {}, 400, "not valid FP32"),
    ("objects_as_data", body({**GOOD, "data": [{"x": 1}] * 4}), {}, 400, "not valid FP32"),
    # NaN, Infinity and -Infinity are data (as in Triton: test_nan_and_infinity_are_data); other spellings are not
    ("nan", b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":[nan,1,2,3]}]}', {}, 400,
     "failed to parse the request JSON"),
    ("inf", b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":[inf,1,2,3]}]}', {}, 400,
     "failed to parse the request JSON"),
    ("nan_string", b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":["NaN",1,2,3]}]}', {}, 400,
     'element 0 is "NaN", not a number'),
    ("nan_as_int", b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"INT32","data":[NaN,1,2,3]}]}', {}, 400,
     "element 0 is NaN, not an integer"),
    ("truncated_binary", *binary({"inputs": [bin_input([1, 4], 16)]}, b"\0" * 8), 400, "past the end"),
    ("unclaimed_binary", *binary({"inputs": [bin_input([1, 4], 16)]}, b"\0" * 20), 400, "not claimed"),
    ("header_past_body", body(GOOD), {"Inference-Header-Content-Length": "100000"}, 400, "outside the body"),
    ("header_negative", body(GOOD), {"Inference-Header-Content-Length": "-5"}, 400, "outside the body"),
    ("header_not_int", body(GOOD), {"Inference-Header-Content-Length": "lots"}, 400, "must be an integer"),
    ("binary_size_negative", *binary({"inputs": [bin_input([1, 4], -16)]}, b"\0" * 16), 400, "non-negative"),
    ("binary_size_string", *binary({"inputs": [bin_input([1, 4], "16")]}, b"\0" * 16), 400, "non-negative"),
    ("bytes_lying_length", *binary({"inputs": [bin_input([1, 1], 7, "BYTES")]}, lying_bytes()), 400,
     "claims 1000 bytes"),
    ("bytes_short", *binary({"inputs": [bin_input([1, 4], 2, "BYTES")]}, b"\1\0"), 400, "BYTES data ends"),
    ("huge_dims_json", body({**GOOD, "shape": [2**40, 2**40]}), {}, 400, "needs"),
    ("huge_dims_binary", *binary({"inputs": [bin_input([2**31, 2**31], 16)]}, b"\0" * 16), 400, "needs"),
    ("huge_batch", body({**GOOD, "shape": [9, 4], "data": [0.0] * 36}), {}, 400, "batch-size"),
    ("negative_dims", body({**GOOD, "shape": [-1, 4]}), {}, 400, "non-negative"),
    ("float_dims", body({**GOOD, "shape": [1.0, 4]}), {}, 400, "non-negative"),
    ("invalid_utf8", b'{"inputs":[{"name":"in\xff\xfe0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}', {},
     400, "failed to parse"),
    ("gigantic_array", body({**GOOD, "data": [0.5] * 2_000_000}), {}, 400, "2000000 values"),
    ("deeply_nested", b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":' + b"[" * 200_000 + b"]}]}",
     {}, 400, "failed to parse"),
    ("not_json", b"\x00\x01garbage", {}, 400, "failed to parse"),
    ("empty_body", b"", {}, 400, "failed to parse"),
    ("json_array", b"[1, 2, 3]", {}, 400, "must be an object"),
    ("inputs_not_list", b'{"inputs": {"in0": 1}}', {}, 400, "list 'inputs'"),
    ("input_not_object", b'{"inputs": [42]}', {}, 400, "needs 'name'"),
    ("parameters_not_object", body(GOOD, parameters=[1, 2]), {}, 400, "must be an object"),
    ("timeout_not_int", body(GOOD, parameters={"timeout": "soon"}), {}, 400,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got \"soon\""),
    ("priority_negative", body(GOOD, parameters={"priority": -3}), {}, 400,
     "Unable to parse 'priority': expected an unsigned 64-bit integer, got -3"),
    ("priority_past_uint64", body(GOOD, parameters={"priority": 2**64}), {}, 400,
     "Unable to parse 'priority': expected an unsigned 64-bit integer, got 18446744073709551616"),
    ("priority_fraction", body(GOOD, parameters={"priority": 1.5}), {}, 400,
     "Unable to parse 'priority': expected an unsigned 64-bit integer, got 1.5"),
    ("timeout_past_uint64", body(GOOD, parameters={"timeout": 2**64}), {}, 400,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got 18446744073709551616"),
    ("timeout_negative", body(GOOD, parameters={"timeout": -1}), {}, 400,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got -1"),
    ("timeout_number_string", body(GOOD, parameters={"timeout": "1000"}), {}, 400,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got \"1000\""),
    ("outputs_not_list", body(GOOD, outputs={"name": "out0"}), {}, 400, "'outputs' must be a list"),
    ("unknown_output", body(GOOD, outputs=[{"name": "out9"}]), {}, 400, "unexpected inference output"),
    ("bad_gzip", body(GOOD), {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_answers_kserve_error(server: ServerProcess, case: tuple) -> None:
    _, content, headers, status, words = case
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=content,
                   headers={"Content-Type": "application/json", **headers}, timeout=60)
    assert r.status_code == status, r.text
    assert words in r.json()["error"], r.text


@pytest.mark.parametrize(("path", "status", "words"), [
    ("/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),  # Triton 2.51
    ("/v2/models/affine/versions/7/infer", 404, "version 7"),
    ("/v2/models/%2e%2e%2faffine/infer", 404, ""),  # not a route: Starlette's plain 404
])
def test_bad_model_paths(server: ServerProcess, path: str, status: int, words: str) -> None:
    r = httpx.post(f"http://{server.http_url}{path}", content=body(GOOD), timeout=30)
    assert r.status_code == status, r.text
    assert words in r.text


def test_server_still_correct_after_the_battery(server: ServerProcess) -> None:
    for case in CASES:  # the whole battery again, back to back, then a correct request
        httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=case[1], headers=case[2], timeout=60)
    x = np.array([[0.5, -1.0, 2.0, 3.5]], np.float32)
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer",
                   json={"inputs": [{**GOOD, "data": x.reshape(-1).tolist()}]}, timeout=30)
    assert r.status_code == 200, r.text
    outs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    for name, expected in affine_reference(x).items():
        np.testing.assert_allclose(outs[name], expected, rtol=1e-5, atol=1e-6)
    assert server.proc.poll() is None
    assert "Traceback" not in server.log_text, server.log_text


def test_nan_and_infinity_are_data(server: ServerProcess) -> None:
    """NaN, Infinity and -Infinity in a request's JSON are values, as Triton reads them (its JSON parser takes them,
    rapidjson's kParseNanAndInfFlag) and as gRPC's typed floats carry them; the answer follows IEEE and writes them
    the same way (Triton: kWriteNanAndInfFlag). A number too large for FP32 (1e39) is still refused."""
    head = b'{"inputs":[{"name":"in0","shape":[2,4],"datatype":"FP32","data":[[NaN,1,2,3],[-Infinity,1,2,Infinity]]}]}'
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=head, timeout=30)
    assert r.status_code == 200, r.text
    assert b"NaN" in r.content  # written as Triton writes it, which json.loads reads back
    outs = {o["name"]: np.array(o["data"], np.float64).reshape(o["shape"]) for o in r.json()["outputs"]}
    assert np.isnan(outs["out1"][0]).all()  # a NaN reaches every output of the linear layer
    with np.errstate(invalid="ignore", over="ignore"):
        expected = affine_reference(np.array([[-np.inf, 1, 2, np.inf]], np.float32))["out1"]
    np.testing.assert_allclose(outs["out1"][1:], expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", timeout=30,
                   content=b'{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":[NaN,1e39,2,3]}]}')
    assert r.status_code == 400 and "element 1 is 1e+39, outside the range of FP32" in r.json()["error"], r.text


def test_raw_binary_request(server: ServerProcess) -> None:
    """Inference-Header-Content-Length: 0: the body is the only input (batch 1); every output comes back binary."""
    x = np.array([[0.25, 1.5, -2.0, 3.0]], np.float32)
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=x.tobytes(),
                   headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert r.status_code == 200, r.text
    head_len = int(r.headers["Inference-Header-Content-Length"])
    head, pos = json.loads(r.content[:head_len]), head_len
    ref = affine_reference(x)
    for out in head["outputs"]:
        size = out["parameters"]["binary_data_size"]
        got = np.frombuffer(r.content[pos:pos + size], np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, ref[out["name"]], rtol=1e-5, atol=1e-6)
        pos += size
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=x.tobytes()[:15],
                   headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert r.status_code == 400 and "got 15 bytes" in r.json()["error"], r.text

"""The link between the server and a Python-backend worker (server/python_backend/ipc.py) and the
triton_python_backend_utils module's pure parts: tensors of every Triton type cross unchanged, and a frame that
breaks the format or a limit is refused before anything is allocated for it."""

from __future__ import annotations

import json
import socket
import struct

import numpy as np
import pytest

from server.python_backend import ipc, pb_utils
from server.python_backend.ipc import IpcError, Link


@pytest.fixture
def pair():  # noqa: ANN201
    a, b = socket.socketpair()
    yield Link(a), Link(b)
    a.close()
    b.close()


ARRAYS = [
    np.arange(12, dtype=np.int32).reshape(3, 4),
    np.array([True, False, True]),
    np.linspace(0, 1, 5).astype(np.float16),
    np.array([[b"he\x00llo", b""], [b"\xff", "\u00e9".encode()]], dtype=object),
    np.zeros((0, 3), np.float32),
    np.array([1, 2], dtype=np.uint64),
]


def test_tensors_of_every_kind_cross_unchanged(pair):
    out, into = pair
    out.send({"kind": "x", "n": 1}, [({"name": f"t{i}"}, a) for i, a in enumerate(ARRAYS)])
    header, tensors = into.receive()
    assert header == {"kind": "x", "n": 1}
    for (description, array), sent in zip(tensors, ARRAYS, strict=True):
        assert description["name"].startswith("t")
        assert array.shape == sent.shape and array.dtype == sent.dtype
        assert [bytes(v) if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()] == \
            sent.reshape(-1).tolist()


def test_strings_and_fixed_width_bytes_travel_as_bytes(pair):
    out, into = pair
    out.send({}, [({"name": "s"}, np.array(["a", "\u00e9"])), ({"name": "b"}, np.array([b"x\x00z", b"y"]))])
    _, tensors = into.receive()
    assert tensors[0][1].tolist() == [b"a", "\u00e9".encode()] and tensors[1][1].tolist() == [b"x\x00z", b"y"]


def test_the_closed_link_between_frames_is_the_end(pair):
    out, into = pair
    out.close()
    assert into.receive() is None


def raw_frame(header: dict, body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return ipc.PREFIX.pack(len(head), len(body)) + head + body


@pytest.mark.parametrize("frame, words", [
    (ipc.PREFIX.pack(ipc.MAX_HEADER_BYTES + 1, 0), "over the limits"),
    (ipc.PREFIX.pack(10, ipc.MAX_BODY_BYTES + 1), "over the limits"),
    (ipc.PREFIX.pack(5, 0) + b"[1,2]", "not a JSON object"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "i4", "shape": [4], "nbytes": 16}]}, b"\0" * 8),
     "past the frame's end"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "i4", "shape": [4], "nbytes": 8}]}, b"\0" * 8),
     "8 bytes for shape [4]"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "O", "shape": [1], "nbytes": 6}]}, struct.pack("<I", 9) + b"ab"),
     "runs past the tensor's end"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "i4", "shape": [1], "nbytes": 4}]}, b"\0" * 6),
     "2 bytes of a frame are claimed by no tensor"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "V8", "shape": [1], "nbytes": 8}]}, b"\0" * 8),
     "malformed description"),
    (raw_frame({"tensors": [{"name": "t", "dtype": "i4", "shape": [-1], "nbytes": 0}]}), "malformed description"),
    # a BYTES shape of 2^40 elements in 8 bytes: refused before an array of that many is allocated
    (raw_frame({"tensors": [{"name": "t", "dtype": "O", "shape": [1 << 20, 1 << 20], "nbytes": 8}]}, b"\0" * 8),
     "8 bytes cannot hold 1099511627776 BYTES elements"),
])
def test_a_malformed_frame_is_refused(pair, frame, words):
    out, into = pair
    out.sock.sendall(frame)
    with pytest.raises(IpcError) as info:
        into.receive()
    assert words in str(info.value)


def test_a_frame_cut_short_is_refused(pair):
    out, into = pair
    out.sock.sendall(ipc.PREFIX.pack(100, 0) + b"{")
    out.close()
    with pytest.raises(IpcError, match="closed in the middle of a frame"):
        into.receive()


def test_tensors_over_the_limit_are_refused_when_sent(pair, monkeypatch):
    monkeypatch.setattr(ipc, "MAX_BODY_BYTES", 64)
    with pytest.raises(IpcError, match="exceed the Python backend's limit of 64 bytes"):
        pair[0].send({}, [({"name": "big"}, np.zeros(100, np.uint8))])


def test_a_type_triton_lacks_is_refused():
    with pytest.raises(IpcError, match="complex128 has no Triton datatype"):
        ipc.encode_frame({}, [({"name": "c"}, np.zeros(2, np.complex128))])


# ---- triton_python_backend_utils ----------------------------------------------------------------------------------
def test_auto_complete_refuses_what_contradicts_the_config():
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 8,
                                   "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}], "output": []})
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'X', model provides "
                                         "TYPE_INT32"):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [3]})
    with pytest.raises(ValueError, match="the model expects dims \\[4\\] but the model configuration specifies dims"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(4)
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict()["output"] == [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}]


def test_type_helpers_follow_triton():
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11 and pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    data = np.array([b"ab", b"", b"\x00c"], dtype=object)
    np.testing.assert_array_equal(pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(data)), data)


def test_a_response_sender_closes_after_the_final_flag():
    sender = pb_utils.InferenceResponseSender(pb_utils.InferenceRequest("m"), decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(pb_utils.InferenceResponse(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse())

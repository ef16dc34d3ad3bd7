"""System shared memory (Triton's extension) against the real server, with tritonclient and its shared-memory
utilities, as Triton's simple_{http,grpc}_shm_client examples use them: regions registered, inputs read from and
outputs written to them, status and unregister; then what must be refused (keys outside /dev/shm, symlinks,
windows outside a region, regions too small, a server that does not allow client shared memory) and a region
unregistered while a request still uses it."""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository
from tritonclient.utils import InferenceServerException

X = np.array([[0.5, -1.0, 2.0, 1.5], [1.0, 0.0, -0.5, 3.0]], np.float32)
HOLD_ROW = [1e26] * 4  # held at tests/server/held_ops.py's gate (a plugin of the server, never imported here)
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, gate: Path):
    repo = make_repository(tmp_path_factory.mktemp("shmrepo"), {"affine": AFFINE_CONFIG})
    env = {"NNSERVE_PLUGINS": "held_ops", "NNSERVE_TEST_GATE": str(gate),
           "PYTHONPATH": str(Path(__file__).resolve().parent)}
    server = ServerProcess(repo, "--allow-client-shm", "true", env=env)
    yield server
    (gate / "open").touch()  # never leave an execution held
    assert server.stop() == 0, server.log_text


def client(srv: ServerProcess, protocol: str):
    module = CLIENTS[protocol]
    return module, module.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class Regions:
    """Shared-memory objects a test creates, destroyed at its end."""

    def __init__(self) -> None:
        self.handles = []

    def create(self, name: str, size: int):
        handle = shm.create_shared_memory_region(name, "/" + name, size)
        self.handles.append(handle)
        return handle

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions():
    made = Regions()
    yield made
    made.destroy()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory(srv, regions, protocol):
    module, c = client(srv, protocol)
    c.unregister_system_shared_memory()
    inp_key, out_key = unique("in"), unique("out")
    inp = regions.create(inp_key, X.nbytes)
    shm.set_shared_memory_region(inp, [X])
    out_bytes = X.shape[0] * 3 * 4
    out = regions.create(out_key, 2 * out_bytes)
    c.register_system_shared_memory("input_data", "/" + inp_key, X.nbytes)
    c.register_system_shared_memory("output_data", "/" + out_key, 2 * out_bytes)
    status = c.get_system_shared_memory_status()
    if protocol == "http":
        assert sorted(r["name"] for r in status) == ["input_data", "output_data"]
        assert {"name": "input_data", "key": "/" + inp_key, "offset": 0, "byte_size": X.nbytes} in status
    else:
        assert sorted(status.regions) == ["input_data", "output_data"]
        assert status.regions["input_data"].byte_size == X.nbytes

    infer_input = module.InferInput("in0", list(X.shape), "FP32")
    infer_input.set_shared_memory("input_data", X.nbytes)
    outputs = [module.InferRequestedOutput(name) for name in ("out0", "out1")]
    outputs[0].set_shared_memory("output_data", out_bytes)
    outputs[1].set_shared_memory("output_data", out_bytes, offset=out_bytes)
    result = c.infer("affine", [infer_input], outputs=outputs)
    expected = affine_reference(X)
    for i, name in enumerate(("out0", "out1")):
        meta = result.get_output(name)
        shape = list(meta["shape"] if protocol == "http" else meta.shape)
        assert shape == [2, 3]
        got = shm.get_contents_as_numpy(out, np.float32, shape, offset=i * out_bytes)
        np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6)
    if protocol == "grpc":  # the data is in the region only: raw_output_contents keeps an empty place for it
        assert [len(raw) for raw in result.get_response().raw_output_contents] == [0, 0]
    else:
        assert all("data" not in o and "parameters" not in o for o in result.get_response()["outputs"])

    # a shared-memory input with an output in the response, as simple_*_shm_client's second half does
    result = c.infer("affine", [infer_input], outputs=[module.InferRequestedOutput("out1")])
    np.testing.assert_allclose(result.as_numpy("out1"), expected["out1"], rtol=1e-5, atol=1e-6)

    c.unregister_system_shared_memory("input_data")
    status = c.get_system_shared_memory_status()
    names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
    assert names == ["output_data"]
    c.unregister_system_shared_memory()
    status = c.get_system_shared_memory_status()
    assert (status == [] if protocol == "http" else not status.regions)
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'input_data'"):
        c.infer("affine", [infer_input])


def test_region_at_an_offset_and_status_of_one(srv, regions):
    _, c = client(srv, "http")
    c.unregister_system_shared_memory()
    key = unique("off")
    handle = regions.create(key, 64 + X[:1].nbytes)
    shm.set_shared_memory_region(handle, [X[:1]], offset=64)
    c.register_system_shared_memory("shifted", "/" + key, X[:1].nbytes, offset=64)
    assert c.get_system_shared_memory_status("shifted") == [
        {"name": "shifted", "key": "/" + key, "offset": 64, "byte_size": X[:1].nbytes}]
    infer_input = httpclient.InferInput("in0", [1, 4], "FP32")
    infer_input.set_shared_memory("shifted", X[:1].nbytes)
    result = c.infer("affine", [infer_input])
    np.testing.assert_allclose(result.as_numpy("out0"), affine_reference(X[:1])["out0"], rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
        c.get_system_shared_memory_status("nope")
    c.unregister_system_shared_memory()


def url(srv: ServerProcess, path: str) -> str:
    return f"http://{srv.http_url}{path}"


def register(srv: ServerProcess, name: str, key: str, byte_size: int, offset: int = 0) -> httpx.Response:
    return httpx.post(url(srv, f"/v2/systemsharedmemory/region/{name}/register"),
                      json={"key": key, "offset": offset, "byte_size": byte_size}, timeout=30)


@pytest.mark.parametrize(("key", "words"), [
    ("/../etc/passwd", "invalid shm key"),
    ("a/b", "invalid shm key"),
    ("..", "invalid shm key"),
    ("///", "invalid shm key"),
    ("/" + "k" * 300, "invalid shm key"),
    ("/triton_python_backend_shm_region_x", "reserved prefix"),
    ("/nnserve_no_such_object_here", "Unable to open shared memory region"),
])
def test_keys_must_name_one_object_in_dev_shm(srv, key, words):
    r = register(srv, "bad", key, 16)
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_symlinks_and_other_files_are_refused(srv, tmp_path, regions):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 64)
    link = Path("/dev/shm") / unique("link")
    fifo = Path("/dev/shm") / unique("fifo")
    link.symlink_to(secret)
    os.mkfifo(fifo)
    try:
        r = register(srv, "link", "/" + link.name, 16)
        assert r.status_code == 400 and "symbolic link" in r.json()["error"], r.text
        r = register(srv, "fifo", "/" + fifo.name, 16)
        assert r.status_code == 400 and "not a shared-memory object" in r.json()["error"], r.text
    finally:
        link.unlink()
        fifo.unlink()
    assert httpx.get(url(srv, "/v2/systemsharedmemory/status"), timeout=10).json() == []


def test_windows_must_lie_within_the_region(srv, regions):
    _, c = client(srv, "http")
    c.unregister_system_shared_memory()
    key = unique("small")
    regions.create(key, 32)
    r = register(srv, "toolong", "/" + key, 64)
    assert r.status_code == 400 and "failed to register shared memory region 'toolong': invalid args" in r.text
    r = register(srv, "shifted", "/" + key, 16, offset=24)
    assert r.status_code == 400 and "invalid args" in r.text
    assert register(srv, "small", "/" + key, 32).status_code == 200
    r = register(srv, "small", "/" + key, 16)  # Triton: ALREADY_EXISTS, HTTP 400
    assert r.status_code == 400 and "shared memory region 'small' already in manager" in r.json()["error"]

    def infer(params: dict) -> httpx.Response:
        body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "parameters": params}]}
        return httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)

    r = infer({"shared_memory_region": "small", "shared_memory_byte_size": 32, "shared_memory_offset": 32})
    assert r.status_code == 400 and "Invalid offset for shared memory region: 'small'" in r.json()["error"]
    r = infer({"shared_memory_region": "small", "shared_memory_byte_size": 32, "shared_memory_offset": 8})
    assert r.status_code == 400 and "Invalid offset + byte size for shared memory region: 'small'" in r.text
    r = infer({"shared_memory_region": "small", "shared_memory_byte_size": 16})  # shape [2, 4] needs 32 bytes
    assert r.status_code == 400 and "got 16 bytes of data" in r.json()["error"]
    r = infer({"shared_memory_region": "small"})
    assert r.status_code == 400 and "'shared_memory_byte_size' must be specified" in r.json()["error"]
    r = infer({"shared_memory_region": "ghost", "shared_memory_byte_size": 32})
    assert r.status_code == 404 and "Unable to find shared memory region: 'ghost'" in r.json()["error"]
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist(),
                        "parameters": {"shared_memory_region": "small", "shared_memory_byte_size": 32}}]}
    r = httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "Input must set only one of the following fields" in r.json()["error"]

    # an output region too small for the output, and the combinations Triton refuses
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}],
            "outputs": [{"name": "out0", "parameters": {"shared_memory_region": "small",
                                                        "shared_memory_byte_size": 8}}]}
    r = httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "should be at least 24 bytes to hold the results" in r.json()["error"]
    body["outputs"][0]["parameters"].update(classification=2, shared_memory_byte_size=24)
    r = httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "can't set both 'shared_memory_region' and 'classification'" in r.text
    c.unregister_system_shared_memory()


def test_a_shrunken_object_is_an_error_not_a_crash(srv, regions):
    """The client truncates its object after registering it: a mapping would kill the server with SIGBUS; reads
    and writes through the descriptor answer an error instead."""
    _, c = client(srv, "http")
    c.unregister_system_shared_memory()
    key = unique("shrink")
    regions.create(key, 64)
    assert register(srv, "shrink", "/" + key, 64).status_code == 200
    fd = os.open(f"/dev/shm/{key}", os.O_RDWR)
    os.ftruncate(fd, 8)
    os.close(fd)
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32",
                        "parameters": {"shared_memory_region": "shrink", "shared_memory_byte_size": 32}}]}
    r = httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "smaller than when it was registered" in r.json()["error"], r.text
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}],
            "outputs": [{"name": "out0", "parameters": {"shared_memory_region": "shrink",
                                                        "shared_memory_byte_size": 24}}]}
    r = httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "smaller than when it was registered" in r.json()["error"], r.text
    assert os.stat(f"/dev/shm/{key}").st_size == 8  # not grown by the server
    c.unregister_system_shared_memory()
    assert srv.proc.poll() is None


def test_unregistered_while_in_use(srv, regions, gate):
    """A request holds its regions: unregistering them answers at once, the request still reads and writes them,
    and they close when it is done (Triton's rule)."""
    _, c = client(srv, "grpc")
    c.unregister_system_shared_memory()
    row = np.array([HOLD_ROW], np.float32)
    inp_key, out_key = unique("heldin"), unique("heldout")
    shm.set_shared_memory_region(regions.create(inp_key, row.nbytes), [row])
    out = regions.create(out_key, 12)
    c.register_system_shared_memory("held_in", "/" + inp_key, row.nbytes)
    c.register_system_shared_memory("held_out", "/" + out_key, 12)
    infer_input = grpcclient.InferInput("in0", [1, 4], "FP32")
    infer_input.set_shared_memory("held_in", row.nbytes)
    output = grpcclient.InferRequestedOutput("out0")
    output.set_shared_memory("held_out", 12)
    done = []
    c.async_infer("affine", [infer_input], callback=lambda result, error: done.append((result, error)),
                  outputs=[output])
    deadline = time.monotonic() + 60
    while not list(gate.glob("entered-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(gate.glob("entered-*")), "the request never reached the model"
    c.unregister_system_shared_memory()  # while the request holds both regions
    assert not c.get_system_shared_memory_status().regions
    (gate / "open").touch()
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    result, error = done[0]
    assert error is None, error
    with np.errstate(over="ignore"):
        expected = affine_reference(row)["out0"]
    np.testing.assert_allclose(shm.get_contents_as_numpy(out, np.float32, [1, 3]), expected, rtol=1e-5)
    assert srv.proc.poll() is None


def test_cuda_shared_memory_answers_gpus_not_supported(srv):
    _, c = client(srv, "http")
    assert c.get_cuda_shared_memory_status() == []
    r = httpx.post(url(srv, "/v2/cudasharedmemory/region/gpu0/register"),
                   json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == "failed to register CUDA shared memory region: 'gpu0', GPUs not supported"
    _, g = client(srv, "grpc")
    with pytest.raises(InferenceServerException, match="GPUs not supported"):
        g.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 16)
    g.unregister_cuda_shared_memory()
    assert not g.get_cuda_shared_memory_status().regions


def test_client_shared_memory_is_off_by_default(server):
    """The session server runs without --allow-client-shm: registering answers Triton's UNSUPPORTED text."""
    words = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    r = httpx.post(f"http://{server.http_url}/v2/systemsharedmemory/region/r/register",
                   json={"key": "/x", "byte_size": 8}, timeout=30)
    assert r.status_code == 501 and r.json()["error"] == words
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        grpcclient.InferenceServerClient(server.grpc_url).register_system_shared_memory("r", "/x", 8)
    assert httpx.get(f"http://{server.http_url}/v2/systemsharedmemory/status", timeout=10).json() == []
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32",
                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]}
    r = httpx.post(f"http://{server.http_url}/v2/models/affine/infer", content=json.dumps(body), timeout=30)
    assert r.status_code == 404 and "Unable to find shared memory region: 'r'" in r.json()["error"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_inputs_count_against_the_request_limit_under_concurrency(tmp_path, regions, protocol):
    """A request's shared-memory inputs may hold no more bytes than its body could carry (--http-max-input-size,
    --grpc-max-message-size), checked from the window sizes before anything is copied: several clients at once,
    each naming a window over the limit, are each refused (413 / RESOURCE_EXHAUSTED); a window within the limit is
    then read and answered."""
    limit = 4096
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo, "--allow-client-shm", "true", "--http-max-input-size", str(limit),
                           "--grpc-max-message-size", str(limit))
    try:
        module, c = client(server, protocol)
        big = np.ones((4 * limit // 16, 4), np.float32)  # 4x the limit
        key = unique("over")
        handle = regions.create(key, big.nbytes)
        shm.set_shared_memory_region(handle, [big])
        c.register_system_shared_memory("big", "/" + key, big.nbytes)

        def over_the_limit(_: int) -> str:
            own = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
            inp = module.InferInput("in0", list(big.shape), "FP32")
            inp.set_shared_memory("big", big.nbytes)
            with pytest.raises(InferenceServerException) as info:
                own.infer("affine", [inp])
            return str(info.value.status()), info.value.message()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(over_the_limit, range(8)))
        status = "413" if protocol == "http" else "StatusCode.RESOURCE_EXHAUSTED"
        words = (f"the request's shared-memory inputs hold {big.nbytes} bytes, more than the {limit} a request may "
                 "carry")
        assert all(s == status and words in m for s, m in answers), answers
        # a window within the limit, in the same region, is read and answered
        inp = module.InferInput("in0", list(X.shape), "FP32")
        shm.set_shared_memory_region(handle, [X])
        inp.set_shared_memory("big", X.nbytes)
        result = c.infer("affine", [inp])
        for name, expected in affine_reference(X).items():
            np.testing.assert_allclose(result.as_numpy(name), expected, rtol=1e-5, atol=1e-6)
        c.unregister_system_shared_memory()
    finally:
        assert server.stop() == 0, server.log_text

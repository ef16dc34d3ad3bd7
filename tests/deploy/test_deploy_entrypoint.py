"""The image's ENTRYPOINT + CMD, run locally on the bundled model_repository/ from the wheel the image installs,
answers the probes as the Deployment expects: start-up (live 200 while ready is not 2xx), steady state, and SIGTERM
(ready 503 first while live stays 200 and requests in flight finish, then exit 0).

Beside the bundled models the repository holds `gate`, whose executions the test-only plugin plugins/gated_ops.py
holds until the test opens its gate: its warm-up keeps the server loading, and its requests stay in flight across
SIGTERM, for as long as the test needs, whatever the machine's load."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from dockerfile import Dockerfile
from imagebuild import site_env
from kube import REPO_ROOT
from liveserver import LiveServer, sample_until

from server import settings

pytestmark = pytest.mark.slow
IN_FLIGHT = 6  # requests to `gate` held across SIGTERM: two inside its two instances, four queued
# Not ready while loading: Triton answers 400 there (and 503 once shutting down); a kubelet fails on either.
NOT_READY = (400, 503)
# Readiness fails at SIGTERM and the listeners close this long after: the window the probes must see. Generous, so
# a probe's round trip on a loaded machine fits in it many times over.
DRAIN_DELAY_SECS = 5
PLUGINS = Path(__file__).resolve().parent / "plugins"
GATE_CONFIG = """
name: "gate"
backend: "pnnx"
max_batch_size: 8
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "out1" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [ { name: "held" batch_size: 1 count: 1
                 inputs { key: "in0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
"""


class Gate:
    """The directory gated_ops.py watches: `open` lets the held executions go on; `entered-*` marks each one."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir()

    def entered(self) -> int:
        return len(list(self.path.glob("entered-*")))

    def open(self) -> None:
        (self.path / "open").touch()

    def close(self) -> None:
        (self.path / "open").unlink()
        for marker in self.path.glob("entered-*"):
            marker.unlink()


def gated_repository(root: Path) -> Path:
    """The bundled models plus `gate`: the tiny affine model whose Sigmoid node is named `gate`."""
    shutil.copytree(REPO_ROOT / "model_repository", root)
    affine = REPO_ROOT / "tests" / "server" / "fixtures" / "affine"
    shutil.copytree(affine, root / "gate")
    param = root / "gate" / "1" / "model.pnnx.param"
    text = param.read_text()
    assert " F.sigmoid_0 " in text
    param.write_text(text.replace(" F.sigmoid_0 ", " gate        ", 1))
    (root / "gate" / "config.pbtxt").write_text(GATE_CONFIG)
    return root


def image_command(df: Dockerfile, site: Path, repository: Path) -> tuple[list[str], str]:
    """ENTRYPOINT + CMD with the console script the wheel installed, `repository` in place of the baked-in one,
    ephemeral ports and the test's drain delay; plus the in-image repository path that was replaced."""
    final = df.stages[-1]
    entry = final.all("ENTRYPOINT")[-1].exec_form()
    cmd = final.all("CMD")[-1].exec_form()
    baked = cmd[cmd.index("--model-repository") + 1]
    argv = [str(site / "bin" / entry[0]), *entry[1:], *cmd]
    argv[argv.index(baked)] = str(repository)
    return argv + ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                   "--drain-delay-secs", str(DRAIN_DELAY_SECS)], baked


def healthcheck(df: Dockerfile, http_port: int) -> int:
    """The image's HEALTHCHECK command against this server: its exit code."""
    exec_form = json.loads(df.stages[-1].all("HEALTHCHECK")[-1].value.split("CMD", 1)[1])
    argv = [a.replace(f":{settings.HTTP_PORT}/", f":{http_port}/") for a in exec_form]
    assert argv[0] == "python3"
    return subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=30).returncode


def infer_body() -> dict:
    """A JSON request, as curl would send it."""
    zeros = np.zeros(3 * 240 * 320, np.float32).tolist()
    return {"inputs": [{"name": "input", "shape": [1, 3, 240, 320], "datatype": "FP32", "data": zeros}],
            "outputs": [{"name": "scores"}]}


# A cold pod compiles every numba kernel before it is ready: ~15 s on two idle cores, minutes on a busy machine.
@pytest.mark.timeout(900)
def test_probes_through_startup_steady_state_and_sigterm(image_install, tmp_path: Path) -> None:
    df = Dockerfile.parse(REPO_ROOT / "Dockerfile")
    argv, _ = image_command(df, image_install.site, gated_repository(tmp_path / "repository"))
    gate = Gate(tmp_path / "gate")
    env = site_env(image_install.site, NUMBA_CACHE_DIR=str(tmp_path / "numba"), NNSERVE_PLUGINS="gated_ops",
                   NNSERVE_TEST_GATE=str(gate.path))
    env["PYTHONPATH"] += f":{PLUGINS}"  # the wheel's site first, then the test plugin
    server = LiveServer(argv, env, tmp_path)
    try:
        server.wait_listening()
        check_startup(server, df, gate)
        check_steady_state(server, df)
        check_sigterm(server, gate)
    finally:
        server.stop()


def wait_for(condition, what: str, server: LiveServer, timeout: float = 300) -> None:  # noqa: ANN001
    """Until condition() holds; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert server.proc.poll() is None, f"the server exited while waiting for {what}:\n{server.log_text}"
        assert time.monotonic() < deadline, f"never saw {what}:\n{server.log_text}"
        time.sleep(0.05)


def check_startup(server: LiveServer, df: Dockerfile, gate: Gate) -> None:
    # `gate` loads first (repository order) and its warm-up is held: the server is loading until the gate opens
    wait_for(lambda: gate.entered() > 0, "the gate model's warm-up held", server)
    loading = [server.probes() for _ in range(3)]
    health_while_loading = healthcheck(df, server.ports["http"])
    gate.open()
    # a kubelet probes every few seconds; polling hard would only slow the loading down
    samples = loading + sample_until(server, lambda p: p[1] == 200, timeout=300, interval=0.25)
    assert server.proc.poll() is None, server.log_text
    assert all(live == 200 for live, _ in samples), f"liveness failed during start-up: {samples}"
    assert all(ready in NOT_READY for _, ready in loading), f"ready while a model was loading: {loading}"
    assert {ready for _, ready in samples} <= {200, *NOT_READY}
    assert health_while_loading != 0, "HEALTHCHECK passed while the models were loading"


def check_steady_state(server: LiveServer, df: Dockerfile) -> None:
    assert server.probes() == (200, 200)
    assert healthcheck(df, server.ports["http"]) == 0
    for model in ("ultraface_tnn", "ultraface_pnnx", "gate"):
        assert server.status(f"/v2/models/{model}/ready") == 200
    reply = httpx.post(server.url("/v2/models/ultraface_tnn/infer"), json=infer_body(), timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["shape"] == [1, 4420, 2, 1]
    metrics = httpx.get(server.url(settings.METRICS_PATH, "metrics"), timeout=10).text
    assert 'nv_inference_request_success{model="ultraface_tnn",version="1"} 1.0' in metrics
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    assert client.is_server_live() and client.is_server_ready()
    client.close()


def check_sigterm(server: LiveServer, gate: Gate) -> None:
    gate.close()
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(binary_infer(server))) for _ in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    # both instances hold an execution and the other requests wait in the server's queue
    wait_for(lambda: gate.entered() == 2 and pending(server, "gate") == IN_FLIGHT - 2, "the requests held", server)
    assert codes == [], "a held request finished"
    server.proc.send_signal(signal.SIGTERM)
    samples = sample_until(server, lambda p: p == (None, None), timeout=settings.EXIT_TIMEOUT_SECS + 30)
    # the listeners are closed; the process waits for the requests still held
    assert server.proc.poll() is None and codes == [], f"gave up on the requests in flight: {codes}"
    gate.open()
    assert server.proc.wait(settings.EXIT_TIMEOUT_SECS + 30) == 0, server.log_text
    for t in threads:
        t.join(30)
    assert codes == [200] * IN_FLIGHT, f"requests in flight at SIGTERM must finish: {codes}"
    phases = [phase(p) for p in samples]
    assert phases == sorted(phases), f"probes went back after SIGTERM: {samples}"
    assert (200, 503) in samples, f"never saw the drain state (live, not ready): {samples}"


def binary_infer(server: LiveServer) -> int:
    """One request to `gate` with the binary tensor extension, as tritonclient sends it."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}", network_timeout=300)
    inp = httpclient.InferInput("in0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
    try:
        client.infer("gate", [inp])
        return 200
    except InferenceServerException as exc:  # the status in the message; -1 marks "not answered 200"
        print("in-flight request failed:", exc)
        return -1
    finally:
        client.close()


def phase(pair: tuple) -> int:
    """0 serving, 1 draining (live, not ready), 2 exiting or gone."""
    return {(200, 200): 0, (200, 503): 1}.get(pair, 2)


def pending(server: LiveServer, model: str) -> float:
    """Requests of `model` waiting for an instance, from the metrics endpoint."""
    text = httpx.get(server.url(settings.METRICS_PATH, "metrics"), timeout=10).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(f'nv_inference_pending_request_count{{model="{model}"'))

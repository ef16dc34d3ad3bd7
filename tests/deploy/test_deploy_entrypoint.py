"""The image's ENTRYPOINT + CMD, run locally on the bundled model_repository/ from the wheel the image installs,
answers the probes as the Deployment expects: start-up (live 200 while ready is not 2xx), steady state, and SIGTERM
(ready 503 first while live stays 200 and requests in flight finish, then exit 0)."""

from __future__ import annotations

import json
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
IN_FLIGHT = 12  # requests sent just before SIGTERM; they queue on the model's two instances
# Not ready while loading: Triton answers 400 there (and 503 once shutting down); a kubelet fails on either.
NOT_READY = (400, 503)


def image_command(df: Dockerfile, site: Path) -> tuple[list[str], str]:
    """ENTRYPOINT + CMD with the console script the wheel installed, the checkout's repository in place of the
    baked-in one, and ephemeral ports; plus the in-image repository path that was replaced."""
    final = df.stages[-1]
    entry = final.all("ENTRYPOINT")[-1].exec_form()
    cmd = final.all("CMD")[-1].exec_form()
    baked = cmd[cmd.index("--model-repository") + 1]
    argv = [str(site / "bin" / entry[0]), *entry[1:], *cmd]
    argv[argv.index(baked)] = str(REPO_ROOT / "model_repository")
    return argv + ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"], baked


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
    argv, _ = image_command(df, image_install.site)
    env = site_env(image_install.site, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    server = LiveServer(argv, env, tmp_path)
    try:
        server.wait_listening()
        check_startup(server, df)
        check_steady_state(server, df)
        check_sigterm(server)
    finally:
        server.stop()


def check_startup(server: LiveServer, df: Dockerfile) -> None:
    health_while_loading = None
    samples = []
    for _ in range(3):  # catch the loading window with the HEALTHCHECK command too
        before = server.probes()
        code = healthcheck(df, server.ports["http"])
        if before[1] in NOT_READY and server.probes()[1] in NOT_READY:
            health_while_loading = code
        samples.append(before)
    # a kubelet probes every few seconds; polling hard would only slow the loading down
    samples += sample_until(server, lambda p: p[1] == 200, timeout=300, interval=0.25)
    assert server.proc.poll() is None, server.log_text
    assert all(live == 200 for live, _ in samples), f"liveness failed during start-up: {samples}"
    assert {ready for _, ready in samples} <= {200, *NOT_READY}
    assert any(ready in NOT_READY for _, ready in samples), "never saw start-up (live, not ready)"
    if health_while_loading is not None:
        assert health_while_loading != 0, "HEALTHCHECK passed while the models were loading"


def check_steady_state(server: LiveServer, df: Dockerfile) -> None:
    assert server.probes() == (200, 200)
    assert healthcheck(df, server.ports["http"]) == 0
    for model in ("ultraface_tnn", "ultraface_pnnx"):
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


def check_sigterm(server: LiveServer) -> None:
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(binary_infer(server))) for _ in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    wait_queued(server, 2)
    assert len(codes) < IN_FLIGHT, "the requests finished before SIGTERM: nothing to drain"
    server.proc.send_signal(signal.SIGTERM)
    samples = sample_until(server, lambda p: p == (None, None), timeout=settings.EXIT_TIMEOUT_SECS + 30)
    assert server.proc.wait(settings.EXIT_TIMEOUT_SECS + 30) == 0, server.log_text
    for t in threads:
        t.join(30)
    assert codes == [200] * IN_FLIGHT, f"requests in flight at SIGTERM must finish: {codes}"
    phases = [phase(p) for p in samples]
    assert phases == sorted(phases), f"probes went back after SIGTERM: {samples}"
    assert (200, 503) in samples, f"never saw the drain state (live, not ready): {samples}"


def binary_infer(server: LiveServer) -> int:
    """One request with the binary tensor extension (cheap to decode, so it reaches the queue at once)."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}", network_timeout=120)
    inp = httpclient.InferInput("input", [1, 3, 240, 320], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 240, 320), np.float32), binary_data=True)
    try:
        client.infer("ultraface_tnn", [inp])
        return 200
    except InferenceServerException as exc:  # the status in the message; -1 marks "not answered 200"
        print("in-flight request failed:", exc)
        return -1
    finally:
        client.close()


def phase(pair: tuple) -> int:
    """0 serving, 1 draining (live, not ready), 2 exiting or gone."""
    return {(200, 200): 0, (200, 503): 1}.get(pair, 2)


def wait_queued(server: LiveServer, n: int, timeout: float = 20) -> None:
    """Until the metrics show `n` requests waiting for an instance (so they are inside the server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(server.url(settings.METRICS_PATH, "metrics"), timeout=10).text
        pending = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                      if ln.startswith('nv_inference_pending_request_count{model="ultraface_tnn"'))
        if pending >= n:
            return
        time.sleep(0.01)

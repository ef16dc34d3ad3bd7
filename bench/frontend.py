"""The front end's cost: the server's CPU per request (user + system, from /proc) for the identity model at batch
1, perf_analyzer's sync requests at c=1, over HTTP and gRPC; this checkout's server alternating with another
checkout's (`--other`, run with the same python, its tree first on sys.path), so both meet the same load.

    NNSERVE_PERF_HOME=... .venv/bin/python bench/frontend.py --other /tmp/fe-main --rounds 3
    .venv/bin/python bench/frontend.py --floors     # the libraries' floor: bare uvicorn and grpcio servers

The floors: what uvicorn (httptools protocol, uvloop, as nnserve runs it) costs to answer a small JSON to a POST,
and what grpcio costs to echo bytes through a generic unary handler, on grpc.aio and on the sync server (a thread
pool). Each floor server runs in a process of its own and a client of ours (sync, one request at a time, a fixed
count) in another.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

import _serving as sv  # noqa: E402

FLOORS = ("uvicorn", "grpc-aio", "grpc-sync")
FLOOR_BODY = b'{"model_name":"identity","outputs":[{"name":"out0","datatype":"FP32","shape":[1,16],"data":[0]}]}'
FLOOR_METHOD = "/bench.Echo/Echo"


# ---- floors ---------------------------------------------------------------------------------------------------
def floor_server(kind: str) -> None:
    """Serves until killed; prints its port on stdout first."""
    if kind == "uvicorn":
        import asyncio

        import uvicorn
        import uvloop

        async def app(scope, receive, send):  # noqa: ANN001
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(FLOOR_BODY)).encode())]})
            await send({"type": "http.response.body", "body": FLOOR_BODY})

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(app, http="httptools", log_level="warning", access_log=False, lifespan="off",
                                proxy_headers=False)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(uvicorn.Server(config).serve(sockets=[sock]))
        return
    import grpc

    def echo(request: bytes, context) -> bytes:  # noqa: ANN001
        return request

    if kind == "grpc-sync":
        from concurrent.futures import ThreadPoolExecutor

        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(echo)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        print(port, flush=True)
        server.wait_for_termination()
        return
    import asyncio

    import uvloop

    async def aecho(request: bytes, context) -> bytes:  # noqa: ANN001
        return request

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(aecho)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def floor_client(kind: str, port: int, count: int) -> None:
    """`count` requests one at a time (after a warm-up of count // 10); prints requests/s."""
    if kind == "uvicorn":
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", port)
        body = b'{"inputs":[{"name":"in0","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"0"] * 16) + b"]}]}"

        def call() -> None:
            conn.request("POST", "/v2/models/identity/infer", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
    else:
        import grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = channel.unary_unary(FLOOR_METHOD)
        payload = bytes(100)

        def call() -> None:
            stub(payload)

    for _ in range(count // 10):
        call()
    print("go", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(count):
        call()
    print(f"{count / (time.perf_counter() - t0):.1f}", flush=True)


def measure_floor(kind: str, count: int) -> tuple[float, float]:
    """(requests/s, server CPU us/request) of one floor server."""
    me = [sys.executable, __file__]
    server = subprocess.Popen(me + ["--floor-server", kind], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = subprocess.Popen(me + ["--floor-client", kind, str(port), str(count)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "go"
        cpu0 = sv.process_cpu_s(server.pid)
        client.stdin.write("\n")
        client.stdin.flush()
        rate = float(client.stdout.readline())
        cpu = sv.process_cpu_s(server.pid) - cpu0
        client.wait()
        return rate, cpu / count * 1e6
    finally:
        server.kill()
        server.wait()


# ---- nnserve, this checkout against another -------------------------------------------------------------------
def start(checkout: str, repo: Path) -> sv.Process:
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = checkout + (os.pathsep + env_path if env_path else "")
    try:
        cmd = [sys.executable, "-m", "server.cli", "serve", "--model-repository", str(repo), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address",
               "127.0.0.1"]
        proc = sv.Process.__new__(sv.Process)
        # the server runs from the checkout, so `server` is that checkout's package
        proc.proc = subprocess.Popen(cmd, cwd=checkout, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        proc.log, proc.ports, proc._ports_seen = [], {}, threading.Event()
        threading.Thread(target=proc._read, daemon=True).start()
        proc._wait_ready(lambda p: p.ports and f"http://127.0.0.1:{p.ports['http']}/v2/health/ready", 300)
        return proc
    finally:
        os.environ["PYTHONPATH"] = env_path


def run_nnserve(checkouts: dict[str, str], rounds: int, window_ms: int) -> list[tuple[str, int, str, sv.PerfResult]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        sv.write_identity(repo)
        for r in range(1, rounds + 1):
            for label, checkout in checkouts.items():
                proc = start(checkout, repo)
                try:
                    http, grpc = f"127.0.0.1:{proc.ports['http']}", f"127.0.0.1:{proc.ports['grpc']}"
                    sv.perf("identity", "http", http, 1, 1000)  # warm-up
                    sv.perf("identity", "grpc", grpc, 1, 1000)
                    for protocol, url in (("http", http), ("grpc", grpc)):
                        res = sv.perf("identity", protocol, url, 1, window_ms, server_pid=proc.proc.pid)
                        rows.append((label, r, protocol, res))
                        print(f"round {r} {label:<10} {protocol:<5} " + (
                            f"{res.throughput:7.0f} infer/s  server CPU {res.server_cpu_us:5.0f} us/req"
                            if not res.error else f"FAILED: {res.error}"), flush=True)
                finally:
                    proc.stop()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", help="another checkout of nnserve to alternate with (same python)")
    p.add_argument("--other-label", default="other")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window-ms", type=int, default=3000)
    p.add_argument("--floors", action="store_true", help="measure the bare libraries' floors instead")
    p.add_argument("--count", type=int, default=20000, help="requests per floor measurement")
    p.add_argument("--floor-server", choices=FLOORS, help=argparse.SUPPRESS)
    p.add_argument("--floor-client", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.floor_server:
        floor_server(a.floor_server)
    elif a.floor_client:
        floor_client(a.floor_client[0], int(a.floor_client[1]), int(a.floor_client[2]))
    elif a.floors:
        print("| floor | requests/s | server CPU us/req |\n|---|---|---|")
        for _ in range(2):
            for kind in FLOORS:
                rate, us = measure_floor(kind, a.count)
                print(f"| {kind} | {rate:.0f} | {us:.0f} |", flush=True)
    else:
        checkouts = {"this": _ROOT}
        if a.other:
            checkouts[a.other_label] = str(Path(a.other).resolve())
        rows = run_nnserve(checkouts, a.rounds, a.window_ms)
        print("\n| round | server | protocol | infer/s | server CPU us/req |\n|---|---|---|---|---|")
        for label, r, protocol, res in rows:
            print(f"| {r} | {label} | {protocol} | {res.throughput:.0f} | {res.server_cpu_us:.0f} |")


if __name__ == "__main__":
    main()

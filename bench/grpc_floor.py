"""The per-call CPU floor of a Python gRPC server on this machine: what any grpcio-based server pays before
doing its own work (issue 5's identity-over-gRPC target is measured against it).

    .venv/bin/python bench/grpc_floor.py                  # grpc.aio on uvloop and the thread-pool server
    .venv/bin/python bench/grpc_floor.py --seconds 10 --concurrency 1 4

Each server is a subprocess with one generic unary handler returning 64 fixed bytes (no protobuf, no
interceptor); a grpcio client in this process calls it from N threads for a few seconds. Printed: calls per
second and the server process's user + system CPU per call (from /proc, Linux only).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import grpc

METHOD = "/floor.Floor/Call"
SERVERS = {
    "aio": """
import asyncio, sys, grpc, uvloop
async def call(request, context):
    return b"x" * 64
async def main():
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("floor.Floor", {"Call": grpc.unary_unary_rpc_method_handler(call)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()
uvloop.run(main())
""",
    "threads": """
import sys, grpc
from concurrent import futures
def call(request, context):
    return b"x" * 64
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
handler = grpc.method_handlers_generic_handler("floor.Floor", {"Call": grpc.unary_unary_rpc_method_handler(call)})
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
""",
}


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def drive(port: int, threads: int, seconds: float) -> int:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(METHOD)
    call(b"warm-up")
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        while time.monotonic() < stop:
            call(b"a")
            counts[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    channel.close()
    return sum(counts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args(argv)
    for name, code in SERVERS.items():
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            for c in args.concurrency:
                before = cpu_seconds(proc.pid)
                calls = drive(port, c, args.seconds)
                per_call_us = (cpu_seconds(proc.pid) - before) / calls * 1e6
                rate = calls / args.seconds
                print(f"grpc {name:8s} c={c:<3d} {rate:8.0f} calls/s  server CPU {per_call_us:5.0f} us/call")
        finally:
            proc.terminate()
            proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

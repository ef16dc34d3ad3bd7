"""Wiring: repository + data plane + REST (uvicorn) + gRPC (grpc.aio) + metrics endpoint in one event loop,
and the SIGTERM sequence: readiness fails at once, requests are still served for --drain-delay-secs, then the
listeners close and in-flight requests get --exit-timeout-secs to finish, then exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import uvicorn
import uvloop
from fastapi import FastAPI
from fastapi.responses import Response

import engine
from server import settings as defaults
from server.dataplane import DataPlane
from server.errors import ListenError
from server.logging_setup import LogControl
from server.metrics import ServerMetrics
from server.plugins import load_plugins
from server.protocol.grpc import servicer
from server.protocol.grpc.interceptors import RestrictedProtocolInterceptor
from server.protocol.rest import create_app
from server.protocol.rest.body_limit import BodyLimitMiddleware
from server.protocol.rest.transport import HttpLimits, protocol_class
from server.python_backend import worker as python_workers
from server.repository import ModelRepository
from server.response_cache import ResponseCache
from server.security import parse_restrictions
from server.settings import ServerSettings
from server.shared_memory import SystemSharedMemory
from server.tracing import Tracer, parse_trace_config

log = logging.getLogger("nnserve")
# What the orderly stop may take beyond the drain delay and the exit timeout (its own tear-down) before the process
# is ended regardless.
EXIT_GRACE_SECS = 5.0


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the app owns SIGTERM/SIGINT and decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(address: str, port: int, what: str = "HTTP") -> socket.socket:
    # proto must say TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto is IPPROTO_TCP, and
    # without it every response (headers, then body) waits ~40 ms for the client's delayed ACK.
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((address, port))
        sock.listen(2048)
    except OSError as exc:  # port taken, address not on this host: one line and exit 1, not a traceback
        sock.close()
        raise ListenError(f"cannot listen on {address}:{port} ({what}): {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def metrics_app(metrics: ServerMetrics, max_body_bytes: int = defaults.HTTP_MAX_BODY_BYTES) -> Any:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(defaults.METRICS_PATH)
    async def scrape() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return BodyLimitMiddleware(app, max_body_bytes)


class NNServer:
    def __init__(self, s: ServerSettings):
        self.settings = s
        self.http_restrictions = parse_restrictions(s.http_restricted_api, "--http-restricted-api")
        self.grpc_restrictions = parse_restrictions(s.grpc_restricted_protocol, "--grpc-restricted-protocol")
        self.metrics = ServerMetrics()
        self.repository = ModelRepository(s.model_repository, control_mode=s.model_control_mode,
                                          default_max_batch_size=s.default_max_batch_size, metrics=self.metrics,
                                          load_fn=functools.partial(engine.load, options=s.engine_options))
        self.dp = DataPlane(self.repository, self.metrics, strict_readiness=s.strict_readiness, name=s.server_name,
                            log_tensors=s.log_verbose >= 2,
                            shared_memory=SystemSharedMemory(allowed=s.allow_client_shm),
                            tracer=Tracer(parse_trace_config(s.trace_config)),
                            cache=ResponseCache(s.cache_bytes) if s.cache_bytes else None,
                            log_control=LogControl(s.log_verbose, s.log_format),
                            max_load_file_bytes=s.model_load_max_file_bytes)
        self.ports: dict[str, int] = {}
        self._http: list[tuple[_Uvicorn, asyncio.Task]] = []  # the API servers
        self._metrics_http: list[tuple[_Uvicorn, asyncio.Task]] = []  # scraped until the very end
        self._grpc: grpc.aio.Server | None = None
        self._stop = asyncio.Event()
        self._stopped = threading.Event()  # the orderly stop is over (set at the end of shutdown)

    async def start_endpoints(self) -> None:
        s = self.settings
        if s.allow_http:
            app = create_app(self.dp, s.http_max_input_bytes, self.http_restrictions,
                             max_body_bytes=s.http_max_body_bytes, decode_in_thread_bytes=s.http_decode_in_thread_bytes,
                             max_load_file_bytes=s.model_load_max_file_bytes)
            self.ports["http"] = self._start_http(app, s.http_address, s.http_port, self._http, s.http_max_connections)
        if s.allow_grpc:
            self.ports["grpc"] = await self._start_grpc(s.grpc_address, s.grpc_port)
        if s.allow_metrics:  # scrapers are few: a small share of the connections
            self.ports["metrics"] = self._start_http(metrics_app(self.metrics, s.http_max_body_bytes),
                                                    s.metrics_address, s.metrics_port, self._metrics_http,
                                                    max(s.http_max_connections // 8, 16), "metrics")
        log.info("%s", defaults.format_listening(self.ports))

    def _start_http(self, app: Any, address: str, port: int, into: list[tuple[_Uvicorn, asyncio.Task]],
                    max_connections: int, what: str = "HTTP") -> int:
        s = self.settings
        sock = bind(address, port, what)
        limits = HttpLimits(max_header_bytes=s.http_max_header_bytes, header_timeout=s.http_header_timeout_secs,
                            body_timeout=s.http_body_timeout_secs, idle_timeout=s.http_idle_timeout_secs,
                            max_connections=max_connections)
        # no proxy_headers: its middleware would rewrite every request scope for client addresses nothing reads
        config = uvicorn.Config(app, http=protocol_class(limits), log_level="warning", access_log=False,
                                lifespan="off", proxy_headers=False, timeout_keep_alive=s.http_idle_timeout_secs,
                                timeout_graceful_shutdown=s.exit_timeout_secs)
        server = _Uvicorn(config)
        into.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
        return sock.getsockname()[1]

    async def _start_grpc(self, address: str, port: int) -> int:
        size = self.settings.grpc_max_message_bytes
        # grpc sets SO_REUSEPORT by default: a port another server holds would be silently shared with it
        opts = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size),
                ("grpc.so_reuseport", 0)]
        # Restriction is the only interceptor, and only when configured: grpc.aio's interceptor path costs more per
        # call than the rest of a small model's request. The decode guard goes on each handler at registration.
        interceptors = [RestrictedProtocolInterceptor(self.grpc_restrictions)] if self.grpc_restrictions else None
        self._grpc = grpc.aio.server(options=opts, interceptors=interceptors)
        servicer.add_to_server(self._grpc, self.dp, servicer.StreamLimits(
            per_stream=self.settings.grpc_stream_max_inflight, per_server=self.settings.grpc_streams_max_inflight,
            pending_responses=self.settings.grpc_stream_max_pending_responses),
            max_input_bytes=size, trace_context=self.dp.tracer.propagates)
        if port:  # a taken port: grpc would print its own C++ error before raising; say it in our one line instead
            bind(address, port, "gRPC").close()
        target = f"[{address}]:{port}" if ":" in address and not address.startswith("[") else f"{address}:{port}"
        try:
            bound = self._grpc.add_insecure_port(target)
        except RuntimeError as exc:  # grpc raises (or, in older versions, returns 0) when it cannot bind
            raise ListenError(f"cannot listen on {address}:{port} (gRPC): the port is in use or the address is not "
                              f"local ({str(exc).split(';')[0]})") from None
        if not bound:
            raise ListenError(f"cannot listen on {address}:{port} (gRPC)")
        await self._grpc.start()
        return bound

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_requested)
        load_plugins(self.settings.plugins)
        try:
            await self.start_endpoints()
        except ListenError as exc:
            log.error("%s", exc)
            await self._close_endpoints()
            return 1
        t0 = time.perf_counter()
        startup = asyncio.create_task(self.repository.startup(self.settings.load_models))
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({startup, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not startup.done():  # stopped while models load: the loads under way are cancelled by the shutdown
            log.info("stopping while loading models (%s)", ", ".join(self.repository.loading()) or "none left")
            startup.cancel()
            await self.shutdown()
            return 0
        stop.cancel()
        failed = startup.result()
        # Everything alive now (modules, models) lives as long as the server: out of the collector's sight, a full
        # collection no longer walks it, which took tens of ms at a time from whichever request was running.
        gc.collect()
        gc.freeze()
        self.dp.started = True
        log.info("model repository %s: %d model(s) ready, %d failed, in %.2f s", self.settings.model_repository,
                 len(self.repository.loaded()), len(failed), time.perf_counter() - t0)
        if failed and self.settings.exit_on_error:
            log.error("exiting: failed to load %s (--exit-on-error=true)", ", ".join(failed))
            await self.shutdown()
            return 1
        poller = None
        if self.settings.model_control_mode == "poll":
            poller = asyncio.create_task(self.repository.poll_forever(self.settings.repository_poll_secs))
        await self._stop.wait()
        if poller:
            poller.cancel()
        await self.shutdown()
        return 0

    def _stop_requested(self) -> None:
        """SIGTERM/SIGINT: the orderly stop starts; and, once, a watchdog that ends the process should a model load
        keep it alive past the drain delay plus the exit timeout (a model's initialize or warm-up stuck in a worker
        thread: threads cannot be stopped, and the interpreter waits for them)."""
        if not self._stop.is_set():
            s = self.settings
            limit = max(s.drain_delay_secs, 0.0) + max(s.exit_timeout_secs, 0.0) + EXIT_GRACE_SECS
            threading.Thread(target=self._exit_after, args=(limit,), name="nnserve-exit-watchdog", daemon=True).start()
        self._stop.set()

    def _exit_after(self, seconds: float) -> None:
        time.sleep(seconds)
        # An orderly stop still under way with no load stuck (a model's finalize, bounded by its own timeout) is
        # left to finish: only a stuck load, or a process still alive after the stop is over, is cut short.
        while not self.repository.loading() and not self._stopped.wait(0.5):
            pass
        if self._stopped.is_set():
            time.sleep(EXIT_GRACE_SECS)  # the interpreter may still be waiting for a load's thread
        log.error("exit timeout reached with model loads still running (%s): exiting without waiting for them",
                  ", ".join(self.repository.loading()) or "none")
        if not self._stopped.is_set():
            try:
                self.dp.tracer.close()  # buffered traces are written, as the orderly stop would have
            except Exception:  # exiting regardless: say so, do not hang on it
                log.exception("writing the buffered traces failed")
        python_workers.kill_all("was killed: the server exited")
        logging.shutdown()
        os._exit(0)  # the code an orderly stop on SIGTERM exits with

    async def shutdown(self) -> None:
        """SIGTERM: not ready at once; serve on for the drain delay; close the listeners; in-flight requests get
        --exit-timeout-secs; then models are unloaded."""
        s = self.settings
        self.dp.draining = True
        log.info("shutting down: readiness now fails; serving %.1f s more before closing the listeners",
                 s.drain_delay_secs)
        await asyncio.sleep(max(s.drain_delay_secs, 0.0))
        log.info("closing the listeners, draining %d in-flight request(s) (up to %.0f s)", self.dp.inflight,
                 s.exit_timeout_secs)
        deadline = time.monotonic() + s.exit_timeout_secs
        # Both protocols stop accepting at once; each lets its in-flight calls finish within the timeout.
        stopping = [self._stop_http(self._http)]
        if self._grpc is not None:
            stopping.append(self._grpc.stop(grace=s.exit_timeout_secs))
        await asyncio.gather(*stopping, return_exceptions=True)
        while self.dp.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.dp.exiting = True
        await self._stop_http(self._metrics_http)
        try:  # queues still holding requests (their clients are gone) may not outlast the exit timeout either
            await asyncio.wait_for(asyncio.shield(self.repository.shutdown()),
                                   timeout=max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            log.warning("exit timeout reached: dropping the requests still queued")
            await self.repository.shutdown(drain=False)
        self.dp.tracer.close()  # buffered traces are written
        self.dp.shared_memory.close()
        self._stopped.set()
        log.info("nnserve stopped")

    async def _close_endpoints(self) -> None:
        """Stops whatever endpoints did start before one failed to listen."""
        await self._stop_http(self._http + self._metrics_http)
        if self._grpc is not None:
            await self._grpc.stop(grace=None)

    @staticmethod
    async def _stop_http(servers: list[tuple[_Uvicorn, asyncio.Task]]) -> None:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in servers), return_exceptions=True)


async def serve(s: ServerSettings) -> int:
    return await NNServer(s).run()


def run(s: ServerSettings) -> int:
    # uvloop (the server extra has it): its C event loop costs a fraction of asyncio's per request
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(s))

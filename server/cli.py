"""`nnserve`: the console script. `nnserve serve` takes Triton's flag names; the engine adds run/inspect/convert.

The one place where the server reads its command line and environment (into ServerSettings, server/settings.py).
The serving stack (server.app: FastAPI, uvicorn, grpc, ...) is imported only when `serve` runs, so that the
engine's commands work without the `server` extra and `serve` without it says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import resource
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import engine
from engine.cli import DefaultsHelpFormatter, add_engine_commands, exit_quietly_on_broken_pipe, parse_shape
from server import settings as defaults
from server.logging_setup import LOG_FORMATS, setup_logging
from server.security import RestrictionSpecError, parse_restrictions
from server.settings import ServerSettings
from server.tracing import parse_trace_config

# The top-level modules the `server` extra installs (pyproject.toml).
SERVER_EXTRA_MODULES = frozenset({"fastapi", "starlette", "uvicorn", "grpc", "google", "prometheus_client",
                                  "httptools", "uvloop"})


def str2bool(value: str) -> bool:
    """Triton spells booleans --flag=true/false."""
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a model repository over KServe v2 REST and gRPC",
                              description="Serve a model repository over KServe v2 REST and gRPC, with Prometheus "
                              "metrics; the flags follow Triton's names.", formatter_class=DefaultsHelpFormatter)
    p.add_argument("--model-repository", "--model-store", required=True, type=Path, metavar="DIR",
                   help="the model repository: DIR/<model>/config.pbtxt and DIR/<model>/<version>/model.*")
    p.add_argument("--http-port", type=int, default=defaults.HTTP_PORT, help="KServe v2 REST port; 0 = any free port")
    p.add_argument("--grpc-port", type=int, default=defaults.GRPC_PORT, help="gRPC port; 0 = any free port")
    p.add_argument("--metrics-port", type=int, default=defaults.METRICS_PORT,
                   help="Prometheus /metrics port; 0 = any free port")
    p.add_argument("--http-address", default="0.0.0.0", help="address the REST endpoint listens on")
    p.add_argument("--grpc-address", default="0.0.0.0", help="address the gRPC endpoint listens on")
    p.add_argument("--metrics-address", default=None, help="address the metrics endpoint listens on "
                   "(default: the HTTP address)")
    p.add_argument("--allow-http", type=str2bool, default=True, metavar="BOOL", help="serve REST")
    p.add_argument("--allow-grpc", type=str2bool, default=True, metavar="BOOL", help="serve gRPC")
    p.add_argument("--allow-metrics", type=str2bool, default=True, metavar="BOOL", help="serve metrics")
    p.add_argument("--model-control-mode", choices=defaults.CONTROL_MODES, default="none",
                   help="none: load every model at start; poll: also follow changes on disk; explicit: load only "
                   "--load-model and what the repository API loads")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="explicit mode: a model to load at start, repeatable ('*' = all)")
    p.add_argument("--repository-poll-secs", type=float, default=defaults.REPOSITORY_POLL_SECS, metavar="S",
                   help="poll mode: seconds between scans of the repository")
    p.add_argument("--exit-timeout-secs", type=float, default=defaults.EXIT_TIMEOUT_SECS, metavar="S",
                   help="after SIGTERM, how long requests in flight get to finish")
    p.add_argument("--drain-delay-secs", type=float, default=defaults.DRAIN_DELAY_SECS, metavar="S",
                   help="after SIGTERM, keep serving (not ready) this long before closing the listeners")
    p.add_argument("--exit-on-error", type=str2bool, default=True, metavar="BOOL",
                   help="exit if a model fails to load at start")
    p.add_argument("--strict-readiness", type=str2bool, default=True, metavar="BOOL",
                   help="/v2/health/ready needs every model ready (false: the server alone)")
    p.add_argument("--server-name", default=defaults.SERVER_NAME, metavar="NAME",
                   help="the name the server metadata gives (clients written for Triton may check for 'triton')")
    p.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE",
                   help="<backend>,default-max-batch-size=<n>: the max_batch_size auto-complete gives a batchable "
                   f"model without one (default: {defaults.DEFAULT_MAX_BATCH_SIZE})")
    p.add_argument("--http-max-input-size", type=int, default=defaults.HTTP_MAX_INPUT_BYTES, metavar="BYTES",
                   help="largest HTTP request body in bytes, also after decompression (413 above it)")
    p.add_argument("--grpc-max-message-size", type=int, default=defaults.GRPC_MAX_MESSAGE_BYTES, metavar="BYTES",
                   help="largest gRPC message in bytes, both directions (RESOURCE_EXHAUSTED above it)")
    p.add_argument("--http-max-body-size", type=int, default=defaults.HTTP_MAX_BODY_BYTES,
                   help="largest body of any HTTP request but infer (repository, health, metadata), in bytes (413)")
    p.add_argument("--http-max-header-size", type=int, default=defaults.HTTP_MAX_HEADER_BYTES,
                   help="largest HTTP request line + headers in bytes (431)")
    p.add_argument("--http-header-timeout-secs", type=float, default=defaults.HTTP_HEADER_TIMEOUT_SECS,
                   help="a request's headers must arrive within this many seconds of its first byte (else closed)")
    p.add_argument("--http-body-timeout-secs", type=float, default=defaults.HTTP_BODY_TIMEOUT_SECS,
                   help="a request's body must arrive within this many seconds of its headers (408)")
    p.add_argument("--http-idle-timeout-secs", type=float, default=defaults.HTTP_IDLE_TIMEOUT_SECS,
                   help="close an HTTP connection with no request in progress after this many seconds")
    p.add_argument("--http-max-connections", type=int, default=defaults.HTTP_MAX_CONNECTIONS,
                   help="open HTTP connections at most; past it the longest-idle one is closed, or the new one if "
                        "none is idle (0 = half the open-file limit)")
    p.add_argument("--http-decode-in-thread-size", type=int, default=defaults.HTTP_DECODE_IN_THREAD_BYTES,
                   help="infer bodies of at least this many bytes are decoded off the event loop")
    p.add_argument("--grpc-stream-max-inflight", type=int, default=defaults.STREAM_MAX_INFLIGHT,
                   help="ModelStreamInfer: requests read but not yet answered per stream; past it the stream is "
                        "not read (backpressure)")
    p.add_argument("--grpc-streams-max-inflight", type=int, default=defaults.STREAMS_MAX_INFLIGHT,
                   help="the same, over all streams of the server")
    p.add_argument("--grpc-stream-max-pending-responses", type=int, default=defaults.STREAM_MAX_PENDING_RESPONSES,
                   help="ModelStreamInfer: responses made but not yet written per stream (a decoupled model's, to a "
                        "client that does not read); past it the request making one more fails and is cancelled")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
                   help="e.g. model-repository,statistics:admin-key=secret: those APIs need header KEY: VALUE "
                   "(repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="PROTOCOLS:KEY=VALUE",
                   help="as --http-restricted-api; the gRPC header is triton-grpc-protocol-KEY (repeatable)")
    p.add_argument("--log-verbose", type=int, default=0, metavar="N",
                   help="1: debug logging; 2 and above: also tensor contents of requests")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text lines, or one JSON object per line (time, level, logger, message)")
    p.add_argument("--allow-client-shm", type=str2bool, default=False, metavar="BOOL",
                   help="let clients register system shared-memory regions (/dev/shm objects) for their tensors")
    p.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                   help="the response cache (models with response_cache { enable: true }): its size in bytes")
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="tracing: file=PATH, level=OFF|TIMESTAMPS, rate=N, count=N, log_frequency=N, "
                   "mode=triton|opentelemetry; opentelemetry,url=HOST:PORT/v1/traces, opentelemetry,resource=K=V, "
                   "opentelemetry,bsp_max_queue_size=N|bsp_schedule_delay=MS|bsp_max_export_batch_size=N "
                   "(repeatable)")
    p.add_argument("--model-load-max-file-size", type=int, default=defaults.MODEL_LOAD_MAX_FILE_BYTES,
                   metavar="BYTES", help="model files one load request may carry in total ('file:' parameters); "
                   "0 refuses them")
    p.set_defaults(func=run_serve)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerSettings:
    """The flags and the environment (os.environ unless given) as ServerSettings."""
    environ = os.environ if environ is None else environ
    try:
        engine_options = engine.EngineOptions.from_env(environ)
    except ValueError as exc:  # an NNSERVE_* setting out of its range
        raise SystemExit(f"nnserve serve: {exc}") from None
    if "*" in args.load_model and len(args.load_model) > 1:
        raise SystemExit("--load-model=* must be the only --load-model")
    max_batch = defaults.DEFAULT_MAX_BATCH_SIZE
    for item in args.backend_config:
        _, _, kv = item.rpartition(",")
        key, _, value = kv.partition("=")
        if key == "default-max-batch-size":
            max_batch = int(value)
    return ServerSettings(
        model_repository=args.model_repository, http_address=args.http_address, http_port=args.http_port,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port,
        metrics_address=args.metrics_address or args.http_address, metrics_port=args.metrics_port,
        allow_http=args.allow_http, allow_grpc=args.allow_grpc, allow_metrics=args.allow_metrics,
        model_control_mode=args.model_control_mode, load_models=list(args.load_model),
        repository_poll_secs=args.repository_poll_secs, exit_timeout_secs=args.exit_timeout_secs,
        exit_on_error=args.exit_on_error, strict_readiness=args.strict_readiness, server_name=args.server_name,
        engine_options=engine_options,
        default_max_batch_size=max_batch, http_max_input_bytes=args.http_max_input_size,
        grpc_max_message_bytes=args.grpc_max_message_size, drain_delay_secs=args.drain_delay_secs,
        http_max_body_bytes=args.http_max_body_size, http_max_header_bytes=args.http_max_header_size,
        http_header_timeout_secs=args.http_header_timeout_secs, http_body_timeout_secs=args.http_body_timeout_secs,
        http_idle_timeout_secs=args.http_idle_timeout_secs,
        http_max_connections=args.http_max_connections or defaults.connections_for(open_files_limit()),
        http_decode_in_thread_bytes=args.http_decode_in_thread_size,
        grpc_stream_max_inflight=args.grpc_stream_max_inflight,
        grpc_streams_max_inflight=args.grpc_streams_max_inflight,
        grpc_stream_max_pending_responses=args.grpc_stream_max_pending_responses,
        http_restricted_api=list(args.http_restricted_api),
        grpc_restricted_protocol=list(args.grpc_restricted_protocol), log_verbose=args.log_verbose,
        log_format=args.log_format, plugins=defaults.plugins_from(environ), allow_client_shm=args.allow_client_shm,
        cache_bytes=cache_size(args.cache_config), trace_config=list(args.trace_config),
        model_load_max_file_bytes=args.model_load_max_file_size)


def cache_size(specs: list[str]) -> int:
    """Triton's --cache-config <cache>,<key>=<value>: the local cache's size in bytes (0: no cache)."""
    size = 0
    for spec in specs:
        cache, _, kv = spec.partition(",")
        key, eq, value = kv.partition("=")
        if cache != "local":
            raise SystemExit(f"nnserve serve: --cache-config '{spec}': only the 'local' cache is implemented")
        if key != "size" or not eq:
            raise SystemExit(f"nnserve serve: --cache-config '{spec}': expected local,size=BYTES")
        try:
            size = int(value)
        except ValueError:
            raise SystemExit(f"nnserve serve: --cache-config '{spec}': the size must be an integer") from None
        if size <= 0:
            raise SystemExit(f"nnserve serve: --cache-config '{spec}': the size must be positive")
    return size


def open_files_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 2**20


def check_limits(s: ServerSettings) -> None:
    positive = {"--http-max-body-size": s.http_max_body_bytes, "--http-max-header-size": s.http_max_header_bytes,
                "--http-max-input-size": s.http_max_input_bytes, "--http-max-connections": s.http_max_connections,
                "--http-header-timeout-secs": s.http_header_timeout_secs,
                "--http-body-timeout-secs": s.http_body_timeout_secs,
                "--http-idle-timeout-secs": s.http_idle_timeout_secs,
                "--grpc-stream-max-inflight": s.grpc_stream_max_inflight,
                "--grpc-streams-max-inflight": s.grpc_streams_max_inflight,
                "--grpc-stream-max-pending-responses": s.grpc_stream_max_pending_responses}
    for flag, value in positive.items():
        if value <= 0:
            raise SystemExit(f"nnserve serve: {flag} must be positive, got {value}")
    if s.model_load_max_file_bytes < 0:
        raise SystemExit(f"nnserve serve: --model-load-max-file-size must not be negative, got "
                         f"{s.model_load_max_file_bytes}")
    try:
        parse_trace_config(s.trace_config)
    except ValueError as exc:
        raise SystemExit(f"nnserve serve: {exc}") from None


def check_restrictions(s: ServerSettings) -> None:
    try:
        parse_restrictions(s.http_restricted_api, "--http-restricted-api")
        parse_restrictions(s.grpc_restricted_protocol, "--grpc-restricted-protocol")
    except RestrictionSpecError as exc:
        raise SystemExit(f"nnserve serve: {exc}") from None


def run_serve(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    check_limits(s)
    check_restrictions(s)
    setup_logging(s.log_verbose, s.log_format)
    if not s.model_repository.is_dir():
        logging.getLogger("nnserve").error("--model-repository %s is not a directory", s.model_repository)
        return 1
    return int(serving_stack().run(s))


def serving_stack() -> ModuleType:
    """server.app; a missing package of the `server` extra is a one-line error naming the extra."""
    return server_module("server.app", "serve")


def server_module(name: str, command: str) -> ModuleType:
    """A server module for `command`, imported only when that command runs (the engine's commands need none of the
    `server` extra); a missing package of that extra is a one-line error naming the extra."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_EXTRA_MODULES:
            raise
        raise SystemExit(f"nnserve {command}: the '{exc.name}' package is not installed: install nnserve[server]"
                         ) from None


def add_import_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "import", help="copy a model into a model repository and write its config.pbtxt",
        formatter_class=DefaultsHelpFormatter,
        description="Copies MODEL and its weights file into DIR/NAME/VERSION/ under the names the server looks for, "
        "infers a config.pbtxt with the server's auto-complete, checks that the server can load the model at its "
        "max shapes, writes the config and prints it.")
    p.add_argument("model", help="MODEL.pnnx.param or MODEL.tnnproto (the weights file beside it)")
    p.add_argument("--repository", "--model-repository", required=True, type=Path, metavar="DIR",
                   help="the model repository (created if absent)")
    p.add_argument("--name", required=True, help="the model's name: its directory DIR/NAME")
    p.add_argument("--model-version", type=int, default=1, metavar="N", help="the version directory DIR/NAME/N")
    p.add_argument("--max-batch-size", type=int, default=None, metavar="N",
                   help="0: no batching, dims are full shapes (default: 1 for a model that fixes dim 0 to 1; else "
                   f"auto-complete's: {defaults.DEFAULT_MAX_BATCH_SIZE} where every tensor's dim 0 is dynamic, else 0)")
    p.add_argument("--max-shape", type=parse_shape, action="append", default=[], metavar="NAME=3x640x640",
                   help="largest shape of an input with dynamic dims, as its config dims (without the batch dim "
                   "when max_batch_size > 0); repeat per input")
    p.add_argument("--dry-run", action="store_true", help="print the config and the files it would write; write "
                   "nothing")
    p.add_argument("--force", action="store_true", help="replace an existing config.pbtxt and model files")
    p.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    mi = server_module("server.model_import", "import")
    try:
        plan = mi.plan_import(Path(args.model), args.repository, args.name, version=args.model_version,
                              max_batch_size=args.max_batch_size, max_shapes=dict(args.max_shape),
                              default_max_batch_size=defaults.DEFAULT_MAX_BATCH_SIZE)
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        written = [*plan.targets, plan.config_path] if args.dry_run else mi.write_import(plan, force=args.force)
    except mi.ModelImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# {plan.config_path}")
    print(mi.config_text(plan.config), end="")
    verb = "would write" if args.dry_run else "wrote"
    for path in written:
        print(f"{verb} {path}")
    replaced = mi.existing_files(plan) if args.dry_run else []
    if replaced:
        print(f"would replace {', '.join(str(p) for p in replaced)}{'' if args.force else ' (needs --force)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnserve", description="Inference server for TNN and PNNX models")
    parser.add_argument("--version", action="version", version=f"nnserve {defaults.SERVER_VERSION}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_command(subparsers)
    add_import_command(subparsers)
    add_engine_commands(subparsers)  # run / inspect / convert, owned by the engine
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_quietly_on_broken_pipe(lambda: int(args.func(args) or 0))


if __name__ == "__main__":
    sys.exit(main())

"""Server settings, in one place: the defaults (ports, addresses, health paths, timeouts; deploy files read them
from here), ServerSettings, and the environment variables the server reads. server/cli.py reads the flags and the
environment once into a ServerSettings, which is passed down; nothing else in server/ reads either."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import EngineOptions

SERVER_NAME = "nnserve"
SERVER_VERSION = "0.1.0"

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002

# The start-up log line that names the bound ports (`nnserve listening: http=8000 grpc=8001 metrics=8002`);
# tests, benches and deploy probes find ephemeral ports through it.
LISTENING_PREFIX = "nnserve listening: "


def format_listening(ports: dict[str, int]) -> str:
    return LISTENING_PREFIX + " ".join(f"{k}={v}" for k, v in ports.items())


def parse_listening(line: str) -> dict[str, int] | None:
    """The ports in a `format_listening` message found anywhere in `line` (a log prefix may precede it, JSON may
    wrap it: `--log-format json`), else None."""
    at = line.find(LISTENING_PREFIX)
    if at < 0:
        return None
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line[at + len(LISTENING_PREFIX):])}


LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"
METRICS_PATH = "/metrics"

# Triton's defaults for the same knobs.
EXIT_TIMEOUT_SECS = 30
# After SIGTERM readiness fails at once but requests are still served this long, so load balancers that have not
# yet seen the readiness change do not send requests into a closed port (Kubernetes' preStop sleep adds more).
DRAIN_DELAY_SECS = 0.5
REPOSITORY_POLL_SECS = 15
DEFAULT_MAX_BATCH_SIZE = 4
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # Triton lifts gRPC's 4 MiB default to INT32_MAX
HTTP_MAX_INPUT_BYTES = 64 * 2**20

# Limits on what a client can make the server hold or wait for (SECURITY.md explains each).
HTTP_MAX_BODY_BYTES = 2**20  # every HTTP request but infer: repository index/load/unload, health, metadata, ...
HTTP_MAX_HEADER_BYTES = 64 * 2**10  # request line + headers
HTTP_HEADER_TIMEOUT_SECS = 10.0  # from a request's first byte to the end of its headers
HTTP_BODY_TIMEOUT_SECS = 60.0  # from the end of the headers to the end of the body
HTTP_IDLE_TIMEOUT_SECS = 65.0  # a connection with no request in progress (longer than the usual 60 s of a proxy)
HTTP_MAX_CONNECTIONS = 0  # 0: half the process's open-file limit, resolved by the CLI
# JSON bodies at least this large are decoded in a worker thread, off the event loop, a slice at a time.
HTTP_DECODE_IN_THREAD_BYTES = 256 * 2**10
STREAM_MAX_INFLIGHT = 64  # ModelStreamInfer: requests read and not yet answered, per stream
STREAMS_MAX_INFLIGHT = 1024  # the same over all streams of the server
# ModelStreamInfer: a stream's responses made but not yet written (a decoupled model's responses to a client that
# does not read them); past it the request that makes one more fails and is cancelled
STREAM_MAX_PENDING_RESPONSES = 1024

# Model files one load request may carry (Triton's `file:` parameters), in total: 0 refuses them.
MODEL_LOAD_MAX_FILE_BYTES = 64 * 2**20

# What /v2 and ServerMetadata advertise: only extensions we actually implement, in Triton's order. CUDA shared
# memory is not among them (its endpoints answer Triton's error for a server without GPU support).
EXTENSIONS = (
    "classification",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)

CONTROL_MODES = ("none", "poll", "explicit")

# Comma-separated modules imported before any model loads, so they can register engine ops (custom layers).
PLUGINS_ENV = "NNSERVE_PLUGINS"


def connections_for(open_files_limit: int) -> int:
    """The default HTTP connection limit: half the open-file limit (the rest is for gRPC, the metrics endpoint and
    model files), so that idle or slow clients run into the limit, which closes the oldest idle connection, before
    accept() runs out of descriptors, which would lock everyone out."""
    return max(open_files_limit // 2, 16)


def plugins_from(environ: Mapping[str, str]) -> list[str]:
    return [name.strip() for name in environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


@dataclass
class ServerSettings:
    """Everything `nnserve serve` can be told (flags and environment); the CLI fills it, the app reads it."""

    model_repository: Path
    http_address: str = "0.0.0.0"
    http_port: int = HTTP_PORT
    grpc_address: str = "0.0.0.0"
    grpc_port: int = GRPC_PORT
    metrics_address: str = "0.0.0.0"
    metrics_port: int = METRICS_PORT
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = REPOSITORY_POLL_SECS
    exit_timeout_secs: float = EXIT_TIMEOUT_SECS
    strict_readiness: bool = True
    server_name: str = SERVER_NAME  # the server metadata's name
    engine_options: EngineOptions | None = None  # the engine's NNSERVE_* settings, read with the rest (None: the
    # engine reads the environment when it makes an instance; for settings built without the CLI, in tests)
    exit_on_error: bool = True
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    http_max_input_bytes: int = HTTP_MAX_INPUT_BYTES
    grpc_max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES
    http_max_body_bytes: int = HTTP_MAX_BODY_BYTES
    http_max_header_bytes: int = HTTP_MAX_HEADER_BYTES
    http_header_timeout_secs: float = HTTP_HEADER_TIMEOUT_SECS
    http_body_timeout_secs: float = HTTP_BODY_TIMEOUT_SECS
    http_idle_timeout_secs: float = HTTP_IDLE_TIMEOUT_SECS
    http_max_connections: int = 1024  # the CLI resolves HTTP_MAX_CONNECTIONS (0) against the open-file limit
    http_decode_in_thread_bytes: int = HTTP_DECODE_IN_THREAD_BYTES
    grpc_stream_max_inflight: int = STREAM_MAX_INFLIGHT
    grpc_streams_max_inflight: int = STREAMS_MAX_INFLIGHT
    grpc_stream_max_pending_responses: int = STREAM_MAX_PENDING_RESPONSES
    drain_delay_secs: float = DRAIN_DELAY_SECS
    http_restricted_api: list[str] = field(default_factory=list)  # Triton's "<apis>:<key>=<value>" specs
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    log_verbose: int = 0
    log_format: str = "text"  # or "json": one JSON object per line
    plugins: list[str] = field(default_factory=list)  # NNSERVE_PLUGINS
    allow_client_shm: bool = False  # Triton's --allow-client-shm (off by default since Triton 2.6x)
    cache_bytes: int = 0  # --cache-config local,size=N: the response cache's size; 0 = no cache
    trace_config: list[str] = field(default_factory=list)  # Triton's --trace-config values
    model_load_max_file_bytes: int = MODEL_LOAD_MAX_FILE_BYTES

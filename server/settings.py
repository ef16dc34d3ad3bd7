"""Server settings, in one place: the defaults (ports, addresses, health paths, timeouts; deploy files read them
from here), ServerSettings, and the environment variables the server reads. server/cli.py reads the flags and the
environment once into a ServerSettings, which is passed down; nothing else in server/ reads either."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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

# What /v2 and ServerMetadata advertise: only extensions we actually implement.
EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "schedule_policy",
)

CONTROL_MODES = ("none", "poll", "explicit")

# Comma-separated modules imported before any model loads, so they can register engine ops (custom layers).
PLUGINS_ENV = "NNSERVE_PLUGINS"


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
    exit_on_error: bool = True
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    http_max_input_bytes: int = HTTP_MAX_INPUT_BYTES
    grpc_max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES
    drain_delay_secs: float = DRAIN_DELAY_SECS
    http_restricted_api: list[str] = field(default_factory=list)  # Triton's "<apis>:<key>=<value>" specs
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    log_verbose: int = 0
    log_format: str = "text"  # or "json": one JSON object per line
    plugins: list[str] = field(default_factory=list)  # NNSERVE_PLUGINS

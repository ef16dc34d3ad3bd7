"""Access control and path safety.

Restricted APIs follow Triton's `--http-restricted-api` / `--grpc-restricted-protocol`: each flag value is
`<api>[,<api>...]:<key>=<value>`; a call to one of those APIs must carry header `<key>: <value>` (HTTP) or
metadata `triton-grpc-protocol-<key>: <value>` (gRPC), else it is refused with HTTP 403 / gRPC UNAVAILABLE and
Triton's message. Path safety keeps the repository API inside the repository root.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

# Triton's API group names.
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
              "trace", "logging")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# gRPC method -> API group (grpc.health.v1.Health/Check is "health" too).
GRPC_METHOD_GROUPS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}


class RestrictionSpecError(ValueError):
    """A malformed --http-restricted-api / --grpc-restricted-protocol value."""


@dataclass(frozen=True)
class Restriction:
    key: str
    value: str

    def allows(self, presented: str | None) -> bool:
        # constant-time comparison: the value is a shared secret
        return presented is not None and hmac.compare_digest(presented.encode(), self.value.encode())


def parse_restrictions(specs: list[str], flag: str) -> dict[str, Restriction]:
    """Flag values -> {api group: Restriction}. An API may be in one group only, as in Triton."""
    out: dict[str, Restriction] = {}
    for spec in specs:
        apis, sep, kv = spec.partition(":")
        key, eq, value = kv.partition("=")
        if not sep or not eq or not key.strip() or not apis.strip():
            raise RestrictionSpecError(f"{flag} '{spec}': expected <api>[,<api>...]:<key>=<value>")
        for api in (a.strip() for a in apis.split(",")):
            if api not in API_GROUPS:
                raise RestrictionSpecError(f"{flag} '{spec}': unknown API '{api}' (known: {', '.join(API_GROUPS)})")
            if api in out:
                raise RestrictionSpecError(f"{flag}: API '{api}' is in more than one restricted group")
            out[api] = Restriction(key.strip().lower(), value)
    return out


def http_api_group(method: str, path: str) -> str | None:
    """The API group of a REST route (None for paths that are not part of the API, e.g. the OpenAPI schema)."""
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] != "v2":
        return None
    if len(parts) == 1:
        return "metadata"
    head, last = parts[1], parts[-1]
    if head == "health":
        return "health"
    if head == "repository":
        return "model-repository"
    if head in ("systemsharedmemory", "cudasharedmemory"):
        return "shared-memory"
    if head == "logging":
        return "logging"
    if last == "setting" and "trace" in parts:
        return "trace"
    if head == "models":
        return {"infer": "inference", "ready": "health", "config": "model-config", "stats": "statistics",
                "profile": "trace"}.get(last, "metadata")
    return None


def restricted_message(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def grpc_restricted_message(key: str) -> str:
    return f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}{key}'"


# ---- path safety ---------------------------------------------------------------------------------------------
def check_model_name(name: str) -> str | None:
    """Why `name` cannot be a model directory name (None when it can): one plain path component."""
    if not name or name in (".", ".."):
        return f"invalid model name '{name}'"
    if "/" in name or "\\" in name or "\0" in name or name.startswith("~") or Path(name).is_absolute():
        return f"invalid model name '{name}': a model name is a single directory name in the repository"
    return None


def inside(root: Path, path: Path) -> bool:
    """True when `path`, with every symlink resolved, is `root` or below it."""
    try:
        path.resolve(strict=False).relative_to(root.resolve(strict=False))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop
        return False
    return True


def escaping_paths(root: Path, model_dir: Path) -> list[str]:
    """Entries of `model_dir` (itself included) whose real location is outside `root` (symlinks out)."""
    bad = [] if inside(root, model_dir) else [model_dir.name + "/"]
    if not bad:
        for p in model_dir.rglob("*"):
            if not inside(root, p):
                bad.append(str(p.relative_to(model_dir)))
    return bad

"""REST routes of Triton's shared-memory, trace and logging extensions: thin adapters over the data plane (bodies
are JSON objects, read under the app's body limit)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from server.dataplane import DataPlane
from server.errors import InvalidArgumentError
from server.protocol.rest.openapi import LOGGING_EXTRA, SHM_REGISTER_EXTRA, SHM_STATUS_OK, TRACE_EXTRA, errors

SYSTEM, CUDA = "/v2/systemsharedmemory", "/v2/cudasharedmemory"


def add_extension_routes(app: FastAPI, dp: DataPlane) -> None:
    _shared_memory_routes(app, dp)
    _trace_routes(app, dp)
    _logging_routes(app, dp)


def _ok() -> Response:
    return Response(status_code=200, media_type="application/json")


def _shared_memory_routes(app: FastAPI, dp: DataPlane) -> None:
    status_responses = {**errors(400, 403, 404), 200: SHM_STATUS_OK}

    @app.get(f"{SYSTEM}/status", responses=status_responses)
    async def system_status() -> list[dict[str, Any]]:
        return dp.shm_status()

    @app.get(f"{SYSTEM}/region/{{region}}/status", responses=status_responses)
    async def system_region_status(region: str) -> list[dict[str, Any]]:
        return dp.shm_status(region)

    @app.post(f"{SYSTEM}/region/{{region}}/register", openapi_extra=SHM_REGISTER_EXTRA, response_class=Response,
              responses=errors(400, 403, 404, 413, 501))
    async def system_register(region: str, request: Request) -> Response:
        doc = await json_body(request)
        dp.shm_register(region, doc.get("key"), doc.get("offset"), doc.get("byte_size"))
        return _ok()

    @app.post(f"{SYSTEM}/unregister", response_class=Response, responses=errors(400, 403, 413, 501))
    async def system_unregister_all(request: Request) -> Response:
        await json_body(request)  # read, and so limited, like every body
        dp.shm_unregister()
        return _ok()

    @app.post(f"{SYSTEM}/region/{{region}}/unregister", response_class=Response,
              responses=errors(400, 403, 413, 501))
    async def system_unregister(region: str, request: Request) -> Response:
        await json_body(request)
        dp.shm_unregister(region)
        return _ok()

    @app.get(f"{CUDA}/status", responses=status_responses)
    async def cuda_status() -> list[dict[str, Any]]:
        return dp.cuda_shm_status()

    @app.get(f"{CUDA}/region/{{region}}/status", responses=status_responses)
    async def cuda_region_status(region: str) -> list[dict[str, Any]]:
        return dp.cuda_shm_status(region)

    @app.post(f"{CUDA}/region/{{region}}/register", openapi_extra=SHM_REGISTER_EXTRA, response_class=Response,
              responses=errors(400, 403, 413, 501))
    async def cuda_register(region: str, request: Request) -> Response:
        await json_body(request)
        dp.cuda_shm_register(region)
        return _ok()

    @app.post(f"{CUDA}/unregister", response_class=Response, responses=errors(400, 403, 413, 501))
    async def cuda_unregister_all(request: Request) -> Response:
        await json_body(request)
        dp.cuda_shm_unregister()
        return _ok()

    @app.post(f"{CUDA}/region/{{region}}/unregister", response_class=Response,
              responses=errors(400, 403, 413, 501))
    async def cuda_unregister(region: str, request: Request) -> Response:
        await json_body(request)
        dp.cuda_shm_unregister(region)
        return _ok()


def _trace_routes(app: FastAPI, dp: DataPlane) -> None:
    lookup = errors(400, 403, 404, 413, 501, 503)

    @app.get("/v2/trace/setting", responses=errors(403))
    async def trace_get() -> dict[str, Any]:
        return dp.trace_settings()

    @app.post("/v2/trace/setting", openapi_extra=TRACE_EXTRA, responses=errors(400, 403, 413, 501))
    async def trace_post(request: Request) -> dict[str, Any]:
        return dp.trace_settings(update=await json_body(request))

    @app.get("/v2/models/{model}/trace/setting", responses=lookup)
    async def model_trace_get(model: str) -> dict[str, Any]:
        return dp.trace_settings(model)

    @app.post("/v2/models/{model}/trace/setting", openapi_extra=TRACE_EXTRA, responses=lookup)
    async def model_trace_post(model: str, request: Request) -> dict[str, Any]:
        return dp.trace_settings(model, await json_body(request))


def _logging_routes(app: FastAPI, dp: DataPlane) -> None:
    @app.get("/v2/logging", responses=errors(403))
    async def logging_get() -> dict[str, Any]:
        return dp.log_settings()

    @app.post("/v2/logging", openapi_extra=LOGGING_EXTRA, responses=errors(400, 403, 413, 501))
    async def logging_post(request: Request) -> dict[str, Any]:
        return dp.log_settings(await json_body(request))


async def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object ({} when empty); 400 otherwise."""
    return parse_json_object(await request.body())


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, invalid UTF-8 (UnicodeDecodeError), digits past Python's limit
        raise InvalidArgumentError(f"failed to parse the request JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgumentError("failed to parse the request JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the request JSON must be an object")
    return doc

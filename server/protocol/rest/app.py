"""KServe v2 REST routes. Each handler converts the wire format and calls the data plane; ServerErrors become
`{"error": ...}` with Triton's status code through one mapping (infer.error_answer). Infer requests are answered by
the fast path in front of the FastAPI app (server/protocol/rest/infer.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from server import settings
from server.dataplane import DataPlane
from server.errors import InvalidArgumentError, ServerError, UnavailableError
from server.model_upload import file_parameters
from server.protocol.rest.body_limit import BodyLimitMiddleware, RouteLimit
from server.protocol.rest.extension_routes import add_extension_routes, json_body, parse_json_object
from server.protocol.rest.infer import Answer, InferFastPath, error_answer, infer_answer
from server.protocol.rest.openapi import (
    EMPTY_OK,
    INDEX_EXTRA,
    INFER_EXTRA,
    INFER_RESPONSES,
    LOAD_EXTRA,
    NOT_READY,
    errors,
)
from server.protocol.rest.restrict import RestrictedApiMiddleware
from server.request_limits import quoted
from server.security import Restriction

log = logging.getLogger("nnserve.http")
LOAD_PATH = re.compile(r"/v2/repository/models/[^/]+/load")


def create_app(dp: DataPlane, max_input_bytes: int = settings.HTTP_MAX_INPUT_BYTES,
               restrictions: dict[str, Restriction] | None = None, *,
               max_body_bytes: int = settings.HTTP_MAX_BODY_BYTES,
               decode_in_thread_bytes: int = settings.HTTP_DECODE_IN_THREAD_BYTES,
               max_load_file_bytes: int = settings.MODEL_LOAD_MAX_FILE_BYTES) -> Any:
    """The ASGI app: the infer fast path (server/protocol/rest/infer.py) in front of the FastAPI app, whose routes
    take bodies of at most `max_body_bytes` (the load API: also its model files, base64)."""
    # The schema is served (at /openapi.json) so clients and fuzzers can check the routes against it, and FastAPI's
    # UI for it at /docs (its script and style come from a CDN to the browser; the server serves only the page).
    app = FastAPI(title="nnserve", version=settings.SERVER_VERSION, docs_url="/docs", redoc_url=None,
                  openapi_url="/openapi.json")

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> Response:
        return _as_response(error_answer(exc, request.method, request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # unknown routes (404) and wrong methods (405, with its Allow header) answer KServe's {"error": ...}
        return JSONResponse({"error": routing_message(request, exc)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors())
        return JSONResponse({"error": f"invalid request to {request.url.path}: {where}"}, status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:  # a bug: no traceback to the client
        return _as_response(error_answer(exc, request.method, request.url.path))

    # Large bodies are decoded one at a time: decoding holds the GIL, so two at once take as long as one after the
    # other, and a JSON document takes up to ~20x its size in Python objects while it is decoded ('[],' is 3 bytes,
    # its list 64): clients sending large bodies at once must not multiply that.
    decode_turn = asyncio.Lock()
    _health_routes(app, dp)
    _model_routes(app, dp, max_input_bytes, decode_turn)
    _repository_routes(app, dp, decode_in_thread_bytes)
    add_extension_routes(app, dp)
    load_limit = RouteLimit(LOAD_PATH, max_body_bytes + 4 * -(-max_load_file_bytes // 3), "--http-max-body-size + "
                            "--model-load-max-file-size in base64")
    limited = BodyLimitMiddleware(app, max_body_bytes, routes=(load_limit,))
    served: Any = InferFastPath(limited, dp, max_input_bytes, decode_in_thread_bytes, decode_turn)
    # outermost: a restricted call is refused before any route, fast or not, reads its body
    return RestrictedApiMiddleware(served, restrictions=restrictions) if restrictions else served


def _as_response(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type, headers=answer.headers)


def routing_message(request: Request, exc: StarletteHTTPException) -> str:
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        return f"no such endpoint: {method} {path}"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return f"method {method} is not allowed for {path}" + (f"; allowed: {allowed}" if allowed else "")
    return str(exc.detail)


def _health_routes(app: FastAPI, dp: DataPlane) -> None:
    @app.get("/v2", responses=errors(403))
    async def server_metadata() -> dict[str, Any]:
        return dp.server_metadata()

    @app.get(settings.LIVE_PATH, response_class=Response, responses={**errors(403, 503), 200: EMPTY_OK})
    async def live() -> Response:
        if not dp.live():
            raise UnavailableError("Server exiting")
        return Response(status_code=200)

    @app.get(settings.READY_PATH, response_class=Response, responses={**errors(403, 503), 200: EMPTY_OK,
                                                                      400: NOT_READY})
    async def ready() -> Response:
        if dp.draining or dp.exiting:
            raise UnavailableError("Server exiting")
        return Response(status_code=200 if dp.ready() else 400)


def _model_routes(app: FastAPI, dp: DataPlane, max_input_bytes: int, decode_turn: asyncio.Lock) -> None:
    # before /v2/models/{model}, which would otherwise take "stats" for a model name
    @app.get("/v2/models/stats", responses=errors(403))
    async def all_stats() -> dict[str, Any]:
        return {"model_stats": dp.statistics()}

    def both(path: str) -> list[str]:
        return [f"/v2/models/{{model}}{path}", f"/v2/models/{{model}}/versions/{{version}}{path}"]

    lookup = errors(400, 403, 404, 503)  # unknown model, restricted, no such version, not ready
    for path in both(""):
        app.add_api_route(path, lambda model, version="": dp.model_metadata(model, version), methods=["GET"],
                          responses=lookup)
    def model_ready(model: str, version: str = "") -> Response:
        """Triton's answer: 200 when ready; 400 "Model version not ready" for an unknown, unloaded or loading
        model or a version it lacks; 503 while the server is not ready."""
        if dp.model_ready(model, version):
            return Response(status_code=200)
        return JSONResponse({"error": "Model version not ready"}, status_code=400)

    for path in both("/ready"):
        app.add_api_route(path, model_ready, methods=["GET"], response_class=Response,
                          responses={**errors(400, 403, 503), 200: EMPTY_OK})
    for path in both("/config"):
        app.add_api_route(path, lambda model, version="": dp.model_config_dict(model, version), methods=["GET"],
                          responses=lookup)
    for path in both("/stats"):
        app.add_api_route(path, lambda model, version="": {"model_stats": dp.statistics(model, version)},
                          methods=["GET"], responses=lookup)

    async def profile(request: Request, model: str, version: str = "") -> dict[str, Any]:
        # GET: the per-op profile so far; POST {"action": "start" | "stop"}: (re)start or stop collecting
        action = str((await json_body(request)).get("action", "")) if request.method == "POST" else ""
        if request.method == "POST" and not action:
            raise InvalidArgumentError("POST .../profile takes {\"action\": \"start\"} or {\"action\": \"stop\"}")
        return dp.model_profile(model, version, action)

    for path in both("/profile"):
        app.add_api_route(path, profile, methods=["GET", "POST"], responses=lookup)

    async def infer(request: Request, model: str, version: str = "") -> Response:
        # served by InferFastPath in front of this app; this route gives the schema and the same answers
        answer = await infer_answer(dp, model, version, request.headers, request.receive, max_input_bytes,
                                    decode_turn=decode_turn)
        return Response(answer.body, media_type=answer.content_type, headers=answer.headers)

    for path in both("/infer"):
        app.add_api_route(path, infer, methods=["POST"], openapi_extra=INFER_EXTRA, responses=INFER_RESPONSES)


def _repository_routes(app: FastAPI, dp: DataPlane, decode_in_thread_bytes: int) -> None:
    @app.post("/v2/repository/index", openapi_extra=INDEX_EXTRA, responses=errors(400, 403, 413))
    async def index(request: Request) -> list[dict[str, str]]:
        ready = (await json_body(request)).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgumentError("Invalid value for 'ready': expected a boolean")  # Triton's words
        return dp.repository_index(ready)

    @app.post("/v2/repository/models/{model}/load", openapi_extra=LOAD_EXTRA,
              responses=errors(400, 403, 413, 500, 503))
    async def load(model: str, request: Request) -> Response:
        body = await request.body()
        if len(body) >= decode_in_thread_bytes:  # model files (base64): parsed and decoded off the event loop
            config, files = await asyncio.to_thread(load_parameters, body)
        else:
            config, files = load_parameters(body)
        del body
        await dp.load_model(model, config, files)
        return Response(status_code=200)

    @app.post("/v2/repository/models/{model}/unload", responses=errors(400, 403, 413, 503))
    async def unload(model: str, request: Request) -> Response:
        await json_body(request)  # read (and so limited) like the others; unload_dependents: nothing depends
        await dp.unload_model(model)
        return Response(status_code=200)


def load_parameters(body: bytes) -> tuple[str | None, dict[str, bytes]]:
    """(config JSON, model files) of a load request: Triton's `config` and `file:<path>` parameters (base64)."""
    params = parse_json_object(body).get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgumentError("'parameters' must be an object")
    config = params.get("config")
    files = {}
    for key in file_parameters(params):
        value = params[key]
        if not isinstance(value, str):
            raise InvalidArgumentError(f"Unable to parse '{quoted(key)}': a file's content must be a base64 string")
        try:
            files[key] = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise InvalidArgumentError(f"Unable to parse '{quoted(key)}': invalid base64") from None
    return (config if isinstance(config, str) or config is None else json.dumps(config)), files

"""Fuzz the REST API against its own OpenAPI schema (served by the server at /openapi.json) with schemathesis:
generated requests never get a 5xx other than a documented 503, every status code and content type is one the
schema declares for that route; and requests that break the schema on purpose (schemathesis' negative mode) never
get a 5xx either. Bounded examples per route keep it within a minute or two; `make fuzz-server` runs it long
(NNSERVE_FUZZ_EXAMPLES)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import content_type_conformance, status_code_conformance
from schemathesis.generation import GenerationMode
from serverproc import ServerProcess

EXAMPLES = max(25, int(os.environ.get("NNSERVE_FUZZ_EXAMPLES", "150")) // 6)


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    """The session's server, with client shared memory on: the fuzzer then reaches the shared-memory routes'
    checks, not only their 'disabled' answer (Triton's 501)."""
    srv = ServerProcess(repo, "--allow-client-shm", "true")
    yield srv
    assert srv.stop() == 0, srv.log_text


@schemathesis.check
def no_server_error_but_503(ctx, response, case) -> None:  # noqa: ANN001 - schemathesis' check signature
    """5xx means a bug, except 503 (queue full, timeout, exiting), which the schema documents."""
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(f"{case.method} {case.formatted_path} answered {response.status_code}: "
                             f"{response.text[:300]}")


CHECKS = [no_server_error_but_503, status_code_conformance, content_type_conformance]
# A path parameter's schema keywords that leave every string valid: the URL carries text, so negative mode has
# nothing to break in such a parameter.
ANY_TEXT = {"title", "description", "type"}


def nothing_to_break(op) -> bool:  # noqa: ANN001 - a schemathesis APIOperation
    """No body and only path parameters that take any text: schemathesis' negative mode can generate no case for
    it, and hypothesis needs 3-10 s of failed draws to say so (Unsatisfiable) for each such route, sending
    nothing meanwhile."""
    def any_text(p) -> bool:  # noqa: ANN001
        schema = p.definition.get("schema")  # a parameter described by `content` instead is fuzzed
        return isinstance(schema, dict) and set(schema) <= ANY_TEXT and schema.get("type", "string") == "string"
    return not op.body and all(p.location == "path" and any_text(p) for p in op.iter_parameters())


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "checks"), [(GenerationMode.POSITIVE, CHECKS),
                                              (GenerationMode.NEGATIVE, [no_server_error_but_503])])
def test_api_conforms_to_its_schema(server: ServerProcess, mode: GenerationMode, checks: list) -> None:
    """Every operation in the schema, 25 generated cases each (schemathesis' strategies, driven by hypothesis)."""
    schema = schemathesis.openapi.from_url(f"http://{server.http_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 15
    calls: list[int] = []
    unbreakable: list[str] = []
    for op in operations:
        if mode == GenerationMode.NEGATIVE and nothing_to_break(op):
            unbreakable.append(op.label)
            continue

        @given(op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:  # noqa: ANN001
            response = case.call(timeout=30)
            calls.append(response.status_code)
            case.validate_response(response, checks=checks)

        try:
            run()
        except Unsatisfiable:  # negative mode: nothing to break (no body, only free-form string path parameters)
            assert mode == GenerationMode.NEGATIVE, op.label
            unbreakable.append(op.label)
    assert len(calls) >= len(operations) - len(unbreakable)  # something was sent for every route
    assert not {op.label for op in operations if op.body} & set(unbreakable), unbreakable  # every body was broken
    assert server.proc.poll() is None
    assert "Traceback" not in server.log_text, server.log_text[-3000:]


def test_schema_lists_every_route(server: ServerProcess) -> None:
    paths = httpx.get(f"http://{server.http_url}/openapi.json", timeout=10).json()["paths"]
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model}/infer",
                 "/v2/models/{model}/versions/{version}/infer", "/v2/repository/index",
                 "/v2/repository/models/{model}/load", "/v2/models/stats"):
        assert path in paths, sorted(paths)
    infer = paths["/v2/models/{model}/infer"]["post"]
    assert "application/json" in infer["requestBody"]["content"]
    assert {"400", "404", "413", "503"} <= set(infer["responses"])

"""The request limits as `nnserve serve` reads them: every one a flag with its default in server/settings.py, the
connection limit derived from the open-file limit, and nonsense values refused at start."""

from __future__ import annotations

import resource

import pytest

from server import settings
from server.cli import build_parser, check_limits, settings_from_args


def serve_args(*flags: str):  # noqa: ANN201 - argparse's Namespace
    return build_parser().parse_args(["serve", "--model-repository", "repo", *flags])


def test_defaults() -> None:
    s = settings_from_args(serve_args(), {})
    assert (s.http_max_body_bytes, s.http_max_header_bytes) == (settings.HTTP_MAX_BODY_BYTES,
                                                                 settings.HTTP_MAX_HEADER_BYTES)
    assert (s.http_header_timeout_secs, s.http_body_timeout_secs, s.http_idle_timeout_secs) == (10, 60, 65)
    assert (s.grpc_stream_max_inflight, s.grpc_streams_max_inflight) == (64, 1024)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert s.http_max_connections == settings.connections_for(soft) == max(soft // 2, 16)


def test_flags() -> None:
    s = settings_from_args(serve_args("--http-max-body-size", "10", "--http-max-connections", "7",
                                      "--http-header-timeout-secs", "1.5", "--grpc-stream-max-inflight", "3",
                                      "--http-decode-in-thread-size", "99"), {})
    assert (s.http_max_body_bytes, s.http_max_connections, s.http_header_timeout_secs) == (10, 7, 1.5)
    assert (s.grpc_stream_max_inflight, s.http_decode_in_thread_bytes) == (3, 99)


@pytest.mark.parametrize("flag", ["--http-max-body-size", "--http-body-timeout-secs", "--grpc-streams-max-inflight",
                                  "--http-max-connections"])
def test_nonsense_is_refused_at_start(flag: str) -> None:
    with pytest.raises(SystemExit, match=f"{flag} must be positive"):
        check_limits(settings_from_args(serve_args(flag, "-1"), {}))

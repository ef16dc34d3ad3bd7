"""HTTP body compression as Triton does it: `Content-Encoding` on requests, `Accept-Encoding` for responses
(gzip or deflate). Inference-Header-Content-Length always counts the uncompressed JSON.
"""

from __future__ import annotations

import gzip
import zlib

from server.errors import InvalidArgumentError, PayloadTooLargeError, UnsupportedError
from server.settings import HTTP_MAX_INPUT_BYTES

ENCODINGS = ("gzip", "deflate")


def decompress(body: bytes, encoding: str | None, limit: int = HTTP_MAX_INPUT_BYTES) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ENCODINGS:
        raise UnsupportedError(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
    try:
        return b"".join(_inflated(body, encoding, limit))
    except zlib.error as exc:
        raise InvalidArgumentError(f"request body is not valid {encoding} data: {exc}") from None


def _inflated(body: bytes, encoding: str, limit: int) -> list[bytes]:
    """The inflated parts of `body`: every member of a gzip file (RFC 1952: members are concatenated), the one zlib
    stream of deflate; a truncated stream or bytes after the end are refused, not dropped. `limit` bounds the total,
    checked on the inflated size so that a small bomb cannot exhaust memory."""
    # wbits: 16 + MAX_WBITS reads the gzip wrapper, MAX_WBITS the zlib one (what "deflate" means on the web)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    parts: list[bytes] = []
    total, data = 0, body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(data, limit + 1 - total)
        except zlib.error as exc:
            if parts:  # RFC 1952 allows only further members after a member, not other bytes
                raise zlib.error(f"{len(data)} bytes after member {len(parts)} are not a gzip member ({exc})") from None
            raise
        total += len(part)
        if total > limit:
            raise PayloadTooLargeError(f"decompressed request exceeds the {limit}-byte limit (--http-max-input-size)")
        parts.append(part)
        if not inflater.eof:
            raise zlib.error("the stream is truncated")
        data = inflater.unused_data
        if not data:
            return parts
        if encoding != "gzip":
            raise zlib.error(f"{len(data)} bytes follow the end of the stream")


def compress(payload: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """Compress with the first encoding the client accepts; (payload, None) when it accepts neither."""
    accepted = [part.split(";")[0].strip().lower() for part in (accept_encoding or "").split(",")]
    for encoding in accepted:
        if encoding == "gzip":
            return gzip.compress(payload, compresslevel=1), "gzip"
        if encoding == "deflate":
            return zlib.compress(payload, 1), "deflate"
    return payload, None

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
    # wbits: 16 + MAX_WBITS reads the gzip wrapper, MAX_WBITS the zlib one (what "deflate" means on the web)
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgumentError(f"request body is not valid {encoding} data: {exc}") from None
    if len(out) > limit:  # checked on the inflated size so a small bomb cannot exhaust memory
        raise PayloadTooLargeError(f"decompressed request exceeds the {limit}-byte limit (--http-max-input-size)")
    return out


def compress(payload: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """Compress with the first encoding the client accepts; (payload, None) when it accepts neither."""
    accepted = [part.split(";")[0].strip().lower() for part in (accept_encoding or "").split(",")]
    for encoding in accepted:
        if encoding == "gzip":
            return gzip.compress(payload, compresslevel=1), "gzip"
        if encoding == "deflate":
            return zlib.compress(payload, 1), "deflate"
    return payload, None

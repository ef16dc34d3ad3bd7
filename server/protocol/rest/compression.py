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


# A request is one gzip member in practice; a body of thousands of tiny members only costs time to take apart.
MAX_MEMBERS = 1024
# Input is fed to each member's inflater in pieces that start this small and double, so what is copied past a
# member's end (its unused_data) stays within the member's own size: a body of many members costs linear time.
FIRST_FEED = 1024
MAX_FEED = 1 << 20


def _inflated(body: bytes, encoding: str, limit: int) -> list[bytes]:
    """The inflated parts of `body`: every member of a gzip file (RFC 1952: members are concatenated), the one zlib
    stream of deflate; a truncated stream or bytes after the end are refused, not dropped. `limit` bounds the total,
    checked on the inflated size so that a small bomb cannot exhaust memory."""
    # wbits: 16 + MAX_WBITS reads the gzip wrapper, MAX_WBITS the zlib one (what "deflate" means on the web)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    view, pos, parts, total, members = memoryview(body), 0, [], 0, 0
    while True:
        members += 1
        if members > MAX_MEMBERS:
            raise zlib.error(f"more than {MAX_MEMBERS} gzip members")
        inflater, step, start = zlib.decompressobj(wbits), FIRST_FEED, pos
        while not inflater.eof:
            if pos >= len(body):
                raise zlib.error("the stream is truncated")
            chunk = view[pos:pos + step]
            try:
                part = inflater.decompress(chunk, limit + 1 - total)
            except zlib.error as exc:
                if members > 1 and pos == start:  # RFC 1952 allows only further members after a member
                    raise zlib.error(f"{len(body) - start} bytes after member {members - 1} are not a gzip member "
                                     f"({exc})") from None
                raise
            total += len(part)
            if total > limit:
                raise PayloadTooLargeError(f"decompressed request exceeds the {limit}-byte limit "
                                           "(--http-max-input-size)")
            parts.append(part)
            pos += len(chunk) - (len(inflater.unused_data) if inflater.eof else 0)
            step = min(2 * step, MAX_FEED)
        if pos == len(body):
            return parts
        if encoding != "gzip":
            raise zlib.error(f"{len(body) - pos} bytes follow the end of the stream")


def compress(payload: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """Compress with the first encoding the client accepts; (payload, None) when it accepts neither."""
    accepted = [part.split(";")[0].strip().lower() for part in (accept_encoding or "").split(",")]
    for encoding in accepted:
        if encoding == "gzip":
            return gzip.compress(payload, compresslevel=1), "gzip"
        if encoding == "deflate":
            return zlib.compress(payload, 1), "deflate"
    return payload, None

"""The server's log: text lines (time, level, logger, message) or JSON lines (--log-format json), and which
loggers speak at which --log-verbose level.

At the default level the log reads like Triton's: the server's own lines (a line per model state change, the table
of models once loading is done, the listening ports); the engine's per-instance planning notes (the blocked layout's
statistics, oneDNN choices) are debug detail. --log-verbose 1 turns on debug for the server and the engine, but not
for the libraries underneath (grpc logs a "Loaded running loop" line per thread, asyncio its selector, numba its
compiler passes): their debug lines say nothing about serving.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENGINE_LOGGER = "engine"
# Libraries whose DEBUG lines are noise even at --log-verbose 1: they log at INFO and above only.
QUIET_LIBRARIES = ("grpc", "asyncio", "numba", "multipart", "python_multipart", "httpx", "httpcore", "urllib3")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the traceback when there is
    one; a multi-line message (the model table) stays one record."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(verbose: int, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Configure the root logger once, for `nnserve serve` (stderr unless `stream` is given)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose > 0 else logging.INFO, handlers=[handler], force=True)
    logging.getLogger(ENGINE_LOGGER).setLevel(logging.DEBUG if verbose > 0 else logging.WARNING)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO)

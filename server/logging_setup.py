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
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from server.errors import InvalidArgumentError, UnsupportedError

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
    handler.setFormatter(_formatter(log_format))
    handler.addFilter(LevelSwitch())
    logging.basicConfig(handlers=[handler], force=True)
    set_verbose(verbose)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO)


def set_verbose(verbose: int) -> None:
    logging.getLogger().setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
    logging.getLogger(ENGINE_LOGGER).setLevel(logging.DEBUG if verbose > 0 else logging.WARNING)


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "ISO8601":
        formatter = logging.Formatter(TEXT_FORMAT, datefmt="%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
        return formatter
    return logging.Formatter(TEXT_FORMAT)


class LevelSwitch(logging.Filter):
    """Triton's log_info / log_warning / log_error switches (the logging extension), on the server's handler."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.error
        if record.levelno >= logging.WARNING:
            return self.warning
        return self.info


# The logging extension's log_format values: Triton's two, and nnserve's JSON lines (--log-format json).
EXTENSION_FORMATS = {"text": "default", "json": "json"}


class LogControl:
    """Triton's logging extension (/v2/logging, LogSettings): the log settings, read and changed at run time on the
    handler setup_logging installed. The log file is not settable over the network (Triton's rule): nnserve logs
    to stderr."""

    def __init__(self, verbose: int = 0, log_format: str = "text"):
        self.verbose = verbose
        self.format = EXTENSION_FORMATS.get(log_format, log_format)
        self.switch = LevelSwitch()
        self.handlers = [h for h in logging.getLogger().handlers
                         if any(isinstance(f, LevelSwitch) for f in h.filters)]
        for handler in self.handlers:
            self.switch = next(f for f in handler.filters if isinstance(f, LevelSwitch))

    def settings(self) -> dict[str, Any]:
        return {"log_file": "", "log_info": self.switch.info, "log_warning": self.switch.warning,
                "log_error": self.switch.error, "log_verbose_level": self.verbose, "log_format": self.format}

    def update(self, values: dict[str, Any]) -> None:
        """Apply a settings request (checked whole first, so a bad value changes nothing); Triton's words."""
        if values.get("log_file") is not None:
            raise UnsupportedError("log file location can not be updated through network protocol")
        for key in ("log_info", "log_warning", "log_error"):
            if values.get(key) is not None and not isinstance(values[key], bool):
                raise InvalidArgumentError(f"expect boolean for '{key}'")
        verbose = values.get("log_verbose_level")
        if verbose is not None and (isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0):
            raise InvalidArgumentError("expect a non-negative integer for 'log_verbose_level'")
        fmt = values.get("log_format")
        if fmt is not None and fmt not in ("default", "ISO8601", "json"):
            raise InvalidArgumentError(f"invalid argument for log_format, got: {str(fmt)[:64]}")
        for key, attr in (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error")):
            if values.get(key) is not None:
                setattr(self.switch, attr, values[key])
        if verbose is not None:
            self.verbose = verbose
            set_verbose(verbose)
        if fmt is not None:
            self.format = fmt
            for handler in self.handlers:
                handler.setFormatter(_formatter("text" if fmt == "default" else fmt))

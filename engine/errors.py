"""One exception hierarchy for the engine. Every message names the file, line or byte offset it is about."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class ModelFormatError(EngineError):
    """A model file is malformed. Carries the path and, where known, the line or byte offset."""

    def __init__(self, path: str, message: str, *, line: int | None = None, offset: int | None = None):
        self.path, self.line, self.offset, self.detail = str(path), line, offset, message
        where = self.path
        if line is not None:
            where += f":{line}"
        if offset is not None:
            where += f" at byte {offset}"
        super().__init__(f"{where}: {message}")


class UnsupportedOpError(EngineError):
    """The graph uses an op type the engine has no implementation for."""

    def __init__(self, op_type: str, node: str = "", where: str = "", available: list[str] | None = None):
        self.op_type, self.node = op_type, node
        msg = f"unsupported op {op_type!r}"
        if node:
            msg += f" (node {node!r})"
        if where:
            msg = f"{where}: {msg}"
        if available:
            msg += f"; supported ops: {', '.join(sorted(available))}"
        super().__init__(msg)


class ShapeError(EngineError):
    """Shapes do not fit: an input of the wrong shape, or an op whose operands disagree."""


class ArenaOverflowError(ShapeError):
    """A request needs more activation memory than the instance planned for at its max shapes."""


class InputValueError(EngineError):
    """An input holds a value the model cannot take (a NaN that an int8 model would quantize): the request's fault,
    as a wrong shape is."""


class KernelError(EngineError):
    """A kernel raised while running a node; names the node and op."""

"""The pnnx handler table: pnnx type (without prefix) -> handler. Handler modules register with @handles."""

from __future__ import annotations

from collections.abc import Callable

from engine.formats.pnnx.lowering.context import Ctx

Handler = Callable[[Ctx], None]
HANDLERS: dict[str, Handler] = {}


def handles(*types: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for t in types:
            if t in HANDLERS:
                raise ValueError(f"pnnx type {t!r} has two lowering handlers")
            HANDLERS[t] = fn
        return fn
    return deco

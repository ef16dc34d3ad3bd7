"""The TNN handler tables: layer type -> handler, for float layers (HANDLERS) and `Quantized*` layers (QUANTIZED).
Handler modules register with @handles / @handles_quantized, or a table of made handlers with register()."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engine.formats.tnn.lowering.context import Ctx

Handler = Callable[[Ctx], None]
HANDLERS: dict[str, Handler] = {}
QUANTIZED: dict[str, Handler] = {}


def register(table: Mapping[str, Handler], *, quantized: bool = False) -> None:
    target = QUANTIZED if quantized else HANDLERS
    for layer_type, handler in table.items():
        if layer_type in target:
            raise ValueError(f"TNN layer type {layer_type!r} has two lowering handlers")
        target[layer_type] = handler


def handles(*layer_types: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        register(dict.fromkeys(layer_types, fn))
        return fn
    return deco


def handles_quantized(*layer_types: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        register(dict.fromkeys(layer_types, fn), quantized=True)
        return fn
    return deco

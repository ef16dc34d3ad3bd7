"""Canonical ops, one module per family. Importing this package registers them all."""

import importlib
import pkgutil

from engine.ops.registry import OPS, OpDef, TensorInfo, all_ops, get_op, register

_FAMILY_SKIP = {"registry"}
for _m in pkgutil.iter_modules(__path__):
    if _m.name not in _FAMILY_SKIP and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["OPS", "OpDef", "TensorInfo", "all_ops", "get_op", "register"]

"""Plugins: the modules named in NNSERVE_PLUGINS (ServerSettings.plugins) are imported before any model loads, so
they can register engine ops (custom layers): their meaning with engine.ops.register and their CPU kernel with
engine.devices.cpu.register_kernel.
"""

from __future__ import annotations

import importlib
import logging

from server.settings import PLUGINS_ENV

log = logging.getLogger("nnserve")


def load_plugins(names: list[str]) -> None:
    """Import each named module; a plugin that fails to import stops the server (its models could not load)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise SystemExit(f"nnserve: plugin '{name}' ({PLUGINS_ENV}) failed to import: {exc}") from exc
        log.info("loaded plugin %s", name)

"""Plugins: modules named in NNSERVE_PLUGINS (comma-separated) are imported before any model loads, so they can
register engine ops (custom layers) with engine.ops.registry.
"""

from __future__ import annotations

import importlib
import logging
import os

log = logging.getLogger("nnserve")
ENV_VAR = "NNSERVE_PLUGINS"


def load_plugins(spec: str | None = None) -> list[str]:
    """Import each named module; a plugin that fails to import stops the server (its models could not load)."""
    spec = os.environ.get(ENV_VAR, "") if spec is None else spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise SystemExit(f"nnserve: plugin '{name}' ({ENV_VAR}) failed to import: {exc}") from exc
        log.info("loaded plugin %s", name)
    return names

"""A numba/numpy pair known to fail every compilation is refused when a device is made, naming the fix."""

from __future__ import annotations

import pytest

from engine.devices import get_device, toolchain
from engine.errors import EngineError


@pytest.mark.parametrize(("numba", "numpy", "broken"), [
    ("0.68.0", "2.5.2", True), ("0.68.0", "2.5.0", True), ("0.68.0", "3.0.0", True),
    ("0.68.0", "2.4.6", False), ("0.68.1", "2.5.2", False), ("0.67.1", "2.3.0", False),
])
def test_known_broken_pairs(numba, numpy, broken):
    why = toolchain.incompatibility(numba, numpy)
    assert (why is not None) == broken
    if broken:
        assert f"numba {numba}" in why and f"numpy {numpy}" in why and "numba>=0.68.1" in why


def test_a_broken_pair_is_refused_when_a_device_is_made(monkeypatch):
    monkeypatch.setattr(toolchain.metadata, "version", lambda name: "0.68.0")
    monkeypatch.setattr(toolchain.np, "__version__", "2.5.2")
    toolchain.check.cache_clear()
    try:
        with pytest.raises(EngineError, match=r"numba 0\.68\.0 cannot compile kernels with numpy 2\.5\.2"):
            get_device("cpu")
    finally:
        toolchain.check.cache_clear()

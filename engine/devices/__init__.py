"""Devices by name. CPU is built in; CUDA is imported lazily so CPU-only installs never need pycuda."""

from __future__ import annotations

import importlib

from engine.devices.base import Device
from engine.errors import EngineError

_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


def get_device(name: str = "cpu") -> Device:
    """The Device for "cpu", "cuda" or "gpu" (EngineError for anything else or an unavailable CUDA)."""
    key = _ALIASES.get(str(name).lower().split(":")[0])
    if key is None:
        raise EngineError(f"unknown device {name!r}; supported devices: cpu, cuda (gpu)")
    if key == "cpu":
        from engine.devices.cpu.device import CpuDevice

        return CpuDevice()
    try:
        module = importlib.import_module("engine.devices.cuda")
        return module.CudaDevice(name)
    except EngineError:
        raise
    except Exception as e:  # ImportError without pycuda, driver errors without a GPU
        raise EngineError(f"CUDA device support is not installed/available: {type(e).__name__}: {e}") from None


__all__ = ["Device", "get_device"]

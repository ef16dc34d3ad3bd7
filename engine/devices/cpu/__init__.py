"""CPU device."""

from engine.devices.cpu.device import CpuDevice, reference_kernel

__all__ = ["CpuDevice", "reference_kernel"]

"""The CUDA device: `Model.instance("cuda")`, "gpu" or "cuda:N". Imported lazily by engine.devices.get_device.

Decision: kernels, device memory, streams, pinned host buffers and contexts all use numba.cuda (the numba-cuda
package). One library serves both jobs, and its simulator (NUMBA_ENABLE_CUDASIM=1) runs the very same kernel
code on machines without a GPU, which is how CI tests every kernel against the numpy references. pycuda is not
needed by the engine; it stays in the optional `cuda` extra for the CUDA image's tooling only, and nothing
here imports it. Kernels are grid-stride loops over flat arena views (see _launch.py); the op families live in
elementwise, movement, reduce, linalg, conv, spatial and attention; kernels.KERNELS is the table.
"""

from engine.devices.cuda.device import CudaDevice, device_count

__all__ = ["CudaDevice", "device_count"]

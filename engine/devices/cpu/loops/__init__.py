"""numba loops behind the CPU kernels, one module per kind of loop; each releases the GIL and works on an item
range [lo, hi) where the thread pool splits it."""

"""oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) through ctypes: loading the library, its objects, and the
primitives the CPU kernels run on it."""

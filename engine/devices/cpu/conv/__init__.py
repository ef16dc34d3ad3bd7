"""The CPU's convolutions: oneDNN's primitives through one plan, the direct numpy/numba paths (GEMM, im2col,
depthwise, Winograd F(2x2)), and Winograd F(4x4)/F(2x2) on blocked values."""

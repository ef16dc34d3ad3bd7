"""TNN's int8 ops on oneDNN: activations stay int8 in NHWC (channels last, the layout oneDNN's int8 kernels use)
between quantized layers, and every result is bit-exact with TNN's CPU kernels (engine/ops/quant.py).

ops.py (the NHWC twins of the int8 ops), rewrite.py (the graph pass putting int8 values in NHWC),
scales.py and requant.py (making oneDNN's rounding TNN's), conv.py (the convolution kernel), loops.py (numba loops),
kernels.py (the kernel table entries), upsample.py (TnnQUpsample's kernels, NCHW and NHWC).
"""

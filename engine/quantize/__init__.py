"""Post-training static quantization to TNN's int8 format (`nnserve quantize`).

A float model (PNNX or TNN) is loaded without fusing activations into convolutions, so that every blob TNN's
int8 layers read or write exists (plan.py picks the layers: convolutions with their ReLU / ReLU6, inner
products, adds, max pools, concats and ReLUs, as TNN's quantization tool does). Calibration inputs run through
that float graph while per-channel statistics of those blobs are gathered (calibrate.py); blob scales come from
them by TNN's formulas (scales.py: min-max, KL divergence, or a percentile), weights are quantized per output
channel (weights.py), and the int8 graph (build.py) is written by the TNN writer as TNN's tool writes it. The
written model is loaded back and compared layer by layer with the float one (report.py).

    result = quantize("model.pnnx.param", samples, "out/model_int8", method="kl")
    print(format_report(result))
"""

from engine.quantize.api import QuantizeOptions, QuantizeResult, format_report, quantize

__all__ = ["QuantizeOptions", "QuantizeResult", "format_report", "quantize"]

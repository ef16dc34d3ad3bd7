"""TNN constants shared by the readers, the lowering and the writer: file magics, DataType codes, layer types.

Layer type names are the spellings TNN's layer-type table accepts (case-sensitive). The number is the
LayerType enum the quantizer and model packer write into `.tnnmodel` headers (0 where we never write it;
onnx2tnn writes 0 everywhere and readers go by the name).
"""

from __future__ import annotations

import numpy as np

MAGIC_V1 = 0xFABC0002  # 4206624770
MAGIC_V2 = 0xFABC0004  # 4206624772
MAGICS = {MAGIC_V1: 1, MAGIC_V2: 2}

# TNN DataType codes -> numpy storage dtype. bfloat16 is stored as raw uint16 and widened by the reader.
DATA_TYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("i1"),
    3: np.dtype("<i4"),
    4: np.dtype("<u2"),
    5: np.dtype("<i8"),
    6: np.dtype("<u4"),
}
DT_FLOAT, DT_HALF, DT_INT8, DT_INT32, DT_BF16, DT_INT64, DT_UINT32 = range(7)

# The dtype a graph input of a given DataType code gets in the IR.
INPUT_DTYPES: dict[int, np.dtype] = {
    0: np.dtype(np.float32), 1: np.dtype(np.float16), 2: np.dtype(np.int8), 3: np.dtype(np.int32),
    4: np.dtype(np.float32), 5: np.dtype(np.int64), 6: np.dtype(np.uint32),
}
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.int8): 2, np.dtype(np.int32): 3,
    np.dtype(np.int64): 5, np.dtype(np.uint32): 6, np.dtype(np.bool_): 2,
}

_ENUMS = {
    "Convolution": 1, "BatchNormCxx": 2, "BatchNormalization": 2, "Pooling": 4, "ReLU": 5, "Relu": 5,
    "Concat": 8, "Reshape": 9, "Flatten": 10, "Dropout": 11, "LRN": 12, "Scale": 16, "InnerProduct": 19,
    "Softmax": 21, "SoftmaxCaffe": 21, "Deconvolution": 22, "Sigmoid": 23, "Permute": 32, "PriorBox": 33,
    "DetectionOutput": 34, "PReLU": 35, "Add": 38, "Tanh": 39, "LeakyRelu": 40, "Abs": 41, "Mul": 42,
    "InstBatchNormCxx": 43, "Pad": 44, "Normalize": 45, "BiasAdd": 54, "StridedSlice": 57,
    "ShuffleChannel": 63, "Power": 69, "Neg": 70, "Shape": 72, "Const": 100, "Cast": 103, "Gather": 104,
    "MatMul": 105, "Sub": 108, "Squeeze": 118, "ReLU6": 125, "Relu6": 125, "Square": 129, "Sqrt": 130,
    "Reorg": 131, "Elu": 132, "ReduceSum": 133, "Maximum": 137, "Rsqrt": 138, "Minimum": 140, "Exp": 141,
    "Tile": 148, "Repeat": 148, "Upsample": 149, "SplitV": 153, "Unsqueeze": 164, "ReduceMean": 169,
    "Clip": 171, "HardSigmoid": 172, "HardSwish": 173, "Softplus": 174, "Div": 175, "ReduceMax": 177,
    "Floor": 186, "Selu": 187, "ReduceMin": 192, "ReduceProd": 193, "ArgMaxOrMin": 199,
    "Convolution3D": 201, "Pooling3D": 202, "Convolution1D": 203, "Pooling1D": 204, "PixelShuffle": 303,
    "Expand": 304, "ScatterND": 305, "StridedSliceV2": 306, "Erf": 307, "ConstantOfShape": 308,
    "LSTMONNX": 310, "Range": 311, "PadV2": 316, "GroupNorm": 318, "LayerNorm": 326, "GELU": 327,
    "LogSoftmax": 330, "Swish": 401, "GLU": 402, "BlobScale": 600,
}
# Spellings TNN accepts whose enum we never need to write.
_OTHER_NAMES = """
Split Eltwise ArbitraryDimensionSpp BatchNorm ReshapeC Pooling_split_CC QuantizedPooling QuantizedReLU
QuantizedAdd QuantizedConcat QuantizedConvolution QuantizedInnerProduct QuantizedSigmoid QuantizedUpsample
QuantizedBiasAdd QuantizedSum QuantizedReshapeTensorflow QuantizedBatchNormCxx QuantizedMul QuantizedReshape
QuantizedPermute DynamicRangeQuantizedConvolution DynamicRangeQuantizedMatMul DynamicRangeQuantizedInnerProduct
DynamicRangeQuantizedLSTMONNX DynamicRangeQuantizedGather
Deconvolution1D Deconvolution3D QuantizedDeconvolution Identity Slice SliceCaffe Transpose Reverse Prod Pack
Placeholder LogSigmoid HardTanH AdaptiveAvgPool2d AdaptiveMaxPool2d HDRGuide HdrGuide Reformat Sign Cos Acos Sin
Asin Tan Atan Log Reciprocal Ceil ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare RoiAlign
Einsum Inverse GridSample Equal Where Greater Less And Or Xor Not CategoricalCrossEntropy
BinaryCrossEntropy SignedMul DetectionPostProcess SquaredDifference NonZero Size Histogram GatherND BitShift
OneHot CbamFusedReduce CbamFusedPooling Softsign TopK Scatter ScatterElements NonMaxSuppression Mat Flatten
InstanceNorm Lstm Gru Unpack Fill Interp RealDiv Mish Roll Trilu Mod Pow Mean Sum Linspace
""".split()

LAYER_TYPES: dict[str, int] = {**dict.fromkeys(_OTHER_NAMES, 0), **_ENUMS}

# Other spellings of a type in TNN's layer type map (source/tnn/core/layer_type.cc): TNN turns the string into its
# LayerType on reading and keys the interpreter, the resource reader and every acc on that, so a
# `Convolution_nhwc` layer is read and run exactly as a `Convolution` one (the suffix names no layout: TNN's
# runtime blobs are NCHW either way).
TYPE_ALIASES: dict[str, str] = {
    "Convolution_nhwc": "Convolution", "BatchNormCxx_nhwc": "BatchNormCxx", "Pooling_nhwc": "Pooling",
    "Pooling_split_CC": "Pooling", "Softmax_nhwc": "Softmax", "Concat_nhwc": "Concat", "Flatten_nhwc": "Flatten",
    "InnerProduct_nhwc": "InnerProduct", "PReLU_nhwc": "PReLU", "StridedSlice_nhwc": "StridedSlice",
    "Reduce_Sum": "ReduceSum", "QuantizedConvolution_nhwc": "QuantizedConvolution",
}
LAYER_TYPES |= {alias: LAYER_TYPES.get(base, 0) for alias, base in TYPE_ALIASES.items() if alias not in LAYER_TYPES}


def is_known_type(name: str) -> bool:
    return name in LAYER_TYPES


def layer_enum(name: str) -> int:
    return LAYER_TYPES.get(name, 0)

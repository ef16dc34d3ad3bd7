"""Canonical ops: what each op means (shape/dtype inference, the numpy reference, in-place and alias
declarations), one module per family; importing the package registers every family.

This package needs numpy only: how a device computes an op is in engine/devices/<device>/.
"""

from engine.ops import (  # noqa: F401  (each family module registers its ops)
    activation,
    attention,
    conv,
    data_dependent,
    detection,
    elementwise,
    expression,
    generate,
    grid_sample,
    histogram,
    linear,
    norm,
    pad,
    pool,
    quant,
    quant_upsample,
    recurrent,
    reduce,
    resize,
    roi_align,
    scatter,
    shape,
    softmax,
    sort,
    tensor,
    volume,
)
from engine.ops.registry import OPS, OpDef, TensorInfo, all_ops, get_op, register

__all__ = ["OPS", "OpDef", "TensorInfo", "all_ops", "get_op", "register"]

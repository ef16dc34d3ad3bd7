"""Kernels for ToBlocked / ToPlain: the reorders between NCHW and nChw{B}c.

The numpy kernels copy whole blocks with one strided copy and the last partial block apart; with oneDNN a
reorder primitive does the same (several times faster on big maps, and it writes the padding lanes' zeros).
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md
from engine.ops.registry import Kernel


def onednn_available() -> bool:
    return D.available()


# -- kernels ------------------------------------------------------------------------------------------
def build(to_blocked: bool, block: int, dtype: np.dtype) -> Kernel:
    if dtype == np.float32 and onednn_available():
        return _onednn_kernel(to_blocked, block)
    return _numpy_kernel(to_blocked, block)


def _numpy_kernel(to_blocked: bool, block: int) -> Kernel:
    def run(inputs, outputs, workspace):
        (blocked_into if to_blocked else plain_into)(inputs[0], outputs[0], block)
    return run


def blocked_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = x.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full], x[:, :full * block].reshape(n, full, block, h, w).transpose(0, 1, 3, 4, 2))
    if rem:
        np.copyto(out[:, full, :, :, :rem], x[:, full * block:].transpose(0, 2, 3, 1))
        out[:, full, :, :, rem:] = 0


def plain_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = out.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full * block].reshape(n, full, block, h, w), x[:, :full].transpose(0, 1, 4, 2, 3))
    if rem:
        np.copyto(out[:, full * block:], x[:, full, :, :, :rem].transpose(0, 3, 1, 2))


def _onednn_kernel(to_blocked: bool, block: int) -> Kernel:
    steps: dict[tuple, object] = {}

    def step_for(plain_shape: tuple) -> object:
        step = steps.get(plain_shape)
        if step is None:
            plain, blocked = D.MemoryDesc.plain(plain_shape), blocked_md(plain_shape, block)
            step = steps[plain_shape] = (D.reorder_step(plain, blocked) if to_blocked
                                         else D.reorder_step(blocked, plain))
        return step

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        D.sync_threads()
        step_for(x.shape if to_blocked else out.shape).run({L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)})
        D.wait()
    return run

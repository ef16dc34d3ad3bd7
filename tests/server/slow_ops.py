"""Test-only plugin (NNSERVE_PLUGINS=slow_ops): every Sigmoid execution takes SECONDS longer, so a test can make a
model slower than its clients (the sleep releases the GIL: the server stays responsive)."""

from __future__ import annotations

import time

import numpy as np
from sigmoid_hook import hook_sigmoid

from engine.ir import Node

SECONDS = 0.1


def _sleep(node: Node, x: np.ndarray) -> None:
    time.sleep(SECONDS)


hook_sigmoid(_sleep)

"""Test-only plugin (NNSERVE_PLUGINS=faulty_ops): the Sigmoid kernel raises when its input holds a value beyond
POISON, so a test can make exactly the executions it chooses fail inside the engine.

The hook goes on Sigmoid's reference and CPU kernel the way a plugin registers an op (tests/server/sigmoid_hook.py).
"""

from __future__ import annotations

import numpy as np
from sigmoid_hook import hook_sigmoid

from engine.ir import Node

POISON = 1e30


def _check(node: Node, x: np.ndarray) -> None:
    if np.any(np.abs(x) > POISON):
        raise RuntimeError("injected fault")


hook_sigmoid(_check)

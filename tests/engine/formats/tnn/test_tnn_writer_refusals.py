"""The TNN writer names what a TNN file cannot hold instead of failing deep inside."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import UnsupportedOpError
from engine.formats.tnn.writer.write import write_tnn
from engine.ir import Graph


def test_slice_with_run_time_bounds_is_refused_by_name(tmp_path):
    g = Graph()
    x = g.value("x", (4, 6), np.float32)
    g.inputs = [x]
    starts, ends = g.const(np.array([0], np.int64)), g.const(np.array([3], np.int64))
    node = g.add_node("Slice", [x, starts, ends], 1, name="cut", params={"axes": [1]})
    g.outputs = node.outputs
    with pytest.raises(UnsupportedOpError, match="bounds computed at run time"):
        write_tnn(g, tmp_path / "m")

"""_onednn.address: the remembered data pointer of an array is the array's own, for views and for new arrays that
reuse a dead array's id, and remembering an array never keeps it alive. A reorder step re-pointed run after run
reads and writes the buffers of each run, and its blocked destination's padding comes out zero whatever was there."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md


def test_address_is_the_data_pointer_of_each_view():
    base = np.zeros((4, 8, 16), np.float32)
    views = [base, base[1], base[2:], base[:, 3]]
    for _ in range(2):  # the second round reads the remembered values
        assert [D.address(v) for v in views] == [v.ctypes.data for v in views]


def test_new_arrays_never_get_a_dead_arrays_address():
    for _ in range(200):  # ids of freed arrays are reused quickly by CPython
        a = np.zeros(37, np.float32)
        assert D.address(a) == a.ctypes.data
        del a


def test_remembering_does_not_keep_an_array_alive():
    a = np.zeros(1 << 20, np.uint8)
    D.address(a)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(not D.available(), reason="oneDNN (libdnnl) is not installed")
def test_a_step_follows_its_buffers_when_they_change_and_come_back():
    shape = (1, 20, 5, 7)
    step = D.reorder_step(D.MemoryDesc.plain(shape), blocked_md(shape, 16))
    rng = np.random.default_rng(0)
    srcs = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    dsts = [np.full((1, 2, 5, 7, 16), np.nan, np.float32) for _ in range(2)]
    for i in (0, 1, 1, 0, 0, 1):  # changed, unchanged, changed back
        srcs[i] += 1.0  # new data in the same buffer
        dsts[i][:, 1, ..., 4:] = np.nan  # another value used the padding lanes' bytes between runs (the arena)
        D.sync_threads()
        step.run({L.ARG_SRC: D.address(srcs[i]), L.ARG_DST: D.address(dsts[i])})
        D.wait()
        padded = np.zeros((1, 32, 5, 7), np.float32)
        padded[:, :20] = srcs[i]
        np.testing.assert_array_equal(dsts[i], padded.reshape(1, 2, 16, 5, 7).transpose(0, 1, 3, 4, 2))

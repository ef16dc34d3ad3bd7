"""_onednn.address: the remembered data pointer of an array is the array's own, for views and for new arrays that
reuse a dead array's id, and remembering an array never keeps it alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from engine.devices.cpu.onednn import objects as D


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

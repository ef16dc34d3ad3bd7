"""oneDNN's loading: OpenMP's wait policy is fixed by the first load, and a later, different one is said; a missing
oneDNN is said once."""

from __future__ import annotations

import logging

import pytest

from engine.devices.cpu.onednn import binding


@pytest.fixture
def loaded_once(monkeypatch):
    if binding.load() is None:
        pytest.skip("oneDNN is not installed here")
    monkeypatch.setattr(binding, "_spin_warned", False)
    monkeypatch.setattr(binding, "_loaded_spin", 2)


def test_a_later_different_spin_is_warned_once(loaded_once, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.devices.cpu"):
        assert binding.load(2) is binding.LIB  # the same spin: nothing to say
        assert not caplog.records
        binding.load(100)
        binding.load(100)
    assert len(caplog.records) == 1
    assert "2 us" in caplog.records[0].getMessage() and "100 us" in caplog.records[0].getMessage()


def test_a_load_with_no_spin_takes_the_loaded_one_unwarned(loaded_once, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.devices.cpu"):
        binding._loaded_spin = 100  # as under the `run` policy; the layout probe (objects.available) asks no spin
        assert binding.load() is binding.LIB
    assert not caplog.records


def test_a_missing_onednn_is_warned_at_the_first_load_only(monkeypatch, caplog):
    monkeypatch.setattr(binding, "_loaded", False)
    for name in ("LIB", "OMP", "INTEL", "INTEL_BLOCKTIME_MS"):  # restored after the test, as the load set them
        monkeypatch.setattr(binding, name, getattr(binding, name))
    monkeypatch.setattr(binding, "_open", lambda *args: None)  # no libdnnl on this host
    with caplog.at_level(logging.WARNING, logger="engine.devices.cpu"):
        assert binding.load() is None
        assert binding.load(100) is None
    assert len(caplog.records) == 1 and binding.SONAME in caplog.records[0].getMessage()

"""oneDNN's loading: OpenMP's wait policy is fixed by the first load, and a later, different one is said."""

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

"""Shared test helpers: where the repository and ../shared are, and how to read a committed model fixture."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from model_fixtures import FIXTURES_DIR, REPO_ROOT, ModelFixture, read_fixture  # noqa: F401 - read by devices/conftest.py

# The suite runs on shared, loaded machines. OpenMP's threads sleep at once here (set before any test loads libgomp,
# and inherited by the servers tests start): spinning at barriers on an oversubscribed host costs whole time
# slices. The engine's default wait policy (NNSERVE_SPIN_US) is tested in a process of its own,
# tests/engine/runtime/test_threads.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared reference folder next to the repository; skips the test when it is absent."""
    path = REPO_ROOT.parent / "shared"
    if not path.is_dir():
        pytest.skip("../shared (reference models and docs) is not present next to the repository")
    return path


@pytest.fixture(scope="session")
def load_fixture() -> Callable[..., ModelFixture]:
    """`load_fixture(name, kind="pnnx")` -> ModelFixture."""
    return read_fixture

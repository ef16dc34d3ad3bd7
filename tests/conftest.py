"""Shared test helpers: where the repository and ../shared are, and how to read a committed model fixture."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from model_fixtures import FIXTURES_DIR, REPO_ROOT, ModelFixture, read_fixture  # noqa: F401 - read by devices/conftest.py

# The suite runs on shared, loaded machines. OpenMP's threads sleep at once here (set before any test loads libgomp,
# and inherited by the servers tests start): spinning at barriers on an oversubscribed host costs whole time
# slices. The engine's default wait policy (NNSERVE_SPIN_US) is tested in a process of its own,
# tests/engine/runtime/test_threads.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# `make test` runs two pytest-xdist workers that take whole modules in collection order (--dist loadscope
# --no-loadscope-reorder), and the run ends when the last module does: a long module handed out near the end keeps
# one worker busy while the other idles. These go first, longest first (seconds: a loaded 2-core host, two workers).
LONG_FIRST = (
    "tests/engine/devices/test_cuda_sim.py",  # every CUDA kernel in a child pytest under numba's simulator (100-200)
    "tests/e2e/test_walk.py",  # README and models guide on a fresh clone, installed into a new venv (90-150)
    "tests/deploy/test_deploy_packaging.py",  # sdist and wheel built, the wheel installed into a clean venv
    "tests/server/test_reliability_soak.py",  # 30 s of mixed traffic
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Known-long modules first (LONG_FIRST), the rest in their own order; the same order with or without xdist."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _module_rng_per_test(request: pytest.FixtureRequest) -> None:
    """A test module's shared generator (a module-level `RNG`) reseeded from the test's id before each test, so a
    test draws the same data whichever tests ran before it in its process: run alone, filtered with -k, or with the
    suite split over pytest-xdist workers (a test asserting a property of its data, such as ties to round, failed
    when another worker took the tests before it)."""
    rng = getattr(request.module, "RNG", None)
    if isinstance(rng, np.random.Generator):
        seed = zlib.crc32(request.node.nodeid.encode())
        rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state


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

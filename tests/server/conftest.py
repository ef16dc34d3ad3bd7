"""Fixtures for the server tests: a repository of the tiny PNNX model and a running `nnserve serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """affine: full config with dynamic batching; affine_auto: no config.pbtxt (auto-completed)."""
    return make_repository(tmp_path_factory.mktemp("repo"), {"affine": AFFINE_CONFIG, "affine_auto": None})


@pytest.fixture(scope="session")
def server(repo: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(repo)
    yield srv
    assert srv.stop() == 0, srv.log_text

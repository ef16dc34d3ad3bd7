from __future__ import annotations

import pytest
from toy_ops import toy_ops


@pytest.fixture
def toys():
    with toy_ops():
        yield

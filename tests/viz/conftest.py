"""The drawing code never imports torch: skip the suite-wide torch set-up for these tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Overrides tests/conftest.py's fixture of the same name (which imports torch)."""
    yield

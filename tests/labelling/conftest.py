"""Fixtures of the labelling tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser import launch


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium (the system's), shared by a module's tests."""
    yield from launch()

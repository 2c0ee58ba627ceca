"""Fixtures of the scheduler tests: a started-on-demand scheduler harness, stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scheduler_harness import Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.stop()

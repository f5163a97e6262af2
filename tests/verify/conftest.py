"""pytest fixtures for verify's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def legacy_cache(tmp_path_factory) -> Path:
    """Legacy runs are deterministic: tests of one fixture share its legacy run."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this session
    return base / "tfmigrate-verify-legacy-cache"

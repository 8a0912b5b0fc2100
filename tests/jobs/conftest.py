"""Fixtures of the offline jobs' tests (users and request figures: tests/conftest.py and
tests/observability/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _job_files(job_files_in_tmp: None) -> None:
    """Job outputs (plots, archives) land in the test's folder (tests/conftest.py)."""

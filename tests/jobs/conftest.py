"""Fixtures of the offline jobs' tests (users: tests/conftest.py; request figures to
work on: tests/records.py's `seed`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _job_files(job_files_in_tmp: None) -> None:
    """Job outputs (plots, archives) land in the test's folder (tests/conftest.py)."""

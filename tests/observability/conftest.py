"""Fixtures for the observability side (the seeded request figures and engine samples
are tests/records.py's `seed`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _job_files(job_files_in_tmp: None) -> None:
    """Benchmark plots and the like land in the test's folder (tests/conftest.py)."""

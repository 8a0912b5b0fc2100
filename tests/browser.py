"""Debian's Chromium for the browser tests, driven by Playwright: never a browser that
a test tool downloads. `make test` installs the Debian package and builds the frontend;
a missing one is a failure here, not a skip, so a green run always drove a browser."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.live_server import ROOT

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Headless, no sandbox (root in CI), and no background traffic: this machine has no
# network beyond the package registries, and Chromium's own calls would be refused.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"


def require_browser_and_bundle(*bundle_files: str) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (make test does)")
    dist = ROOT / "frontend" / "dist"
    missing = [name for name in bundle_files if not (dist / name).exists()]
    if missing:
        pytest.fail(f"frontend not built ({', '.join(missing)}): cd frontend && npm run build")

"""Fixtures of the reliability tests."""

from tests.sockets import sockets_closed_at_the_end

__all__ = ["sockets_closed_at_the_end"]  # autouse here (tests/sockets.py)

"""The embedded default: SQLite, in-memory channel layer, in-process engine."""

from chatapp.settings.base import *  # noqa: F403
from chatapp.settings.env import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)

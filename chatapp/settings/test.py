"""Settings for the test suite."""

from chatapp.settings.base import *  # noqa: F403
from chatapp.settings.base import ENGINE

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ENGINE = {**ENGINE, "PRELOAD": False}
CHAT_DISCONNECT_GRACE_S = 0.0
CELERY_TASK_ALWAYS_EAGER = True
# Observability (inference/): no sampler thread or engine-written titles under tests;
# tests/observability turns titles on where it tests them.
OBS_BACKGROUND = False
CHAT_AUTO_TITLES = False

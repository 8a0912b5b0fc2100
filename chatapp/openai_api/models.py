"""API keys of the OpenAI-compatible API."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """A key for the OpenAI-compatible API. Only its SHA-256 is stored; the key itself
    is shown once, when it is made."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    # 0 means the site-wide default (OPENAI_RATE_LIMIT_PER_MINUTE, OPENAI_MAX_CONCURRENT).
    rate_limit_per_minute = models.PositiveIntegerField(default=0)
    max_concurrent = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chatapp_apikey"  # the app was `chatapp` before the split
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

from django.contrib import admin
from django.http import HttpRequest

from chatapp.openai_api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Where an admin sets a key's own limits (0: the site-wide default) or revokes it.
    The key itself is never stored, so nothing here can reveal it."""

    list_display = (
        "name", "prefix", "owner", "rate_limit_per_minute", "max_concurrent",
        "created_at", "last_used_at", "revoked_at",
    )  # fmt: skip
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "owner__username")
    fields = (
        "owner", "name", "prefix", "rate_limit_per_minute", "max_concurrent",
        "created_at", "last_used_at", "revoked_at",
    )  # fmt: skip
    readonly_fields = ("owner", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are made on /settings/keys/, where the key is shown once

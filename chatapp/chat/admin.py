from django.contrib import admin
from django.http import HttpRequest

from chatapp.login_throttle import ThrottledAdminAuthenticationForm
from chatapp.models import ApiKey, Conversation, Message

# The admin's log-in is throttled like the site's (chatapp/login_throttle.py).
admin.site.login_form = ThrottledAdminAuthenticationForm


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "text")
    readonly_fields = fields
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "owner", "updated_at")
    search_fields = ("title", "owner__username")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation", "role", "status", "finish_reason", "created_at")
    list_filter = ("role", "status")
    search_fields = ("text",)


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

from django.contrib import admin
from django.http import HttpRequest

from chatapp.observability.models import MinuteRollup, RequestRecord


@admin.register(RequestRecord)
class RequestRecordAdmin(admin.ModelAdmin):
    list_display = (
        "finished_at",
        "source",
        "user",
        "ttft",
        "e2e",
        "output_tokens",
        "finish_reason",
    )
    list_filter = ("source", "finish_reason", "error_code")
    date_hierarchy = "finished_at"
    raw_id_fields = ("user", "conversation")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(MinuteRollup)
class MinuteRollupAdmin(admin.ModelAdmin):
    list_display = ("minute", "requests", "output_tokens", "samples")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


# The admin's front page links to the latency dashboard (urls.py).
admin.site.index_template = "observability/admin_index.html"

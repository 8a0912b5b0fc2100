from django.contrib import admin

from chatapp.jobs.models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "user", "created_at", "finished_at")
    list_filter = ("kind", "status")
    raw_id_fields = ("user",)

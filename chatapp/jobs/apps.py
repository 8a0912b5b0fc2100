from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "chatapp.jobs"
    label = "jobs"
    verbose_name = "Offline jobs"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class ChatappConfig(AppConfig):
    name = "chatapp"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chatapp.auth_events import connect_signals

        connect_signals()

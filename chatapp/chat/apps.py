from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chatapp.chat"
    label = "chat"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A socket lives as long as the login it was opened with (user_sockets.py).
        from chatapp.chat.user_sockets import connect_signals

        connect_signals()

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "chatapp.observability"
    label = "observability"
    verbose_name = "Observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chatapp.events import request_ended
        from chatapp.observability.recording import on_request_ended

        request_ended.connect(on_request_ended, dispatch_uid="observability-record-request")

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Serving holds no models: the app is here for `manage.py run_engine`."""

    name = "inference"
    verbose_name = "Inference"

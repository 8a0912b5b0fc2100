from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    name = "chatapp.openai_api"
    label = "openai_api"
    verbose_name = "OpenAI-compatible API"
    default_auto_field = "django.db.models.BigAutoField"

from django.urls import path

from chatapp.openai_api import keys, views

urlpatterns = [
    path("settings/keys/", keys.keys_page, name="api-keys"),
    path("settings/keys/<int:pk>/revoke", keys.revoke_key, name="api-key-revoke"),
    path("api/keys/", keys.keys_api),
    path("api/keys/<int:pk>/", keys.key_api),
    path("v1/models", views.models),
    path("v1/models/<path:model_id>", views.model),
    path("v1/chat/completions", views.chat_completions),
    path("v1/completions", views.completions),
]

from django.urls import path, re_path

from chatapp.chat import api, shares, views

urlpatterns = [
    path("", views.index, name="index"),
    path("api/me/", api.me),
    path("api/me/instructions/", api.custom_instructions),
    path("api/engine/", api.engine_info),
    path("api/models/", api.models),
    path("api/chat/limits/", api.chat_limits),
    path("api/conversations/", api.conversations),
    path("api/conversations/<int:pk>/", api.conversation),
    path("api/conversations/import/", api.import_conversations),
    path("api/attachments/", api.upload_attachment),
    path("api/attachments/<int:pk>/", api.attachment),
    path("api/chat/prompt-size/", api.prompt_size),
    re_path(r"^api/conversations/(?P<pk>[0-9]+)/export\.(?P<fmt>md|json|txt)$", api.export),
    path("api/messages/<int:pk>/feedback/", api.message_feedback),
    path("api/feedback/", api.feedback_summary),
    path("api/feedback/export.jsonl", api.feedback_export),
    path("api/prompts/", api.saved_prompts),
    path("api/prompts/<int:pk>/", api.saved_prompt),
    path("api/conversations/<int:pk>/share/", shares.conversation_link),
    path("api/shares/", shares.links),
    path("share/<str:token>", shares.shared_page, name="shared-conversation"),
    path("api/exports/", api.exports, name="exports"),
    path("api/exports/<int:pk>/download", api.export_download, name="export-download"),
]

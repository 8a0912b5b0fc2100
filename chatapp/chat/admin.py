from django.contrib import admin

from chatapp.chat.models import Conversation, Message, SavedPrompt


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "text")
    readonly_fields = fields
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "owner", "updated_at")
    search_fields = ("title", "owner__username")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "role",
        "status",
        "finish_reason",
        "feedback_rating",
        "created_at",
    )
    # feedback_rating: the owners' thumbs (1 up, -1 down; chatapp/chat/feedback.py).
    list_filter = ("role", "status", "feedback_rating")
    search_fields = ("text", "feedback_comment")


@admin.register(SavedPrompt)
class SavedPromptAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "updated_at")
    search_fields = ("name", "owner__username")

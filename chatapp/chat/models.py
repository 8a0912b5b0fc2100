"""Conversations and messages.

Messages form a tree: each points at its parent, so regenerating a reply or editing a
user message adds a sibling branch and keeps the old one. The conversation remembers
the leaf of the branch on screen (`active_leaf`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


def default_settings() -> dict[str, Any]:
    return dict(settings.CHAT_DEFAULTS)


class Conversation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(default=0.7)
    top_p = models.FloatField(default=0.95)
    max_tokens = models.PositiveIntegerField(default=512)
    # Replies held to a JSON object while decoding (the API's response_format json_object).
    json_mode = models.BooleanField(default=False)
    # The model its turns go to (the picker in the chat header): a served model's name;
    # blank for a conversation from before models were named, which gets the default.
    model = models.CharField(max_length=200, blank=True, default="")
    active_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Organising (the sidebar): pinned ones first, archived ones out of the list, and a
    # folder name ("" for none) grouping the rest.
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    folder = models.CharField(max_length=60, blank=True, default="")
    # A temporary chat (docs/http.md, "Temporary chats"): kept only while the page that
    # started it is open, never listed, searched, exported, shared or titled.
    temporary = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "chatapp_conversation"  # the app was `chatapp` before the split
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def settings_dict(self) -> dict[str, Any]:
        return {
            "system_prompt": self.system_prompt,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "json_mode": self.json_mode,
        }


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        COMPLETE = "complete"
        STREAMING = "streaming"
        STOPPED = "stopped"
        ERROR = "error"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    text = models.TextField(blank=True, default="")
    # The exact ids the engine saw (a user turn, template markers included) or produced
    # (an assistant reply, its end token included): the next turn's prompt is built from
    # them, so it is an exact extension of what the engine already holds in its KV cache.
    token_ids = models.JSONField(default=list, blank=True)
    # The model that wrote a reply, or that a user turn was sent to; and the fingerprint of
    # that model's tokenizer, the vocabulary `token_ids` are in: another model's prompt
    # takes them only when its tokenizer has the same fingerprint. Blank on messages from
    # before models were named (the default model's ids).
    model = models.CharField(max_length=200, blank=True, default="")
    tokenizer = models.CharField(max_length=32, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # The figures of an assistant reply (its one request's numbers): ttft_ms, tokens_per_s,
    # output_tokens, prompt_tokens, cached_tokens, cached_tokens_redis, e2e_ms, queue_ms,
    # and replayed when the response cache answered.
    figures = models.JSONField(default=dict, blank=True)
    # On a user message whose documents were too long to read whole: the passages its turn
    # carried instead (chatapp/chat/retrieval.py), [{n, attachment_id, name, page, text}].
    sources = models.JSONField(default=list, blank=True)
    # How many tokens the message takes in a prompt, for the tokenizer `tokenizer` names: a
    # turn's token ids when it has them, else its text's count (imports). Summed over a
    # branch, it refuses a prompt past the context window without reading or tokenizing
    # the history (conversations.too_long_by_count). None: not counted.
    tokens = models.PositiveIntegerField(null=True, blank=True)
    # The owner's feedback on an assistant reply (chatapp/chat/feedback.py): +1 or -1, an
    # optional comment, and when it was given. On the message itself, as a reply has one
    # owner: a page of the branch reads it with the rows it already reads.
    feedback_rating = models.SmallIntegerField(null=True, blank=True)
    feedback_comment = models.TextField(blank=True, default="")
    feedback_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "chatapp_message"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["conversation", "id"]),
            # The dashboard's newest feedback first, reading only rated replies.
            models.Index(
                fields=["-feedback_at"],
                name="chat_message_feedback_idx",
                condition=models.Q(feedback_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:40]}"

    def feedback_json(self) -> dict[str, Any] | None:
        """The owner's feedback as the API sends it (chatapp/chat/feedback.py)."""
        if self.feedback_rating is None:
            return None
        return {
            "rating": "up" if self.feedback_rating > 0 else "down",
            "comment": self.feedback_comment,
            "at": self.feedback_at.isoformat() if self.feedback_at else None,
        }


class SharedLink(models.Model):
    """A read-only link to a snapshot of a conversation (chatapp/chat/shares.py).

    The snapshot is what the link shows, taken when the owner shares or updates the link:
    later messages are not in it. Revoking deletes the row, so the link answers 404 and
    sharing again makes a new token; deleting the conversation deletes it too."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="shared_link"
    )
    token = models.CharField(max_length=64, unique=True)
    # {"title", "messages": [{"role", "text"}], "author"?, "settings"?}: only what the
    # page shows, nothing read from the live conversation afterwards.
    snapshot = models.JSONField(default=dict)
    show_author = models.BooleanField(default=False)
    show_settings = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    shared_at = models.DateTimeField()

    class Meta:
        ordering = ["-shared_at", "-id"]

    def __str__(self) -> str:
        return f"link to {self.conversation_id}"


class Attachment(models.Model):
    """A document's text, attached to a user message (or uploaded and waiting to be sent,
    `message` null). The text goes into that message's turn of the prompt
    (chatapp/chat/attachments.py); only its owner ever reads it."""

    class Kind(models.TextChoices):
        TEXT = "text"
        PDF = "pdf"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="attachments"
    )
    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="attachments"
    )
    position = models.PositiveSmallIntegerField(default=0)  # order within the message
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    size = models.PositiveBigIntegerField()  # bytes of the file as uploaded
    text = models.TextField()
    # Tokens of its block in the prompt, for the model served when it was uploaded; None
    # where the engine does not tokenize here (an upstream server).
    tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["position", "id"]
        indexes = [models.Index(fields=["owner", "message", "created_at"])]

    def __str__(self) -> str:
        return self.name


class CustomInstructions(models.Model):
    """What a user tells every new chat of theirs (chatapp/chat/instructions.py): about
    themselves, and how they want answers. A new chat takes them as its system prompt."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="custom_instructions"
    )
    about = models.TextField(blank=True, default="")
    style = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)


class SavedPrompt(models.Model):
    """A prompt a user keeps to reuse: typed `/name` in the composer (or picked from the
    Ctrl+K palette) puts its text in the message box (chatapp/chat/prompts.py)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_prompts"
    )
    # The command after `/`: lowercase letters, digits and dashes, unique per owner.
    name = models.CharField(max_length=40)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="chat_savedprompt_owner_name")
        ]

    def __str__(self) -> str:
        return f"/{self.name}"

"""A conversation as Markdown or JSON (the active branch), and the export job that zips all
of a user's conversations."""

from __future__ import annotations

import json
import re
import zipfile
from typing import Any

from django.utils.text import slugify

from chatapp.chat import attachments, conversations
from chatapp.chat.models import Conversation, Message
from chatapp.jobs.files import job_dir, relative_to_var
from chatapp.jobs.models import Job

# /3: a reply's numbers are its `figures` (`stats` until /2; the import reads either).
EXPORT_FORMAT = "chatapp.conversation/3"
# What one conversation or the export of all of them comes as: Markdown, JSON, plain text.
FORMATS = ("md", "json", "txt")


def conversation_payload(conv: Conversation) -> dict[str, Any]:
    """The conversation as its JSON export: `messages` is the branch on screen, oldest
    first; `other_messages` the other branches (edits, regenerated replies), tied in by
    `parent_id`. A user message's `attachments` carry their text. POST
    /api/conversations/import/ takes it back (chatapp/chat/imports.py)."""
    everything = list(Message.objects.filter(conversation=conv).order_by("id"))
    shown = conversations.active_branch(conv)
    on_screen = {m.pk for m in shown}
    documents = attachments.of_messages(m.pk for m in everything if m.role == Message.Role.USER)

    def as_json(m: Message) -> dict[str, Any]:
        data = conversations.message_json(m, documents=documents.get(m.pk, []))
        if m.role == Message.Role.USER:
            data["attachments"] = [
                attachments.attachment_json(a, with_text=True) for a in documents.get(m.pk, [])
            ]
        return data

    return {
        "format": EXPORT_FORMAT,
        "conversation": conversations.conversation_json(conv),
        "messages": [as_json(m) for m in shown],
        "other_messages": [as_json(m) for m in everything if m.pk not in on_screen],
    }


def conversation_markdown(conv: Conversation) -> str:
    """The branch on screen, each document in full under the message it went with."""
    lines = [f"# {conv.title or 'Conversation'}", ""]
    if conv.system_prompt.strip():
        lines += ["**System:**", "", conv.system_prompt, ""]
    branch = conversations.active_branch(conv)
    documents = attachments.of_messages(m.pk for m in branch if m.role == Message.Role.USER)
    for m in branch:
        who = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.title())
        lines += [f"**{who}:**", ""]
        for a in documents.get(m.pk, []):
            tokens = f", {a.tokens:,} tokens" if a.tokens is not None else ""
            fence = "`" * max(3, _longest_backtick_run(a.text) + 1)
            lines += [
                f"Attached: **{a.name}** ({attachments.human_size(a.size)}{tokens})",
                "",
                fence,
                a.text.strip("\n"),
                fence,
                "",
            ]
        if m.text:
            lines += [m.text, ""]
    return "\n".join(lines)


def conversation_text(conv: Conversation) -> str:
    """The branch on screen as plain text: who spoke, then their words, no markup added;
    each document by name and size (its text is in the Markdown and JSON exports)."""
    lines = [conv.title or "Conversation", ""]
    if conv.system_prompt.strip():
        lines += ["System:", conv.system_prompt, ""]
    branch = conversations.active_branch(conv)
    documents = attachments.of_messages(
        (m.pk for m in branch if m.role == Message.Role.USER), with_text=False
    )
    for m in branch:
        who = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.title())
        lines.append(f"{who}:")
        for a in documents.get(m.pk, []):
            lines.append(f"[attached: {a.name}, {attachments.human_size(a.size)}]")
        if m.text:
            lines.append(m.text)
        lines.append("")
    return "\n".join(lines)


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def export_all(job: Job) -> dict[str, Any]:
    """The export job: all of a user's saved conversations (temporary chats are not) as a
    zip, one Markdown or text file each, or one JSON."""
    fmt = job.params.get("format", "md")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    convs = list(Conversation.objects.filter(owner=job.user, temporary=False).order_by("id"))
    path = job_dir(job) / f"conversations-{fmt}.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        if fmt == "json":
            data = [conversation_payload(c) for c in convs]
            zf.writestr("conversations.json", json.dumps(data, ensure_ascii=False, indent=2))
        else:
            render = conversation_markdown if fmt == "md" else conversation_text
            for c in convs:
                name = f"{c.pk:05d}-{slugify(c.title)[:50] or 'conversation'}.{fmt}"
                zf.writestr(name, render(c))
    Job.objects.filter(pk=job.pk).update(
        file=relative_to_var(path), result={"conversations": len(convs)}
    )
    return {"conversations": len(convs)}
